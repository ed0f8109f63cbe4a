"""The embedded server over real gRPC on 127.0.0.1: admin RPCs, appends, StreamingFetch, status codes."""

from __future__ import annotations

import gzip
from collections.abc import Callable
from typing import Any

import grpc
import pytest
import zstandard
from google.protobuf import empty_pb2

from diffstore.streams._proto import hstream_pb2 as pb
from diffstore.streams._proto import hstream_pb2_grpc as pb_grpc
from diffstore.streams.server import ServerThread
from diffstore.streams.sharding import HASH_SPACE_MAX, key_hash
from tests.helpers import wait_until

Stub = pb_grpc.HStreamApiStub
RAW, JSON = 1, 0


def batch(payloads: list[bytes], key: str = "", compression: int = 0) -> pb.BatchedRecord:
    records = pb.BatchHStreamRecords(
        records=[
            pb.HStreamRecord(header=pb.HStreamRecordHeader(flag=RAW, key=key), payload=p) for p in payloads
        ]
    ).SerializeToString()
    if compression == 1:
        records = gzip.compress(records)
    elif compression == 2:
        records = zstandard.ZstdCompressor().compress(records)
    return pb.BatchedRecord(compressionType=compression, batchSize=len(payloads), payload=records)  # type: ignore[arg-type]


def payloads_of(received: pb.ReceivedRecord) -> list[bytes]:
    raw = received.record.payload
    if received.record.compressionType == 1:
        raw = gzip.decompress(raw)
    elif received.record.compressionType == 2:
        raw = zstandard.ZstdDecompressor().decompressobj().decompress(raw)
    records = pb.BatchHStreamRecords.FromString(raw).records
    assert len(records) == len(received.recordIds) == received.record.batchSize
    return [r.payload for r in records]


def code_of(call: Callable[[], Any]) -> grpc.StatusCode:
    with pytest.raises(grpc.RpcError) as info:
        call()
    return info.value.code()  # type: ignore[attr-defined, no-any-return]


def make_stream(stub: Stub, name: str = "s", shards: int = 1) -> list[int]:
    stub.CreateStream(pb.Stream(streamName=name, replicationFactor=1, shardCount=shards))
    return [s.shardId for s in stub.ListShards(pb.ListShardsRequest(streamName=name)).shards]


def subscribe(
    stub: Stub, sub: str, stream: str = "s", ack: int = 1000, max_unacked: int = 10000, latest: bool = False
):
    return stub.CreateSubscription(
        pb.Subscription(
            subscriptionId=sub, streamName=stream, ackTimeoutSeconds=ack, maxUnackedRecords=max_unacked,
            offset=1 if latest else 0,  # type: ignore[arg-type]
        )
    )  # fmt: skip


def append(stub: Stub, shard: int, payloads: list[bytes], stream: str = "s", **kw: Any) -> pb.AppendResponse:
    return stub.Append(pb.AppendRequest(streamName=stream, shardId=shard, records=batch(payloads, **kw)))


def test_cluster_and_lookups_advertise_the_reachable_address(
    stream_server: ServerThread, hstream_stub: Stub
) -> None:
    host, port = stream_server.address.rsplit(":", 1)
    cluster = hstream_stub.DescribeCluster(empty_pb2.Empty())
    assert [(n.host, n.port) for n in cluster.serverNodes] == [(host, int(port))]
    assert cluster.serverNodesStatus[0].state == pb.Running
    assert hstream_stub.Echo(pb.EchoRequest(msg="hi")).msg == "hi"
    for node in (
        hstream_stub.LookupShard(pb.LookupShardRequest(shardId=7)).serverNode,
        hstream_stub.LookupSubscription(pb.LookupSubscriptionRequest(subscriptionId="x")).serverNode,
        hstream_stub.LookupResource(pb.LookupResourceRequest(resType=pb.ResStream, resId="s")),
        hstream_stub.LookupKey(pb.LookupKeyRequest(partitionKey="k")),
    ):
        assert (node.host, node.port) == (host, int(port))


