"""Readers: named positions stored in an owner collection, each pointing at a target.

A target is a collection name or anything else (``hstream://stream``); the ``targets`` reverse index
lets GC compute a collection's minimum and lets collection deletion find the readers that target it.
Reader updates may carry a compare-and-set expectation (``badVersion`` on mismatch).

A reader's generation ``""`` and null are one value (SPEC §7, as in diffbelt: both mean "from the very
beginning"): it is stored, listed and compared as null, so re-creating a reader with the other form is
"same data" and a CAS expecting either matches.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import NamedTuple

import lmdb
import msgpack

from diffstore.engine import layout, retention
from diffstore.engine.meta import CollectionMeta
from diffstore.engine.tables import (
    MAX_NAME_BYTES,
    Tables,
    check_not_collected,
    require_known,
    validate_generation_id,
)
from diffstore.engine.types import UNSET, Reader, ReaderUpdate
from diffstore.errors import (
    BadVersion,
    InvalidRequest,
    NoSuchCollection,
    NoSuchReader,
    ReaderExists,
    text_form,
)

MAX_READER_NAME = 255


class TargetingReader(NamedTuple):
    """A row of the ``targets`` reverse index: a reader (or hold) of ``owner_cid``'s collection."""

    owner_cid: int
    name: str
    generation_id: bytes | None


def normalize_generation(generation_id: bytes | None) -> bytes | None:
    """A reader's generation as stored: ``""`` is null (see the module)."""
    return None if generation_id is None or generation_id == b"" else generation_id


def validate_reader_name(name: str) -> None:
    if not isinstance(name, str) or not 1 <= len(name.encode()) <= MAX_READER_NAME:
        raise InvalidRequest("reader name must be 1..255 bytes of UTF-8")


def validate_target(target: str) -> None:
    if not isinstance(target, str) or not 1 <= len(target.encode()) <= 1024 or "\x00" in target:
        raise InvalidRequest("reader target must be 1..1024 bytes of UTF-8 without NUL")


def load_reader(txn: lmdb.Transaction, tables: Tables, owner: CollectionMeta, name: str) -> Reader | None:
    raw = txn.get(layout.reader_key(owner.cid_prefix, name), db=tables.readers)
    if raw is None:
        return None
    target, generation_id = msgpack.unpackb(raw, raw=False)
    return Reader(name, target, normalize_generation(generation_id))


def _store_reader(txn: lmdb.Transaction, tables: Tables, owner: CollectionMeta, reader: Reader) -> None:
    txn.put(
        layout.reader_key(owner.cid_prefix, reader.name),
        msgpack.packb([reader.collection, reader.generation_id], use_bin_type=True),
        db=tables.readers,
    )
    txn.put(
        layout.target_key(reader.collection, owner.cid_prefix, reader.name),
        msgpack.packb([reader.name, reader.generation_id], use_bin_type=True),
        db=tables.targets,
    )


def is_stream_target(target: str) -> bool:
    """Whether ``target`` names something other than a collection: a URL such as ``hstream://s`` (a
    collection name may hold no ``/``)."""
    return "://" in target


def _check_target_horizon(
    txn: lmdb.Transaction,
    tables: Tables,
    target: str,
    generation_id: bytes | None,
    name: str = "",
    *,
    known: bool = False,
) -> None:
    """A reader may not move below what the target's GC may already have removed; a hold (a replica's
    position) may stay anywhere GC kept, even below where readers read: it is not a reader of the data.
    With ``known`` (a new reader) it may not stand above the target's current generation unless it is the
    open one (``noSuchGeneration``, as a read there). A stream target is not checked."""
    if generation_id is None or generation_id == b"":
        return
    encoded = target.encode()
    raw = txn.get(encoded, db=tables.collections) if len(encoded) <= MAX_NAME_BYTES else None
    if raw is not None:
        meta = CollectionMeta.unpack(target, raw)
        if known:
            require_known(meta, generation_id)
        floor = kept_floor(txn, tables, meta) if is_hold(name) else readable_floor(txn, tables, meta)
        check_not_collected(meta, generation_id, floor)


def _require_target(txn: lmdb.Transaction, tables: Tables, target: str) -> None:
    """A new reader's target is a collection that exists, or a stream (``scheme://...``): a mistyped
    collection name would hold no data back and be reported broken by ``check``."""
    if is_stream_target(target):
        return
    encoded = target.encode()
    if len(encoded) > MAX_NAME_BYTES or txn.get(encoded, db=tables.collections) is None:
        raise NoSuchCollection(
            f"reader target {target!r} is no collection (a stream target is a URL such as hstream://NAME)"
        )


