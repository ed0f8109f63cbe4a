"""The gRPC face of the embedded server: ``HStreamApi`` RPCs as thin calls into the store and the
subscription runtimes. Errors end a call through ``errors.abort`` (the one mapping to gRPC statuses), from
``_call`` for unary RPCs and from StreamingFetch.

A request whose bytes do not decode reaches an RPC as :class:`Undecodable` (see ``app.register``) and is
answered INVALID_ARGUMENT; grpc would otherwise answer a failing deserializer with a bare UNKNOWN.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import grpc
from google.protobuf import empty_pb2, timestamp_pb2

from diffstore.errors import DiffstoreError
from diffstore.streams._proto import hstream_pb2 as pb
from diffstore.streams._proto import hstream_pb2_grpc as pb_grpc
from diffstore.streams.records import Compression

from . import codec
from .appender import GroupAppender
from .config import StreamServerConfig
from .errors import FailedPrecondition, InvalidArgument, ResourceNotFound, StreamServerError, abort
from .runtime import ConsumerInfo, Outbound, SubscriptionRuntime
from .store import MAX_NAME_LENGTH, AppendItem, StreamInfo, StreamStore, SubscriptionInfo, check_identifier
from .subscription import SubscriptionState

PROTOCOL_VERSION = "0.1.0"
_INLINE_CHECK_BYTES = 1 << 20  # larger or compressed batches are checked on a worker thread
R = TypeVar("R")
Handler = Callable[..., Awaitable[R]]


@dataclass(frozen=True, slots=True)
class Undecodable:
    """What the request deserializer hands an RPC for bytes that are not its request message."""

    message: str
    error: str

    def invalid(self) -> InvalidArgument:
        return InvalidArgument(f"undecodable {self.message}: {self.error}")


def _call(method: Handler[R]) -> Handler[R]:
    """Refuses undecodable requests and ends the call of a failing RPC with the error's status."""

    @functools.wraps(method)
    async def wrapper(self: HStreamServicer, request: Any, context: grpc.aio.ServicerContext) -> R:
        try:
            if isinstance(request, Undecodable):
                raise request.invalid()
            return await method(self, request, context)
        except (StreamServerError, DiffstoreError) as exc:
            await abort(context, exc)

    return wrapper


def _timestamp(ms: int) -> timestamp_pb2.Timestamp:
    stamp = timestamp_pb2.Timestamp()
    stamp.FromMilliseconds(ms)
    return stamp


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


def _stream_pb(info: StreamInfo) -> pb.Stream:
    return pb.Stream(
        streamName=info.name,
        replicationFactor=info.replication_factor,
        backlogDuration=info.backlog_duration,
        shardCount=len(info.shard_ids),
        creationTime=_timestamp(info.creation_ms),
    )


def _subscription_pb(info: SubscriptionInfo) -> pb.Subscription:
    return pb.Subscription(
        subscriptionId=info.subscription_id,
        streamName=info.stream_name,
        ackTimeoutSeconds=info.ack_timeout_seconds,
        maxUnackedRecords=info.max_unacked_records,
        offset=pb.SpecialOffset.Name(info.offset),
        creationTime=_timestamp(info.creation_ms),
    )


