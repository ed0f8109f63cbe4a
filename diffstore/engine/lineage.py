"""Lineage: which readers each commit moved, kept with the generation, and the walk back through sources.

A commit that carries reader updates (the transform's ``from_a``/``from_b``, the ingestor's per-shard
``hstream/...`` readers) records, in the same write transaction, one row per updated reader: its target,
the target's collection id when the target was a collection then, and the reader's position before and
after. The rows are keyed by the generation's seq (``layout``: ``lineage``), so:

- ``lineage(g)`` of a generation is one prefix scan;
- the moves of a span of a source's generations (from, to] are one range scan, merged per reader into one
  span -- the earliest ``from`` and the latest ``to`` -- which answers "which records of the source made
  this": e.g. the stream positions (x, y] of each shard that went into generations (from, to] of A;
- GC removes the rows of generations below its horizon (``purge_below``), and a deleted collection's rows
  go with its other rows. Answers never depend on how far GC has got: a generation below the readable
  floor answers ``generationCollected``, and a walk skips the source generations below the source's floor
  (marking the entry ``incomplete``), whether or not their rows are physically gone yet.

Invariants:
- Every row's seq is a committed generation of its owner (rows are written only by commits).
- A reader named in a commit's updates appears once, even if it was updated twice (first before, last
  after); one whose position did not change appears too, with ``from == to`` (the commit read that source up
  to there and found nothing new).
- The walk is bounded: ``depth`` <= :data:`MAX_DEPTH`, and at most ``max_entries`` sources in one answer
  (the walk refuses with ``invalidRequest`` rather than truncating silently).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import lmdb
import msgpack

from diffstore.engine import layout
from diffstore.engine.meta import CollectionMeta
from diffstore.engine.readers import readable_floor
from diffstore.engine.tables import MAX_NAME_BYTES, Tables, check_not_collected, resolve_seq
from diffstore.engine.types import MAX_LINEAGE_DEPTH, Lineage, LineageSource, Reader
from diffstore.errors import InvalidRequest, text_form

MAX_DEPTH = MAX_LINEAGE_DEPTH
MAX_ENTRIES = 10_000


@dataclass(frozen=True, slots=True)
class _Move:
    """One stored row (or several merged): a reader's move and what its target was."""

    name: str
    target: str
    target_cid: int | None
    from_generation_id: bytes | None
    to_generation_id: bytes | None


def record(
    txn: lmdb.Transaction, tables: Tables, owner: CollectionMeta, moves: Sequence[tuple[Reader, Reader]]
) -> None:
    """Stores the reader moves of the commit of ``owner``'s open generation."""
    seq = owner.next_seq
    if seq is None or not moves:
        return
    for before, after in moves:
        row = (
            after.collection,
            _collection_cid(txn, tables, after.collection),
            before.generation_id,
            after.generation_id,
        )
        txn.put(
            layout.lineage_key(owner.cid_prefix, seq, after.name),
            msgpack.packb(row, use_bin_type=True),
            db=tables.lineage,
        )


def _collection_cid(txn: lmdb.Transaction, tables: Tables, target: str) -> int | None:
    encoded = target.encode()
    if not 1 <= len(encoded) <= MAX_NAME_BYTES or encoded.startswith(b"\x00"):
        return None
    raw = txn.get(encoded, db=tables.collections)
    return None if raw is None else CollectionMeta.unpack(target, raw).cid


def _unpack(name: str, raw: bytes) -> _Move:
    target, cid, from_generation_id, to_generation_id = msgpack.unpackb(raw, raw=False)
    return _Move(name, target, cid, from_generation_id, to_generation_id)


def lineage(
    txn: lmdb.Transaction,
    tables: Tables,
    meta: CollectionMeta,
    generation_id: bytes,
    depth: int = 1,
    max_entries: int = MAX_ENTRIES,
) -> Lineage:
    """The readers moved by the commit of ``generation_id``; with ``depth`` > 1, their sources' too.

    Raises:
        InvalidRequest: ``depth`` is not 1..MAX_DEPTH, ``generation_id`` is not a committed generation of
            the collection, or the walk holds more than ``max_entries`` sources.
        GenerationCollected: the generation is below the collection's readable floor.
    """
    if isinstance(depth, bool) or not isinstance(depth, int) or not 1 <= depth <= MAX_DEPTH:
        raise InvalidRequest(f"depth must be an integer 1..{MAX_DEPTH}")
    raw_seq = txn.get(layout.gen_id_key(meta.cid_prefix, generation_id), db=tables.gen_ids)
    if raw_seq is None or layout.read_u64(raw_seq) > meta.generation_seq:
        raise InvalidRequest(
            f"generation {text_form(generation_id)} is not a committed generation of {meta.name!r}"
        )
    check_not_collected(meta, generation_id, readable_floor(txn, tables, meta))
    seq = layout.read_u64(raw_seq)
    walk = _Walk(txn, tables, max_entries)
    return Lineage(
        bytes(generation_id), walk.entries(_moves_of_span(txn, tables, meta, seq - 1, seq), depth - 1)
    )


def moves_of(txn: lmdb.Transaction, tables: Tables, meta: CollectionMeta, seq: int) -> list[_Move]:
    """The readers the commit of generation ``seq`` moved, as stored (no floor check: a replica copies
    what its hold keeps, see ``replication``)."""
    return _moves_of_span(txn, tables, meta, seq - 1, seq)


