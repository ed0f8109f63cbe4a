"""Replication, the engine's side: a primary's generation applied as it is, and the store's replica state.

A replica (``diffstore serve --replica-of``, see :mod:`diffstore.replica`) copies each generation of each
collection of its primary. The engine knows nothing of where they come from; it offers:

- :func:`apply`: one primary generation -- its id, the records it wrote, the readers its commit moved --
  applied in ONE write transaction. The replica's position is the collection's own current generation
  (the ids are the primary's), so the position moves in the same transaction as the data: an apply whose
  ``previous`` is not the current generation changes nothing (already applied, or refused).
- :func:`copy_readers`: the primary's readers and leases as they are, applied only while the replica is
  at the generation they were read at (readers also move outside commits, leases never commit).
- the ``replica`` table's state (primary, id, promotion, counters, lag), read and written here only.
- promotion raises the store's replication term (see :mod:`diffstore.engine.fencing`).

Invariants:
- Generation ids, and so the order of generations, are the primary's. An automatic collection keeps
  ``seq == int(generation id)`` (its ids are its seqs, ``meta.non_manual_generation``), so after a
  promotion its own next generations carry on from the primary's.
- Nothing is half-applied: each apply is one transaction; a promotion (:func:`promote`) is one too, and
  every apply checks in its own transaction that the store was not promoted.
"""

from __future__ import annotations

import itertools
from typing import Any

import lmdb
import msgpack

from diffstore.engine import changes, digests, fencing, history, layout, leases, lineage, readers, writes
from diffstore.engine.meta import CollectionMeta, non_manual_generation
from diffstore.engine.tables import (
    Tables,
    check_not_collected,
    create_meta,
    load_meta,
    register_generation,
    save_meta,
    validate_generation_id,
)
from diffstore.engine.types import (
    GenerationRecords,
    Lease,
    Reader,
    ReplicaGeneration,
    ReplicaLag,
    ReplicaState,
    RetentionPolicy,
)
from diffstore.errors import (
    BadVersion,
    InvalidRequest,
    NoSuchGeneration,
    NoSuchReader,
    NotReplica,
    text_form,
)

# an apply writes a whole primary generation into one generation, whatever its size
_NO_THRESHOLD = 1 << 62


# --- state ------------------------------------------------------------------------------------------------


def state(txn: lmdb.Transaction, tables: Tables) -> ReplicaState:
    """The store's replica state as stored."""
    primary = txn.get(layout.REPLICA_PRIMARY, db=tables.replica)
    if primary is None:
        return ReplicaState(
            term=fencing.term(txn, tables),
            fenced=fencing.fencing(txn, tables),
            step_downs=fencing.step_downs(txn, tables),
        )
    replica_id = txn.get(layout.REPLICA_ID, db=tables.replica)
    promoted = txn.get(layout.REPLICA_PROMOTED, db=tables.replica)
    applied = txn.get(layout.REPLICA_APPLIED, db=tables.replica)
    lags: list[ReplicaLag] = []
    cursor = txn.cursor(db=tables.replica)
    if cursor.set_range(layout.REPLICA_LAG):
        for key, raw in cursor:
            if not key.startswith(layout.REPLICA_LAG):
                break
            lags.append(ReplicaLag(layout.replica_lag_name(key), *_lag_row(raw)))
    return ReplicaState(
        primary=bytes(primary).decode(),
        replica_id=bytes(replica_id).decode() if replica_id else None,
        promoted_at_ms=layout.read_u64(promoted) if promoted else None,
        applied=layout.read_u64(applied) if applied else 0,
        lags=tuple(lags),
        term=fencing.term(txn, tables),
        fenced=fencing.fencing(txn, tables),
        address=_text(txn.get(layout.REPLICA_SELF, db=tables.replica)),
        step_downs=fencing.step_downs(txn, tables),
    )


def _text(raw: bytes | None) -> str | None:
    return bytes(raw).decode() if raw is not None else None


