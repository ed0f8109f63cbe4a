"""A subscriber, the client end of StreamingFetch (HStream calls it a consumer): decoded batches, explicit
acks, reconnect with backoff.

:class:`AckBook` is the pure bookkeeping (no sockets, time passed in): which delivered records are still
unacked, which acks wait to be sent, and when a group of acks is due (by count or age). Acks are
idempotent on the server, so acks pending at a reconnect are simply sent on the next call.

:class:`StreamSubscriber` is the thin I/O layer. One thread runs the call: it opens StreamingFetch on the node
that LookupSubscription names, decodes every response into a :class:`ReceivedBatch` and queues it; the
call's request iterator sends the first request and then the due acks. On a retryable failure (UNAVAILABLE,
CANCELLED, ALREADY_EXISTS while the server still sees our previous call) it reconnects after an exponential
backoff -- with a ``watch`` (:class:`~diffstore.outage.OutageWatch`), an unavailable server is waited for by
that watch's policy, which logs when the server stops answering and when it is back (its lookup answers)
and may give up; any other failure (e.g. NOT_FOUND) ends the consumer and is raised by :meth:`poll`."""

from __future__ import annotations

import queue
import threading
import time
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from diffstore.outage import OutageWatch
from diffstore.streams._proto import hstream_pb2 as pb
from diffstore.streams.client import StreamAlreadyExists, StreamClient, StreamError, map_rpc_errors
from diffstore.streams.records import RecordId, StreamRecord, decode_batch


@dataclass(frozen=True, slots=True)
class SubscriberConfig:
    """Tuning of a :class:`StreamSubscriber`.

    Attributes:
        consumer_name: the name the server sees (default: a random one per consumer).
        ack_batch_records: acks are sent as soon as this many wait ...
        ack_flush_ms: ... or when the oldest waiting ack is this old.
        reconnect_initial_ms / reconnect_max_ms: exponential backoff between reconnects.
        queue_batches: decoded batches buffered ahead of :meth:`StreamSubscriber.poll`.
    """

    consumer_name: str | None = None
    ack_batch_records: int = 500
    ack_flush_ms: float = 20.0
    reconnect_initial_ms: float = 20.0
    reconnect_max_ms: float = 2_000.0
    queue_batches: int = 256

    def __post_init__(self) -> None:
        if self.ack_batch_records < 1 or self.ack_flush_ms < 0 or self.queue_batches < 1:
            raise ValueError("ack_batch_records and queue_batches must be >= 1, ack_flush_ms >= 0")
        if not 0 < self.reconnect_initial_ms <= self.reconnect_max_ms:
            raise ValueError("need 0 < reconnect_initial_ms <= reconnect_max_ms")


@dataclass(frozen=True, slots=True)
class ReceivedBatch:
    """The records of one StreamingFetch response (one stored batch of one shard), and the number of the
    consumer's call that brought them (0 for the first, one more after each reconnect)."""

    shard_id: int
    records: list[StreamRecord]
    call: int = 0

    @property
    def record_ids(self) -> list[RecordId]:
        return [r.record_id for r in self.records]


class AckBook:
    """Unacked deliveries and acks waiting to be sent; pure."""

    def __init__(self, ack_batch_records: int, ack_flush_ms: float) -> None:
        self._batch = ack_batch_records
        self._flush_s = ack_flush_ms / 1000
        self._unacked: set[RecordId] = set()
        self._pending: dict[RecordId, None] = {}
        self._oldest_pending: float | None = None

    def delivered(self, ids: Iterable[RecordId]) -> None:
        """Records handed to the application (a redelivery of an unacked one changes nothing)."""
        self._unacked.update(ids)

    def ack(self, ids: Iterable[RecordId], now: float) -> None:
        """The application is done with ``ids``; they will be sent (once each) with the next group."""
        ids = list(ids)
        self._unacked.difference_update(ids)
        self._pending.update(dict.fromkeys(ids))
        if self._pending and self._oldest_pending is None:
            self._oldest_pending = now

    def due(self, now: float) -> bool:
        if not self._pending:
            return False
        assert self._oldest_pending is not None
        return len(self._pending) >= self._batch or now - self._oldest_pending >= self._flush_s

    def take(self, now: float, force: bool = False) -> list[RecordId]:
        """The acks to send now (all waiting ones when due or forced), else ``[]``."""
        if not (force or self.due(now)):
            return []
        taken = list(self._pending)
        self._pending.clear()
        self._oldest_pending = None
        return taken

    def next_deadline(self) -> float | None:
        """When waiting acks become due by age (``None``: none waiting)."""
        return None if self._oldest_pending is None else self._oldest_pending + self._flush_s

    @property
    def unacked(self) -> int:
        return len(self._unacked)

    @property
    def pending(self) -> int:
        return len(self._pending)


class SubscriberClosed(Exception):
    """:meth:`StreamSubscriber.poll` after the consumer stopped without an error."""


