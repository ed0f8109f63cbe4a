"""Pure HStream record codecs: record ids, batches, compression, JSON payloads (SPEC §4/§5).

Nothing here touches a socket; the producer, consumer and ingestor build on these functions.

Invariants:
- A record position is the 12-byte big-endian ``(batchId u64, batchIndex u32)``: bytewise order of the
  encoding equals numeric order, so positions can be stored as generation ids and compared as bytes.
- A batch's payload is a serialized ``BatchHStreamRecords``, then compressed (none, gzip or zstd).
- JSON records carry a binary ``google.protobuf.Struct``, never JSON text.
- Shard hashing lives in :mod:`diffstore.streams.sharding`.
"""

from __future__ import annotations

import enum
import gzip
import json
import struct
import threading
import zlib
from collections.abc import Iterable, Mapping, Sequence
from itertools import chain
from types import MappingProxyType
from typing import Any, NamedTuple, cast

import zstandard
from google.protobuf import struct_pb2

from diffstore.streams._proto import hstream_pb2 as pb

RECORD_POSITION_SIZE = 12
_NO_ATTRIBUTES: Mapping[str, str] = MappingProxyType({})
_new_tuple = tuple.__new__
_POSITION = struct.Struct(">QI")
_CHUNK = 1 << 20
_UNBOUNDED = 1 << 62  # max_bytes None: no payload is this large
_ZSTD = threading.local()  # zstandard (de)compressors are not thread-safe: one per thread


class Compression(enum.IntEnum):
    """``CompressionType`` of SPEC §4."""

    NONE = 0
    GZIP = 1
    ZSTD = 2

    @classmethod
    def parse(cls, name: str) -> Compression:
        """Parses ``none``/``gzip``/``zstd`` (any case)."""
        try:
            return cls[name.upper()]
        except KeyError as exc:
            raise ValueError(f"unknown compression {name!r} (none, gzip, zstd)") from exc


class RecordFlag(enum.IntEnum):
    """``HStreamRecordHeader.Flag``: how the payload is encoded."""

    JSON = 0
    RAW = 1


class RecordPosition(NamedTuple):
    """A record's place within its shard; ordered like the stream (a tuple: cheap to hash and compare)."""

    batch_id: int
    batch_index: int

    def to_bytes(self) -> bytes:
        """The 12-byte big-endian form stored as a reader's generation id (SPEC §5)."""
        return _POSITION.pack(self.batch_id, self.batch_index)

    @classmethod
    def from_bytes(cls, data: bytes) -> RecordPosition:
        """Inverse of :meth:`to_bytes`; raises ValueError for anything but 12 bytes."""
        if len(data) != RECORD_POSITION_SIZE:
            raise ValueError(f"a record position is {RECORD_POSITION_SIZE} bytes, got {len(data)}")
        batch_id, batch_index = _POSITION.unpack(data)
        return cls(batch_id, batch_index)


class RecordId(NamedTuple):
    """A record's id: shard plus position (``hstream.server.RecordId``); a tuple, ordered field by field."""

    shard_id: int
    batch_id: int
    batch_index: int

    @property
    def position(self) -> RecordPosition:
        return RecordPosition(self.batch_id, self.batch_index)

    def to_proto(self) -> pb.RecordId:
        return pb.RecordId(shardId=self.shard_id, batchId=self.batch_id, batchIndex=self.batch_index)

    @classmethod
    def from_proto(cls, rid: pb.RecordId) -> RecordId:
        return cls(rid.shardId, rid.batchId, rid.batchIndex)


class StreamRecord(NamedTuple):
    """One decoded record as a consumer sees it (a named tuple: consumers create one per record)."""

    record_id: RecordId
    partition_key: str
    flag: RecordFlag
    payload: bytes
    publish_time_ns: int = 0
    attributes: Mapping[str, str] = _NO_ATTRIBUTES

    @property
    def is_json(self) -> bool:
        return self.flag is RecordFlag.JSON

    def json(self) -> Any:
        """The payload of a JSON record as Python values (integral numbers come back as ``int``)."""
        return struct_bytes_to_python(self.payload)


# -- compression ------------------------------------------------------------------------------------------


def compress(data: bytes, compression: int, gzip_level: int = 6) -> bytes:
    """Compresses a serialized ``BatchHStreamRecords`` with a ``CompressionType`` value.

    Raises:
        ValueError: an unknown compression type.
    """
    if compression == Compression.NONE:
        return data
    if compression == Compression.GZIP:
        return gzip.compress(data, compresslevel=gzip_level, mtime=0)
    if compression == Compression.ZSTD:
        compressor = getattr(_ZSTD, "compressor", None)
        if compressor is None:
            compressor = _ZSTD.compressor = zstandard.ZstdCompressor(level=3)
        return compressor.compress(data)
    raise ValueError(f"unknown compression type {compression}")