def is_following(txn: lmdb.Transaction, tables: Tables) -> bool:
    """Whether the store is a replica that refuses writes (two point reads)."""
    return (
        txn.get(layout.REPLICA_PRIMARY, db=tables.replica) is not None
        and txn.get(layout.REPLICA_PROMOTED, db=tables.replica) is None
    )


def become(txn: lmdb.Transaction, tables: Tables, primary: str, replica_id: str) -> ReplicaState:
    """Makes the store a replica of ``primary`` (or checks that it is one already).

    Raises:
        InvalidRequest: the store holds collections but is no replica, or follows another primary, or was
            promoted (a promoted replica is a primary for good).
    """
    current = state(txn, tables)
    if current.primary is None:
        cursor = txn.cursor(db=tables.collections)
        if any(layout.is_collection_row(key) for key in cursor.iternext(values=False)):
            raise InvalidRequest("the data directory holds collections of its own: a replica starts empty")
        txn.put(layout.REPLICA_PRIMARY, primary.encode(), db=tables.replica)
        txn.put(layout.REPLICA_ID, replica_id.encode(), db=tables.replica)
        return state(txn, tables)
    if current.promoted_at_ms is not None:
        raise InvalidRequest(
            f"this store was a replica of {current.primary} and was promoted: it is a primary"
        )
    if current.primary != primary:
        raise InvalidRequest(f"this store is a replica of {current.primary}, not of {primary}")
    return current


def promote(
    txn: lmdb.Transaction, tables: Tables, now_ms: int, new_term: int = 0, address: str | None = None
) -> int:
    """Stops following: from this transaction on the store is a primary (raises :class:`NotReplica`).

    Its term becomes ``new_term``, or one more than it was if that is higher; returns the term.
    ``address`` is the URL it was promoted under (told to the old primary when it steps down).
    """
    if not is_following(txn, tables):
        raise NotReplica("this server is not a replica")
    txn.put(layout.REPLICA_PROMOTED, layout.u64(now_ms), db=tables.replica)
    if address:
        txn.put(layout.REPLICA_SELF, address.encode(), db=tables.replica)
    raised = max(new_term, fencing.term(txn, tables) + 1)
    fencing.set_term(txn, tables, raised)
    txn.delete(layout.REPLICA_FENCED, db=tables.replica)
    cursor = txn.cursor(db=tables.replica)
    lag_keys: list[bytes] = []
    if cursor.set_range(layout.REPLICA_LAG):
        for key in cursor.iternext(values=False):
            if not key.startswith(layout.REPLICA_LAG):
                break
            lag_keys.append(bytes(key))
    for key in lag_keys:
        txn.delete(key, db=tables.replica)
    return raised


def require_following(txn: lmdb.Transaction, tables: Tables) -> None:
    if not is_following(txn, tables):
        raise NotReplica("this store is not a replica (or was promoted): nothing is applied")


def _lag_row(raw: bytes | None) -> list[Any]:
    """A lag row's fields: generations, unapplied since, state, reason, state since (a row of an older
    replica holds the first two only)."""
    if raw is None:
        return [0, None, "following", None, None]
    row = list(msgpack.unpackb(raw))
    return row + [0, None, "following", None, None][len(row) :]


def set_lag(txn: lmdb.Transaction, tables: Tables, name: str, generations: int, since_ms: int | None) -> None:
    """Stores how far a collection is behind (its follower's state, stored with it, is kept)."""
    require_following(txn, tables)
    key = layout.replica_lag_key(name)
    row = _lag_row(txn.get(key, db=tables.replica))
    txn.put(key, msgpack.packb([generations, since_ms, *row[2:]]), db=tables.replica)


def set_status(
    txn: lmdb.Transaction, tables: Tables, name: str, state: str, reason: str | None, since_ms: int
) -> None:
    """Stores what a collection's follower is doing (``copying``, ``following``, ``stalled``), keeping
    its lag figures."""
    require_following(txn, tables)
    key = layout.replica_lag_key(name)
    row = _lag_row(txn.get(key, db=tables.replica))
    txn.put(key, msgpack.packb([*row[:2], state, reason, since_ms]), db=tables.replica)


