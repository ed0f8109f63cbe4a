"""Hostile input to the embedded stream server over real gRPC: every refusal has its status code, and
nothing changed behind it (no stream, subscription or batch appeared, no tail moved)."""

from __future__ import annotations

import dataclasses
import gzip
import logging
import os
from collections.abc import Callable, Iterator
from typing import Any

import grpc
import pytest
import zstandard
from test_server_grpc import append, batch, code_of, make_stream, payloads_of, subscribe

from diffstore.streams._proto import hstream_pb2 as pb
from diffstore.streams._proto import hstream_pb2_grpc as pb_grpc
from diffstore.streams.server import ServerThread, StreamServerConfig
from tests.helpers import wait_until

Stub = pb_grpc.HStreamApiStub
INVALID = grpc.StatusCode.INVALID_ARGUMENT
SERVICE = "/hstream.server.HStreamApi/"


def state(stub: Stub) -> tuple[Any, ...]:
    """Everything a refused call must leave as it was: streams, shards and their tails, subscriptions."""
    streams = sorted(s.streamName for s in stub.ListStreams(pb.ListStreamsRequest()).streams)
    tails = []
    for name in streams:
        for shard in stub.ListShards(pb.ListShardsRequest(streamName=name)).shards:
            tail = stub.GetTailRecordId(pb.GetTailRecordIdRequest(streamName=name, shardId=shard.shardId))
            tails.append((name, shard.shardId, tail.tailRecordId.batchId, tail.tailRecordId.batchIndex))
    subs = sorted(
        s.subscriptionId for s in stub.ListSubscriptions(pb.ListSubscriptionsRequest()).subscription
    )
    return streams, tails, subs


@pytest.fixture
def small_limits(stream_server_config: StreamServerConfig) -> Iterator[tuple[ServerThread, Stub]]:
    """A server whose Append admits at most 1,000 records and 1 MiB decompressed per batch."""
    config = dataclasses.replace(stream_server_config, max_batch_records=1000, max_batch_bytes=1 << 20)
    with ServerThread(config) as server, grpc.insecure_channel(server.address) as channel:
        yield server, pb_grpc.HStreamApiStub(channel)


def _records(count: int, size: int = 1) -> bytes:
    return pb.BatchHStreamRecords(
        records=[pb.HStreamRecord(payload=b"x" * size) for _ in range(count)]
    ).SerializeToString()


def _bad_batches() -> dict[str, pb.BatchedRecord]:
    one = _records(1)
    bomb = b"\0" * (64 << 20)  # 64 MiB of zeros: ~64 KiB gzipped, ~2 KiB with zstd
    return {
        "declares 3,000,000, holds 1": pb.BatchedRecord(batchSize=3_000_000, payload=one),
        "declares 2, holds 1": pb.BatchedRecord(batchSize=2, payload=one),
        "declares 1, holds 2": pb.BatchedRecord(batchSize=1, payload=_records(2)),
        "declares 0": pb.BatchedRecord(batchSize=0, payload=one),
        "above max_batch_records": pb.BatchedRecord(batchSize=1001, payload=_records(1001)),
        "no payload": pb.BatchedRecord(batchSize=1),
        "not records": pb.BatchedRecord(batchSize=1, payload=b"\xff\xff\xff"),
        "corrupt gzip": pb.BatchedRecord(compressionType=1, batchSize=1, payload=gzip.compress(one)[:-9]),
        "corrupt zstd": pb.BatchedRecord(compressionType=2, batchSize=1, payload=b"\x28\xb5\x2f\xfd junk"),
        "gzip bomb": pb.BatchedRecord(compressionType=1, batchSize=1, payload=gzip.compress(bomb, 9)),
        "zstd bomb": pb.BatchedRecord(
            compressionType=2, batchSize=1, payload=zstandard.ZstdCompressor().compress(bomb)
        ),
        "unknown compression": pb.BatchedRecord(compressionType=7, batchSize=1, payload=one),  # type: ignore[arg-type]
    }


@pytest.mark.parametrize("case", list(_bad_batches()))
def test_an_append_whose_batch_does_not_hold_what_it_declares_is_invalid(
    small_limits: tuple[ServerThread, Stub], case: str
) -> None:
    _, stub = small_limits
    (shard,) = make_stream(stub)
    append(stub, shard, [b"before"])
    before = state(stub)
    request = pb.AppendRequest(streamName="s", shardId=shard, records=_bad_batches()[case])
    assert code_of(lambda: stub.Append(request)) == INVALID
    assert state(stub) == before
    # the server still serves, and a good batch right after gets the next id
    assert len(append(stub, shard, [b"a", b"b"]).recordIds) == 2