def test_streams_and_shards(hstream_stub: Stub) -> None:
    created = hstream_stub.CreateStream(pb.Stream(streamName="s", replicationFactor=1, shardCount=3))
    assert created.shardCount == 3 and created.creationTime.seconds > 0
    shards = hstream_stub.ListShards(pb.ListShardsRequest(streamName="s")).shards
    ranges = [(int(s.startHashRangeKey), int(s.endHashRangeKey)) for s in shards]
    cnt = HASH_SPACE_MAX // 3
    assert ranges == [(0, cnt - 1), (cnt, 2 * cnt - 1), (2 * cnt, HASH_SPACE_MAX)]
    assert len({s.shardId for s in shards}) == 3 and all(s.isActive for s in shards)
    assert any(start <= key_hash("") <= end for start, end in ranges)
    assert hstream_stub.GetStream(pb.GetStreamRequest(name="s")).stream.streamName == "s"
    make_stream(hstream_stub, "t")
    assert [s.streamName for s in hstream_stub.ListStreams(pb.ListStreamsRequest()).streams] == ["s", "t"]
    hstream_stub.DeleteStream(pb.DeleteStreamRequest(streamName="t"))
    assert [s.streamName for s in hstream_stub.ListStreams(pb.ListStreamsRequest()).streams] == ["s"]


def test_status_codes(hstream_stub: Stub, fetch_session: Any) -> None:
    stub = hstream_stub
    (shard,) = make_stream(stub)
    assert code_of(lambda: make_stream(stub)) == grpc.StatusCode.ALREADY_EXISTS
    assert code_of(lambda: stub.GetStream(pb.GetStreamRequest(name="nope"))) == grpc.StatusCode.NOT_FOUND
    assert (
        code_of(lambda: stub.ListShards(pb.ListShardsRequest(streamName="nope"))) == grpc.StatusCode.NOT_FOUND
    )
    nope = pb.DeleteStreamRequest(streamName="nope")
    assert code_of(lambda: stub.DeleteStream(nope)) == grpc.StatusCode.NOT_FOUND
    stub.DeleteStream(pb.DeleteStreamRequest(streamName="nope", ignoreNonExist=True))
    bad = pb.Stream(streamName="bad name", replicationFactor=1, shardCount=1)
    assert code_of(lambda: stub.CreateStream(bad)) == grpc.StatusCode.INVALID_ARGUMENT
    zero = pb.Stream(streamName="z", replicationFactor=1, shardCount=0)
    assert code_of(lambda: stub.CreateStream(zero)) == grpc.StatusCode.INVALID_ARGUMENT
    empty = pb.AppendRequest(streamName="s", shardId=shard, records=pb.BatchedRecord(batchSize=0))
    assert code_of(lambda: stub.Append(empty)) == grpc.StatusCode.INVALID_ARGUMENT
    assert code_of(lambda: append(stub, shard, [b"x"], stream="nope")) == grpc.StatusCode.NOT_FOUND
    assert code_of(lambda: append(stub, shard + 100, [b"x"])) == grpc.StatusCode.NOT_FOUND
    assert code_of(lambda: subscribe(stub, "sub", stream="nope")) == grpc.StatusCode.FAILED_PRECONDITION
    assert code_of(lambda: subscribe(stub, "sub", ack=0)) == grpc.StatusCode.INVALID_ARGUMENT
    subscribe(stub, "sub")
    assert code_of(lambda: subscribe(stub, "sub")) == grpc.StatusCode.ALREADY_EXISTS
    missing = pb.GetSubscriptionRequest(id="nope")
    assert code_of(lambda: stub.GetSubscription(missing)) == grpc.StatusCode.NOT_FOUND
    gone = pb.DeleteSubscriptionRequest(subscriptionId="nope")
    assert code_of(lambda: stub.DeleteSubscription(gone)) == grpc.StatusCode.NOT_FOUND
    assert fetch_session("nope", "c").error().code() == grpc.StatusCode.NOT_FOUND
    assert code_of(lambda: stub.DeleteStream(pb.DeleteStreamRequest(streamName="s"))) == (
        grpc.StatusCode.FAILED_PRECONDITION
    )
    first = fetch_session("sub", "c")
    append(stub, shard, [b"x"])
    first.collect(1)
    assert fetch_session("sub", "c").error().code() == grpc.StatusCode.ALREADY_EXISTS
    consumers = stub.ListConsumers(pb.ListConsumersRequest(subscriptionId="sub")).consumers
    assert [c.name for c in consumers] == ["c"]
    busy = pb.DeleteSubscriptionRequest(subscriptionId="sub")
    assert code_of(lambda: stub.DeleteSubscription(busy)) == grpc.StatusCode.FAILED_PRECONDITION
    stub.DeleteSubscription(pb.DeleteSubscriptionRequest(subscriptionId="sub", force=True))
    assert first.error().code() == grpc.StatusCode.NOT_FOUND
    assert not stub.CheckSubscriptionExist(pb.CheckSubscriptionExistRequest(subscriptionId="sub")).exists