def forget(txn: lmdb.Transaction, tables: Tables, name: str) -> None:
    """Drops the lag row of a collection the replica no longer holds."""
    txn.delete(layout.replica_lag_key(name), db=tables.replica)


# --- applying ---------------------------------------------------------------------------------------------


def apply(txn: lmdb.Transaction, tables: Tables, step: ReplicaGeneration) -> CollectionMeta | None:
    """Applies one primary generation; returns the new meta, or None when it was applied before.

    Raises:
        NotReplica: the store is not (or no longer) a replica.
        BadVersion: the replica is neither at ``step.previous`` nor past ``step.generation_id`` (its
            follower must start the collection over); nothing changed.
    """
    require_following(txn, tables)
    validate_generation_id(step.generation_id)
    if step.previous is None:
        if txn.get(step.collection.encode(), db=tables.collections) is not None:
            return None
        meta = create_meta(
            txn, tables, step.collection, step.manual, step.generation_id if step.manual else None
        )
        if not step.manual and step.generation_id == meta.generation:
            # a new automatic collection: its generation 0 holds nothing, its next one is open
            _count_applied(txn, tables, step)
            return meta
        if step.manual:
            # the first copy lands in the initial generation: open it again to write there
            meta = meta.with_(next=meta.generation, next_seq=0)
        else:
            meta = move_open_generation(txn, tables, meta, step.generation_id)
    else:
        meta = load_meta(txn, tables, step.collection)
        if meta.generation != step.previous:
            if meta.generation >= step.generation_id:
                return None
            raise BadVersion(
                f"the replica of {step.collection!r} is at {text_form(meta.generation)},"
                f" not {text_form(step.previous)}"
            )
        if step.generation_id <= meta.generation:
            raise InvalidRequest("a replicated generation must be above the current one")
        if meta.next != step.generation_id:
            meta = move_open_generation(txn, tables, meta, step.generation_id)
    meta = write_records(txn, tables, meta, step.generation_id, step.records)
    return commit_applied(txn, tables, meta, step)


def write_records(
    txn: lmdb.Transaction,
    tables: Tables,
    meta: CollectionMeta,
    generation_id: bytes,
    records: list[tuple[bytes, bytes | None]],
) -> CollectionMeta:
    """Writes a primary generation's records into the open generation ``generation_id`` (uncommitted)."""
    meta, _, _ = writes.put_many(
        txn,
        tables,
        meta,
        records,
        generation_id=generation_id,
        phantom_id=None,
        if_not_present=False,
        skip_unchanged=False,
        producer_id=None,
        seq_no=None,
        max_generation_records=_NO_THRESHOLD,
    )
    return meta


def commit_applied(
    txn: lmdb.Transaction, tables: Tables, meta: CollectionMeta, step: ReplicaGeneration
) -> CollectionMeta:
    """Commits the open generation ``step.generation_id`` whose records were written (its reader moves,
    lineage, commit time and digest with it) and saves the collection's row; returns the new meta."""
    if step.previous is None:
        for reader in step.before:
            readers.put_copy(txn, tables, meta, reader)
    moves = [(readers.put_copy(txn, tables, meta, reader), reader) for reader in step.readers]
    lineage.record(txn, tables, meta, moves)
    assert meta.next_seq is not None
    if step.recorded:  # the primary's time and metadata; its changed keys: the records it sent (one a key)
        history.record(txn, tables, meta, meta.next_seq, step.committed_at_ms, step.metadata, meta.next_keys)
    digests.record_commit(txn, tables, meta, meta.next_seq)
    wrote = meta.next_count > 0  # a staged first copy wrote its records in earlier transactions
    meta = _commit(txn, tables, meta)
    if step.floor and step.previous is None and wrote:
        meta = meta.with_(gc_horizon=meta.generation)
    save_meta(txn, tables, meta)
    _count_applied(txn, tables, step)
    return meta


