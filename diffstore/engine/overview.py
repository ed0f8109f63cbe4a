"""A whole-store summary in one read snapshot: collections, their readers and how far behind each reader is.

Used by the operator console (one call draws the first page, whatever the number of collections) and by the
metrics (reader lag, store size). A reader's *lag* is the number of committed generations of its target
after the reader's generation, up to the target's current one: generation ids are opaque bytes, so the
distance is counted, not computed (the empty generation a collection starts at never counts). Lag is None
when the target is not a collection of this store (an ``hstream://`` position reader, say).
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
        if raw_name.startswith(b"\x00"):  # the store's own rows (the next collection id)
            continue
        name = raw_name.decode()
        found[name] = CollectionMeta.unpack(name, raw)
    return found


def committed_between(txn: lmdb.Transaction, tables: Tables, meta: CollectionMeta, after_seq: int) -> int:
    """How many committed generations of ``meta`` have a seq in (after_seq, current] (aborts leave gaps).

    The collection's first generation (seq 0, made when it was created) holds nothing and never counts.
    """
    after_seq = max(after_seq, 0)
    if after_seq >= meta.generation_seq:
        return 0
    prefix = meta.cid_prefix
    cursor = txn.cursor(db=tables.gens)
    count = 0
    if cursor.set_range(layout.gen_key(prefix, after_seq + 1)):
        last = layout.gen_key(prefix, meta.generation_seq)
        for key in cursor.iternext(values=False):
            if key > last or count >= LAG_COUNT_MAX:
                break
            count += 1
    return count


def _reader_lag(
    txn: lmdb.Transaction, tables: Tables, target: CollectionMeta, generation_id: bytes | None
) -> int:
    # null and "" are one stored value (SPEC §7): both stand before the first generation with data
    after = max(resolve_seq(txn, tables, target, generation_id or b""), 0)
    current = target.generation_seq
    if after >= current:
        return 0
    key = (target.cid, after)
    counted = tables.lag_cache.get(key)
    if counted is not None and counted[0] <= current:  # only the generations committed since
        up_to, count = counted
        count += committed_between(txn, tables, target, up_to) if up_to < current else 0
    else:
        count = committed_between(txn, tables, target, after)
    if count >= LAG_COUNT_MAX:
        return LAG_COUNT_MAX  # not kept: the count stopped short of the current generation
    if len(tables.lag_cache) >= _LAG_CACHE_MAX:
        tables.lag_cache.clear()  # readers that moved on leave entries behind: start afresh, rarely
    tables.lag_cache[key] = (current, count)
    return count


def overview(store: Store) -> list[CollectionOverview]:
    """Every collection (sorted by name) with its generations and readers, from one snapshot.

    Cheap when scraped often: a snapshot with nothing written since the last call answers the same list,
    and a reader's lag is counted over the generations committed since it was last counted.
    """
    tables = store.tables
    states: list[CollectionOverview] = []
    with store.read() as txn:
        snapshot = txn.id()
        cached = tables.overview_cache.get(snapshot)
        if cached is not None:
            return list(cached)
        metas = _metas(txn, tables)
        for name in sorted(metas, key=str.encode):
            meta = metas[name]
            readers: list[ReaderOverview] = []
            for reader in list_readers(txn, tables, meta):
                target = metas.get(reader.collection)
                lag = None if target is None else _reader_lag(txn, tables, target, reader.generation_id)
                readers.append(
                    ReaderOverview(
                        reader.name, reader.collection, reader.generation_id, lag, target is not None
                    )
                )
            states.append(
                CollectionOverview(
                    name,
                    meta.manual,
                    meta.generation,
                    meta.next,
                    tuple(readers),
                )
            )
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


def version(store: Store) -> str:
    """A digest of every collection's row and every reader: it changes when anything :func:`overview` shows
    changes (commits, writes into an open generation, readers created, moved or deleted, collections)."""
    digest = hashlib.blake2b(digest_size=12)
    with store.read() as txn:
        for db in (store.tables.collections, store.tables.readers):
            for key, value in txn.cursor(db=db):
                digest.update(len(key).to_bytes(4, "big") + key + len(value).to_bytes(4, "big") + value)
    return digest.hexdigest()