class HStreamServicer(pb_grpc.HStreamApiServicer):
    """``HStreamApi`` over one :class:`StreamStore`; one node that advertises ``host:port``."""

    def __init__(self, store: StreamStore, config: StreamServerConfig) -> None:
        self._store = store
        self._config = config
        self._runtimes: dict[str, SubscriptionRuntime] = {}
        self._appender = GroupAppender(store)
        self._started = time.monotonic()
        self.node = pb.ServerNode(id=1, host=config.public_host, port=config.port)

    def advertise(self, host: str, port: int) -> None:
        self.node = pb.ServerNode(
            id=1, host=host, port=port, version=pb.HStreamVersion(version=self._config.server_version)
        )

    async def close(self) -> None:
        for runtime in list(self._runtimes.values()):
            await runtime.close()
        self._runtimes.clear()
        self._appender.close()

    # -- cluster ----------------------------------------------------------------------------------------

    @_call
    async def Echo(self, request: pb.EchoRequest, context: grpc.aio.ServicerContext) -> pb.EchoResponse:
        return pb.EchoResponse(msg=request.msg)

    @_call
    async def DescribeCluster(
        self, request: Any, context: grpc.aio.ServicerContext
    ) -> pb.DescribeClusterResponse:
        return pb.DescribeClusterResponse(
            protocolVersion=PROTOCOL_VERSION,
            serverNodes=[self.node],
            serverNodesStatus=[pb.ServerNodeStatus(node=self.node, state=pb.Running)],
            clusterUpTime=int(time.monotonic() - self._started),
        )

    @_call
    async def LookupShard(self, request: pb.LookupShardRequest, context: Any) -> pb.LookupShardResponse:
        return pb.LookupShardResponse(shardId=request.shardId, serverNode=self.node)

    @_call
    async def LookupSubscription(
        self, request: pb.LookupSubscriptionRequest, context: Any
    ) -> pb.LookupSubscriptionResponse:
        return pb.LookupSubscriptionResponse(subscriptionId=request.subscriptionId, serverNode=self.node)

    @_call
    async def LookupResource(self, request: pb.LookupResourceRequest, context: Any) -> pb.ServerNode:
        return self.node

    @_call
    async def LookupKey(self, request: pb.LookupKeyRequest, context: Any) -> pb.ServerNode:
        return self.node

    # -- streams ----------------------------------------------------------------------------------------

    @_call
    async def CreateStream(self, request: pb.Stream, context: Any) -> pb.Stream:
        info = self._store.create_stream(
            request.streamName,
            request.replicationFactor,
            request.backlogDuration,
            request.shardCount,
            _now_ms(),
        )
        return _stream_pb(info)

    @_call
    async def GetStream(self, request: pb.GetStreamRequest, context: Any) -> pb.GetStreamResponse:
        return pb.GetStreamResponse(stream=_stream_pb(self._store.get_stream(request.name)))

    @_call
    async def ListStreams(self, request: Any, context: Any) -> pb.ListStreamsResponse:
        return pb.ListStreamsResponse(streams=[_stream_pb(s) for s in self._store.list_streams()])

    @_call
    async def DeleteStream(self, request: pb.DeleteStreamRequest, context: Any) -> empty_pb2.Empty:
        try:
            deleted = self._store.delete_stream(request.streamName, force=request.force)
        except ResourceNotFound:
            if request.ignoreNonExist:
                return empty_pb2.Empty()
            raise
        for subscription_id in deleted:
            runtime = self._runtimes.pop(subscription_id, None)
            if runtime is not None:
                await runtime.close()
        return empty_pb2.Empty()

    @_call
    async def ListShards(self, request: pb.ListShardsRequest, context: Any) -> pb.ListShardsResponse:
        return self._shards_pb(request.streamName)

    def _shards_pb(self, stream_name: str) -> pb.ListShardsResponse:
        shards = [
            pb.Shard(
                streamName=s.stream_name,
                shardId=s.shard_id,
                startHashRangeKey=str(s.start),
                endHashRangeKey=str(s.end),
                epoch=s.epoch,
                isActive=True,
            )
            for s in self._store.shards(stream_name)
        ]
        return pb.ListShardsResponse(shards=shards)

    @_call
    async def SplitShard(self, request: pb.Shard, context: Any) -> pb.ListShardsResponse:
        """Beyond HStream (service ``SHARD_ADMIN_SERVICE``): splits a shard's hash range in two, the upper
        half going to a new shard that every subscription of the stream reads from its start."""
        _, added = self._store.split_shard(request.streamName, request.shardId)
        for runtime in self._runtimes.values():
            if runtime.stream_name == request.streamName:
                runtime.add_shard(added.shard_id)
        return self._shards_pb(request.streamName)

    @_call
    async def Append(self, request: pb.AppendRequest, context: Any) -> bytes:
        """Answers a serialized AppendResponse (``codec.append_response``)."""
        check_identifier("stream", request.streamName)
        batch = request.records
        # every batch is decoded and counted: a batchSize above what the payload holds would otherwise
        # build (and store) one RecordId per declared record
        limits = (self._config.max_batch_records, self._config.max_batch_bytes)
        if int(batch.compressionType) == Compression.NONE and len(batch.payload) <= _INLINE_CHECK_BYTES:
            codec.check_batch(batch, *limits)
        else:  # inflating may take up to max_batch_bytes of work: off the event loop (zlib/zstd free the GIL)
            await asyncio.to_thread(codec.check_batch, batch, *limits)
        if not batch.HasField("publishTime"):
            batch.publishTime.FromMilliseconds(_now_ms())
        item = AppendItem(request.streamName, request.shardId, batch.batchSize, batch.SerializeToString())
        batch_id = await self._appender.append(item)
        for runtime in self._runtimes.values():
            if runtime.stream_name == request.streamName:
                runtime.notify()
        return codec.append_response(request.streamName, request.shardId, batch_id, batch.batchSize)

    @_call
    async def GetTailRecordId(
        self, request: pb.GetTailRecordIdRequest, context: Any
    ) -> pb.GetTailRecordIdResponse:
        check_identifier("stream", request.streamName)
        shard = self._store.shard(request.shardId)
        if shard.stream_name != request.streamName:
            raise ResourceNotFound(f"shard {request.shardId} is not a shard of {request.streamName}")
        tail = self._store.tail(request.shardId)
        batch_id, index = (tail[0], tail[1] - 1) if tail else (0, 0)
        return pb.GetTailRecordIdResponse(
            tailRecordId=pb.RecordId(shardId=request.shardId, batchId=batch_id, batchIndex=index)
        )

    # -- subscriptions ----------------------------------------------------------------------------------

    @_call
    async def CreateSubscription(self, request: pb.Subscription, context: Any) -> pb.Subscription:
        info = SubscriptionInfo(
            request.subscriptionId,
            request.streamName,
            request.ackTimeoutSeconds,
            request.maxUnackedRecords,
            int(request.offset),
            _now_ms(),
        )
        self._store.create_subscription(info)
        return _subscription_pb(info)

    @_call
    async def GetSubscription(
        self, request: pb.GetSubscriptionRequest, context: Any
    ) -> pb.GetSubscriptionResponse:
        info = self._store.get_subscription(request.id)
        runtime = self._runtimes.get(request.id)
        # per shard a batch below which every record is acked (without a runtime: the stored position's,
        # whose batch may still hold unacked records)
        if runtime:
            below = runtime.state.acked_below()
        else:
            below = {sid: pos[0] for sid, pos in self._store.positions(request.id).items()}
        offsets = [pb.SubscriptionOffset(shardId=sid, batchId=batch) for sid, batch in sorted(below.items())]
        return pb.GetSubscriptionResponse(subscription=_subscription_pb(info), offsets=offsets)

    @_call
    async def ListSubscriptions(self, request: Any, context: Any) -> pb.ListSubscriptionsResponse:
        return pb.ListSubscriptionsResponse(
            subscription=[_subscription_pb(s) for s in self._store.list_subscriptions()]
        )

    @_call
    async def CheckSubscriptionExist(
        self, request: pb.CheckSubscriptionExistRequest, context: Any
    ) -> pb.CheckSubscriptionExistResponse:
        try:
            self._store.get_subscription(request.subscriptionId)
        except (ResourceNotFound, InvalidArgument):  # a name that cannot exist does not exist
            return pb.CheckSubscriptionExistResponse(exists=False)
        return pb.CheckSubscriptionExistResponse(exists=True)

    @_call
    async def DeleteSubscription(
        self, request: pb.DeleteSubscriptionRequest, context: Any
    ) -> empty_pb2.Empty:
        self._store.get_subscription(request.subscriptionId)
        runtime = self._runtimes.get(request.subscriptionId)
        if runtime is not None and runtime.consumers and not request.force:
            raise FailedPrecondition(f"subscription {request.subscriptionId} has live consumers")
        self._store.delete_subscription(request.subscriptionId)
        if runtime is not None:
            del self._runtimes[request.subscriptionId]
            await runtime.close()
        return empty_pb2.Empty()

    @_call
    async def ListConsumers(self, request: pb.ListConsumersRequest, context: Any) -> pb.ListConsumersResponse:
        self._store.get_subscription(request.subscriptionId)
        runtime = self._runtimes.get(request.subscriptionId)
        consumers = runtime.consumers if runtime else []
        return pb.ListConsumersResponse(
            consumers=[pb.Consumer(name=c.name, uri=c.uri, userAgent=c.user_agent) for c in consumers]
        )

    def _runtime(self, subscription_id: str) -> SubscriptionRuntime:
        runtime = self._runtimes.get(subscription_id)
        if runtime is None:
            info = self._store.get_subscription(subscription_id)
            state = SubscriptionState(
                self._store.positions(subscription_id),
                ack_timeout=info.ack_timeout_seconds * self._config.ack_timeout_unit,
                max_unacked=info.max_unacked_records,
                redeliver_at_once=self._config.redeliver_at_once,
            )
            runtime = SubscriptionRuntime(subscription_id, info.stream_name, state, self._store, self._config)
            self._runtimes[subscription_id] = runtime
        return runtime

    async def StreamingFetch(
        self, request_iterator: AsyncIterator[pb.StreamingFetchRequest], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[bytes]:
        try:
            first = await anext(aiter(request_iterator))
        except StopAsyncIteration:
            return
        try:
            if isinstance(first, Undecodable):
                raise first.invalid()
            if not 1 <= len(first.consumerName) <= MAX_NAME_LENGTH:
                raise InvalidArgument(f"consumerName is required, of 1..{MAX_NAME_LENGTH} characters")
            runtime = self._runtime(first.subscriptionId)
            agent = dict(context.invocation_metadata() or ()).get("user-agent", "")
            queue = runtime.join(ConsumerInfo(first.consumerName, context.peer(), str(agent)))
        except (StreamServerError, DiffstoreError) as exc:
            await abort(context, exc)
        runtime.ack(list(first.ackIds))
        refused: list[InvalidArgument] = []
        reader = asyncio.get_running_loop().create_task(
            self._read_acks(request_iterator, runtime, queue, refused)
        )
        try:
            while (response := await queue.get()) is not None:
                yield response
        finally:
            reader.cancel()
            runtime.leave(first.consumerName)
        if refused:
            await abort(context, refused[0])
        if runtime.closed:
            await abort(context, ResourceNotFound(f"subscription {first.subscriptionId} was deleted"))

    @staticmethod
    async def _read_acks(
        requests: AsyncIterator[pb.StreamingFetchRequest | Undecodable],
        runtime: SubscriptionRuntime,
        queue: Outbound,
        refused: list[InvalidArgument],
    ) -> None:
        """Applies the acks of later requests; an undecodable one ends the call (``refused``)."""
        try:
            async for request in requests:
                if isinstance(request, Undecodable):
                    refused.append(request.invalid())
                    return
                runtime.ack(list(request.ackIds))
        finally:
            queue.end()
