import datetime

from google.protobuf import empty_pb2 as _empty_pb2
from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class SpecialOffset(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    EARLIEST: _ClassVar[SpecialOffset]
    LATEST: _ClassVar[SpecialOffset]

class CompressionType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    Gzip: _ClassVar[CompressionType]
    Zstd: _ClassVar[CompressionType]

class NodeState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    Starting: _ClassVar[NodeState]
    Running: _ClassVar[NodeState]
    Unavailable: _ClassVar[NodeState]
    Dead: _ClassVar[NodeState]

class ResourceType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ResStream: _ClassVar[ResourceType]
    ResSubscription: _ClassVar[ResourceType]
    ResShard: _ClassVar[ResourceType]
    ResShardReader: _ClassVar[ResourceType]
    ResConnector: _ClassVar[ResourceType]
    ResQuery: _ClassVar[ResourceType]
    ResView: _ClassVar[ResourceType]
EARLIEST: SpecialOffset
LATEST: SpecialOffset
Gzip: CompressionType
Zstd: CompressionType
Starting: NodeState
Running: NodeState
Unavailable: NodeState
Dead: NodeState
ResStream: ResourceType
ResSubscription: ResourceType
ResShard: ResourceType
ResShardReader: ResourceType
ResConnector: ResourceType
ResQuery: ResourceType
ResView: ResourceType

class EchoRequest(_message.Message):
    __slots__ = ("msg",)
    MSG_FIELD_NUMBER: _ClassVar[int]
    msg: str
    def __init__(self, msg: _Optional[str] = ...) -> None: ...

class EchoResponse(_message.Message):
    __slots__ = ("msg",)
    MSG_FIELD_NUMBER: _ClassVar[int]
    msg: str
    def __init__(self, msg: _Optional[str] = ...) -> None: ...

class GetStreamRequest(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class GetStreamResponse(_message.Message):
    __slots__ = ("stream",)
    STREAM_FIELD_NUMBER: _ClassVar[int]
    stream: Stream
    def __init__(self, stream: _Optional[_Union[Stream, _Mapping]] = ...) -> None: ...

class AppendRequest(_message.Message):
    __slots__ = ("streamName", "shardId", "records")
    STREAMNAME_FIELD_NUMBER: _ClassVar[int]
    SHARDID_FIELD_NUMBER: _ClassVar[int]
    RECORDS_FIELD_NUMBER: _ClassVar[int]
    streamName: str
    shardId: int
    records: BatchedRecord
    def __init__(self, streamName: _Optional[str] = ..., shardId: _Optional[int] = ..., records: _Optional[_Union[BatchedRecord, _Mapping]] = ...) -> None: ...

class AppendResponse(_message.Message):
    __slots__ = ("streamName", "shardId", "recordIds")
    STREAMNAME_FIELD_NUMBER: _ClassVar[int]
    SHARDID_FIELD_NUMBER: _ClassVar[int]
    RECORDIDS_FIELD_NUMBER: _ClassVar[int]
    streamName: str
    shardId: int
    recordIds: _containers.RepeatedCompositeFieldContainer[RecordId]
    def __init__(self, streamName: _Optional[str] = ..., shardId: _Optional[int] = ..., recordIds: _Optional[_Iterable[_Union[RecordId, _Mapping]]] = ...) -> None: ...

class Subscription(_message.Message):
    __slots__ = ("subscriptionId", "streamName", "ackTimeoutSeconds", "maxUnackedRecords", "offset", "creationTime")
    SUBSCRIPTIONID_FIELD_NUMBER: _ClassVar[int]
    STREAMNAME_FIELD_NUMBER: _ClassVar[int]
    ACKTIMEOUTSECONDS_FIELD_NUMBER: _ClassVar[int]
    MAXUNACKEDRECORDS_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    CREATIONTIME_FIELD_NUMBER: _ClassVar[int]
    subscriptionId: str
    streamName: str
    ackTimeoutSeconds: int
    maxUnackedRecords: int
    offset: SpecialOffset
    creationTime: _timestamp_pb2.Timestamp
    def __init__(self, subscriptionId: _Optional[str] = ..., streamName: _Optional[str] = ..., ackTimeoutSeconds: _Optional[int] = ..., maxUnackedRecords: _Optional[int] = ..., offset: _Optional[_Union[SpecialOffset, str]] = ..., creationTime: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class SubscriptionOffset(_message.Message):
    __slots__ = ("shardId", "batchId")
    SHARDID_FIELD_NUMBER: _ClassVar[int]
    BATCHID_FIELD_NUMBER: _ClassVar[int]
    shardId: int
    batchId: int
    def __init__(self, shardId: _Optional[int] = ..., batchId: _Optional[int] = ...) -> None: ...

class GetSubscriptionRequest(_message.Message):
    __slots__ = ("id",)
    ID_FIELD_NUMBER: _ClassVar[int]
    id: str
    def __init__(self, id: _Optional[str] = ...) -> None: ...

class GetSubscriptionResponse(_message.Message):
    __slots__ = ("subscription", "offsets")
    SUBSCRIPTION_FIELD_NUMBER: _ClassVar[int]
    OFFSETS_FIELD_NUMBER: _ClassVar[int]
    subscription: Subscription
    offsets: _containers.RepeatedCompositeFieldContainer[SubscriptionOffset]
    def __init__(self, subscription: _Optional[_Union[Subscription, _Mapping]] = ..., offsets: _Optional[_Iterable[_Union[SubscriptionOffset, _Mapping]]] = ...) -> None: ...

class DeleteSubscriptionRequest(_message.Message):
    __slots__ = ("subscriptionId", "force")
    SUBSCRIPTIONID_FIELD_NUMBER: _ClassVar[int]
    FORCE_FIELD_NUMBER: _ClassVar[int]
    subscriptionId: str
    force: bool
    def __init__(self, subscriptionId: _Optional[str] = ..., force: _Optional[bool] = ...) -> None: ...

class CheckSubscriptionExistRequest(_message.Message):
    __slots__ = ("subscriptionId",)
    SUBSCRIPTIONID_FIELD_NUMBER: _ClassVar[int]
    subscriptionId: str
    def __init__(self, subscriptionId: _Optional[str] = ...) -> None: ...

class CheckSubscriptionExistResponse(_message.Message):
    __slots__ = ("exists",)
    EXISTS_FIELD_NUMBER: _ClassVar[int]
    exists: bool
    def __init__(self, exists: _Optional[bool] = ...) -> None: ...

class StreamingFetchRequest(_message.Message):
    __slots__ = ("subscriptionId", "consumerName", "ackIds")
    SUBSCRIPTIONID_FIELD_NUMBER: _ClassVar[int]
    CONSUMERNAME_FIELD_NUMBER: _ClassVar[int]
    ACKIDS_FIELD_NUMBER: _ClassVar[int]
    subscriptionId: str
    consumerName: str
    ackIds: _containers.RepeatedCompositeFieldContainer[RecordId]
    def __init__(self, subscriptionId: _Optional[str] = ..., consumerName: _Optional[str] = ..., ackIds: _Optional[_Iterable[_Union[RecordId, _Mapping]]] = ...) -> None: ...

class StreamingFetchResponse(_message.Message):
    __slots__ = ("receivedRecords",)
    RECEIVEDRECORDS_FIELD_NUMBER: _ClassVar[int]
    receivedRecords: ReceivedRecord
    def __init__(self, receivedRecords: _Optional[_Union[ReceivedRecord, _Mapping]] = ...) -> None: ...

class ReceivedRecord(_message.Message):
    __slots__ = ("recordIds", "record")
    RECORDIDS_FIELD_NUMBER: _ClassVar[int]
    RECORD_FIELD_NUMBER: _ClassVar[int]
    recordIds: _containers.RepeatedCompositeFieldContainer[RecordId]
    record: BatchedRecord
    def __init__(self, recordIds: _Optional[_Iterable[_Union[RecordId, _Mapping]]] = ..., record: _Optional[_Union[BatchedRecord, _Mapping]] = ...) -> None: ...

class DeleteStreamRequest(_message.Message):
    __slots__ = ("streamName", "ignoreNonExist", "force")
    STREAMNAME_FIELD_NUMBER: _ClassVar[int]
    IGNORENONEXIST_FIELD_NUMBER: _ClassVar[int]
    FORCE_FIELD_NUMBER: _ClassVar[int]
    streamName: str
    ignoreNonExist: bool
    force: bool
    def __init__(self, streamName: _Optional[str] = ..., ignoreNonExist: _Optional[bool] = ..., force: _Optional[bool] = ...) -> None: ...

class ListStreamsResponse(_message.Message):
    __slots__ = ("streams",)
    STREAMS_FIELD_NUMBER: _ClassVar[int]
    streams: _containers.RepeatedCompositeFieldContainer[Stream]
    def __init__(self, streams: _Optional[_Iterable[_Union[Stream, _Mapping]]] = ...) -> None: ...

class ListStreamsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListSubscriptionsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListSubscriptionsResponse(_message.Message):
    __slots__ = ("subscription",)
    SUBSCRIPTION_FIELD_NUMBER: _ClassVar[int]
    subscription: _containers.RepeatedCompositeFieldContainer[Subscription]
    def __init__(self, subscription: _Optional[_Iterable[_Union[Subscription, _Mapping]]] = ...) -> None: ...

class ListConsumersRequest(_message.Message):
    __slots__ = ("subscriptionId",)
    SUBSCRIPTIONID_FIELD_NUMBER: _ClassVar[int]
    subscriptionId: str
    def __init__(self, subscriptionId: _Optional[str] = ...) -> None: ...

class ListConsumersResponse(_message.Message):
    __slots__ = ("consumers",)
    CONSUMERS_FIELD_NUMBER: _ClassVar[int]
    consumers: _containers.RepeatedCompositeFieldContainer[Consumer]
    def __init__(self, consumers: _Optional[_Iterable[_Union[Consumer, _Mapping]]] = ...) -> None: ...

class Stream(_message.Message):
    __slots__ = ("streamName", "replicationFactor", "backlogDuration", "shardCount", "creationTime")
    STREAMNAME_FIELD_NUMBER: _ClassVar[int]
    REPLICATIONFACTOR_FIELD_NUMBER: _ClassVar[int]
    BACKLOGDURATION_FIELD_NUMBER: _ClassVar[int]
    SHARDCOUNT_FIELD_NUMBER: _ClassVar[int]
    CREATIONTIME_FIELD_NUMBER: _ClassVar[int]
    streamName: str
    replicationFactor: int
    backlogDuration: int
    shardCount: int
    creationTime: _timestamp_pb2.Timestamp
    def __init__(self, streamName: _Optional[str] = ..., replicationFactor: _Optional[int] = ..., backlogDuration: _Optional[int] = ..., shardCount: _Optional[int] = ..., creationTime: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class BatchedRecord(_message.Message):
    __slots__ = ("compressionType", "publishTime", "batchSize", "payload")
    COMPRESSIONTYPE_FIELD_NUMBER: _ClassVar[int]
    PUBLISHTIME_FIELD_NUMBER: _ClassVar[int]
    BATCHSIZE_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    compressionType: CompressionType
    publishTime: _timestamp_pb2.Timestamp
    batchSize: int
    payload: bytes
    def __init__(self, compressionType: _Optional[_Union[CompressionType, str]] = ..., publishTime: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., batchSize: _Optional[int] = ..., payload: _Optional[bytes] = ...) -> None: ...

class HStreamRecord(_message.Message):
    __slots__ = ("header", "payload")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    header: HStreamRecordHeader
    payload: bytes
    def __init__(self, header: _Optional[_Union[HStreamRecordHeader, _Mapping]] = ..., payload: _Optional[bytes] = ...) -> None: ...

class BatchHStreamRecords(_message.Message):
    __slots__ = ("records",)
    RECORDS_FIELD_NUMBER: _ClassVar[int]
    records: _containers.RepeatedCompositeFieldContainer[HStreamRecord]
    def __init__(self, records: _Optional[_Iterable[_Union[HStreamRecord, _Mapping]]] = ...) -> None: ...

class HStreamRecordHeader(_message.Message):
    __slots__ = ("flag", "attributes", "key")
    class Flag(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        JSON: _ClassVar[HStreamRecordHeader.Flag]
        RAW: _ClassVar[HStreamRecordHeader.Flag]
    JSON: HStreamRecordHeader.Flag
    RAW: HStreamRecordHeader.Flag
    class AttributesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    FLAG_FIELD_NUMBER: _ClassVar[int]
    ATTRIBUTES_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    flag: HStreamRecordHeader.Flag
    attributes: _containers.ScalarMap[str, str]
    key: str
    def __init__(self, flag: _Optional[_Union[HStreamRecordHeader.Flag, str]] = ..., attributes: _Optional[_Mapping[str, str]] = ..., key: _Optional[str] = ...) -> None: ...

class RecordId(_message.Message):
    __slots__ = ("shardId", "batchId", "batchIndex")
    SHARDID_FIELD_NUMBER: _ClassVar[int]
    BATCHID_FIELD_NUMBER: _ClassVar[int]
    BATCHINDEX_FIELD_NUMBER: _ClassVar[int]
    shardId: int
    batchId: int
    batchIndex: int
    def __init__(self, shardId: _Optional[int] = ..., batchId: _Optional[int] = ..., batchIndex: _Optional[int] = ...) -> None: ...

class Shard(_message.Message):
    __slots__ = ("streamName", "shardId", "startHashRangeKey", "endHashRangeKey", "epoch", "isActive")
    STREAMNAME_FIELD_NUMBER: _ClassVar[int]
    SHARDID_FIELD_NUMBER: _ClassVar[int]
    STARTHASHRANGEKEY_FIELD_NUMBER: _ClassVar[int]
    ENDHASHRANGEKEY_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    ISACTIVE_FIELD_NUMBER: _ClassVar[int]
    streamName: str
    shardId: int
    startHashRangeKey: str
    endHashRangeKey: str
    epoch: int
    isActive: bool
    def __init__(self, streamName: _Optional[str] = ..., shardId: _Optional[int] = ..., startHashRangeKey: _Optional[str] = ..., endHashRangeKey: _Optional[str] = ..., epoch: _Optional[int] = ..., isActive: _Optional[bool] = ...) -> None: ...

class ListShardsRequest(_message.Message):
    __slots__ = ("streamName",)
    STREAMNAME_FIELD_NUMBER: _ClassVar[int]
    streamName: str
    def __init__(self, streamName: _Optional[str] = ...) -> None: ...

class ListShardsResponse(_message.Message):
    __slots__ = ("shards",)
    SHARDS_FIELD_NUMBER: _ClassVar[int]
    shards: _containers.RepeatedCompositeFieldContainer[Shard]
    def __init__(self, shards: _Optional[_Iterable[_Union[Shard, _Mapping]]] = ...) -> None: ...

class Consumer(_message.Message):
    __slots__ = ("name", "uri", "userAgent")
    NAME_FIELD_NUMBER: _ClassVar[int]
    URI_FIELD_NUMBER: _ClassVar[int]
    USERAGENT_FIELD_NUMBER: _ClassVar[int]
    name: str
    uri: str
    userAgent: str
    def __init__(self, name: _Optional[str] = ..., uri: _Optional[str] = ..., userAgent: _Optional[str] = ...) -> None: ...

class DescribeClusterResponse(_message.Message):
    __slots__ = ("protocolVersion", "serverNodes", "serverNodesStatus", "clusterUpTime")
    PROTOCOLVERSION_FIELD_NUMBER: _ClassVar[int]
    SERVERNODES_FIELD_NUMBER: _ClassVar[int]
    SERVERNODESSTATUS_FIELD_NUMBER: _ClassVar[int]
    CLUSTERUPTIME_FIELD_NUMBER: _ClassVar[int]
    protocolVersion: str
    serverNodes: _containers.RepeatedCompositeFieldContainer[ServerNode]
    serverNodesStatus: _containers.RepeatedCompositeFieldContainer[ServerNodeStatus]
    clusterUpTime: int
    def __init__(self, protocolVersion: _Optional[str] = ..., serverNodes: _Optional[_Iterable[_Union[ServerNode, _Mapping]]] = ..., serverNodesStatus: _Optional[_Iterable[_Union[ServerNodeStatus, _Mapping]]] = ..., clusterUpTime: _Optional[int] = ...) -> None: ...

class ServerNode(_message.Message):
    __slots__ = ("id", "host", "port", "version")
    ID_FIELD_NUMBER: _ClassVar[int]
    HOST_FIELD_NUMBER: _ClassVar[int]
    PORT_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    id: int
    host: str
    port: int
    version: HStreamVersion
    def __init__(self, id: _Optional[int] = ..., host: _Optional[str] = ..., port: _Optional[int] = ..., version: _Optional[_Union[HStreamVersion, _Mapping]] = ...) -> None: ...

class ServerNodeStatus(_message.Message):
    __slots__ = ("node", "state")
    NODE_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    node: ServerNode
    state: NodeState
    def __init__(self, node: _Optional[_Union[ServerNode, _Mapping]] = ..., state: _Optional[_Union[NodeState, str]] = ...) -> None: ...

class HStreamVersion(_message.Message):
    __slots__ = ("version", "commit")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    COMMIT_FIELD_NUMBER: _ClassVar[int]
    version: str
    commit: str
    def __init__(self, version: _Optional[str] = ..., commit: _Optional[str] = ...) -> None: ...

class LookupShardRequest(_message.Message):
    __slots__ = ("shardId",)
    SHARDID_FIELD_NUMBER: _ClassVar[int]
    shardId: int
    def __init__(self, shardId: _Optional[int] = ...) -> None: ...

class LookupShardResponse(_message.Message):
    __slots__ = ("shardId", "serverNode")
    SHARDID_FIELD_NUMBER: _ClassVar[int]
    SERVERNODE_FIELD_NUMBER: _ClassVar[int]
    shardId: int
    serverNode: ServerNode
    def __init__(self, shardId: _Optional[int] = ..., serverNode: _Optional[_Union[ServerNode, _Mapping]] = ...) -> None: ...

class LookupSubscriptionRequest(_message.Message):
    __slots__ = ("subscriptionId",)
    SUBSCRIPTIONID_FIELD_NUMBER: _ClassVar[int]
    subscriptionId: str
    def __init__(self, subscriptionId: _Optional[str] = ...) -> None: ...

class LookupSubscriptionResponse(_message.Message):
    __slots__ = ("subscriptionId", "serverNode")
    SUBSCRIPTIONID_FIELD_NUMBER: _ClassVar[int]
    SERVERNODE_FIELD_NUMBER: _ClassVar[int]
    subscriptionId: str
    serverNode: ServerNode
    def __init__(self, subscriptionId: _Optional[str] = ..., serverNode: _Optional[_Union[ServerNode, _Mapping]] = ...) -> None: ...

class LookupResourceRequest(_message.Message):
    __slots__ = ("resType", "resId")
    RESTYPE_FIELD_NUMBER: _ClassVar[int]
    RESID_FIELD_NUMBER: _ClassVar[int]
    resType: ResourceType
    resId: str
    def __init__(self, resType: _Optional[_Union[ResourceType, str]] = ..., resId: _Optional[str] = ...) -> None: ...

class LookupKeyRequest(_message.Message):
    __slots__ = ("partitionKey",)
    PARTITIONKEY_FIELD_NUMBER: _ClassVar[int]
    partitionKey: str
    def __init__(self, partitionKey: _Optional[str] = ...) -> None: ...

class GetTailRecordIdRequest(_message.Message):
    __slots__ = ("streamName", "shardId")
    STREAMNAME_FIELD_NUMBER: _ClassVar[int]
    SHARDID_FIELD_NUMBER: _ClassVar[int]
    streamName: str
    shardId: int
    def __init__(self, streamName: _Optional[str] = ..., shardId: _Optional[int] = ...) -> None: ...

class GetTailRecordIdResponse(_message.Message):
    __slots__ = ("tailRecordId",)
    TAILRECORDID_FIELD_NUMBER: _ClassVar[int]
    tailRecordId: RecordId
    def __init__(self, tailRecordId: _Optional[_Union[RecordId, _Mapping]] = ...) -> None: ...
