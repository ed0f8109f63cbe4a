"""A whole-store summary in one read snapshot: collections, their readers and how far behind each reader is.

Used by the operator console (one call draws the first page, whatever the number of collections) and by the
metrics (reader lag, store size). A reader's *lag* is the number of committed generations of its target
after the reader's generation, up to the target's current one: generation ids are opaque bytes, so the
distance is counted, not computed (the empty generation a collection starts at never counts). Lag is None
when the target is not a collection of this store (an ``hstream://`` position reader, say).

A reader that is behind also has ``unread_since_ms``: when the oldest generation of its target that it has
not read was committed (its ``commits`` row, SPEC §8), from which the metrics tell how long ago that was.
None when the reader is caught up, or when that generation was committed before commit times existed.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import TYPE_CHECKING

import lmdb

from diffstore.engine import layout, space, storage
from diffstore.engine.meta import CollectionMeta
from diffstore.engine.readers import list_readers
from diffstore.engine.tables import Tables, load_meta, resolve_seq

if TYPE_CHECKING:
    from diffstore.engine.store import Store

LAG_COUNT_MAX = 1_000_000
"""Counting stops here: a reader this far behind shows this figure (the walk is one cursor step each)."""
_LAG_CACHE_MAX = 100_000


@dataclass(frozen=True, slots=True)
class ReaderOverview:
    name: str
    target: str
    generation_id: bytes | None
    lag: int | None
    target_is_collection: bool
    unread_since_ms: int | None = None  # commit time (Unix ms) of the oldest generation not read yet


@dataclass(frozen=True, slots=True)
class CollectionOverview:
    name: str
    manual: bool
    generation_id: bytes
    next_generation_id: bytes | None
    readers: tuple[ReaderOverview, ...]


def _metas(txn: lmdb.Transaction, tables: Tables) -> dict[str, CollectionMeta]:
    found: dict[str, CollectionMeta] = {}
    for raw_name, raw in txn.cursor(db=tables.collections):
        if not layout.is_collection_row(raw_name):  # the store's own rows
            continue
        name = raw_name.decode()
        found[name] = CollectionMeta.unpack(name, raw)
    return found


def _counts_above(
    txn: lmdb.Transaction, tables: Tables, meta: CollectionMeta, stops: set[int]
) -> dict[int, int]:
    """For each seq of ``stops`` (below the current one), how many committed generations of ``meta`` have a
    seq in (stop, current], from ONE walk down from the current generation to the lowest stop: the work is
    the largest distance, not the sum (at most :data:`LAG_COUNT_MAX` steps; stops below show that figure).
    """
    counts: dict[int, int] = {}
    pending = sorted(stops, reverse=True)
    prefix = meta.cid_prefix
    cursor = txn.cursor(db=tables.gens)
    if cursor.set_range(layout.gen_key(prefix, meta.generation_seq + 1)):
        found = cursor.prev()
    else:
        found = cursor.last()
    count = 0
    while pending and found and count < LAG_COUNT_MAX:
        key = cursor.key()
        if not key.startswith(prefix) or len(key) != len(prefix) + 8:
            break
        seq = layout.read_u64(key[len(prefix) :])
        while pending and pending[0] >= seq:
            counts[pending.pop(0)] = count
        if not pending or seq == 0:  # the collection's first generation never counts
            break
        count += 1
        found = cursor.prev()
    for stop in pending:
        counts[stop] = count if count < LAG_COUNT_MAX else LAG_COUNT_MAX
    return counts


def _lags(
    txn: lmdb.Transaction, tables: Tables, target: CollectionMeta, positions: set[int]
) -> dict[int, int]:
    """The lag of a reader of ``target`` standing at each seq of ``positions``.

    A position counted before is counted again only over the generations committed since (``lag_cache``);
    the others share one walk (:func:`_counts_above`).
    """
    current = target.generation_seq
    lags: dict[int, int] = {}
    since: dict[int, tuple[int, int]] = {}  # position -> (counted up to, count) of an earlier overview
    stops: set[int] = set()
    for position in positions:
        if position >= current:
            lags[position] = 0
            continue
        counted = tables.lag_cache.get((target.cid, position))
        if counted is not None and counted[0] <= current:
            since[position] = counted
            stops.add(counted[0])
        else:
            stops.add(position)
    above = _counts_above(txn, tables, target, stops) if stops else {}
    if len(tables.lag_cache) >= _LAG_CACHE_MAX:
        tables.lag_cache.clear()  # readers that moved on leave entries behind: start afresh, rarely
    for position in positions - lags.keys():
        counted = since.get(position)
        count = above[position] if counted is None else counted[1] + above[counted[0]]
        if count >= LAG_COUNT_MAX:
            lags[position] = LAG_COUNT_MAX  # not kept: the count stopped short of the current generation
            continue
        lags[position] = count
        tables.lag_cache[(target.cid, position)] = (current, count)
    return lags


def _unread_since(txn: lmdb.Transaction, tables: Tables, target: CollectionMeta, position: int) -> int | None:
    """The commit time of the first committed generation of ``target`` after seq ``position`` (None: none
    is, or it has no commit row). Generations above ``position`` up to the current one are committed ones
    (an aborted generation is unregistered, the open one is above the current one). Once such a generation
    exists the answer never changes: it is kept in ``tables.unread_cache``."""
    cache = tables.unread_cache
    key = (target.cid, position)
    if key in cache:
        return cache[key]
    cursor = txn.cursor(db=tables.gens)
    prefix = target.cid_prefix
    if not cursor.set_range(layout.gen_key(prefix, position + 1)):
        return None
    found = cursor.key()
    if not found.startswith(prefix) or len(found) != len(prefix) + 8:
        return None
    seq = layout.read_u64(found[len(prefix) :])
    if seq > target.generation_seq:
        return None  # none committed after it yet: nothing to keep
    raw = txn.get(layout.commit_key(prefix, seq), db=tables.commits)
    if len(cache) >= _LAG_CACHE_MAX:
        cache.clear()  # readers that moved on leave entries behind: start afresh, rarely
    cache[key] = None if raw is None else layout.unpack_commit(raw)[0]
    return cache[key]


def overview(store: Store) -> list[CollectionOverview]:
    """Every collection (sorted by name) with its generations and readers, from one snapshot.

    Cheap when scraped often: a snapshot with nothing written since the last call answers the same list;
    otherwise the readers of one target share one walk over its generations (the work is its largest lag,
    not the sum), and a reader counted before is counted only over the generations committed since.
    """
    tables = store.tables
    with store.read() as txn:
        snapshot = txn.id()
        cached = tables.overview_cache.get(snapshot)
        if cached is not None:
            return list(cached)
        metas = _metas(txn, tables)
        names = sorted(metas, key=str.encode)
        listed = {name: list_readers(txn, tables, metas[name]) for name in names}
        positions: dict[str, set[int]] = {}
        position_of: dict[tuple[str, str], int] = {}
        for name in names:
            for reader in listed[name]:
                target = metas.get(reader.collection)
                if target is None:
                    continue
                # null and "" are one stored value (SPEC §7): both stand before the first generation
                seq = max(resolve_seq(txn, tables, target, reader.generation_id or b""), 0)
                position_of[(name, reader.name)] = seq
                positions.setdefault(target.name, set()).add(seq)
        lags = {target: _lags(txn, tables, metas[target], seqs) for target, seqs in positions.items()}
        since = {
            (target, seq): _unread_since(txn, tables, metas[target], seq)
            for target, seqs in positions.items()
            for seq in seqs
            if lags[target][seq] > 0
        }
        states: list[CollectionOverview] = []
        for name in names:
            meta = metas[name]
            readers: list[ReaderOverview] = []
            for reader in listed[name]:
                at = position_of.get((name, reader.name))
                lag = None if at is None else lags[reader.collection][at]
                unread = None if at is None else since.get((reader.collection, at))
                readers.append(
                    ReaderOverview(
                        reader.name, reader.collection, reader.generation_id, lag, at is not None, unread
                    )
                )
            states.append(CollectionOverview(name, meta.manual, meta.generation, meta.next, tuple(readers)))
    tables.overview_cache.clear()  # the latest snapshot's only
    tables.overview_cache[snapshot] = tuple(states)
    return states


def recent_generations(store: Store, name: str, limit: int) -> list[bytes]:
    """Up to ``limit`` committed generation ids of a collection, newest first."""
    tables = store.tables
    found: list[bytes] = []
    with store.read() as txn:
        meta = load_meta(txn, tables, name)
        prefix = meta.cid_prefix
        cursor = txn.cursor(db=tables.gens)
        if not cursor.set_range(layout.gen_key(prefix, meta.generation_seq + 1)):
            if not cursor.last():
                return found
        elif not cursor.prev():
            return found
        while len(found) < limit and cursor.key().startswith(prefix):
            found.append(bytes(cursor.value()))
            if not cursor.prev():
                break
    return found


def size_bytes(store: Store) -> int:
    """Bytes of the store's data file in use (pages up to the highest one ever used)."""
    info = store.env.info()
    return int((info["last_pgno"] + 1) * store.env.stat()["psize"])


def space_of(store: Store) -> space.Space:
    """The data file's size, its pages in use and its free pages (what ``diffstore compact`` gives back)."""
    tables = [getattr(store.tables, name.decode()) for name in layout.TABLES]
    try:
        return space.measure(store.env, tables, store.path)
    except lmdb.Error as exc:
        raise storage.storage_error(
            exc, store.path, store.config.map_size, writing=False, doing="reading the store's size failed"
        ) from exc


def map_size_bytes(store: Store) -> int:
    """The upper bound of the store's data file (``StoreConfig.map_size``): writes past it fail."""
    return int(store.env.info()["map_size"])


def version(store: Store) -> str:
    """A digest of every collection's row and every reader: it changes when anything :func:`overview` shows
    changes (commits, writes into an open generation, readers created, moved or deleted, collections)."""
    digest = hashlib.blake2b(digest_size=12)
    with store.read() as txn:
        for db in (store.tables.collections, store.tables.readers):
            for key, value in txn.cursor(db=db):
                digest.update(len(key).to_bytes(4, "big") + key + len(value).to_bytes(4, "big") + value)
    return digest.hexdigest()
