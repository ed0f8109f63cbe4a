"""Revert (SPEC §8): the writes that make a collection equal to its state at an earlier generation.

A key can differ from its value at ``to`` only if a generation after ``to`` wrote it: a committed one in
(to, current] or the open generation. So the candidates are the merged ``changes`` runs of those
generations, and the cost follows the writes since ``to`` (as a diff's does), never the collection's
size. For each candidate the value visible at ``to`` is compared with what a read at the open generation
sees -- its uncommitted writes included, so that the result equals the state at ``to`` whatever was
already written there. Where they differ, the value at ``to`` (a tombstone where the key was absent) is
one of the revert's items; keys already equal are not written.

The items are computed and written in the caller's write transaction, through ``writes.put_many``, so a
revert is fenced, counted and committed (a full non-manual generation) exactly as a putMany.

A manual collection's revert is written in batches (:data:`BATCH_KEYS` candidates examined per write
transaction, in key form order, each batch resuming where the last stopped), so that the writers of other
collections are not held up behind one transaction of unbounded size: each batch is exact at its own
instant, and none is visible to readers before the collection's writer commits the open generation. A
revert cut off between two batches (a crash, ``kill -9``) leaves the open generation holding part of the
revert: abort it, or call revert again -- it writes only the keys still differing. A non-manual collection's
revert stays one transaction: its open generation is committed by the server on its own timer
(``commitDelayMs``), which would commit a half-reverted state, a generation that readers and diffs see.
"""

from __future__ import annotations

import lmdb

from diffstore.engine import layout
from diffstore.engine.diff import DiffRange, changed_forms, run_seqs
from diffstore.engine.meta import CollectionMeta
from diffstore.engine.readers import readable_floor
from diffstore.engine.tables import Tables, check_not_collected, validate_generation_id
from diffstore.engine.visibility import base_version
from diffstore.errors import NoSuchGeneration, text_form

RevertItem = tuple[bytes, bytes | None]
BATCH_KEYS = 2_000
"""Candidate keys a manual collection's revert examines (and writes, where they differ) per write
transaction. ``benchmarks/writer_stalls.py`` (120k keys, load average 12): 1,000 made the revert 1.9x as
long as one transaction and another writer waited 28 ms at p50; 2,000: 1.3x and 36 ms; 5,000: 1.2x and
93 ms; one transaction: 2.2 s."""


def committed_seq(txn: lmdb.Transaction, tables: Tables, meta: CollectionMeta, generation_id: bytes) -> int:
    """The seq of ``generation_id`` when it is a committed generation of ``meta`` (its first one included),
    readable (not below the readers' floor).

    A revert names an exact version: an id between two committed generations, which a read would take as
    the older one, is refused here (as Dolt and Delta refuse an unknown version).

    Raises:
        InvalidRequest: not 0..255 bytes.
        NoSuchGeneration: not a committed generation (an aborted, open or never-started id).
        GenerationCollected: below the readers' minimum (GC may have removed its versions).
    """
    validate_generation_id(generation_id, "toGenerationId")
    raw = txn.get(layout.gen_id_key(meta.cid_prefix, generation_id), db=tables.gen_ids)
    seq = None if raw is None else layout.read_u64(raw)
    if seq is None or seq > meta.generation_seq:
        raise NoSuchGeneration(
            f"toGenerationId {text_form(generation_id)} is not a committed generation of {meta.name!r}"
        )
    check_not_collected(meta, generation_id, readable_floor(txn, tables, meta))
    return seq


def items(txn: lmdb.Transaction, tables: Tables, meta: CollectionMeta, to_seq: int) -> list[RevertItem]:
    """(key, value at ``to_seq``) of every key whose value at the open generation differs from it, in key
    form order (``None``: absent at ``to_seq``, a tombstone to write)."""
    return batch(txn, tables, meta, to_seq, b"", None)[0]


def batch(
    txn: lmdb.Transaction, tables: Tables, meta: CollectionMeta, to_seq: int, lower: bytes, limit: int | None
) -> tuple[list[RevertItem], bytes | None]:
    """:func:`items` among the candidate key forms from ``lower`` on, at most ``limit`` of them examined
    (None: all); and the ``lower`` of the next batch (None: no candidate is left)."""
    assert meta.next is not None and meta.next_seq is not None
    span = DiffRange(b"", to_seq, meta.next, meta.next_seq)
    records, records_prefix = txn.cursor(db=tables.records), meta.records_prefix
    found: list[RevertItem] = []
    seqs = run_seqs(txn, tables, meta, span)
    for examined, form in enumerate(changed_forms(txn, tables, meta.cid_prefix, seqs, lower, None)):
        if limit is not None and examined == limit:
            return found, form  # the next batch starts at this candidate
        then = base_version(records, records_prefix, form, to_seq)
        now = base_version(records, records_prefix, form, meta.next_seq)
        value = None if then is None else layout.decode_value(then[1])
        if value != (None if now is None else layout.decode_value(now[1])):
            raw = then[1] if then is not None else now[1]  # type: ignore[index]  # they differ: one exists
            found.append((layout.key_of(form, raw), value))
    return found, None