def list_readers(txn: lmdb.Transaction, tables: Tables, owner: CollectionMeta) -> list[Reader]:
    prefix = owner.cid_prefix
    found: list[Reader] = []
    cursor = txn.cursor(db=tables.readers)
    if cursor.set_range(prefix):
        for key, raw in cursor:
            if not key.startswith(prefix):
                break
            target, generation_id = msgpack.unpackb(raw, raw=False)
            found.append(Reader(layout.after_cid(key).decode(), target, normalize_generation(generation_id)))
    return found


def create_reader(
    txn: lmdb.Transaction,
    tables: Tables,
    owner: CollectionMeta,
    name: str,
    target: str,
    generation_id: bytes | None,
) -> None:
    validate_reader_name(name)
    validate_target(target)
    if generation_id is not None:
        validate_generation_id(generation_id)
    wanted = Reader(name, target, normalize_generation(generation_id))
    existing = load_reader(txn, tables, owner, name)
    if existing is not None:
        if existing != wanted:
            raise ReaderExists(f"reader {name!r} exists with other data")
        return
    _require_target(txn, tables, target)
    _check_target_horizon(txn, tables, target, generation_id, name, known=True)
    _store_reader(txn, tables, owner, wanted)


def apply_updates(
    txn: lmdb.Transaction, tables: Tables, owner: CollectionMeta, updates: Iterable[ReaderUpdate]
) -> list[tuple[Reader, Reader]]:
    """Validates then applies every update; any bad one raises before anything is written.

    Returns:
        Each updated reader as it was before and after, by first appearance (a commit records these
        as its lineage).
    """
    staged: dict[str, Reader] = {}
    before: dict[str, Reader] = {}
    for update in updates:
        validate_reader_name(update.name)
        if update.generation_id is not None:
            validate_generation_id(update.generation_id)
        current = staged.get(update.name) or load_reader(txn, tables, owner, update.name)
        if current is None:
            raise NoSuchReader(f"collection {owner.name!r} has no reader {update.name!r}")
        before.setdefault(update.name, current)
        expected = update.expected
        if expected is not UNSET and normalize_generation(current.generation_id) != normalize_generation(
            expected
        ):
            raise BadVersion(
                f"reader {update.name!r} is at {_position(current.generation_id)}, expected "
                f"{_position(normalize_generation(expected))}"
            )
        _check_target_horizon(txn, tables, current.collection, update.generation_id, update.name)
        staged[update.name] = Reader(
            update.name, current.collection, normalize_generation(update.generation_id)
        )
    for reader in staged.values():
        _store_reader(txn, tables, owner, reader)
    return [(before[name], reader) for name, reader in staged.items()]


def _position(generation_id: bytes | None) -> str:
    """A reader's position in a message: its generation's text form, or "the beginning" for null."""
    return "the beginning (null)" if generation_id is None else text_form(generation_id)


def delete_reader(txn: lmdb.Transaction, tables: Tables, owner: CollectionMeta, name: str) -> None:
    existing = load_reader(txn, tables, owner, name)
    if existing is None:
        return
    txn.delete(layout.reader_key(owner.cid_prefix, name), db=tables.readers)
    txn.delete(layout.target_key(existing.collection, owner.cid_prefix, name), db=tables.targets)


def readable_floor(
    txn: lmdb.Transaction, tables: Tables, meta: CollectionMeta, now_ms: int | None = None
) -> bytes | None:
    """The lowest generation of ``meta`` that reads, diffs and reader updates may still name (None: any).

    It is the readers' minimum (capped at the current generation, so the current one stays readable, and
    lowered to what the retention policy keeps at ``now_ms``, default the store's clock), or the GC horizon
    where that is higher: the minimum may drop again (a new null reader), but what GC removed stays
    removed. Answering from the minimum, not from how far GC has got, makes the answer independent of
    background timing (SPEC §1: "below the minimum answers 410").
    """
    floor = meta.gc_horizon
    minimum = _retained(minimum_generation(txn, tables, meta.name), txn, tables, meta, now_ms)
    if minimum:
        live = min(minimum, meta.generation)
        if floor is None or live > floor:
            floor = live
    return floor


HOLD_PREFIX = "diffstore-replica:"
"""Readers named so are *holds*: a read replica's position on its primary (see ``replication``). A hold
keeps the GC from collecting what its replica has not copied, but it is not a reader of the data: it
neither raises the readable floor nor turns GC on for a collection that no other reader targets, so a
primary answers every read the same with or without replicas."""


