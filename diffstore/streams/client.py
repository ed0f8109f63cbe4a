"""A synchronous HStream client: URL parsing, cluster discovery, lookups, admin calls and Append.

``hstream://host[:port]`` (plaintext) and ``hstreams://host[:port]`` (TLS), default port 6570. Like the
official clients, :class:`StreamClient` calls DescribeCluster on the URL's node first, then asks a Lookup
RPC which node owns a shard or subscription and dials the ``host:port`` it returns. Channels are cached
per address. Calls wait for a channel that is (re)connecting (gRPC ``wait_for_ready``) up to their deadline
instead of failing at once, so a restarting server is ridden out.

``grpc.RpcError`` is translated here, and only here, into :class:`StreamError` subclasses
(``raise … from exc``); callers above never see gRPC exceptions.

    StreamError
    ├── StreamNotFound ............ NOT_FOUND
    ├── StreamAlreadyExists ....... ALREADY_EXISTS
    ├── StreamPreconditionFailed .. FAILED_PRECONDITION
    ├── StreamInvalidArgument ..... INVALID_ARGUMENT
    └── StreamUnavailable ......... UNAVAILABLE, DEADLINE_EXCEEDED, CANCELLED (retryable)
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar, cast
from urllib.parse import urlsplit

import grpc
from google.protobuf import empty_pb2

from diffstore.streams import DEFAULT_PORT as DEFAULT_PORT
from diffstore.streams._proto import hstream_pb2 as pb
from diffstore.streams._proto import hstream_pb2_grpc as pb_grpc
from diffstore.streams.records import RecordId, record_ids_from_protos
from diffstore.streams.sharding import SPLIT_SHARD_METHOD, ShardMap

_T = TypeVar("_T")
_CHANNEL_OPTIONS = [
    ("grpc.max_send_message_length", 256 * 1024 * 1024),
    ("grpc.max_receive_message_length", 256 * 1024 * 1024),
    # gRPC's own reconnect back-off grows to 120 s: a channel to a server that was away for a few minutes
    # would stay down that long after it is back. Bounded as the commands' retry policy (diffstore.backoff).
    ("grpc.initial_reconnect_backoff_ms", 200),
    ("grpc.max_reconnect_backoff_ms", 5_000),
]


class StreamError(Exception):
    """A failed HStream call; ``code`` is the gRPC status name (``"NOT_FOUND"``, ...)."""

    code: str = "UNKNOWN"
    retryable: bool = False

    def __init__(self, message: str, code: str | None = None) -> None:
        super().__init__(message)
        if code is not None:
            self.code = code


class StreamNotFound(StreamError):
    code = "NOT_FOUND"


class StreamAlreadyExists(StreamError):
    code = "ALREADY_EXISTS"


class StreamPreconditionFailed(StreamError):
    code = "FAILED_PRECONDITION"


class StreamInvalidArgument(StreamError):
    code = "INVALID_ARGUMENT"


class StreamUnavailable(StreamError):
    code = "UNAVAILABLE"
    retryable = True


_ERRORS_BY_STATUS: dict[grpc.StatusCode, type[StreamError]] = {
    grpc.StatusCode.NOT_FOUND: StreamNotFound,
    grpc.StatusCode.ALREADY_EXISTS: StreamAlreadyExists,
    grpc.StatusCode.FAILED_PRECONDITION: StreamPreconditionFailed,
    grpc.StatusCode.INVALID_ARGUMENT: StreamInvalidArgument,
    grpc.StatusCode.UNAVAILABLE: StreamUnavailable,
    grpc.StatusCode.DEADLINE_EXCEEDED: StreamUnavailable,
    grpc.StatusCode.CANCELLED: StreamUnavailable,
}


def translate_rpc_error(exc: grpc.RpcError, what: str) -> StreamError:
    """The :class:`StreamError` for a failed call (``what`` names the call for the message)."""
    status = exc.code() if isinstance(exc, grpc.Call) else grpc.StatusCode.UNKNOWN
    details = exc.details() if isinstance(exc, grpc.Call) else str(exc)
    cls = _ERRORS_BY_STATUS.get(status, StreamError)
    return cls(f"{what}: {status.name} {details or ''}".strip(), code=status.name)


@contextlib.contextmanager
def map_rpc_errors(what: str) -> Iterator[None]:
    """Translates ``grpc.RpcError`` raised inside the block into a :class:`StreamError`."""
    try:
        yield
    except grpc.RpcError as exc:
        raise translate_rpc_error(exc, what) from exc


@dataclass(frozen=True, slots=True)
class StreamUrl:
    """A parsed ``hstream://`` / ``hstreams://`` URL."""

    host: str
    port: int
    tls: bool

    @classmethod
    def parse(cls, url: str) -> StreamUrl:
        parts = urlsplit(url)
        if parts.scheme not in ("hstream", "hstreams"):
            raise ValueError(f"not an hstream URL: {url!r} (hstream://host[:port] or hstreams://)")
        if not parts.hostname:
            raise ValueError(f"no host in {url!r}")
        return cls(parts.hostname, parts.port or DEFAULT_PORT, parts.scheme == "hstreams")

    @property
    def address(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


@dataclass(frozen=True, slots=True)
class StreamClientConfig:
    """How to reach a cluster.

    Attributes:
        url: ``hstream://host[:port]`` or ``hstreams://host[:port]``.
        timeout_s: deadline of each unary call.
        root_certificates: PEM roots for TLS (``None``: the system's).
    """

    url: str
    timeout_s: float = 30.0
    root_certificates: bytes | None = None

    def __post_init__(self) -> None:
        StreamUrl.parse(self.url)
        if self.timeout_s <= 0:
            raise ValueError("timeout_s must be > 0")


@dataclass(frozen=True, slots=True)
class ShardInfo:
    stream_name: str
    shard_id: int
    start_hash: int
    end_hash: int


class StreamClient:
    """Admin calls, Append and the StreamingFetch call of one HStream cluster; thread-safe."""

    def __init__(self, config: StreamClientConfig | str) -> None:
        self.config = StreamClientConfig(config) if isinstance(config, str) else config
        self._url = StreamUrl.parse(self.config.url)
        self._lock = threading.Lock()
        self._channels: dict[str, grpc.Channel] = {}
        self._stubs: dict[str, pb_grpc.HStreamApiStub] = {}
        self._shard_nodes: dict[int, str] = {}
        self._cluster_checked = False

    # -- plumbing ------------------------------------------------------------------------------------------

    def _stub(self, address: str) -> pb_grpc.HStreamApiStub:
        with self._lock:
            stub = self._stubs.get(address)
            if stub is None:
                if self._url.tls:
                    creds = grpc.ssl_channel_credentials(root_certificates=self.config.root_certificates)
                    channel = grpc.secure_channel(address, creds, options=_CHANNEL_OPTIONS)
                else:
                    channel = grpc.insecure_channel(address, options=_CHANNEL_OPTIONS)
                self._channels[address] = channel
                stub = self._stubs[address] = pb_grpc.HStreamApiStub(channel)
            return stub

    def _call(self, what: str, fn: Callable[..., _T], request: Any) -> _T:
        with map_rpc_errors(what):
            return fn(request, timeout=self.config.timeout_s, wait_for_ready=True)

    @property
    def _seed(self) -> pb_grpc.HStreamApiStub:
        if not self._cluster_checked:
            self.describe_cluster()
        return self._stub(self._url.address)

    @staticmethod
    def _node_address(node: pb.ServerNode) -> str:
        host = node.host
        return f"[{host}]:{node.port}" if ":" in host else f"{host}:{node.port}"

    def close(self) -> None:
        """Closes every channel."""
        with self._lock:
            channels = list(self._channels.values())
            self._channels.clear()
            self._stubs.clear()
        for channel in channels:
            channel.close()

    def __enter__(self) -> StreamClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- cluster and lookups -------------------------------------------------------------------------------

    def check_reachable(self, timeout_s: float) -> None:
        """Raises :class:`StreamUnavailable` unless the URL's node takes a connection within ``timeout_s``.

        Calls wait for a (re)connecting channel up to their whole deadline, which rides out a restart but
        makes a command against a server that is not there wait that long to say so; a command checks
        first, briefly.
        """
        self._stub(self._url.address)
        ready = grpc.channel_ready_future(self._channels[self._url.address])
        try:
            ready.result(timeout=timeout_s)
        except grpc.FutureTimeoutError:
            hint = ""
            if self._url.tls:  # gRPC says nothing of a failed handshake but a log line: say what to check
                hint = (
                    " (hstreams://: or the TLS handshake failed: is the server's certificate signed by an"
                    " authority given with --hstream-ca-file, or by one this machine trusts?)"
                )
            raise StreamUnavailable(
                f"no connection to {self._url.address} within {timeout_s:g} s{hint}", code="UNAVAILABLE"
            ) from None
        finally:
            ready.cancel()

    def echo(self, message: str) -> str:
        return self._call("Echo", self._stub(self._url.address).Echo, pb.EchoRequest(msg=message)).msg

    def describe_cluster(self) -> pb.DescribeClusterResponse:
        """DescribeCluster on the URL's node (the first call any client makes)."""
        stub = self._stub(self._url.address)
        response = self._call("DescribeCluster", stub.DescribeCluster, empty_pb2.Empty())
        self._cluster_checked = True
        return response

    def lookup_shard(self, shard_id: int) -> str:
        """The ``host:port`` of the node owning ``shard_id`` (cached)."""
        cached = self._shard_nodes.get(shard_id)
        if cached is not None:
            return cached
        response = self._call("LookupShard", self._seed.LookupShard, pb.LookupShardRequest(shardId=shard_id))
        address = self._shard_nodes[shard_id] = self._node_address(response.serverNode)
        return address

    def forget_shard(self, shard_id: int) -> None:
        """Drops a cached lookup (after a failure, so the next call looks up again)."""
        self._shard_nodes.pop(shard_id, None)

    def lookup_subscription(self, subscription_id: str) -> str:
        """The ``host:port`` of the node serving ``subscription_id``."""
        request = pb.LookupSubscriptionRequest(subscriptionId=subscription_id)
        response = self._call("LookupSubscription", self._seed.LookupSubscription, request)
        return self._node_address(response.serverNode)

    # -- streams -------------------------------------------------------------------------------------------

    def create_stream(
        self, name: str, shard_count: int = 1, replication_factor: int = 1, backlog_duration_s: int = 0
    ) -> pb.Stream:
        request = pb.Stream(
            streamName=name,
            shardCount=shard_count,
            replicationFactor=replication_factor,
            backlogDuration=backlog_duration_s,
        )
        return self._call("CreateStream", self._seed.CreateStream, request)

    def delete_stream(self, name: str, *, force: bool = False, ignore_non_exist: bool = False) -> None:
        request = pb.DeleteStreamRequest(streamName=name, force=force, ignoreNonExist=ignore_non_exist)
        self._call("DeleteStream", self._seed.DeleteStream, request)

    def get_stream(self, name: str) -> pb.Stream:
        return self._call("GetStream", self._seed.GetStream, pb.GetStreamRequest(name=name)).stream

    def list_streams(self) -> list[pb.Stream]:
        return list(self._call("ListStreams", self._seed.ListStreams, pb.ListStreamsRequest()).streams)

    def list_shards(self, stream_name: str) -> list[ShardInfo]:
        request = pb.ListShardsRequest(streamName=stream_name)
        shards = self._call("ListShards", self._seed.ListShards, request).shards
        return [
            ShardInfo(s.streamName, s.shardId, int(s.startHashRangeKey), int(s.endHashRangeKey))
            for s in shards
        ]

    def split_shard(self, stream_name: str, shard_id: int) -> list[ShardInfo]:
        """Adds a shard to ``stream_name`` by splitting ``shard_id``'s hash range in two; returns the
        stream's shards after the split. Beyond HStream: only diffstore's embedded server has it
        (HStreamDB answers UNIMPLEMENTED, raised as :class:`StreamError`)."""
        self._seed  # noqa: B018 - opens the seed node's channel (after DescribeCluster, as every call)
        with self._lock:
            channel = self._channels[self._url.address]
        split = channel.unary_unary(
            SPLIT_SHARD_METHOD,
            request_serializer=pb.Shard.SerializeToString,
            response_deserializer=pb.ListShardsResponse.FromString,
        )
        shards = self._call("SplitShard", split, pb.Shard(streamName=stream_name, shardId=shard_id)).shards
        return [
            ShardInfo(s.streamName, s.shardId, int(s.startHashRangeKey), int(s.endHashRangeKey))
            for s in shards
        ]

    def shard_map(self, stream_name: str) -> ShardMap:
        """The hash-range map of ``stream_name`` (for picking a shard by partition key)."""
        shards = self.list_shards(stream_name)
        return ShardMap.from_ranges((s.shard_id, s.start_hash, s.end_hash) for s in shards)

    def get_tail_record_id(self, stream_name: str, shard_id: int) -> RecordId:
        request = pb.GetTailRecordIdRequest(streamName=stream_name, shardId=shard_id)
        stub = self._stub(self.lookup_shard(shard_id))
        return RecordId.from_proto(self._call("GetTailRecordId", stub.GetTailRecordId, request).tailRecordId)

    def append(self, stream_name: str, shard_id: int, batch: pb.BatchedRecord) -> list[RecordId]:
        """Appends one batch to one shard on the shard's node; returns the records' ids in order."""
        request = pb.AppendRequest(streamName=stream_name, shardId=shard_id, records=batch)
        stub = self._stub(self.lookup_shard(shard_id))
        try:
            response = self._call("Append", stub.Append, request)
        except StreamError:
            self.forget_shard(shard_id)
            raise
        return record_ids_from_protos(response.recordIds)

    # -- subscriptions -------------------------------------------------------------------------------------

    def create_subscription(
        self,
        subscription_id: str,
        stream_name: str,
        *,
        ack_timeout_s: int = 600,
        max_unacked_records: int = 10_000,
        offset: int = pb.EARLIEST,
    ) -> pb.Subscription:
        request = pb.Subscription(
            subscriptionId=subscription_id,
            streamName=stream_name,
            ackTimeoutSeconds=ack_timeout_s,
            maxUnackedRecords=max_unacked_records,
            offset=cast(Any, offset),
        )
        return self._call("CreateSubscription", self._seed.CreateSubscription, request)

    def get_subscription(self, subscription_id: str) -> pb.GetSubscriptionResponse:
        request = pb.GetSubscriptionRequest(id=subscription_id)
        return self._call("GetSubscription", self._seed.GetSubscription, request)

    def list_subscriptions(self) -> list[pb.Subscription]:
        request = pb.ListSubscriptionsRequest()
        return list(self._call("ListSubscriptions", self._seed.ListSubscriptions, request).subscription)

    def subscription_exists(self, subscription_id: str) -> bool:
        request = pb.CheckSubscriptionExistRequest(subscriptionId=subscription_id)
        return self._call("CheckSubscriptionExist", self._seed.CheckSubscriptionExist, request).exists

    def delete_subscription(self, subscription_id: str, *, force: bool = False) -> None:
        request = pb.DeleteSubscriptionRequest(subscriptionId=subscription_id, force=force)
        self._call("DeleteSubscription", self._seed.DeleteSubscription, request)

    def list_consumers(self, subscription_id: str) -> list[pb.Consumer]:
        request = pb.ListConsumersRequest(subscriptionId=subscription_id)
        return list(self._call("ListConsumers", self._seed.ListConsumers, request).consumers)

    def streaming_fetch(self, subscription_id: str, requests: Iterator[pb.StreamingFetchRequest]) -> Any:
        """Opens StreamingFetch on the subscription's node; returns the gRPC response iterator/call.

        The caller iterates it inside :func:`map_rpc_errors` and may ``cancel()`` it.
        """
        stub = self._stub(self.lookup_subscription(subscription_id))
        with map_rpc_errors("StreamingFetch"):
            return stub.StreamingFetch(requests, wait_for_ready=True)
