"""Key layout round trips, the LMDB store, and a server restart that keeps everything."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import grpc
import pytest
from hypothesis import given
from hypothesis import strategies as st

from diffstore.streams._proto import hstream_pb2 as pb
from diffstore.streams._proto import hstream_pb2_grpc as pb_grpc
from diffstore.streams.server import ServerThread, StreamServerConfig, keys
from diffstore.streams.server.errors import (
    AlreadyExists,
    FailedPrecondition,
    InvalidArgument,
    ResourceNotFound,
)
from diffstore.streams.server.store import EARLIEST, LATEST, AppendItem, StreamStore, SubscriptionInfo
from tests.helpers import wait_until

U64 = st.integers(0, 2**64 - 1)


@given(U64, U64, U64, U64)
def test_batch_keys_round_trip_and_sort_numerically(s1: int, b1: int, s2: int, b2: int) -> None:
    assert keys.parse_batch_key(keys.batch_key(s1, b1)) == (s1, b1)
    assert (keys.batch_key(s1, b1) < keys.batch_key(s2, b2)) == ((s1, b1) < (s2, b2))


@given(st.text(min_size=1, max_size=50), U64, U64, st.integers(0, 2**32 - 1))
def test_position_keys_and_values_round_trip(name: str, shard: int, batch: int, index: int) -> None:
    assert keys.parse_position_key(keys.position_key(name, shard)) == (name, shard)
    assert keys.parse_position_value(keys.position_value(batch, index)) == (batch, index)
    assert keys.position_key(name, shard).startswith(keys.subscription_prefix(name))
    assert keys.parse_batch_value(keys.batch_value(index, b"rec")) == (index, b"rec")


def test_store_rules(tmp_path: Path) -> None:
    store = StreamStore(tmp_path, sync=False)
    try:
        info = store.create_stream("s", 1, 0, 2, 1)
        with pytest.raises(AlreadyExists):
            store.create_stream("s", 1, 0, 2, 1)
        with pytest.raises(InvalidArgument):
            store.create_stream("", 1, 0, 1, 1)
        with pytest.raises(InvalidArgument):
            store.create_stream("t", 0, 0, 1, 1)
        a, b = info.shard_ids
        assert store.tail(a) is None and store.next_batch(a, 0) is None
        ids = [store.append("s", a, 2, b"x"), store.append("s", b, 1, b"y"), store.append("s", a, 3, b"z")]
        assert ids == sorted(ids) and len(set(ids)) == 3
        assert store.tail(a) == (ids[2], 3) and store.tail(b) == (ids[1], 1)
        found = store.next_batch(a, ids[0] + 1)
        assert found is not None and (found.batch_id, found.size, found.payload) == (ids[2], 3, b"z")
        with pytest.raises(ResourceNotFound):
            store.append("s", 999, 1, b"x")
        sub = SubscriptionInfo("late", "s", 5, 10, LATEST, 1)
        assert store.create_subscription(sub) == {a: (ids[2], 3), b: (ids[1], 1)}
        early = dataclasses.replace(sub, subscription_id="early", offset=EARLIEST)
        assert store.create_subscription(early) == {a: (0, 0), b: (0, 0)}
        with pytest.raises(FailedPrecondition):
            store.create_subscription(dataclasses.replace(sub, subscription_id="x", stream_name="nope"))
        store.save_positions("early", {a: (ids[0], 1)})
        assert store.positions("early") == {a: (ids[0], 1), b: (0, 0)}
        with pytest.raises(FailedPrecondition):
            store.delete_stream("s", force=False)
        store.delete_subscription("late")
        assert [s.subscription_id for s in store.list_subscriptions()] == ["early"]
        assert store.delete_stream("s", force=True) == ["early"]
        assert (
            store.list_streams() == [] and store.list_subscriptions() == [] and store.positions("early") == {}
        )
        assert store.tail(a) is None
        again = store.create_stream("s", 1, 0, 1, 1)
        assert again.shard_ids[0] > b  # shard ids are never reused
    finally:
        store.close()


def test_a_restart_keeps_streams_records_subscriptions_and_committed_positions(
    stream_server_config: StreamServerConfig, open_fetch: Any
) -> None:
    def stub_for(server: ServerThread) -> tuple[grpc.Channel, pb_grpc.HStreamApiStub]:
        channel = grpc.insecure_channel(server.address)
        return channel, pb_grpc.HStreamApiStub(channel)

    records = pb.BatchHStreamRecords(
        records=[pb.HStreamRecord(header=pb.HStreamRecordHeader(flag=1), payload=b"%d" % i) for i in range(2)]
    ).SerializeToString()
    with ServerThread(stream_server_config) as first:
        channel, stub = stub_for(first)
        stub.CreateStream(pb.Stream(streamName="s", replicationFactor=1, shardCount=1))
        (shard,) = [s.shardId for s in stub.ListShards(pb.ListShardsRequest(streamName="s")).shards]
        appended = [
            stub.Append(
                pb.AppendRequest(
                    streamName="s", shardId=shard, records=pb.BatchedRecord(batchSize=2, payload=records)
                )
            ).recordIds
            for _ in range(3)
        ]
        stub.CreateSubscription(
            pb.Subscription(
                subscriptionId="sub", streamName="s", ackTimeoutSeconds=1000, maxUnackedRecords=100
            )
        )
        session = open_fetch(stub, "sub", "c")
        got = [session.next() for _ in range(3)]
        assert [list(g.recordIds) for g in got] == [list(a) for a in appended]
        session.ack(list(appended[0]) + [appended[1][0]])

        def committed() -> list[tuple[int, int]]:
            offsets = stub.GetSubscription(pb.GetSubscriptionRequest(id="sub")).offsets
            return [(o.shardId, o.batchId) for o in offsets]

        wait_until(lambda: committed() == [(shard, appended[1][0].batchId)])
        session.close()
        channel.close()
    with ServerThread(dataclasses.replace(stream_server_config, port=0)) as second:
        channel, stub = stub_for(second)
        assert [s.streamName for s in stub.ListStreams(pb.ListStreamsRequest()).streams] == ["s"]
        sub = stub.GetSubscription(pb.GetSubscriptionRequest(id="sub"))
        assert sub.subscription.ackTimeoutSeconds == 1000
        assert [(o.shardId, o.batchId) for o in sub.offsets] == [(shard, appended[1][0].batchId)]
        tail = stub.GetTailRecordId(pb.GetTailRecordIdRequest(streamName="s", shardId=shard)).tailRecordId
        assert (tail.batchId, tail.batchIndex) == (appended[2][0].batchId, 1)
        session = open_fetch(stub, "sub", "c")
        resumed = session.next()
        assert list(resumed.recordIds) == [appended[1][1]]  # only the unacked rest of the half-acked batch
        assert list(session.next().recordIds) == list(appended[2])
        session.close()
        channel.close()


def test_a_group_of_appends_is_one_transaction_with_per_item_errors(tmp_path: Path) -> None:
    store = StreamStore(tmp_path, sync=False)
    try:
        (shard,) = store.create_stream("s", 1, 0, 1, 1).shard_ids
        results = store.append_many(
            [
                AppendItem("s", shard, 1, b"a"),
                AppendItem("nope", shard, 1, b"x"),
                AppendItem("s", shard + 1, 1, b"x"),
                AppendItem("s", shard, 2, b"b"),
            ]
        )
        first, missing_stream, missing_shard, last = results
        assert isinstance(first, int) and isinstance(last, int) and first < last
        assert isinstance(missing_stream, ResourceNotFound) and isinstance(missing_shard, ResourceNotFound)
        assert store.tail(shard) == (last, 2)
    finally:
        store.close()


def test_config_validates_and_advertises_a_dialable_host(tmp_path: Path) -> None:
    assert StreamServerConfig(tmp_path).public_host == "127.0.0.1"
    assert StreamServerConfig(tmp_path, host="0.0.0.0").public_host == "127.0.0.1"
    assert StreamServerConfig(tmp_path, host="0.0.0.0", advertised_host="node1").public_host == "node1"
    assert StreamServerConfig(tmp_path, host="10.1.2.3").public_host == "10.1.2.3"
    bad: list[dict[str, Any]] = [
        {"port": 70000},
        {"resend_tick": 0},
        {"assignment_interval": -1},
        {"max_batches_per_poll": 0},
    ]
    for options in bad:
        with pytest.raises(ValueError):
            StreamServerConfig(tmp_path, **options)


def test_split_shard_adds_a_shard_that_subscriptions_read_from_its_start(tmp_path: Path) -> None:
    store = StreamStore(tmp_path, sync=False)
    try:
        (shard,) = store.create_stream("s", 1, 0, 1, 1).shard_ids
        store.create_subscription(SubscriptionInfo("early", "s", 5, 100, EARLIEST, 1))
        store.append("s", shard, 2, b"x")
        store.create_subscription(SubscriptionInfo("late", "s", 5, 100, LATEST, 1))
        kept, added = store.split_shard("s", shard)
        assert (kept.shard_id, kept.start, kept.epoch) == (shard, 0, 1)
        assert added.start == kept.end + 1 and added.end == 2**128 - 1 and added.shard_id != shard
        assert store.shards("s") == [kept, added]
        assert store.get_stream("s").shard_ids == (shard, added.shard_id)
        assert store.positions("early")[added.shard_id] == (0, 0)
        assert store.positions("late")[added.shard_id] == (0, 0)  # empty when added: nothing to skip
        assert store.append("s", added.shard_id, 1, b"y") > 0
        # refused splits change nothing
        for stream, shard_id, error in (("nope", shard, ResourceNotFound), ("s", 999, ResourceNotFound)):
            with pytest.raises(error):
                store.split_shard(stream, shard_id)
        with pytest.raises(InvalidArgument):
            store.split_shard("", shard)
        assert store.shards("s") == [kept, added]
    finally:
        store.close()


def test_split_shard_over_grpc_and_after_a_restart(stream_server_config: StreamServerConfig) -> None:
    from diffstore.streams.client import StreamClient, StreamNotFound

    with ServerThread(stream_server_config) as server, StreamClient(server.url) as client:
        client.create_stream("s", shard_count=2)
        client.create_subscription("sub", "s")
        first, second = client.list_shards("s")
        shards = client.split_shard("s", second.shard_id)
        assert [s.shard_id for s in shards[:2]] == [first.shard_id, second.shard_id] and len(shards) == 3
        assert shards[1].end_hash + 1 == shards[2].start_hash and shards[2].end_hash == second.end_hash
        assert client.list_shards("s") == shards
        with pytest.raises(StreamNotFound):
            client.split_shard("s", 12345)
        with pytest.raises(StreamNotFound):
            client.split_shard("missing", first.shard_id)
        assert client.list_shards("s") == shards
    restarted = dataclasses.replace(stream_server_config, port=0)
    with ServerThread(restarted) as server, StreamClient(server.url) as client:
        assert client.list_shards("s") == shards
        offsets = client.get_subscription("sub").offsets
        assert sorted(o.shardId for o in offsets) == sorted(s.shard_id for s in shards)
