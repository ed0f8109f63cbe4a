"""A read replica's first copy of a collection: what the primary serves it (every record visible at one
generation, kept for it by its hold) and how the replica writes it (staged in batches, see below).

A replica starts a collection at the oldest generation G0 that readers may still read, and places its hold
(``readers.HOLD_PREFIX``) there, so that the primary's GC keeps G0's records. A ``query`` at G0 would
still answer 410 as soon as the collection's readers move past G0 (SPEC §1: reads below the readers'
minimum), which on a busy pipeline source happens before a large copy ends; this read answers down to
what the hold keeps instead (``readers.kept_floor``), in pages by key, each page in its own transaction.
"""

from __future__ import annotations

from dataclasses import dataclass

import lmdb
import msgpack

from diffstore.engine import layout, readers, replication
from diffstore.engine.meta import CollectionMeta
from diffstore.engine.tables import Tables, check_not_collected, create_meta, validate_generation_id
from diffstore.engine.types import GenerationRecords, Record, ReplicaGeneration
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


# --- the replica's side: a first copy staged in batches --------------------------------------------------
#
# A large first copy is written in batches, each its own write transaction (bounded memory; readers and
# other collections' applies go on between them). Until its last batch the collection's row is kept in the
# replica table (``layout.replica_staged_key``), not in ``collections``: reads, listings and GC do not see
# the collection -- it answers ``noSuchCollection`` as before its copy began, and ``GET /replica`` says
# ``copying`` -- while its records, written into its open generation under its own cid, are on disk. The
# row also says where the copy goes on (the next key), so a copy cut by a crash resumes there. The last
# batch commits the generation and moves the row into ``collections`` in one transaction.
# Invariants: a staged row and a ``collections`` row of one name never both exist; a staged copy that is
# abandoned (dropped, started again at another generation, promoted) hands its cid to the background purge.


@dataclass(frozen=True, slots=True)
class Staged:
    """A first copy under way: the collection's row as staged, the generation it copies, the next key."""

    meta: CollectionMeta
    generation_id: bytes
    next_key: bytes | None


def staged(txn: lmdb.Transaction, tables: Tables, name: str) -> Staged | None:
    """The first copy of ``name`` under way, if any."""
    raw = txn.get(layout.replica_staged_key(name), db=tables.replica)
    if raw is None:
        return None
    packed, generation_id, next_key = msgpack.unpackb(raw)
    return Staged(CollectionMeta.unpack(name, packed), generation_id, next_key)


def _save(txn: lmdb.Transaction, tables: Tables, row: Staged) -> None:
    # put_many saved the row under the collection's name: it moves back to the replica table
    txn.delete(row.meta.name.encode(), db=tables.collections)
    value = msgpack.packb([row.meta.pack(), row.generation_id, row.next_key])
    txn.put(layout.replica_staged_key(row.meta.name), value, db=tables.replica)


def abandon(txn: lmdb.Transaction, tables: Tables, name: str) -> bool:
    """Drops the first copy of ``name`` under way (its records are purged in the background)."""
    row = staged(txn, tables, name)
    if row is None:
        return False
    txn.delete(layout.replica_staged_key(name), db=tables.replica)
    txn.put(row.meta.cid_prefix, b"", db=tables.dropped)
    return True


def abandon_all(txn: lmdb.Transaction, tables: Tables) -> list[str]:
    """Drops every first copy under way (a promotion: they will never be finished); their names."""
    cursor = txn.cursor(db=tables.replica)
    names: list[str] = []
    if cursor.set_range(layout.REPLICA_STAGED):
        for key in cursor.iternext(values=False):
            if not key.startswith(layout.REPLICA_STAGED):
                break
            names.append(layout.replica_staged_name(bytes(key)))
    for name in names:
        abandon(txn, tables, name)
    return names


def stage(
    txn: lmdb.Transaction, tables: Tables, name: str, manual: bool, generation_id: bytes
) -> Staged | None:
    """Begins (or finds, to resume) a staged first copy of ``name`` at ``generation_id``; None when the
    collection is copied already. A copy staged at another generation is abandoned first.

    Raises:
        NotReplica: the store is not (or no longer) a replica.
    """
    replication.require_following(txn, tables)
    if txn.get(name.encode(), db=tables.collections) is not None:
        return None
    row = staged(txn, tables, name)
    if row is not None:
        if row.generation_id == generation_id and row.meta.manual == manual:
            return row
        abandon(txn, tables, name)
    validate_generation_id(generation_id)
    meta = create_meta(txn, tables, name, manual, generation_id if manual else None)
    if manual:
        meta = meta.with_(next=meta.generation, next_seq=0)  # the copy lands in the initial generation
    else:
        meta = replication.move_open_generation(txn, tables, meta, generation_id)
    row = Staged(meta, bytes(generation_id), None)
    _save(txn, tables, row)
    return row


def stage_batch(
    txn: lmdb.Transaction,
    tables: Tables,
    name: str,
    generation_id: bytes,
    records: list[tuple[bytes, bytes | None]],
    next_key: bytes | None,
) -> bool:
    """Writes one batch of a staged first copy (the records up to ``next_key``); False when no copy of
    ``name`` at ``generation_id`` is staged (abandoned meanwhile: nothing written)."""
    replication.require_following(txn, tables)
    row = staged(txn, tables, name)
    if row is None or row.generation_id != generation_id:
        return False
    meta = replication.write_records(txn, tables, row.meta, generation_id, records)
    _save(txn, tables, Staged(meta, row.generation_id, next_key))
    return True


def finish(txn: lmdb.Transaction, tables: Tables, step: ReplicaGeneration) -> CollectionMeta | None:
    """Writes the last batch (``step.records``) of the staged copy of ``step.collection`` and commits it:
    from this transaction on the collection is readable. None: no such copy is staged."""
    replication.require_following(txn, tables)
    row = staged(txn, tables, step.collection)
    if row is None or row.generation_id != step.generation_id:
        return None
    meta = replication.write_records(txn, tables, row.meta, step.generation_id, step.records)
    txn.delete(layout.replica_staged_key(step.collection), db=tables.replica)
    return replication.commit_applied(txn, tables, meta, step)
