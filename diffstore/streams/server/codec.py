"""Batch payloads and hot responses on the server: stored batches are kept as received; a partial resend
needs a batch holding only the unacked records, re-encoded with the batch's own compression; Append and
StreamingFetch responses are written as wire bytes.
"""

from __future__ import annotations

import gzip
from collections.abc import Sequence

import zstandard

from diffstore.streams._proto import hstream_pb2 as pb
from diffstore.streams.records import SMALL_VARINTS, length_prefix, varint

from .errors import InvalidArgument

# CompressionType values (``CompressionType.None`` is not valid Python).
NONE, GZIP, ZSTD = 0, 1, 2


def decompress(record: pb.BatchedRecord) -> bytes:
    """The serialized ``BatchHStreamRecords`` inside a batch.

    Raises:
        InvalidArgument: unknown compression or a corrupt payload.
    """
    try:
        if record.compressionType == NONE:
            return record.payload
        if record.compressionType == GZIP:
            return gzip.decompress(record.payload)
        if record.compressionType == ZSTD:
            return zstandard.ZstdDecompressor().decompressobj().decompress(record.payload)
    except (OSError, EOFError, zstandard.ZstdError) as exc:
        raise InvalidArgument(f"corrupt batch payload: {exc}") from exc
    raise InvalidArgument(f"unknown compression type {record.compressionType}")


def compress(compression: int, raw: bytes) -> bytes:
    """Compresses ``raw`` with a ``CompressionType`` value."""
    if compression == GZIP:
        return gzip.compress(raw, compresslevel=1)
    if compression == ZSTD:
        return zstandard.ZstdCompressor(level=3).compress(raw)
    return raw


def subset(record: pb.BatchedRecord, indices: Sequence[int]) -> pb.BatchedRecord:
    """A copy of ``record`` holding only the records at ``indices`` (in that order), same compression."""
    batch = pb.BatchHStreamRecords.FromString(decompress(record))
    picked = pb.BatchHStreamRecords(records=[batch.records[i] for i in indices])
    return pb.BatchedRecord(
        compressionType=record.compressionType,
        publishTime=record.publishTime,
        batchSize=len(indices),
        payload=compress(record.compressionType, picked.SerializeToString()),
    )


# -- hand-encoded responses -------------------------------------------------------------------------------
# A response repeats one RecordId per record; building thousands of RecordId objects costs more than the
# rest of a delivery, so the two hot responses are written as protobuf wire bytes directly (the gRPC
# serializer passes bytes through; see ``app.register``). Field numbers are those of protos/hstream.proto.


def _len_field(tag: bytes, body: bytes) -> bytes:
    return tag + length_prefix(len(body)) + body


def record_ids(tag: bytes, shard_id: int, batch_id: int, indices: Sequence[int]) -> bytes:
    """Repeated ``RecordId`` entries under ``tag`` (one length-delimited field per index)."""
    prefix = b"\x08" + varint(shard_id) + b"\x10" + varint(batch_id)
    small, limit = SMALL_VARINTS, len(SMALL_VARINTS)
    index_tag = prefix + b"\x18"
    parts = []
    for index in indices:
        body = index_tag + (small[index] if index < limit else varint(index)) if index else prefix
        parts.append(tag + small[len(body)] + body)
    return b"".join(parts)


def fetch_response(shard_id: int, batch_id: int, indices: Sequence[int], record: bytes) -> bytes:
    """A serialized ``StreamingFetchResponse`` carrying ``record`` (a serialized BatchedRecord)."""
    # ReceivedRecord: recordIds = 1, record = 2; StreamingFetchResponse: receivedRecords = 1.
    inner = record_ids(b"\x0a", shard_id, batch_id, indices) + _len_field(b"\x12", record)
    return _len_field(b"\x0a", inner)


def append_response(stream_name: str, shard_id: int, batch_id: int, size: int) -> bytes:
    """A serialized ``AppendResponse`` (streamName = 1, shardId = 2, recordIds = 3)."""
    head = _len_field(b"\x0a", stream_name.encode("utf-8")) + (
        b"\x10" + varint(shard_id) if shard_id else b""
    )
    return head + record_ids(b"\x1a", shard_id, batch_id, range(size))