def is_hold(name: str) -> bool:
    return name.startswith(HOLD_PREFIX)


def readers_targeting(txn: lmdb.Transaction, tables: Tables, target: str) -> list[TargetingReader]:
    """Every reader (and hold) of any owner that targets ``target``, from the ``targets`` reverse index."""
    prefix = layout.target_prefix(target)
    found: list[TargetingReader] = []
    cursor = txn.cursor(db=tables.targets)
    if cursor.set_range(prefix):
        for key, raw in cursor:
            if not key.startswith(prefix):
                break
            name, generation_id = msgpack.unpackb(raw, raw=False)
            owner_cid = layout.owner_of_target_key(key)
            found.append(TargetingReader(owner_cid, name, normalize_generation(generation_id)))
    return found


def drop_readers_of(txn: lmdb.Transaction, tables: Tables, meta: CollectionMeta) -> None:
    """Deletes the readers ``meta``'s collection owns and every reader that targets it (the collection is
    being deleted: a reader of a deleted collection would hold nothing and name nothing)."""
    for reader in list_readers(txn, tables, meta):
        delete_reader(txn, tables, meta, reader.name)
    for targeting in readers_targeting(txn, tables, meta.name):
        owner_prefix = layout.cid_bytes(targeting.owner_cid)
        txn.delete(layout.reader_key(owner_prefix, targeting.name), db=tables.readers)
        txn.delete(layout.target_key(meta.name, owner_prefix, targeting.name), db=tables.targets)


def _minimums(txn: lmdb.Transaction, tables: Tables, target: str) -> tuple[bytes | None, bytes | None]:
    """(minimum over the readers, minimum over the holds) targeting ``target``; None: there is none."""
    readers_min: bytes | None = None
    holds_min: bytes | None = None
    for targeting in readers_targeting(txn, tables, target):
        generation_id = targeting.generation_id or b""  # null counts as the beginning
        if is_hold(targeting.name):
            if holds_min is None or generation_id < holds_min:
                holds_min = generation_id
        elif readers_min is None or generation_id < readers_min:
            readers_min = generation_id
    return readers_min, holds_min


def minimum_generation(txn: lmdb.Transaction, tables: Tables, target: str) -> bytes | None:
    """The minimum over every reader targeting ``target`` (None: no reader targets it; null counts as "");
    holds (``HOLD_PREFIX``) are not readers."""
    return _minimums(txn, tables, target)[0]


def gc_minimum(txn: lmdb.Transaction, tables: Tables, target: str) -> bytes | None:
    """What GC may collect below: the readers' minimum, lowered to the holds' (None: no reader, no GC)."""
    readers_min, holds_min = _minimums(txn, tables, target)
    if readers_min is None or holds_min is None:
        return readers_min
    return min(readers_min, holds_min)


def kept_floor(
    txn: lmdb.Transaction, tables: Tables, meta: CollectionMeta, now_ms: int | None = None
) -> bytes | None:
    """The lowest generation whose records GC keeps whole (None: any): ``readable_floor`` as the holds
    see it. What replicas copy (a generation's records) is answered down to here."""
    floor = meta.gc_horizon
    minimum = _retained(gc_minimum(txn, tables, meta.name), txn, tables, meta, now_ms)
    if minimum:
        live = min(minimum, meta.generation)
        if floor is None or live > floor:
            floor = live
    return floor


def _retained(
    minimum: bytes | None, txn: lmdb.Transaction, tables: Tables, meta: CollectionMeta, now_ms: int | None
) -> bytes | None:
    if minimum is None or meta.retention is None:
        return minimum
    return retention.lower(minimum, txn, tables, meta, tables.clock_ms() if now_ms is None else now_ms)


def put_copy(txn: lmdb.Transaction, tables: Tables, owner: CollectionMeta, reader: Reader) -> Reader:
    """Stores a primary's reader as it is, created when missing (a replica's copy; no horizon check: the
    primary made that check). Returns the reader as it was before (at null when it was missing)."""
    reader = Reader(reader.name, reader.collection, normalize_generation(reader.generation_id))
    existing = load_reader(txn, tables, owner, reader.name)
    if existing is not None and existing.collection != reader.collection:
        delete_reader(txn, tables, owner, reader.name)
    _store_reader(txn, tables, owner, reader)
    return existing if existing is not None else Reader(reader.name, reader.collection, None)
