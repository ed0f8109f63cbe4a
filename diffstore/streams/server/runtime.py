"""The live side of one subscription: its state machine, its consumers' outbound queues and a pacing task.

The task wakes on appends, acks and joins (or every ``resend_tick``), asks the pure
:class:`~diffstore.streams.server.subscription.SubscriptionState` what to send, queues the responses for
the consumers' StreamingFetch calls and persists moved commit positions. Everything runs on the server's
event loop, so no locks are needed.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Protocol

from diffstore.streams._proto import hstream_pb2 as pb

from . import codec
from .config import StreamServerConfig
from .errors import AlreadyExists, InvalidArgument
from .subscription import ConsumerExists, Delivery, Position, StoredBatch, SubscriptionState

logger = logging.getLogger(__name__)


class Outbound:
    """One consumer's responses (serialized StreamingFetchResponses, see ``codec.fetch_response``) waiting
    for its StreamingFetch call to send them, and the batches they hold.

    A consumer that stops reading (paused, or behind a stalled link) keeps its shards until it leaves, and
    each ack deadline resends its unacked batches to it: queued behind the copies it never took, they would
    pile up a copy per deadline, without bound. A resend of a batch whose earlier copy still waits here is
    dropped instead; the consumer gets that copy when it reads again."""

    def __init__(self) -> None:
        self._queue: asyncio.Queue[tuple[tuple[int, int] | None, bytes | None]] = asyncio.Queue()
        self._waiting: set[tuple[int, int]] = set()

    def holds(self, batch: tuple[int, int]) -> bool:
        """Whether a copy of ``batch`` (shard id, batch id) is waiting to be sent."""
        return batch in self._waiting

    def put(self, batch: tuple[int, int], response: bytes) -> None:
        self._waiting.add(batch)
        self._queue.put_nowait((batch, response))

    def end(self) -> None:
        """Ends the call once the responses before it are sent."""
        self._queue.put_nowait((None, None))

    def qsize(self) -> int:
        return self._queue.qsize()

    async def get(self) -> bytes | None:
        """The next response to send; None: the call ends."""
        batch, response = await self._queue.get()
        if batch is not None:
            self._waiting.discard(batch)
        return response


class SubscriptionStore(Protocol):
    """What a subscription's runtime needs of :class:`~diffstore.streams.server.store.StreamStore`."""

    def next_batch(self, shard_id: int, min_batch_id: int) -> StoredBatch | None: ...

    def save_positions(self, subscription_id: str, positions: dict[int, Position]) -> None: ...


@dataclass(frozen=True, slots=True)
class ConsumerInfo:
    name: str
    uri: str
    user_agent: str


def response_for(delivery: Delivery) -> bytes:
    """A serialized StreamingFetchResponse: the stored batch, or a batch of just the resent records.

    A resend decodes the stored batch (to pick the unacked records, or to check a batch resent whole:
    records nobody acked may be records nobody could decode).

    Raises:
        InvalidArgument: the stored batch cannot be decoded.
    """
    record = delivery.batch.payload
    if not delivery.whole_batch:
        record = codec.subset(codec.parse_stored(record), delivery.indices).SerializeToString()
    elif delivery.resend:
        codec.check_stored(codec.parse_stored(record), delivery.batch.size)
    return codec.fetch_response(delivery.shard_id, delivery.batch.batch_id, delivery.indices, record)


class SubscriptionRuntime:
    """Consumers, delivery loop and commit persistence of one subscription."""

    def __init__(
        self,
        subscription_id: str,
        stream_name: str,
        state: SubscriptionState,
        store: SubscriptionStore,
        config: StreamServerConfig,
    ) -> None:
        self.subscription_id = subscription_id
        self.stream_name = stream_name
        self.state = state
        self._store = store
        self._config = config
        self._queues: dict[str, Outbound] = {}
        self._consumers: dict[str, ConsumerInfo] = {}
        self._wake = asyncio.Event()
        self.closed = False
        self._task = asyncio.get_running_loop().create_task(
            self._run(), name=f"subscription:{subscription_id}"
        )

    @property
    def consumers(self) -> list[ConsumerInfo]:
        return list(self._consumers.values())

    def join(self, info: ConsumerInfo) -> Outbound:
        """Attaches a consumer and returns the queue its responses arrive on (None ends the call).

        Raises:
            AlreadyExists: a consumer of that name is attached.
        """
        try:
            self.state.join(info.name)
        except ConsumerExists as exc:
            raise AlreadyExists(f"consumer {info.name} already attached to {self.subscription_id}") from exc
        queue = Outbound()
        self._queues[info.name] = queue
        self._consumers[info.name] = info
        self.notify()
        return queue

    def leave(self, name: str) -> None:
        self.state.leave(name)
        self._queues.pop(name, None)
        self._consumers.pop(name, None)
        self.notify()

    def ack(self, record_ids: list[pb.RecordId]) -> None:
        if record_ids and self.state.ack((r.shardId, r.batchId, r.batchIndex) for r in record_ids):
            self.notify()

    def add_shard(self, shard_id: int) -> None:
        """A shard added to the stream (a split): delivered from its start, to an owner given at once."""
        self.state.add_shard(shard_id)
        self.notify()

    def notify(self) -> None:
        """Something changed (append, ack, join, leave): run a delivery round soon."""
        self._wake.set()

    async def close(self) -> None:
        """Ends every consumer's call, stops the loop and persists the last commit positions (a deleted
        subscription's are dropped by the store)."""
        self.closed = True
        for queue in self._queues.values():
            queue.end()
        self._task.cancel()
        try:
            await self._task
        except asyncio.CancelledError:
            pass
        changed = self.state.take_changed()  # acks that arrived after the last round
        if changed:
            self._store.save_positions(self.subscription_id, changed)

    def _round(self, now: float) -> bool:
        deliveries = self.state.poll(now, self._store, self._config.max_batches_per_poll)
        for delivery in deliveries:
            queue = self._queues.get(delivery.consumer)
            batch = (delivery.shard_id, delivery.batch.batch_id)
            if queue is None or (delivery.resend and queue.holds(batch)):
                continue
            try:
                queue.put(batch, response_for(delivery))
            except InvalidArgument as exc:
                # Skipped as if acked, so that the committed position moves past it: resending a batch
                # that cannot be decoded would fail forever and hold the whole shard back.
                logger.error(
                    "subscription %s: batch %d of shard %d cannot be decoded; its records %s are skipped: %s",
                    self.subscription_id,
                    delivery.batch.batch_id,
                    delivery.shard_id,
                    list(delivery.indices),
                    exc.reason,
                )
                self.state.ack((delivery.shard_id, delivery.batch.batch_id, i) for i in delivery.indices)
        changed = self.state.take_changed()
        if changed:
            self._store.save_positions(self.subscription_id, changed)
        new = sum(not d.resend for d in deliveries)
        return new >= self._config.max_batches_per_poll

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        next_assignment = loop.time() + self._config.assignment_interval
        while not self.closed:
            self._wake.clear()
            now = loop.time()
            if now >= next_assignment:
                self.state.rebalance()
                next_assignment = now + self._config.assignment_interval
            try:
                more = self._round(now)
            except Exception:  # the loop must outlive one bad round (a corrupt batch, a storage error)
                logger.exception("subscription %s: delivery round failed", self.subscription_id)
                more = False
            if more:
                await asyncio.sleep(0)
                continue
            timeout = max(0.0, min(self._config.resend_tick, next_assignment - loop.time()))
            try:
                await asyncio.wait_for(self._wake.wait(), timeout)
            except TimeoutError:
                pass