def test_batches_within_the_limits_are_accepted_in_every_compression(
    small_limits: tuple[ServerThread, Stub],
) -> None:
    _, stub = small_limits
    (shard,) = make_stream(stub)
    for compression in (0, 1, 2):
        ids = append(stub, shard, [b"p%d" % i for i in range(1000)], compression=compression).recordIds
        assert len(ids) == 1000


def test_a_stored_batch_that_cannot_be_decoded_is_skipped_and_the_subscription_moves_on(
    stream_server: ServerThread,
    hstream_stub: Stub,
    fetch_session: Any,
    caplog: pytest.LogCaptureFixture,
) -> None:
    stub = hstream_stub
    (shard,) = make_stream(stub)
    subscribe(stub, "sub", ack=1)  # 50 ms ack timeout
    good = append(stub, shard, [b"a1", b"a2"]).recordIds
    # a batch stored before Append checked batches (or damaged on disk): 3 declared records, a payload
    # that says gzip but is not
    corrupt = pb.BatchedRecord(compressionType=1, batchSize=3, payload=b"not gzip at all")
    store = stream_server.server._store
    assert store is not None
    bad_id = store.append("s", shard, 3, corrupt.SerializeToString())
    last = append(stub, shard, [b"c1"]).recordIds
    session = fetch_session("sub", "consumer")
    first = session.next()
    assert payloads_of(first) == [b"a1", b"a2"]
    session.ack(list(first.recordIds))
    broken = session.next()
    assert [r.batchId for r in broken.recordIds] == [bad_id] * 3
    session.ack([broken.recordIds[0]])  # a partial ack: the resend must decode the stored batch
    final = session.next()
    assert payloads_of(final) == [b"c1"]
    session.ack(list(final.recordIds))
    with caplog.at_level(logging.ERROR, logger="diffstore.streams.server.runtime"):

        def committed_past_the_bad_batch() -> bool:
            info = stub.GetSubscription(pb.GetSubscriptionRequest(id="sub"))
            return [o.batchId for o in info.offsets] == [last[0].batchId]

        wait_until(committed_past_the_bad_batch)
    assert any("cannot be decoded" in r.getMessage() for r in caplog.records)
    assert good[0].batchId < bad_id < last[0].batchId


NAMED_CALLS: dict[str, Callable[[Stub, str], Any]] = {
    "GetStream": lambda stub, n: stub.GetStream(pb.GetStreamRequest(name=n)),
    "DeleteStream": lambda stub, n: stub.DeleteStream(
        pb.DeleteStreamRequest(streamName=n, ignoreNonExist=True)
    ),
    "ListShards": lambda stub, n: stub.ListShards(pb.ListShardsRequest(streamName=n)),
    "CreateStream": lambda stub, n: stub.CreateStream(
        pb.Stream(streamName=n, replicationFactor=1, shardCount=1)
    ),
    "Append": lambda stub, n: stub.Append(pb.AppendRequest(streamName=n, records=batch([b"x"]))),
    "GetTailRecordId": lambda stub, n: stub.GetTailRecordId(
        pb.GetTailRecordIdRequest(streamName=n, shardId=1)
    ),
    "CreateSubscription": lambda stub, n: subscribe(stub, n),
    "CreateSubscription(stream)": lambda stub, n: subscribe(stub, "fresh", stream=n),
    "GetSubscription": lambda stub, n: stub.GetSubscription(pb.GetSubscriptionRequest(id=n)),
    "DeleteSubscription": lambda stub, n: stub.DeleteSubscription(
        pb.DeleteSubscriptionRequest(subscriptionId=n)
    ),
    "ListConsumers": lambda stub, n: stub.ListConsumers(pb.ListConsumersRequest(subscriptionId=n)),
}
BAD_NAMES = ["", "x" * 256, "a b", "ä", "../etc", "-leading-dash", "nul\0"]


@pytest.mark.parametrize("name", BAD_NAMES, ids=repr)
def test_bad_stream_and_subscription_names_are_invalid_everywhere(
    hstream_stub: Stub, fetch_session: Any, name: str
) -> None:
    stub = hstream_stub
    make_stream(stub)
    subscribe(stub, "sub")
    before = state(stub)
    for rpc, call in NAMED_CALLS.items():
        assert code_of(lambda call=call: call(stub, name)) == INVALID, rpc  # type: ignore[misc]
    assert fetch_session(name, "consumer").error().code() == INVALID
    exists = stub.CheckSubscriptionExist(pb.CheckSubscriptionExistRequest(subscriptionId=name))
    assert exists.exists is False
    assert state(stub) == before