def test_force_deleting_a_stream_removes_its_subscriptions(hstream_stub: Stub, fetch_session: Any) -> None:
    (shard,) = make_stream(hstream_stub)
    subscribe(hstream_stub, "sub")
    session = fetch_session("sub", "c")
    append(hstream_stub, shard, [b"x"])
    session.collect(1)
    hstream_stub.DeleteStream(pb.DeleteStreamRequest(streamName="s", force=True))
    assert session.error().code() == grpc.StatusCode.NOT_FOUND
    assert not hstream_stub.CheckSubscriptionExist(
        pb.CheckSubscriptionExistRequest(subscriptionId="sub")
    ).exists
    assert list(hstream_stub.ListSubscriptions(pb.ListSubscriptionsRequest()).subscription) == []


def test_append_ids_and_tail(hstream_stub: Stub) -> None:
    shard, other = make_stream(hstream_stub, shards=2)
    tail = hstream_stub.GetTailRecordId(pb.GetTailRecordIdRequest(streamName="s", shardId=shard)).tailRecordId
    assert (tail.shardId, tail.batchId, tail.batchIndex) == (shard, 0, 0)
    first = append(hstream_stub, shard, [b"a", b"b", b"c"]).recordIds
    assert [(r.shardId, r.batchIndex) for r in first] == [(shard, 0), (shard, 1), (shard, 2)]
    assert len({r.batchId for r in first}) == 1
    append(hstream_stub, other, [b"z"])
    second = append(hstream_stub, shard, [b"d"]).recordIds
    assert second[0].batchId > first[0].batchId
    tail = hstream_stub.GetTailRecordId(pb.GetTailRecordIdRequest(streamName="s", shardId=shard)).tailRecordId
    assert (tail.batchId, tail.batchIndex) == (second[0].batchId, 0)


def test_fetch_in_order_and_ack_all(hstream_stub: Stub, fetch_session: Any) -> None:
    shards = make_stream(hstream_stub, shards=2)
    appended = {
        shard: [
            append(hstream_stub, shard, [b"%d-%d" % (shard, i)] * (i + 1), compression=i % 3)
            for i in range(5)
        ]
        for shard in shards
    }
    subscribe(hstream_stub, "sub")
    received = fetch_session("sub", "c").collect(30)
    for shard in shards:
        mine = [r for r in received if r.recordIds[0].shardId == shard]
        assert [r.recordIds[0].batchId for r in mine] == [a.recordIds[0].batchId for a in appended[shard]]
        assert [payloads_of(r) for r in mine] == [[b"%d-%d" % (shard, i)] * (i + 1) for i in range(5)]
        assert [r.record.compressionType for r in mine] == [i % 3 for i in range(5)]

    def committed() -> dict[int, int]:
        offsets = hstream_stub.GetSubscription(pb.GetSubscriptionRequest(id="sub")).offsets
        return {o.shardId: o.batchId for o in offsets}

    wait_until(lambda: committed() == {s: appended[s][-1].recordIds[0].batchId for s in shards})


def test_latest_starts_after_the_tail(hstream_stub: Stub, fetch_session: Any) -> None:
    (shard,) = make_stream(hstream_stub)
    append(hstream_stub, shard, [b"old"])
    subscribe(hstream_stub, "sub", latest=True)
    append(hstream_stub, shard, [b"new"])
    (received,) = fetch_session("sub", "c").collect(1)
    assert payloads_of(received) == [b"new"]


