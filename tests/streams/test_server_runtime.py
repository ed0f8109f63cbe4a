"""A subscription's live loop with an in-memory store: responses reach the owner's queue, commits persist."""

from __future__ import annotations

import asyncio
from pathlib import Path

from diffstore.streams._proto import hstream_pb2 as pb
from diffstore.streams.server.config import StreamServerConfig
from diffstore.streams.server.runtime import ConsumerInfo, SubscriptionRuntime
from diffstore.streams.server.subscription import START, Delivery, Position, StoredBatch, SubscriptionState

RECORDS = pb.BatchedRecord(
    batchSize=2,
    payload=pb.BatchHStreamRecords(
        records=[pb.HStreamRecord(payload=b"a"), pb.HStreamRecord(payload=b"b")]
    ).SerializeToString(),
).SerializeToString()


class MemoryStore:
    def __init__(self) -> None:
        self.batches = {1: {5: StoredBatch(5, 2, RECORDS)}}
        self.saved: list[dict[int, Position]] = []

    def next_batch(self, shard_id: int, min_batch_id: int) -> StoredBatch | None:
        found = sorted(b for b in self.batches.get(shard_id, {}) if b >= min_batch_id)
        return self.batches[shard_id][found[0]] if found else None

    def save_positions(self, subscription_id: str, positions: dict[int, Position]) -> None:
        self.saved.append(dict(positions))


def test_delivery_ack_and_the_last_commit_persisted_on_close(tmp_path: Path) -> None:
    async def scenario() -> None:
        store = MemoryStore()
        config = StreamServerConfig(tmp_path, resend_tick=60, assignment_interval=60)
        state = SubscriptionState({1: START}, ack_timeout=60, max_unacked=100)
        runtime = SubscriptionRuntime("sub", "s", state, store, config)
        queue = runtime.join(ConsumerInfo("c", "peer", "agent"))
        raw = await asyncio.wait_for(queue.get(), 20)
        assert raw is not None
        response = pb.StreamingFetchResponse.FromString(raw).receivedRecords
        assert [(r.shardId, r.batchId, r.batchIndex) for r in response.recordIds] == [(1, 5, 0), (1, 5, 1)]
        assert response.record.SerializeToString() == RECORDS
        runtime.ack(list(response.recordIds))  # no await: the loop gets no chance to persist this
        await runtime.close()
        assert store.saved[-1] == {1: (5, 2)}
        assert await queue.get() is None  # the consumer's call is ended

    asyncio.run(scenario())


def test_a_consumer_that_stops_reading_holds_one_copy_of_each_unacked_batch(tmp_path: Path) -> None:
    """Every ack deadline resends the unacked batch; while the consumer has not taken the earlier copy, the
    resend is dropped instead of queued behind it (a paused consumer's queue grew a copy per deadline)."""

    async def scenario() -> None:
        store = MemoryStore()
        config = StreamServerConfig(tmp_path, resend_tick=0.01, assignment_interval=60)
        state = SubscriptionState({1: START}, ack_timeout=0.02, max_unacked=100)
        resends = 0
        poll = state.poll

        def counting_poll(*args: object, **kwargs: object) -> list[Delivery]:
            nonlocal resends
            deliveries = poll(*args, **kwargs)  # type: ignore[arg-type]
            resends += sum(d.resend for d in deliveries)
            return deliveries

        state.poll = counting_poll  # type: ignore[method-assign]
        runtime = SubscriptionRuntime("sub", "s", state, store, config)
        queue = runtime.join(ConsumerInfo("c", "peer", "agent"))
        deadline = asyncio.get_running_loop().time() + 60
        while resends < 5:  # the consumer reads nothing meanwhile
            assert asyncio.get_running_loop().time() < deadline, "no resends"
            await asyncio.sleep(0.01)
        assert queue.qsize() == 1
        first = await queue.get()
        assert first is not None
        received = pb.StreamingFetchResponse.FromString(first).receivedRecords
        assert [(r.shardId, r.batchId) for r in received.recordIds] == [(1, 5), (1, 5)]
        # Taken, so the next deadline's resend is queued again: the records still come until acked.
        again = await asyncio.wait_for(queue.get(), 20)
        assert again == first
        runtime.ack(list(received.recordIds))
        await runtime.close()
        assert await queue.get() is None

    asyncio.run(scenario())