class StreamSubscriber:
    """Receives decoded batches of one subscription; the caller acks what it has finished with."""

    def __init__(
        self,
        client: StreamClient,
        subscription_id: str,
        config: SubscriberConfig | None = None,
        watch: OutageWatch | None = None,
    ) -> None:
        self.subscription_id = subscription_id
        self._watch = watch
        self.config = config or SubscriberConfig()
        self.consumer_name = self.config.consumer_name or f"diffstore-{uuid.uuid4().hex[:12]}"
        self._client = client
        self._book = AckBook(self.config.ack_batch_records, self.config.ack_flush_ms)
        self._lock = threading.Condition()
        self._batches: queue.Queue[ReceivedBatch] = queue.Queue(self.config.queue_batches)
        self._stopping = threading.Event()
        self._fatal: BaseException | None = None
        self._flush = False
        self._call: object | None = None
        self._connection = 0
        self.reconnects = 0
        self._thread = threading.Thread(target=self._run, name=f"consumer-{subscription_id}", daemon=True)
        self._thread.start()

    # -- API -----------------------------------------------------------------------------------------------

    def poll(self, timeout: float | None = None) -> ReceivedBatch | None:
        """The next decoded batch, or ``None`` after ``timeout``; raises the error that ended the consumer."""
        try:
            return self._batches.get(timeout=timeout)
        except queue.Empty:
            if self._fatal is not None:
                raise self._fatal from None
            if self._stopping.is_set() and not self._thread.is_alive():
                raise SubscriberClosed("consumer is closed") from None
            return None

    def ack(self, ids: Iterable[RecordId]) -> None:
        """Acknowledges records; they are sent in groups (see :class:`SubscriberConfig`)."""
        with self._lock:
            self._book.ack(ids, time.monotonic())
            self._lock.notify_all()

    def flush(self) -> None:
        """Sends the acks waiting to be sent now, without waiting for their group to fill or age."""
        with self._lock:
            self._flush = True
            self._lock.notify_all()

    def close(self, timeout: float = 5.0) -> None:
        """Sends the waiting acks, then ends the call and the thread."""
        with self._lock:
            self._stopping.set()
            self._lock.notify_all()
        self._thread.join(timeout)
        call = self._call
        if call is not None and self._thread.is_alive():
            call.cancel()  # type: ignore[attr-defined]
            self._thread.join(timeout)

    def __enter__(self) -> StreamSubscriber:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def unacked(self) -> int:
        with self._lock:
            return self._book.unacked

    # -- I/O -----------------------------------------------------------------------------------------------

    def _requests(self, connection: int) -> Iterator[pb.StreamingFetchRequest]:
        sub, name = self.subscription_id, self.consumer_name
        yield pb.StreamingFetchRequest(subscriptionId=sub, consumerName=name)
        with self._lock:
            while self._connection == connection:
                now = time.monotonic()
                stopping = self._stopping.is_set()
                acks = self._book.take(now, force=stopping or self._flush)
                self._flush = False
                if acks:
                    self._lock.release()
                    try:
                        yield pb.StreamingFetchRequest(
                            subscriptionId=sub, consumerName=name, ackIds=[a.to_proto() for a in acks]
                        )
                    finally:
                        self._lock.acquire()
                    continue
                if stopping:
                    return  # half-close: the server ends the call once it has read our last acks
                deadline = self._book.next_deadline()
                self._lock.wait(None if deadline is None else max(0.0, deadline - now))

    def _run(self) -> None:
        backoff = self.config.reconnect_initial_ms / 1000
        while not self._stopping.is_set():
            with self._lock:
                self._connection += 1
                connection = self._connection
            delay = backoff
            try:
                with map_rpc_errors("StreamingFetch"):
                    call = self._client.streaming_fetch(self.subscription_id, self._requests(connection))
                    if self._watch is not None:
                        self._watch.succeeded()  # its lookup answered: the server is back
                    self._call = call
                    for response in call:
                        backoff = self.config.reconnect_initial_ms / 1000
                        self._deliver(response.receivedRecords)
                if self._stopping.is_set():
                    return
            except StreamError as exc:
                if self._stopping.is_set():
                    return
                if not (exc.retryable or isinstance(exc, StreamAlreadyExists)):
                    self._fatal = exc
                    return
                if exc.retryable and self._watch is not None:
                    try:
                        delay = self._watch.failed(exc)
                    except StreamError as given_up:
                        self._fatal = given_up
                        return
            except BaseException as exc:  # a decoding failure must not vanish with the thread
                self._fatal = exc
                return
            finally:
                with self._lock:
                    self._connection += 1  # retire this call's request iterator
                    self._lock.notify_all()
            self.reconnects += 1
            self._stopping.wait(delay)
            backoff = min(backoff * 2, self.config.reconnect_max_ms / 1000)

    def _deliver(self, received: pb.ReceivedRecord) -> None:
        if not received.recordIds:
            return
        records = decode_batch(received.record, received.recordIds)
        batch = ReceivedBatch(received.recordIds[0].shardId, records, self.reconnects)
        with self._lock:
            self._book.delivered(batch.record_ids)
        while not self._stopping.is_set():
            try:
                self._batches.put(batch, timeout=0.1)
                return
            except queue.Full:
                continue