class _Walk:
    """One answer's walk: a snapshot and the count of sources so far."""

    __slots__ = ("txn", "tables", "left")

    def __init__(self, txn: lmdb.Transaction, tables: Tables, max_entries: int) -> None:
        self.txn = txn
        self.tables = tables
        self.left = max_entries

    def entries(self, moves: list[_Move], depth: int) -> tuple[LineageSource, ...]:
        self.left -= len(moves)
        if self.left < 0:
            raise InvalidRequest("the lineage holds too many sources at this depth; ask a smaller depth")
        return tuple(self._entry(move, depth) for move in moves)

    def _entry(self, move: _Move, depth: int) -> LineageSource:
        name = move.target if move.target_cid is not None else None
        if depth <= 0 or move.target_cid is None:
            return LineageSource(move.name, move.target, name, move.from_generation_id, move.to_generation_id)
        source = _collection_if_same(self.txn, self.tables, move.target, move.target_cid)
        if source is None:  # deleted since (or deleted and created again: another history)
            nested: tuple[LineageSource, ...] = ()
            incomplete = True
        else:
            moves, incomplete = _span(
                self.txn, self.tables, source, move.from_generation_id, move.to_generation_id
            )
            nested = self.entries(moves, depth - 1)
        return LineageSource(
            move.name, move.target, name, move.from_generation_id, move.to_generation_id, nested, incomplete
        )


def _collection_if_same(txn: lmdb.Transaction, tables: Tables, name: str, cid: int) -> CollectionMeta | None:
    raw = txn.get(name.encode(), db=tables.collections)
    if raw is None:
        return None
    meta = CollectionMeta.unpack(name, raw)
    return meta if meta.cid == cid else None


def _span(
    txn: lmdb.Transaction, tables: Tables, meta: CollectionMeta, start: bytes | None, end: bytes | None
) -> tuple[list[_Move], bool]:
    """The moves of ``meta``'s live generations in (start, end], merged per reader; and whether some
    generations of the span were below the floor (their moves are not in the answer)."""
    if end is None or (start is not None and start >= end):
        return [], False  # nothing read, or the reader went back
    # seq 0 is the collection's first generation, which no commit made: it never has moves
    first = 0 if start is None else max(0, resolve_seq(txn, tables, meta, start))
    last = resolve_seq(txn, tables, meta, end)
    live = _first_live_seq(txn, tables, meta)
    incomplete = _has_generation(txn, tables, meta, first + 1, min(last + 1, live))
    return _moves_of_span(txn, tables, meta, max(first, live - 1), last), incomplete


def _first_live_seq(txn: lmdb.Transaction, tables: Tables, meta: CollectionMeta) -> int:
    """The seq of the lowest generation at or above the readable floor (0: every generation is live)."""
    floor = readable_floor(txn, tables, meta)
    if not floor:
        return 0
    cursor = txn.cursor(db=tables.gen_ids)
    if cursor.set_range(layout.gen_id_key(meta.cid_prefix, floor)) and cursor.key().startswith(
        meta.cid_prefix
    ):
        return layout.read_u64(cursor.value())
    return meta.generation_seq + 1


def _has_generation(txn: lmdb.Transaction, tables: Tables, meta: CollectionMeta, low: int, high: int) -> bool:
    """Whether a generation with seq in [low, high) exists."""
    if low >= high:
        return False
    cursor = txn.cursor(db=tables.gens)
    if not cursor.set_range(layout.gen_key(meta.cid_prefix, low)):
        return False
    key = cursor.key()
    return key.startswith(meta.cid_prefix) and layout.seq_of_gen_key(key) < high


def _moves_of_span(
    txn: lmdb.Transaction, tables: Tables, meta: CollectionMeta, after: int, last: int
) -> list[_Move]:
    """The moves of generations with seq in (after, last], merged per reader (and target), by name."""
    merged: dict[tuple[str, str, int | None], _Move] = {}
    if last <= after:
        return []
    cursor = txn.cursor(db=tables.lineage)
    if cursor.set_range(layout.lineage_prefix(meta.cid_prefix, after + 1)):
        for key, raw in cursor:
            if not key.startswith(meta.cid_prefix):
                break
            seq, name = layout.split_lineage_key(key)
            if seq > last:
                break
            move = _unpack(name, raw)
            ident = (move.name, move.target, move.target_cid)
            earlier = merged.get(ident)
            if earlier is not None:
                move = _Move(
                    name, move.target, move.target_cid, earlier.from_generation_id, move.to_generation_id
                )
            merged[ident] = move
    return sorted(merged.values(), key=lambda m: (m.name.encode(), m.target.encode()))


def purge_below(txn: lmdb.Transaction, tables: Tables, meta: CollectionMeta, seq: int, limit: int) -> int:
    """Deletes up to ``limit`` rows of generations with seq below ``seq`` (GC); how many it deleted."""
    end = layout.lineage_prefix(meta.cid_prefix, seq)
    cursor = txn.cursor(db=tables.lineage)
    deleted = 0
    if not cursor.set_range(meta.cid_prefix):
        return 0
    while deleted < limit and cursor.key() < end and cursor.key().startswith(meta.cid_prefix):
        if not cursor.delete():
            break
        deleted += 1
    return deleted


def has_below(txn: lmdb.Transaction, tables: Tables, meta: CollectionMeta, seq: int) -> bool:
    """Whether rows of generations with seq below ``seq`` remain (GC has work)."""
    cursor = txn.cursor(db=tables.lineage)
    if not cursor.set_range(meta.cid_prefix):
        return False
    key: bytes = cursor.key()
    return key.startswith(meta.cid_prefix) and key < layout.lineage_prefix(meta.cid_prefix, seq)
