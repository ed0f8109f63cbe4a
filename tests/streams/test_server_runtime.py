"""A subscription's live loop with an in-memory store: responses reach the owner's queue, commits persist."""

from __future__ import annotations

import asyncio
from pathlib import Path

from diffstore.streams._proto import hstream_pb2 as pb
from diffstore.streams.server.config import StreamServerConfig
from diffstore.streams.server.runtime import ConsumerInfo, SubscriptionRuntime
from diffstore.streams.server.subscription import START, Position, StoredBatch, SubscriptionState

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