def _count_applied(txn: lmdb.Transaction, tables: Tables, step: ReplicaGeneration) -> None:
    applied = txn.get(layout.REPLICA_APPLIED, db=tables.replica)
    count = (layout.read_u64(applied) if applied else 0) + 1
    txn.put(layout.REPLICA_APPLIED, layout.u64(count), db=tables.replica)
    set_lag(txn, tables, step.collection, step.lag_generations, step.unapplied_since_ms)
    if step.following_since_ms is not None:
        set_status(txn, tables, step.collection, "following", None, step.following_since_ms)


def status(txn: lmdb.Transaction, tables: Tables, name: str) -> ReplicaLag | None:
    """One collection's lag row as stored (one point read), None when it has none."""
    raw = txn.get(layout.replica_lag_key(name), db=tables.replica)
    return None if raw is None else ReplicaLag(name, *_lag_row(raw))


def move_open_generation(
    txn: lmdb.Transaction, tables: Tables, meta: CollectionMeta, generation_id: bytes
) -> CollectionMeta:
    """Opens ``generation_id`` as the next generation, dropping an open one (an automatic collection always
    has one; its seq is its id's number, see the module)."""
    if meta.next is not None:
        meta = writes.drop_open_generation(txn, tables, meta)
    if meta.manual:
        seq = meta.last_seq + 1
    else:
        if len(generation_id) != 8:
            raise InvalidRequest("an automatic collection's generation ids are 8 bytes")
        seq = layout.read_u64(generation_id)
    meta = meta.with_(next=generation_id, next_seq=seq, last_seq=max(seq, meta.last_seq), next_count=0)
    register_generation(txn, tables, meta, generation_id, seq)
    return meta


def _commit(txn: lmdb.Transaction, tables: Tables, meta: CollectionMeta) -> CollectionMeta:
    assert meta.next is not None and meta.next_seq is not None
    if meta.manual:
        return meta.with_(
            generation=meta.next,
            generation_seq=meta.next_seq,
            next=None,
            next_seq=None,
            next_count=0,
            next_lease=None,
        )
    seq = meta.next_seq + 1
    meta = meta.with_(
        generation=meta.next,
        generation_seq=meta.next_seq,
        next=non_manual_generation(seq),
        next_seq=seq,
        last_seq=max(seq, meta.last_seq),
        next_count=0,
    )
    register_generation(txn, tables, meta, meta.next, seq)  # type: ignore[arg-type]
    return meta


def copy_readers(
    txn: lmdb.Transaction,
    tables: Tables,
    name: str,
    at_generation: bytes,
    copies: list[Reader],
    lease_copies: list[Lease],
    now_ms: int,
) -> bool:
    """Makes the collection's readers (all but the replica readers' own, see the follower) and leases
    those given, if the replica is still at ``at_generation`` (False: it moved on, nothing changed)."""
    require_following(txn, tables)
    meta = load_meta(txn, tables, name)
    if meta.generation != at_generation:
        return False
    wanted = {reader.name for reader in copies}
    for reader in readers.list_readers(txn, tables, meta):
        if reader.name not in wanted:
            readers.delete_reader(txn, tables, meta, reader.name)
    for reader in copies:
        readers.put_copy(txn, tables, meta, reader)
    leases.replicate(txn, tables, meta, lease_copies, now_ms)
    return True


def copy_retention(txn: lmdb.Transaction, tables: Tables, name: str, policy: RetentionPolicy | None) -> bool:
    """Makes the collection's retention policy the primary's (its GC then keeps what the primary keeps);
    False when it was that already."""
    require_following(txn, tables)
    meta = load_meta(txn, tables, name)
    stored = None if policy is None or policy.empty else policy
    if meta.retention == stored:
        return False
    save_meta(txn, tables, meta.with_(retention=stored))
    return True


