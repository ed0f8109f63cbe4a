"""A buffered producer bound to one stream, as the HStreamDB client guidelines describe.

Two pure classes hold every decision and know nothing of sockets (h11 style):

- :class:`BatchBuffer` keeps one open batch per *shard* and says when a batch is sealed: by record count,
  by bytes, or when it has been open ``linger_ms``. Records of many partition keys share a batch (each
  record carries its own header: key and RAW/JSON flag), so the number of keys does not shrink batches.
- :class:`OrderedDispatch` lets sealed batches of different shards run concurrently while batches of the
  same shard run strictly one after the other, in sealing order.

Invariants: a partition key always maps to one shard (the stream's hash ranges, read once); a shard's
records are appended in batches in the order they were buffered, one batch of a shard in flight at a time.
Together these keep every key's records in append order.

:class:`BufferedProducer` is the thin I/O layer: a timer thread for lingering batches, a thread pool for
Append calls, and one :class:`AppendFuture` per record that resolves to its RecordId or to the error of
its batch. Errors are never dropped: every affected future carries the error and :meth:`flush` raises it.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Container, Hashable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from diffstore.streams.client import StreamClient
from diffstore.streams.records import (
    Compression,
    RecordFlag,
    RecordId,
    build_batch,
    encode_header,
    encode_keyed_records,
    encode_records,
    python_to_struct_bytes,
)

B = TypeVar("B")
# Routes (shard, header) remembered per (key, flag); past this many the memo starts over, so a producer fed
# unbounded distinct keys keeps bounded memory.
_ROUTE_MEMO_MAX = 100_000


@dataclass(frozen=True, slots=True)
class ProducerConfig:
    """Buffering and flushing of a :class:`BufferedProducer`.

    Attributes:
        batch_max_records: a shard's batch is sealed when it holds this many records.
        batch_max_bytes: ... or this many payload bytes.
        linger_ms: ... or when its first record is this old (0: seal on every append).
        compression: compression of every batch.
        max_concurrent_flushes: Append calls in flight at once (of different shards).
    """

    batch_max_records: int = 1_000
    batch_max_bytes: int = 1 << 20
    linger_ms: float = 10.0
    compression: Compression = Compression.NONE
    max_concurrent_flushes: int = 8

    def __post_init__(self) -> None:
        if self.batch_max_records < 1 or self.batch_max_bytes < 1:
            raise ValueError("batch_max_records and batch_max_bytes must be >= 1")
        if self.linger_ms < 0 or self.max_concurrent_flushes < 1:
            raise ValueError("linger_ms must be >= 0 and max_concurrent_flushes >= 1")


@dataclass(slots=True)
class PendingBatch:
    """Records bound for one shard, in append order: ``headers[i]`` is the serialized
    ``HStreamRecordHeader`` (partition key and flag) of ``payloads[i]``.

    ``context`` is the I/O layer's (the producer keeps the batch's shared outcome there).
    """

    shard_id: int
    opened_at: float
    headers: list[bytes] = field(default_factory=list)
    payloads: list[bytes] = field(default_factory=list)
    size_bytes: int = 0
    context: Any = None

    def encode(self) -> bytes:
        """The serialized ``BatchHStreamRecords`` (the shared-header fast path when every header is one)."""
        first = self.headers[0]
        if self.headers.count(first) == len(self.headers):
            return encode_records(first, self.payloads)
        return encode_keyed_records(self.headers, self.payloads)


class BatchBuffer:
    """Decides when batches are sealed; pure (time is passed in)."""

    def __init__(self, config: ProducerConfig) -> None:
        self._config = config
        self._open: dict[int, PendingBatch] = {}
        self._max_records = 1 if config.linger_ms == 0 else config.batch_max_records
        self._max_bytes = config.batch_max_bytes

    def add(
        self, shard_id: int, header: bytes, payload: bytes, now: float
    ) -> tuple[PendingBatch, Sequence[PendingBatch]]:
        """Adds one record; returns the batch now holding it (as its last record) and the batches sealed
        by this call (the record's own batch, when it filled up)."""
        batch = self._open.get(shard_id)
        if batch is None:
            batch = self._open[shard_id] = PendingBatch(shard_id, now)
        batch.headers.append(header)
        batch.payloads.append(payload)
        batch.size_bytes += len(payload)
        if len(batch.payloads) >= self._max_records or batch.size_bytes >= self._max_bytes:
            return batch, (self._open.pop(shard_id),)
        return batch, ()

    def due(self, now: float, busy: Container[int] = ()) -> list[PendingBatch]:
        """Seals and returns the batches open for at least ``linger_ms``.

        Shards in ``busy`` (a batch of theirs is still being sent) are left to grow: sealing them would
        only queue a smaller batch behind the one in flight.
        """
        limit = now - self._config.linger_ms / 1000
        shards = [s for s, b in self._open.items() if b.opened_at <= limit and s not in busy]
        return [self._open.pop(s) for s in shards]

    def next_deadline(self, busy: Container[int] = ()) -> float | None:
        """When the oldest open batch of a shard not in ``busy`` becomes due (``None``: none)."""
        opened = [b.opened_at for s, b in self._open.items() if s not in busy]
        if not opened:
            return None
        return min(opened) + self._config.linger_ms / 1000

    def drain(self) -> list[PendingBatch]:
        """Seals everything open."""
        batches = list(self._open.values())
        self._open.clear()
        return batches

    @property
    def empty(self) -> bool:
        return not self._open


K = TypeVar("K", bound=Hashable)


class OrderedDispatch(Generic[K, B]):
    """Per-shard FIFO of sealed batches: one batch per shard in flight, different shards in parallel;
    pure."""

    def __init__(self, key_of: Callable[[B], K]) -> None:
        self._key_of = key_of
        self._waiting: dict[K, deque[B]] = {}

    def submit(self, batch: B) -> bool:
        """Queues ``batch``; True when it may start now (no batch of its shard is in flight)."""
        key = self._key_of(batch)
        queue = self._waiting.get(key)
        if queue is None:
            self._waiting[key] = deque()
            return True
        queue.append(batch)
        return False

    def finished(self, key: K) -> B | None:
        """Marks the in-flight batch of ``key`` done; returns the next batch of that key to start."""
        queue = self._waiting[key]
        if queue:
            return queue.popleft()
        del self._waiting[key]
        return None

    @property
    def busy(self) -> bool:
        return bool(self._waiting)

    @property
    def busy_keys(self) -> Container[K]:
        """Keys with a batch in flight (a live view)."""
        return self._waiting.keys()


class _BatchOutcome:
    """Shared result of one batch; per-record futures index into it."""

    __slots__ = ("event", "record_ids", "error")

    def __init__(self) -> None:
        self.event = threading.Event()
        self.record_ids: list[RecordId] = []
        self.error: BaseException | None = None


class AppendFuture(tuple[_BatchOutcome, int]):
    """The outcome of one appended record: its RecordId, or the error of its batch.

    A tuple (its batch's shared outcome, its index in the batch): one is created per appended record, on
    the hot path, so it is built with ``tuple.__new__`` and has no ``__init__``.
    """

    __slots__ = ()

    def done(self) -> bool:
        return self[0].event.is_set()

    def result(self, timeout: float | None = None) -> RecordId:
        """Waits for the record's id; raises the batch's error, or TimeoutError."""
        error = self.exception(timeout)
        if error is not None:
            raise error
        return self[0].record_ids[self[1]]

    def exception(self, timeout: float | None = None) -> BaseException | None:
        """Waits for the batch; its error or ``None`` (TimeoutError when not finished in time)."""
        if not self[0].event.wait(timeout):
            raise TimeoutError("append not finished")
        return self[0].error


_new_future = tuple.__new__


class ProducerError(Exception):
    """Appends failed; ``errors`` holds the underlying exceptions (the first one is the cause)."""

    def __init__(self, errors: list[BaseException]) -> None:
        super().__init__(f"{len(errors)} batch(es) failed; first: {errors[0]!r}")
        self.errors = errors


class BufferedProducer:
    """Appends records to one stream in buffered, compressed, per-key ordered batches."""

    def __init__(self, client: StreamClient, stream_name: str, config: ProducerConfig | None = None) -> None:
        self.stream_name = stream_name
        self.config = config or ProducerConfig()
        self._client = client
        self._shard_map = client.shard_map(stream_name)
        self._buffer = BatchBuffer(self.config)
        self._dispatch: OrderedDispatch[int, PendingBatch] = OrderedDispatch(lambda b: b.shard_id)
        self._pool = ThreadPoolExecutor(
            self.config.max_concurrent_flushes, thread_name_prefix="producer-append"
        )
        # The hot path enters the bare lock (a Condition's __enter__ is Python code).
        self._mutex = threading.Lock()
        self._lock = threading.Condition(self._mutex)
        self._in_flight = 0
        self._errors: list[BaseException] = []
        self._closed = False
        self._routes: dict[tuple[str, RecordFlag], tuple[int, bytes]] = {}
        self._timer = threading.Thread(target=self._linger_loop, name="producer-linger", daemon=True)
        self._timer.start()

    # -- API -----------------------------------------------------------------------------------------------

    def append(self, payload: bytes | str | Mapping[str, Any], key: str = "") -> AppendFuture:
        """Buffers one record: ``bytes``/``str`` as RAW, a mapping as JSON (protobuf Struct).

        Returns a future resolving to the record's id once its batch is appended.
        """
        if isinstance(payload, bytes):
            flag, data = RecordFlag.RAW, payload
        elif isinstance(payload, str):
            flag, data = RecordFlag.RAW, payload.encode()
        else:
            flag, data = RecordFlag.JSON, python_to_struct_bytes(payload)
        route = self._routes.get((key, flag))
        if route is None:
            route = self._route(key, flag)
        with self._mutex:
            if self._closed:
                raise RuntimeError("producer is closed")
            batch, sealed = self._buffer.add(route[0], route[1], data, time.monotonic())
            outcome = batch.context
            if outcome is None:
                outcome = batch.context = _BatchOutcome()
            future: AppendFuture = _new_future(AppendFuture, (outcome, len(batch.payloads) - 1))
            for full in sealed:
                self._submit_locked(full)
        return future

    def flush(self) -> None:
        """Sends everything buffered and waits for it; raises :class:`ProducerError` for failures since
        the last flush."""
        with self._lock:
            for batch in self._buffer.drain():
                self._submit_locked(batch)
            while self._in_flight or self._dispatch.busy:
                self._lock.wait()
            errors, self._errors = self._errors, []
        if errors:
            raise ProducerError(errors)

    def close(self) -> None:
        """Flushes, then stops the threads; errors of the final flush are raised."""
        try:
            self.flush()
        finally:
            with self._lock:
                self._closed = True
                self._lock.notify_all()
            self._timer.join()
            self._pool.shutdown(wait=True)

    def __enter__(self) -> BufferedProducer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _route(self, key: str, flag: RecordFlag) -> tuple[int, bytes]:
        """The shard and serialized header of ``key``'s records with ``flag`` (memoized: both cost an MD5
        or a protobuf serialization per call)."""
        if len(self._routes) >= _ROUTE_MEMO_MAX:
            self._routes = {}
        route = self._routes[(key, flag)] = (self._shard_map.shard_for_key(key), encode_header(flag, key))
        return route

    # -- I/O -----------------------------------------------------------------------------------------------

    def _submit_locked(self, batch: PendingBatch) -> None:
        self._in_flight += 1
        if self._dispatch.submit(batch):
            self._pool.submit(self._send, batch)

    def _send(self, batch: PendingBatch) -> None:
        while True:
            outcome: _BatchOutcome = batch.context
            try:
                encoded = build_batch(
                    batch.encode(), len(batch.payloads), self.config.compression, time.time_ns()
                )
                outcome.record_ids = self._client.append(self.stream_name, batch.shard_id, encoded)
                if len(outcome.record_ids) != len(batch.payloads):
                    raise RuntimeError(
                        f"Append returned {len(outcome.record_ids)} ids for {len(batch.payloads)} records"
                    )
            except BaseException as exc:  # every failure must reach the futures and flush()
                outcome.error = exc
            outcome.event.set()
            with self._lock:
                if outcome.error is not None:
                    self._errors.append(outcome.error)
                self._in_flight -= 1
                following = self._dispatch.finished(batch.shard_id)
                self._lock.notify_all()
            if following is None:
                return
            batch = following

    def _linger_loop(self) -> None:
        with self._lock:
            while not self._closed:
                busy = self._dispatch.busy_keys
                deadline = self._buffer.next_deadline(busy)
                now = time.monotonic()
                if deadline is None:
                    # Nothing due: look again after one linger period (appends never wake this thread).
                    self._lock.wait(max(self.config.linger_ms / 1000, 0.001))
                    continue
                if deadline > now:
                    self._lock.wait(deadline - now)
                    continue
                for batch in self._buffer.due(now, busy):
                    self._submit_locked(batch)
