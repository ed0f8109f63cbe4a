"""StreamClient: URL parsing, lookups and gRPC status codes as stream errors (embedded server)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from diffstore.streams.client import (
    DEFAULT_PORT,
    StreamAlreadyExists,
    StreamClient,
    StreamClientConfig,
    StreamNotFound,
    StreamPreconditionFailed,
    StreamUrl,
)
from diffstore.streams.sharding import shard_ranges


def test_urls() -> None:
    assert StreamUrl.parse("hstream://example.com") == StreamUrl("example.com", DEFAULT_PORT, tls=False)
    assert StreamUrl.parse("hstreams://10.0.0.1:7000") == StreamUrl("10.0.0.1", 7000, tls=True)
    assert StreamUrl.parse("hstream://[::1]:6571").address == "[::1]:6571"
    for bad in ("http://x", "hstream://", "x:6570"):
        with pytest.raises(ValueError):
            StreamUrl.parse(bad)
    with pytest.raises(ValueError):
        StreamClientConfig("hstream://x", timeout_s=0)


@pytest.fixture
def client(stream_server: Any) -> Iterator[StreamClient]:
    with StreamClient(stream_server.url) as stream_client:
        yield stream_client


def test_lookups_return_the_advertised_node(client: StreamClient, stream_server: Any) -> None:
    assert client.echo("hi") == "hi"
    nodes = client.describe_cluster().serverNodes
    assert [f"{n.host}:{n.port}" for n in nodes] == [stream_server.address]
    client.create_stream("s", shard_count=3)
    client.create_subscription("sub", "s")
    shards = client.list_shards("s")
    assert [(s.start_hash, s.end_hash) for s in shards] == shard_ranges(3)
    assert {client.lookup_shard(s.shard_id) for s in shards} == {stream_server.address}
    assert client.lookup_subscription("sub") == stream_server.address
    assert [s.streamName for s in client.list_streams()] == ["s"]
    assert client.get_stream("s").shardCount == 3
    assert client.subscription_exists("sub") and not client.subscription_exists("other")
    assert [s.subscriptionId for s in client.list_subscriptions()] == ["sub"]


def test_status_codes_become_stream_errors(client: StreamClient) -> None:
    with pytest.raises(StreamNotFound) as missing:
        client.get_stream("nope")
    assert missing.value.code == "NOT_FOUND" and missing.value.__cause__ is not None
    client.create_stream("s")
    with pytest.raises(StreamAlreadyExists):
        client.create_stream("s")
    with pytest.raises(StreamPreconditionFailed):
        client.create_subscription("sub", "missing-stream")
    client.create_subscription("sub", "s")
    with pytest.raises(StreamPreconditionFailed):
        client.delete_stream("s")
    client.delete_subscription("sub")
    client.delete_stream("s")
    with pytest.raises(StreamNotFound):
        client.delete_subscription("sub")
    client.delete_stream("s", ignore_non_exist=True)