def decompress(data: bytes, compression: int, max_bytes: int | None = None) -> bytes:
    """Inverse of :func:`compress`: gzip members one after the other, the first zstd frame.

    With ``max_bytes``, decompression stops as soon as the output passes it, so a small payload that
    would inflate to gigabytes (a zip bomb) costs no more than the limit; the result is then longer
    than ``max_bytes`` (by at most one byte) for the caller to refuse.

    Raises:
        ValueError: an unknown compression type or a corrupt payload.
    """
    limit = _UNBOUNDED if max_bytes is None else max_bytes
    try:
        if compression == Compression.NONE:
            return data
        if compression == Compression.GZIP:
            return _gunzip(data, limit)
        if compression == Compression.ZSTD:
            return _unzstd(data, limit)
    except (OSError, EOFError, zlib.error, zstandard.ZstdError) as exc:
        raise ValueError(f"corrupt batch payload: {exc}") from exc
    raise ValueError(f"unknown compression type {compression}")


def _gunzip(payload: bytes, max_bytes: int) -> bytes:
    """gzip members one after the other (as ``gzip.decompress``), stopping past ``max_bytes``."""
    out = bytearray()
    data = payload
    while data and len(out) <= max_bytes:
        member = zlib.decompressobj(16 + zlib.MAX_WBITS)
        out += member.decompress(data, max_bytes + 1 - len(out))
        if not member.eof:
            if member.unconsumed_tail:  # stopped at the limit: the payload holds more
                break
            raise EOFError("truncated gzip payload")
        data = member.unused_data
    return bytes(out)


def _unzstd(payload: bytes, max_bytes: int) -> bytes:
    """The first zstd frame (frames of streaming compressors may omit their content size), stopping past
    ``max_bytes``."""
    out = bytearray()
    with zstandard.ZstdDecompressor().stream_reader(payload) as reader:
        while len(out) <= max_bytes:
            chunk = reader.read(min(_CHUNK, max_bytes + 1 - len(out)))
            if not chunk:
                break
            out += chunk
    return bytes(out)


# -- batch encoding ---------------------------------------------------------------------------------------


def varint(value: int) -> bytes:
    """Protobuf base-128 varint of a non-negative integer."""
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


SMALL_VARINTS = [varint(i) for i in range(1 << 14)]  # precomputed: lengths and indexes are mostly small


def length_prefix(length: int) -> bytes:
    """The varint of a length (or any non-negative integer), from the table when it is small."""
    return SMALL_VARINTS[length] if length < len(SMALL_VARINTS) else varint(length)


def encode_header(flag: RecordFlag, partition_key: str, attributes: Mapping[str, str] | None = None) -> bytes:
    """The serialized ``HStreamRecordHeader`` (shared by every record of a producer batch)."""
    header = pb.HStreamRecordHeader(flag=cast(Any, int(flag)), key=partition_key)
    if attributes:
        header.attributes.update(attributes)
    serialized: bytes = header.SerializeToString()
    return serialized


class _RecordPrefixes(dict[int, bytes]):
    """Payload length → the bytes that precede such a payload in ``BatchHStreamRecords`` (one header)."""

    def __init__(self, header: bytes) -> None:
        super().__init__()
        self._header_field = b"\x0a" + length_prefix(len(header)) + header

    def __missing__(self, payload_len: int) -> bytes:
        payload_field_len = 1 + len(length_prefix(payload_len)) + payload_len
        record_len = len(self._header_field) + payload_field_len
        record_start = b"\x0a" + length_prefix(record_len) + self._header_field
        prefix = record_start + b"\x12" + length_prefix(payload_len)
        self[payload_len] = prefix
        return prefix


def encode_records(header: bytes, payloads: Iterable[bytes]) -> bytes:
    """Serializes ``BatchHStreamRecords`` whose records share ``header`` (fast path, no message objects).

    The bytes parse as the proto message: each record is field 1 (length-delimited) holding
    ``HStreamRecord{header = 1; payload = 2}``. The prefix of a record depends only on its payload's
    length, so it is looked up per length and the whole batch is joined without Python code per record.
    """
    payloads = payloads if isinstance(payloads, list) else list(payloads)
    prefixes = _RecordPrefixes(header)
    record_prefixes = map(prefixes.__getitem__, map(len, payloads))
    return b"".join(chain.from_iterable(zip(record_prefixes, payloads, strict=True)))


def encode_keyed_records(headers: Sequence[bytes], payloads: Sequence[bytes]) -> bytes:
    """Serializes ``BatchHStreamRecords`` whose record ``i`` has header ``headers[i]`` (records of many
    partition keys or flags in one batch); the same bytes as the proto message would produce."""
    header_fields: dict[bytes, bytes] = {}
    parts: list[bytes] = []
    append = parts.append
    for header, payload in zip(headers, payloads, strict=True):
        header_field = header_fields.get(header)
        if header_field is None:
            header_field = header_fields[header] = b"\x0a" + length_prefix(len(header)) + header
        payload_prefix = length_prefix(len(payload))
        append(b"\x0a")
        append(length_prefix(len(header_field) + 1 + len(payload_prefix) + len(payload)))
        append(header_field)
        append(b"\x12")
        append(payload_prefix)
        append(payload)
    return b"".join(parts)