@pytest.mark.parametrize("compression", [0, 1, 2])
def test_unacked_records_are_resent_after_the_ack_timeout_only_those(
    hstream_stub: Stub, fetch_session: Any, compression: int
) -> None:
    (shard,) = make_stream(hstream_stub)
    subscribe(hstream_stub, "sub", ack=10)  # 10 units of 50 ms in the test config
    ids = append(hstream_stub, shard, [b"r0", b"r1", b"r2", b"r3"], compression=compression).recordIds
    session = fetch_session("sub", "c")
    first = session.next()
    assert list(first.recordIds) == list(ids)
    session.ack([ids[0], ids[2]])
    resent = session.next()
    assert list(resent.recordIds) == [ids[1], ids[3]]
    assert payloads_of(resent) == [b"r1", b"r3"]
    assert resent.record.compressionType == compression
    session.ack([ids[3], ids[3]])
    again = session.next()
    assert list(again.recordIds) == [ids[1]] and payloads_of(again) == [b"r1"]


def test_max_unacked_records_bounds_deliveries(hstream_stub: Stub, fetch_session: Any) -> None:
    (shard,) = make_stream(hstream_stub)
    subscribe(hstream_stub, "sub", max_unacked=2)
    batches = [append(hstream_stub, shard, [b"a", b"b"]).recordIds for _ in range(3)]
    session = fetch_session("sub", "c")
    first = session.next()
    assert list(first.recordIds) == list(batches[0])
    with pytest.raises(AssertionError):
        session.next(timeout=0.3)  # nothing more while 2 records are unacked (a bound, not a timing claim)
    session.ack(list(first.recordIds))
    assert list(session.next().recordIds) == list(batches[1])


def test_shards_are_split_between_consumers_and_move_when_one_leaves(
    hstream_stub: Stub, fetch_session: Any
) -> None:
    shards = make_stream(hstream_stub, shards=4)
    subscribe(hstream_stub, "sub")
    a = fetch_session("sub", "a")
    b = fetch_session("sub", "b")

    def consumers() -> list[str]:
        listed = hstream_stub.ListConsumers(pb.ListConsumersRequest(subscriptionId="sub")).consumers
        return sorted(c.name for c in listed)

    wait_until(lambda: consumers() == ["a", "b"])
    split: dict[str, set[int]] = {}
    for round_ in range(50):
        split = {"a": set(), "b": set()}
        for shard in shards:
            append(hstream_stub, shard, [b"%d" % round_])
        for name, session in (("a", a), ("b", b)):
            while True:
                try:
                    got = session.next(timeout=0.05)
                except AssertionError:
                    break
                split[name].add(got.recordIds[0].shardId)
                session.ack(list(got.recordIds))
        if (
            split["a"]
            and split["b"]
            and not split["a"] & split["b"]
            and split["a"] | split["b"] == set(shards)
        ):
            break
    assert split["a"] and split["b"] and not split["a"] & split["b"], split
    a.close()
    wait_until(lambda: consumers() == ["b"])
    for shard in shards:
        append(hstream_stub, shard, [b"after"])
    after = {r.recordIds[0].shardId for r in b.collect(4) if payloads_of(r) == [b"after"]}
    assert after == set(shards)


def test_concurrent_appends_get_distinct_increasing_ids_and_all_arrive(
    hstream_stub: Stub, fetch_session: Any
) -> None:
    from concurrent.futures import ThreadPoolExecutor

    shards = make_stream(hstream_stub, shards=2)

    def put(i: int) -> list[pb.RecordId]:
        return list(append(hstream_stub, shards[i % 2], [b"%d" % i]).recordIds)

    with ThreadPoolExecutor(max_workers=16) as pool:
        results = list(pool.map(put, range(64)))
    ids = [(r[0].shardId, r[0].batchId) for r in results]
    assert len(set(ids)) == 64
    subscribe(hstream_stub, "sub")
    received = fetch_session("sub", "c").collect(64)
    assert sorted(payloads_of(r)[0] for r in received) == sorted(b"%d" % i for i in range(64))
    for shard in shards:
        batch_ids = [r.recordIds[0].batchId for r in received if r.recordIds[0].shardId == shard]
        assert batch_ids == sorted(batch_ids) == sorted(b for s, b in ids if s == shard)