def add_missing_readers(txn: lmdb.Transaction, tables: Tables, name: str, copies: list[Reader]) -> int:
    """Creates, at null, the readers of ``copies`` the collection lacks (their positions come with the
    commits that move them, or with :func:`copy_readers`); returns how many.

    A reader the primary created outside a commit must be there before the generations after it are
    applied: without it GC on the replica could collect what the primary keeps. At null it keeps
    everything (never more than the primary collects) until its position is copied.
    """
    require_following(txn, tables)
    meta = load_meta(txn, tables, name)
    added = 0
    for reader in copies:
        if readers.load_reader(txn, tables, meta, reader.name) is None:
            readers.put_copy(txn, tables, meta, Reader(reader.name, reader.collection, None))
            added += 1
    return added


# --- what a primary serves its replicas --------------------------------------------------------------------


def committed_generations(
    txn: lmdb.Transaction, tables: Tables, meta: CollectionMeta, before: bytes | None, limit: int
) -> tuple[list[bytes], bool]:
    """Up to ``limit`` committed generation ids below ``before`` (None: from the current one), newest first,
    and whether more remain. Collected generations are listed too (reads there answer 410)."""
    walk = history.newest_first(txn, tables, meta, before)
    found = [generation_id for _, generation_id in itertools.islice(walk, limit)]
    return found, next(walk, None) is not None


def generation_records(
    txn: lmdb.Transaction,
    tables: Tables,
    meta: CollectionMeta,
    generation_id: bytes,
    from_key: bytes | None,
    limit: int,
    hold: str | None = None,
) -> GenerationRecords:
    """A page of the records a committed generation wrote, in key-form order from ``from_key``, at most
    ``limit``; the first page also says what a replica needs besides (see :class:`GenerationRecords`), all
    read in this one transaction.

    Raises:
        NoSuchGeneration: ``generation_id`` is not a committed generation of the collection.
        GenerationCollected: it is below the kept floor (its records may be gone).
        NoSuchReader: ``hold`` is given and the collection has no such reader (a replica's hold: then this
            is not the collection it copied, but another one of the same name).
    """
    raw_seq = txn.get(layout.gen_id_key(meta.cid_prefix, generation_id), db=tables.gen_ids)
    if raw_seq is None or layout.read_u64(raw_seq) > meta.generation_seq:
        raise NoSuchGeneration(f"{text_form(generation_id)} is not a committed generation of {meta.name!r}")
    check_not_collected(meta, generation_id, readers.kept_floor(txn, tables, meta))
    if hold is not None and readers.load_reader(txn, tables, meta, hold) is None:
        raise NoSuchReader(f"collection {meta.name!r} has no reader {hold!r}")
    seq = layout.read_u64(raw_seq)
    lower = layout.key_form(from_key) if from_key is not None else b""
    found: list[tuple[bytes, bytes | None]] = []
    next_key: bytes | None = None
    for form in changes.forms(txn, tables, meta.cid_prefix, seq, lower):
        record_key = layout.record_key(meta.records_prefix, form, seq)
        raw = txn.get(record_key, db=tables.records)
        if raw is None:  # cannot happen above the floor; a row without its record is skipped
            continue
        raw = layout.unseal(record_key, raw)
        key = layout.key_of(form, raw)
        if len(found) == limit:
            next_key = key
            break
        found.append((key, layout.decode_value(raw)))
    if from_key is not None:
        return GenerationRecords(found, next_key)
    return GenerationRecords(
        found,
        next_key,
        previous=_previous_generation(txn, tables, meta, seq),
        moves=tuple(
            Reader(move.name, move.target, move.to_generation_id)
            for move in lineage.moves_of(txn, tables, meta, seq)
        ),
        readers=tuple(readers.list_readers(txn, tables, meta)),
        info=history.info(txn, tables, meta, seq, bytes(generation_id)),
    )


def _previous_generation(
    txn: lmdb.Transaction, tables: Tables, meta: CollectionMeta, seq: int
) -> bytes | None:
    cursor = txn.cursor(db=tables.gens)
    if not cursor.set_key(layout.gen_key(meta.cid_prefix, seq)) or not cursor.prev():
        return None
    return bytes(cursor.value()) if cursor.key().startswith(meta.cid_prefix) else None