def build_batch(
    records_payload: bytes, batch_size: int, compression: Compression, publish_time_ns: int
) -> pb.BatchedRecord:
    """Wraps an encoded ``BatchHStreamRecords`` into a ``BatchedRecord`` ready for Append."""
    batch = pb.BatchedRecord(
        compressionType=cast(Any, int(compression)),
        batchSize=batch_size,
        payload=compress(records_payload, compression),
    )
    batch.publishTime.seconds, batch.publishTime.nanos = divmod(publish_time_ns, 1_000_000_000)
    return batch


def encode_batch(
    records: Sequence[pb.HStreamRecord], compression: Compression = Compression.NONE, publish_time_ns: int = 0
) -> pb.BatchedRecord:
    """Encodes arbitrary ``HStreamRecord`` messages (mixed keys/flags/attributes) into a ``BatchedRecord``."""
    payload = pb.BatchHStreamRecords(records=records).SerializeToString()
    return build_batch(payload, len(records), compression, publish_time_ns)


def record_ids_from_protos(record_ids: Iterable[pb.RecordId]) -> list[RecordId]:
    """``RecordId`` messages as :class:`RecordId` tuples (per record, so ``tuple.__new__`` directly: a named
    tuple's own ``__new__`` is Python code)."""
    return [_new_tuple(RecordId, (r.shardId, r.batchId, r.batchIndex)) for r in record_ids]


def decode_batch(
    batch: pb.BatchedRecord, record_ids: Sequence[pb.RecordId] | None = None, shard_id: int = 0
) -> list[StreamRecord]:
    """Decodes a delivered batch into records.

    Args:
        batch: the ``BatchedRecord`` as stored by the server.
        record_ids: the ids the server sent. As many ids as records: they pair up in order (a resend may
            carry only the unacked records, re-batched); fewer ids than records: each picks its record by
            ``batchIndex``. ``None`` numbers the records 0.. with batch id 0 of ``shard_id``.

    Raises:
        ValueError: unknown compression, undecodable payload, or an id whose index is outside the batch.
    """
    raw = decompress(batch.payload, batch.compressionType)
    parsed = pb.BatchHStreamRecords()
    try:
        parsed.ParseFromString(raw)
    except Exception as exc:  # protobuf raises DecodeError, a plain Exception subclass
        raise ValueError(f"undecodable BatchHStreamRecords: {exc}") from exc
    hrecords = parsed.records
    publish_ns = batch.publishTime.seconds * 1_000_000_000 + batch.publishTime.nanos
    if record_ids is None:
        ids = [RecordId(shard_id, 0, i) for i in range(len(hrecords))]
    else:
        ids = record_ids_from_protos(record_ids)
    if len(ids) == len(hrecords):
        pairs = list(zip(ids, hrecords, strict=True))  # the payload holds exactly the sent records
    else:
        pairs = []  # a subset of ids for the whole stored batch: pick by index
        for rid in ids:
            if rid.batch_index >= len(hrecords):
                raise ValueError(f"record id {rid} is outside a batch of {len(hrecords)}")
            pairs.append((rid, hrecords[rid.batch_index]))
    out: list[StreamRecord] = []
    append = out.append
    raw_flag, json_flag = RecordFlag.RAW, RecordFlag.JSON
    for rid, hrecord in pairs:
        header = hrecord.header
        attributes = header.attributes
        flag = json_flag if header.flag == 0 else raw_flag
        attrs = dict(attributes) if attributes else _NO_ATTRIBUTES
        append(_new_tuple(StreamRecord, (rid, header.key, flag, hrecord.payload, publish_ns, attrs)))
    return out


# -- JSON payloads ----------------------------------------------------------------------------------------


def python_to_struct_bytes(value: Mapping[str, Any]) -> bytes:
    """A dict as a binary ``google.protobuf.Struct`` (the JSON record payload)."""
    message = struct_pb2.Struct()
    message.update(value)
    serialized: bytes = message.SerializeToString()
    return serialized


def _value_to_python(value: struct_pb2.Value) -> Any:
    kind = value.WhichOneof("kind")
    if kind == "struct_value":
        return {k: _value_to_python(v) for k, v in value.struct_value.fields.items()}
    if kind == "list_value":
        return [_value_to_python(v) for v in value.list_value.values]
    if kind == "number_value":
        number = value.number_value
        if number.is_integer() and abs(number) < 2**53:
            return int(number)
        return number
    if kind == "string_value":
        return value.string_value
    if kind == "bool_value":
        return value.bool_value
    return None


def struct_bytes_to_python(data: bytes) -> dict[str, Any]:
    """Parses a binary ``Struct``; whole numbers come back as ``int`` (JSON has no int/float split)."""
    message = struct_pb2.Struct()
    message.ParseFromString(data)
    return {k: _value_to_python(v) for k, v in message.fields.items()}


def compact_json(value: Any) -> bytes:
    """Compact JSON text with sorted keys, UTF-8 (the default ingestion value of a JSON record)."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()
