"""What a read replica's first copy of a collection reads: every record visible at one generation, kept
for it by its hold.

A replica starts a collection at the oldest generation G0 that readers may still read, and places its hold
(``readers.HOLD_PREFIX``) there, so that the primary's GC keeps G0's records. A ``query`` at G0 would
still answer 410 as soon as the collection's readers move past G0 (SPEC §1: reads below the readers'
minimum), which on a busy pipeline source happens before a large copy ends; this read answers down to
what the hold keeps instead (``readers.kept_floor``), in pages by key, each page in its own transaction.
"""

from __future__ import annotations

import lmdb

from diffstore.engine import layout, readers
from diffstore.engine.meta import CollectionMeta
from diffstore.engine.tables import Tables, check_not_collected
from diffstore.engine.types import GenerationRecords, Record
from diffstore.engine.visibility import ReadPoint, compiled_records, in_key_order, lower_form, visible_stream
from diffstore.errors import NoSuchGeneration, NoSuchReader, text_form


def _no_name(seq: int) -> bytes:
    return b""  # a first copy keeps no record's generation: they all count as written by it


def visible_records(
    txn: lmdb.Transaction,
    tables: Tables,
    meta: CollectionMeta,
    generation_id: bytes,
    from_key: bytes | None,
    limit: int,
    hold: str | None,
) -> GenerationRecords:
    """A page of the records visible at committed generation ``generation_id``, in key order from
    ``from_key`` (inclusive), at most ``limit`` (tombstones left out); ``next_key`` goes on.

    Raises:
        NoSuchGeneration: not a committed generation of the collection.
        GenerationCollected: below what GC keeps (with ``hold``: what the holds keep).
        NoSuchReader: ``hold`` is given and the collection has no such reader.
    """
    raw_seq = txn.get(layout.gen_id_key(meta.cid_prefix, generation_id), db=tables.gen_ids)
    if raw_seq is None or layout.read_u64(raw_seq) > meta.generation_seq:
        raise NoSuchGeneration(f"{text_form(generation_id)} is not a committed generation of {meta.name!r}")
    floor = (
        readers.kept_floor(txn, tables, meta)
        if hold is not None
        else readers.readable_floor(txn, tables, meta)
    )
    check_not_collected(meta, generation_id, floor)
    if hold is not None and readers.load_reader(txn, tables, meta, hold) is None:
        raise NoSuchReader(f"collection {meta.name!r} has no reader {hold!r}")
    point = ReadPoint(meta, bytes(generation_id), layout.read_u64(raw_seq))
    found: list[tuple[bytes, bytes | None]] = []
    next_key: bytes | None = None
    lower = lower_form(from_key)
    # short keys through the compiled scan of queries; the key-order stream from a long key on
    compiled = compiled_records(
        txn, tables, point, lower, None, (from_key, None, None), limit + 1, Record, _no_name, {}
    )
    if compiled is not None:
        items, handed = compiled
        if len(items) > limit:
            return GenerationRecords([(r.key, r.value) for r in items[:limit]], items[limit].key)
        found = [(r.key, r.value) for r in items]
        if handed is None:
            return GenerationRecords(found, None)
        lower = handed
    for key, raw, _ in in_key_order(visible_stream(txn, tables, point, lower)):
        if from_key is not None and key < from_key:
            continue  # the rest of a long key's group, below the resume key
        if not raw:
            continue  # the tombstone of a short key
        value = raw[1:] if raw[0] == 1 else layout.decode_value(raw)
        if value is None:
            continue
        if len(found) == limit:
            next_key = key
            break
        found.append((key, value))
    return GenerationRecords(found, next_key)
