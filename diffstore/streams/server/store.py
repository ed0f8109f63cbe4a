"""Persistent state of the embedded stream server in its own LMDB environment (layout: ``keys``).

Streams, shards, batches as received, subscriptions and committed positions; each operation is one LMDB
transaction, so a restart finds exactly what was acknowledged to clients. ``lmdb.Error`` is translated to
:class:`diffstore.errors.StorageError` (``StorageFull`` for a full map or disk) here and nowhere else.
Methods may be called from two threads (the event loop and the append writer): every transaction stays on
the thread that opened it.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import lmdb
import msgpack

from diffstore.engine.storage import DirectoryLock, open_environment, refuse_unfinished_backup, storage_error
from diffstore.streams.sharding import shard_ranges

from . import keys
from .errors import AlreadyExists, FailedPrecondition, InvalidArgument, ResourceNotFound, StreamServerError
from .subscription import START, Position, StoredBatch

MAX_NAME_LENGTH = 255
MAX_SHARD_COUNT = 1024
_IDENTIFIER = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.\-]{0,254}")  # 1..MAX_NAME_LENGTH characters
EARLIEST, LATEST = 0, 1
MAX_READERS = 126  # LMDB's default


def check_identifier(kind: str, name: str) -> None:
    """Raises InvalidArgument unless ``name`` is a valid stream or subscription name.

    Every call that names a stream or a subscription checks it first: an empty or overlong name would
    otherwise reach LMDB as an illegal key (MDB_BAD_VALSIZE, an INTERNAL error).
    """
    if not _IDENTIFIER.fullmatch(name):
        raise InvalidArgument(f"invalid {kind} name {name!r}")


@dataclass(frozen=True, slots=True)
class StreamInfo:
    name: str
    replication_factor: int
    backlog_duration: int
    shard_ids: tuple[int, ...]
    creation_ms: int


@dataclass(frozen=True, slots=True)
class StoredShard:
    shard_id: int
    stream_name: str
    start: int
    end: int
    epoch: int = 0


@dataclass(frozen=True, slots=True)
class AppendItem:
    """One batch to store: ``size`` records, ``record`` a serialized BatchedRecord."""

    stream_name: str
    shard_id: int
    size: int
    record: bytes


@dataclass(frozen=True, slots=True)
class SubscriptionInfo:
    subscription_id: str
    stream_name: str
    ack_timeout_seconds: int
    max_unacked_records: int
    offset: int
    creation_ms: int


def _pack(value: dict[str, Any]) -> bytes:
    return msgpack.packb(value, use_bin_type=True)  # type: ignore[no-any-return]


def _unpack(raw: bytes) -> dict[str, Any]:
    value: dict[str, Any] = msgpack.unpackb(raw, raw=False)
    return value


class StreamStore:
    """The server's LMDB environment; every method is one transaction."""

    def __init__(self, path: Path, *, map_size: int = 1 << 40, sync: bool = True) -> None:
        """Opens (creating if needed) the environment in ``path``.

        Raises:
            StorageFull: the file system is full (reported, never a SIGBUS: see ``engine/storage.py``).
            StorageError: any other failure.
        """
        self._path = path
        self._map_size = map_size
        refuse_unfinished_backup(path)
        self._directory_lock = DirectoryLock(path)  # shared: a compaction waits for the store to close
        try:
            self._env = open_environment(
                path, map_size=map_size, sync=sync, max_dbs=len(keys.DB_NAMES), max_readers=MAX_READERS
            )
        except BaseException:
            self._directory_lock.release()
            raise
        try:
            self._db = {name.decode(): self._env.open_db(name) for name in keys.DB_NAMES}
        except lmdb.Error as exc:
            self._env.close()
            self._directory_lock.release()
            raise storage_error(
                exc, path, map_size, writing=True, doing=f"cannot open stream store at {path}"
            ) from exc

    def close(self) -> None:
        self._env.close()
        self._directory_lock.release()

    @contextmanager
    def _txn(self, write: bool = False) -> Iterator[lmdb.Transaction]:
        try:
            with self._env.begin(write=write) as txn:
                yield txn
        except lmdb.Error as exc:
            # StorageFull for a full map or disk: the transaction changed nothing
            raise storage_error(exc, self._path, self._map_size, writing=write, doing="stream store") from exc

    def _next_id(self, txn: lmdb.Transaction, counter: bytes) -> int:
        raw = txn.get(counter, db=self._db["meta"])
        value = keys.parse_u64(raw) if raw else 1
        txn.put(counter, keys.u64(value + 1), db=self._db["meta"])
        return value

    # -- streams ----------------------------------------------------------------------------------------

    def create_stream(
        self, name: str, replication_factor: int, backlog_duration: int, shard_count: int, creation_ms: int
    ) -> StreamInfo:
        """Creates a stream and its shards over the hash ranges of SPEC §4.

        Raises:
            InvalidArgument: bad name, replication factor or shard count.
            AlreadyExists: the stream exists.
        """
        check_identifier("stream", name)
        if replication_factor < 1:
            raise InvalidArgument("replicationFactor must be positive")
        if not 1 <= shard_count <= MAX_SHARD_COUNT:
            raise InvalidArgument(f"shardCount must be within 1..{MAX_SHARD_COUNT}, not {shard_count}")
        with self._txn(write=True) as txn:
            if txn.get(name.encode(), db=self._db["streams"]) is not None:
                raise AlreadyExists(f"stream {name} exists")
            shard_ids = []
            for start, end in shard_ranges(shard_count):
                shard_id = self._next_id(txn, keys.NEXT_SHARD_ID)
                shard = {"stream": name, "start": str(start), "end": str(end), "epoch": 0}
                txn.put(keys.u64(shard_id), _pack(shard), db=self._db["shards"])
                shard_ids.append(shard_id)
            info = StreamInfo(name, replication_factor, backlog_duration, tuple(shard_ids), creation_ms)
            value = {
                "rf": replication_factor,
                "backlog": backlog_duration,
                "shards": shard_ids,
                "ctime": creation_ms,
            }
            txn.put(name.encode(), _pack(value), db=self._db["streams"])
        return info

    def _stream(self, txn: lmdb.Transaction, name: str) -> StreamInfo | None:
        raw = txn.get(name.encode(), db=self._db["streams"])
        if raw is None:
            return None
        v = _unpack(raw)
        return StreamInfo(name, v["rf"], v["backlog"], tuple(v["shards"]), v["ctime"])

    def get_stream(self, name: str) -> StreamInfo:
        """Raises ResourceNotFound when the stream does not exist (InvalidArgument for a bad name)."""
        check_identifier("stream", name)
        with self._txn() as txn:
            info = self._stream(txn, name)
        if info is None:
            raise ResourceNotFound(f"stream {name} not found")
        return info

    def list_streams(self) -> list[StreamInfo]:
        with self._txn() as txn:
            names = [bytes(k).decode() for k in txn.cursor(db=self._db["streams"]).iternext(values=False)]
            return [info for name in names if (info := self._stream(txn, name)) is not None]

    def delete_stream(self, name: str, *, force: bool) -> list[str]:
        """Deletes a stream, its shards and batches; with ``force`` also its subscriptions.

        Returns:
            The deleted subscriptions.

        Raises:
            ResourceNotFound: no such stream.
            FailedPrecondition: the stream has subscriptions and ``force`` is false.
            InvalidArgument: not a valid stream name.
        """
        check_identifier("stream", name)
        with self._txn(write=True) as txn:
            info = self._stream(txn, name)
            if info is None:
                raise ResourceNotFound(f"stream {name} not found")
            subs = [s.subscription_id for s in self._subscriptions(txn) if s.stream_name == name]
            if subs and not force:
                raise FailedPrecondition(f"stream {name} has subscriptions: {', '.join(subs)}")
            for sub in subs:
                self._delete_subscription(txn, sub)
            for shard_id in info.shard_ids:
                txn.delete(keys.u64(shard_id), db=self._db["shards"])
                self._delete_prefix(txn, "batches", keys.u64(shard_id))
            txn.delete(name.encode(), db=self._db["streams"])
        return subs

    def _delete_prefix(self, txn: lmdb.Transaction, db: str, prefix: bytes) -> None:
        cursor = txn.cursor(db=self._db[db])
        if not cursor.set_range(prefix):
            return
        while cursor.key()[: len(prefix)] == prefix:
            if not cursor.delete():
                break

    # -- shards and batches -----------------------------------------------------------------------------

    def shards(self, stream_name: str) -> list[StoredShard]:
        """The stream's shards in id order (raises ResourceNotFound for a missing stream)."""
        check_identifier("stream", stream_name)
        with self._txn() as txn:
            info = self._stream(txn, stream_name)
            if info is None:
                raise ResourceNotFound(f"stream {stream_name} not found")
            return [self._shard(txn, sid) for sid in info.shard_ids]

    def split_shard(self, stream_name: str, shard_id: int) -> tuple[StoredShard, StoredShard]:
        """Adds a shard to a stream by splitting ``shard_id``'s hash range in two (beyond HStream).

        The shard keeps the lower half (its epoch goes up by one, so clients can tell its range changed)
        and a new shard takes the upper half; the ranges still cover the hash space without overlap.
        Every subscription of the stream reads the new shard from its start (it is empty now). Records
        already in the split shard stay there; records appended after the split go where their
        partition key's hash now falls (producers that list the shards again), so per-key order holds
        within each shard, not across the split.

        Returns:
            The split shard and the new one.

        Raises:
            ResourceNotFound: no such stream, or the shard is not one of its shards.
            FailedPrecondition: the shard's range is a single hash, or the stream has MAX_SHARD_COUNT shards.
            InvalidArgument: not a valid stream name.
        """
        check_identifier("stream", stream_name)
        with self._txn(write=True) as txn:
            info = self._stream(txn, stream_name)
            if info is None:
                raise ResourceNotFound(f"stream {stream_name} not found")
            if shard_id not in info.shard_ids:
                raise ResourceNotFound(f"shard {shard_id} is not a shard of {stream_name}")
            if len(info.shard_ids) >= MAX_SHARD_COUNT:
                raise FailedPrecondition(f"stream {stream_name} has {MAX_SHARD_COUNT} shards already")
            old = self._shard(txn, shard_id)
            if old.start == old.end:
                raise FailedPrecondition(f"shard {shard_id} covers a single hash and cannot be split")
            middle = old.start + (old.end - old.start) // 2
            kept = StoredShard(shard_id, stream_name, old.start, middle, old.epoch + 1)
            added = StoredShard(self._next_id(txn, keys.NEXT_SHARD_ID), stream_name, middle + 1, old.end, 0)
            for shard in (kept, added):
                value = {
                    "stream": stream_name,
                    "start": str(shard.start),
                    "end": str(shard.end),
                    "epoch": shard.epoch,
                }
                txn.put(keys.u64(shard.shard_id), _pack(value), db=self._db["shards"])
            raw = _unpack(txn.get(stream_name.encode(), db=self._db["streams"]))
            raw["shards"] = [*info.shard_ids, added.shard_id]
            txn.put(stream_name.encode(), _pack(raw), db=self._db["streams"])
            for sub in self._subscriptions(txn):
                if sub.stream_name == stream_name:
                    self._put_positions(txn, sub.subscription_id, {added.shard_id: START})
        return kept, added

    def _shard(self, txn: lmdb.Transaction, shard_id: int) -> StoredShard:
        raw = txn.get(keys.u64(shard_id), db=self._db["shards"])
        if raw is None:
            raise ResourceNotFound(f"shard {shard_id} not found")
        v = _unpack(raw)
        return StoredShard(shard_id, v["stream"], int(v["start"]), int(v["end"]), v["epoch"])

    def shard(self, shard_id: int) -> StoredShard:
        with self._txn() as txn:
            return self._shard(txn, shard_id)

    def append(self, stream_name: str, shard_id: int, size: int, record: bytes) -> int:
        """Stores one batch of ``size`` records (serialized BatchedRecord) and returns its batch id.

        Batch ids come from one counter for the whole server: strictly increasing per shard, not dense.

        Raises:
            ResourceNotFound: the stream or the shard (in that stream) does not exist.
        """
        (result,) = self.append_many([AppendItem(stream_name, shard_id, size, record)])
        if isinstance(result, StreamServerError):
            raise result
        return result

    def append_many(self, items: list[AppendItem]) -> list[int | StreamServerError]:
        """Stores several batches in one transaction (group commit); an item that names a missing stream or
        shard gets its error in place of a batch id and the others are stored.
        """
        results: list[int | StreamServerError] = []
        with self._txn(write=True) as txn:
            for item in items:
                if not _IDENTIFIER.fullmatch(item.stream_name):
                    results.append(InvalidArgument(f"invalid stream name {item.stream_name!r}"))
                    continue
                if txn.get(item.stream_name.encode(), db=self._db["streams"]) is None:
                    results.append(ResourceNotFound(f"stream {item.stream_name} not found"))
                    continue
                raw = txn.get(keys.u64(item.shard_id), db=self._db["shards"])
                if raw is None or _unpack(raw)["stream"] != item.stream_name:
                    reason = f"shard {item.shard_id} is not a shard of {item.stream_name}"
                    results.append(ResourceNotFound(reason))
                    continue
                batch_id = self._next_id(txn, keys.NEXT_BATCH_ID)
                key = keys.batch_key(item.shard_id, batch_id)
                txn.put(key, keys.batch_value(item.size, item.record), db=self._db["batches"])
                results.append(batch_id)
        return results

    def tail(self, shard_id: int) -> tuple[int, int] | None:
        """``(batch_id, size)`` of the shard's last batch, or None when it is empty."""
        with self._txn() as txn:
            return self._tail(txn, shard_id)

    def _tail(self, txn: lmdb.Transaction, shard_id: int) -> tuple[int, int] | None:
        cursor = txn.cursor(db=self._db["batches"])
        if cursor.set_range(keys.batch_key(shard_id + 1, 0)):
            found = cursor.prev()
        else:
            found = cursor.last()
        if not found:
            return None
        sid, batch_id = keys.parse_batch_key(cursor.key())
        if sid != shard_id:
            return None
        size, _ = keys.parse_batch_value(cursor.value())
        return batch_id, size

    def next_batch(self, shard_id: int, min_batch_id: int) -> StoredBatch | None:
        """The first batch of the shard with id ``>= min_batch_id`` (a :class:`BatchSource`)."""
        with self._txn() as txn:
            cursor = txn.cursor(db=self._db["batches"])
            if not cursor.set_range(keys.batch_key(shard_id, min_batch_id)):
                return None
            sid, batch_id = keys.parse_batch_key(cursor.key())
            if sid != shard_id:
                return None
            size, record = keys.parse_batch_value(cursor.value())
            return StoredBatch(batch_id, size, record)

    # -- subscriptions ----------------------------------------------------------------------------------

    def create_subscription(self, info: SubscriptionInfo) -> dict[int, Position]:
        """Creates a subscription with its start fixed now (EARLIEST: shard starts; LATEST: shard tails).

        Returns:
            The initial committed position of every shard.

        Raises:
            InvalidArgument: bad name, timeout, bound or offset.
            AlreadyExists: the subscription exists.
            FailedPrecondition: the stream does not exist.
        """
        check_identifier("subscription", info.subscription_id)
        check_identifier("stream", info.stream_name)
        if info.ack_timeout_seconds < 1 or info.max_unacked_records < 1:
            raise InvalidArgument("ackTimeoutSeconds and maxUnackedRecords must be positive")
        if info.offset not in (EARLIEST, LATEST):
            raise InvalidArgument(f"unknown offset {info.offset}")
        with self._txn(write=True) as txn:
            if txn.get(info.subscription_id.encode(), db=self._db["subs"]) is not None:
                raise AlreadyExists(f"subscription {info.subscription_id} exists")
            stream = self._stream(txn, info.stream_name)
            if stream is None:
                raise FailedPrecondition(f"stream {info.stream_name} not found")
            positions: dict[int, Position] = {}
            for shard_id in stream.shard_ids:
                tail = self._tail(txn, shard_id) if info.offset == LATEST else None
                positions[shard_id] = tail if tail is not None else START
            value = {
                "stream": info.stream_name,
                "ack": info.ack_timeout_seconds,
                "max": info.max_unacked_records,
                "offset": info.offset,
                "ctime": info.creation_ms,
            }
            txn.put(info.subscription_id.encode(), _pack(value), db=self._db["subs"])
            self._put_positions(txn, info.subscription_id, positions)
        return positions

    def _subscriptions(self, txn: lmdb.Transaction) -> list[SubscriptionInfo]:
        out = []
        for key, raw in txn.cursor(db=self._db["subs"]):
            v = _unpack(raw)
            out.append(
                SubscriptionInfo(
                    bytes(key).decode(), v["stream"], v["ack"], v["max"], v["offset"], v["ctime"]
                )
            )
        return out

    def list_subscriptions(self) -> list[SubscriptionInfo]:
        with self._txn() as txn:
            return self._subscriptions(txn)

    def get_subscription(self, subscription_id: str) -> SubscriptionInfo:
        """Raises ResourceNotFound when the subscription does not exist (InvalidArgument for a bad name)."""
        check_identifier("subscription", subscription_id)
        with self._txn() as txn:
            raw = txn.get(subscription_id.encode(), db=self._db["subs"])
        if raw is None:
            raise ResourceNotFound(f"subscription {subscription_id} not found")
        v = _unpack(raw)
        return SubscriptionInfo(subscription_id, v["stream"], v["ack"], v["max"], v["offset"], v["ctime"])

    def delete_subscription(self, subscription_id: str) -> None:
        """Raises ResourceNotFound when the subscription does not exist (InvalidArgument for a bad name)."""
        check_identifier("subscription", subscription_id)
        with self._txn(write=True) as txn:
            if txn.get(subscription_id.encode(), db=self._db["subs"]) is None:
                raise ResourceNotFound(f"subscription {subscription_id} not found")
            self._delete_subscription(txn, subscription_id)

    def _delete_subscription(self, txn: lmdb.Transaction, subscription_id: str) -> None:
        txn.delete(subscription_id.encode(), db=self._db["subs"])
        self._delete_prefix(txn, "positions", keys.subscription_prefix(subscription_id))

    def positions(self, subscription_id: str) -> dict[int, Position]:
        """Committed position of every shard of the subscription."""
        prefix = keys.subscription_prefix(subscription_id)
        out: dict[int, Position] = {}
        with self._txn() as txn:
            cursor = txn.cursor(db=self._db["positions"])
            if cursor.set_range(prefix):
                for key, raw in cursor:
                    if key[: len(prefix)] != prefix:
                        break
                    out[keys.parse_position_key(key)[1]] = keys.parse_position_value(raw)
        return out

    def save_positions(self, subscription_id: str, positions: dict[int, Position]) -> None:
        """Persists committed positions (ignored when the subscription was deleted meanwhile)."""
        with self._txn(write=True) as txn:
            if txn.get(subscription_id.encode(), db=self._db["subs"]) is not None:
                self._put_positions(txn, subscription_id, positions)

    def _put_positions(
        self, txn: lmdb.Transaction, subscription_id: str, positions: dict[int, Position]
    ) -> None:
        for shard_id, (batch_id, index) in positions.items():
            txn.put(
                keys.position_key(subscription_id, shard_id),
                keys.position_value(batch_id, index),
                db=self._db["positions"],
            )