@pytest.mark.parametrize("consumer", ["", "c" * 256])
def test_a_bad_consumer_name_is_invalid(hstream_stub: Stub, fetch_session: Any, consumer: str) -> None:
    make_stream(hstream_stub)
    subscribe(hstream_stub, "sub")
    assert fetch_session("sub", consumer).error().code() == INVALID
    consumers = hstream_stub.ListConsumers(pb.ListConsumersRequest(subscriptionId="sub")).consumers
    assert list(consumers) == []


@pytest.mark.parametrize("shards", [0, 1025, 1_000_000])
def test_a_shard_count_out_of_1_to_1024_is_invalid(hstream_stub: Stub, shards: int) -> None:
    before = state(hstream_stub)
    request = pb.Stream(streamName="wide", replicationFactor=1, shardCount=shards)
    assert code_of(lambda: hstream_stub.CreateStream(request)) == INVALID
    assert state(hstream_stub) == before


def test_1024_shards_are_accepted(hstream_stub: Stub) -> None:
    assert len(make_stream(hstream_stub, "wide", shards=1024)) == 1024


def _methods() -> list[Any]:
    return list(pb.DESCRIPTOR.services_by_name["HStreamApi"].methods)


UNDECODABLE = b"\x0a\xff\xff\xff\xff\x0f"  # field 1, length-delimited, with a length far past the end


@pytest.mark.parametrize("method", _methods(), ids=lambda m: m.name)
def test_an_undecodable_request_is_invalid_argument(
    stream_server: ServerThread, hstream_stub: Stub, method: Any
) -> None:
    make_stream(hstream_stub)
    before = state(hstream_stub)
    with grpc.insecure_channel(stream_server.address) as channel:
        code = raw_call(channel, method, UNDECODABLE)
    assert code == INVALID
    assert state(hstream_stub) == before


def test_an_undecodable_ack_ends_the_fetch_with_invalid_argument(
    stream_server: ServerThread, hstream_stub: Stub
) -> None:
    make_stream(hstream_stub)
    subscribe(hstream_stub, "sub")
    first = pb.StreamingFetchRequest(subscriptionId="sub", consumerName="c").SerializeToString()
    with grpc.insecure_channel(stream_server.address) as channel:
        call = channel.stream_stream(SERVICE + "StreamingFetch")
        responses = call(iter([first, UNDECODABLE]), timeout=20)
        with pytest.raises(grpc.RpcError) as info:
            for _ in responses:
                pass
    assert info.value.code() == INVALID  # type: ignore[attr-defined]
    consumers = hstream_stub.ListConsumers(pb.ListConsumersRequest(subscriptionId="sub")).consumers
    assert list(consumers) == []


def raw_call(channel: grpc.Channel, method: Any, raw: bytes) -> grpc.StatusCode:
    """Sends ``raw`` as the request of ``method``; returns the status (OK when it succeeded)."""
    path = SERVICE + method.name
    try:
        if method.client_streaming:
            for _ in channel.stream_stream(path)(iter([raw]), timeout=20):
                pass
        else:
            channel.unary_unary(path)(raw, timeout=20)
    except grpc.RpcError as exc:
        return exc.code()  # type: ignore[attr-defined, no-any-return]
    return grpc.StatusCode.OK


def test_an_append_past_the_map_is_resource_exhausted_and_the_store_stays_usable(
    stream_server_config: StreamServerConfig,
) -> None:
    config = dataclasses.replace(stream_server_config, map_size=1 << 20)
    with ServerThread(config) as server, grpc.insecure_channel(server.address) as channel:
        stub = pb_grpc.HStreamApiStub(channel)
        (shard,) = make_stream(stub)
        append(stub, shard, [b"small"])
        before = state(stub)
        huge = pb.AppendRequest(streamName="s", shardId=shard, records=batch([os.urandom(2 << 20)]))
        with pytest.raises(grpc.RpcError) as info:
            stub.Append(huge)
        assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED  # type: ignore[attr-defined]
        assert "map is full" in info.value.details()  # type: ignore[attr-defined]
        assert state(stub) == before
        assert len(append(stub, shard, [b"again"]).recordIds) == 1
        stub.DeleteStream(pb.DeleteStreamRequest(streamName="s", force=True))
        assert state(stub) == ([], [], [])
