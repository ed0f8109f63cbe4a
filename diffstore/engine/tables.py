"""Shared access to the LMDB tables inside one transaction: metadata rows and generation lookups."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeAlias

import lmdb

from diffstore.engine import layout
from diffstore.engine.meta import CollectionMeta, non_manual_generation
from diffstore.engine.types import RetentionPolicy, wall_clock_ms
from diffstore.errors import (
    CollectionExists,
    GenerationCollected,
    InvalidRequest,
    NoSuchCollection,
    NoSuchGeneration,
    text_form,
)

MAX_GENERATION_ID = 255
MAX_NAME_BYTES = 255
_META_CACHE_SIZE = 4096

Table: TypeAlias = lmdb._Database
"""A handle of one named sub-database: py-lmdb gives the type no public name, so only this module uses
the private one."""


@dataclass(frozen=True, slots=True)
class Tables:
    """Handles of the named sub-databases of one environment (see ``layout.TABLES``)."""

    collections: Table
    gens: Table
    gen_ids: Table
    records: Table
    changes: Table
    phantoms: Table
    phantom_ttl: Table
    readers: Table
    targets: Table
    producers: Table
    leases: Table
    dropped: Table
    due: Table
    lineage: Table
    cursors: Table
    replica: Table
    commits: Table
    change_chunks: Table
    digests: Table
    # The engine's only in-memory caches. Each is keyed by what it was computed from, as read from LMDB in
    # the transaction that uses it, so a hit is right whichever process changed the store meanwhile
    # (see docs/process-model.md):
    # (name, stored row) -> its CollectionMeta: rows are immutable values, so a hit is always right, and
    # every operation loads its collection's row first (unpacking it is most of a point read's cost)
    meta_cache: dict[tuple[str, bytes], CollectionMeta] = field(default_factory=dict, compare=False)
    # (cid, seq, count) -> split keys of a committed generation, (cid, from seq, to seq, count) -> those of
    # the keys changed between two: what they show never changes (cids and seqs are never reused, GC keeps
    # what generations at or above its horizon show), and a split pass reads every key it cuts (parallel
    # readers ask for the same cuts again and again)
    splits_cache: dict[tuple[int, ...], list[bytes]] = field(default_factory=dict, compare=False)
    # (cid, after seq) -> (up to seq, n): n committed generations of cid have a seq in (after, up to]. Those
    # rows never change while a reader stands at ``after`` (GC keeps every generation above the lowest
    # reader), so a reader's lag is counted once and then only over the generations committed since
    # (engine/overview.py: scrapes of /metrics and /overview)
    lag_cache: dict[tuple[int, int], tuple[int, int]] = field(default_factory=dict, compare=False)
    # (cid, after seq) -> commit time (None: unknown) of the first committed generation of cid after that
    # seq: asked only once one exists, and then it is fixed (seqs are never reused, commit rows never
    # rewritten), so a reader's lag in seconds costs one look-up per position it stands at
    unread_cache: dict[tuple[int, int], int | None] = field(default_factory=dict, compare=False)
    # LMDB's transaction id of a snapshot -> the overview read from it: nothing written, nothing to recount
    overview_cache: dict[int, Any] = field(default_factory=dict, compare=False)

    # (kind, cid, current seq, GC horizon, policy field) -> what retention.floor found: the oldest
    # generation a policy keeps, and the range of cutoffs (time windows) it holds for. Generations at or
    # below the current one and their commit rows never change (GC keeps both), so a hit is right in any
    # process; every read asks (readers.readable_floor), and the answer walks the kept generations
    retention_cache: dict[tuple[Any, ...], tuple[bytes, int, int]] = field(
        default_factory=dict, compare=False
    )
    # the store's clock (``StoreConfig.now_ms``): what a retention window is measured against, by the
    # reads and the GC alike, so both see the same generations kept
    clock_ms: Callable[[], int] = field(default=wall_clock_ms, compare=False)

    @classmethod
    def open(cls, env: lmdb.Environment, clock_ms: Callable[[], int] = wall_clock_ms) -> Tables:
        handles = {name.decode(): env.open_db(name, create=True) for name in layout.TABLES}
        return cls(**handles, clock_ms=clock_ms)


def validate_collection_name(name: str) -> None:
    raw = name.encode("utf-8", "surrogatepass") if isinstance(name, str) else b""
    if not isinstance(name, str) or not 1 <= len(raw) <= MAX_NAME_BYTES:
        raise InvalidRequest("collection name must be 1..255 bytes of UTF-8")
    if "/" in name or any(ord(ch) < 0x20 or 0x7F <= ord(ch) <= 0x9F for ch in name):
        raise InvalidRequest("collection name must not contain '/', NUL or control characters (C0, C1)")
    if name in (".", ".."):  # clients remove dot segments from URLs: such a collection could not be named
        raise InvalidRequest("collection name must not be '.' or '..'")
    try:
        name.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise InvalidRequest("collection name must be valid UTF-8") from exc


def validate_generation_id(generation_id: bytes, what: str = "generation id") -> None:
    if not isinstance(generation_id, bytes | bytearray) or len(generation_id) > MAX_GENERATION_ID:
        raise InvalidRequest(f"{what} must be 0..255 bytes")


def load_meta(txn: lmdb.Transaction, tables: Tables, name: str) -> CollectionMeta:
    raw = txn.get(name.encode(), db=tables.collections)
    if raw is None:
        raise NoSuchCollection(f"no collection named {name!r}")
    cache = tables.meta_cache
    meta = cache.get((name, raw))
    if meta is None:
        if len(cache) >= _META_CACHE_SIZE:
            cache.clear()
        meta = cache[(name, raw)] = CollectionMeta.unpack(name, raw)
    return meta


def save_meta(txn: lmdb.Transaction, tables: Tables, meta: CollectionMeta) -> None:
    txn.put(meta.name.encode(), meta.pack(), db=tables.collections)


def register_generation(
    txn: lmdb.Transaction, tables: Tables, meta: CollectionMeta, gen: bytes, seq: int
) -> None:
    prefix = meta.cid_prefix
    txn.put(layout.gen_key(prefix, seq), gen, db=tables.gens)
    txn.put(layout.gen_id_key(prefix, gen), layout.u64(seq), db=tables.gen_ids)


def unregister_generation(
    txn: lmdb.Transaction, tables: Tables, meta: CollectionMeta, gen: bytes, seq: int
) -> None:
    prefix = meta.cid_prefix
    txn.delete(layout.gen_key(prefix, seq), db=tables.gens)
    txn.delete(layout.gen_id_key(prefix, gen), db=tables.gen_ids)


def resolve_seq(txn: lmdb.Transaction, tables: Tables, meta: CollectionMeta, generation_id: bytes) -> int:
    """The highest seq visible to a read at ``generation_id`` (-1: nothing is visible).

    The open generation is visible only to a read that names it exactly.
    """
    if meta.next is not None and generation_id == meta.next:
        assert meta.next_seq is not None
        return meta.next_seq
    if generation_id >= meta.generation:
        return meta.generation_seq
    prefix = meta.cid_prefix
    cursor = txn.cursor(db=tables.gen_ids)
    target = layout.gen_id_key(prefix, generation_id)
    if cursor.set_range(target):
        if cursor.key() == target:
            return layout.read_u64(cursor.value())
        found = cursor.prev()
    else:
        found = cursor.last()
    while found and cursor.key().startswith(prefix):
        seq = layout.read_u64(cursor.value())
        if seq <= meta.generation_seq:
            return seq
        found = cursor.prev()
    return -1


def generation_of_seq(txn: lmdb.Transaction, tables: Tables, meta: CollectionMeta, seq: int) -> bytes:
    raw = txn.get(layout.gen_key(meta.cid_prefix, seq), db=tables.gens)
    if raw is None:
        raise InvalidRequest(f"generation #{seq} is unknown")
    return bytes(raw)


def require_known(meta: CollectionMeta, generation_id: bytes) -> None:
    """Refuses a read above the current generation that is not the open one (SPEC §8): it used to read the
    current data, so a mistyped or future id answered as if it were there. A phantom read is exempt (a
    phantom write may name any generation, future ones included, and reads it back there)."""
    if generation_id > meta.generation and generation_id != meta.next:
        raise NoSuchGeneration(
            f"generation {text_form(generation_id)} of {meta.name!r} is above the current generation "
            f"{text_form(meta.generation)} and is not the open one"
        )


def check_not_collected(
    meta: CollectionMeta, generation_id: bytes, floor: bytes | None, *, allow_beginning: bool = False
) -> None:
    """Refuses work below ``floor`` (see ``readers.readable_floor``): GC may already have removed it.

    ``allow_beginning`` lets a diff start at ``""``, which holds no records and so loses nothing to GC.
    """
    if floor is None or generation_id >= floor:
        return
    if allow_beginning and generation_id == b"":
        return
    raise GenerationCollected(
        f"generation {text_form(generation_id)} of {meta.name!r} is below the readers' minimum "
        f"{text_form(floor)}"
    )


def create_meta(
    txn: lmdb.Transaction,
    tables: Tables,
    name: str,
    manual: bool,
    initial_generation_id: bytes | None,
    retention: RetentionPolicy | None = None,
) -> CollectionMeta:
    """Creates a collection's row (with a new cid) and registers its first generation(s); see
    ``Store.create_collection``. Raises :class:`CollectionExists`."""
    kept = None if retention is None or retention.empty else retention
    if txn.get(name.encode(), db=tables.collections) is not None:
        raise CollectionExists(f"collection {name!r} exists")
    raw_cid = txn.get(layout.NEXT_CID, db=tables.collections)
    cid = layout.read_u64(raw_cid) if raw_cid else 1
    txn.put(layout.NEXT_CID, layout.u64(cid + 1), db=tables.collections)
    if manual:
        gen = bytes(initial_generation_id or b"")
        meta = CollectionMeta(name, cid, True, gen, 0, None, None, 0, retention=kept)
        register_generation(txn, tables, meta, gen, 0)
    else:
        meta = CollectionMeta(
            name, cid, False, non_manual_generation(0), 0, non_manual_generation(1), 1, 1, retention=kept
        )
        register_generation(txn, tables, meta, meta.generation, 0)
        register_generation(txn, tables, meta, non_manual_generation(1), 1)
    # the first generation holds nothing: its digest (engine/digests.py) is that of no record
    txn.put(layout.digest_key(meta.cid_prefix, 0), layout.pack_digest(0, 0), db=tables.digests)
    txn.put(layout.digest_start_key(meta.cid_prefix), layout.u64(0), db=tables.digests)
    save_meta(txn, tables, meta)
    return meta
