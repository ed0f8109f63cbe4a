"""Batch payloads and hot responses on the server: stored batches are kept as received; a partial resend
needs a batch holding only the unacked records, re-encoded with the batch's own compression; Append and
StreamingFetch responses are written as wire bytes.
"""

from __future__ import annotations

from collections.abc import Sequence

from google.protobuf.message import DecodeError

from diffstore.streams import records
from diffstore.streams._proto import hstream_pb2 as pb
from diffstore.streams.records import SMALL_VARINTS, length_prefix, varint

from .errors import InvalidArgument

# A stored batch passed the limits of the Append that stored it; re-reading it needs no tighter bound.
_STORED_MAX_BYTES = 1 << 31


def decompress(record: pb.BatchedRecord, max_bytes: int = _STORED_MAX_BYTES) -> bytes:
    """The serialized ``BatchHStreamRecords`` inside a batch, at most ``max_bytes`` of it (decompression
    stops past the limit: see :func:`diffstore.streams.records.decompress`).

    Raises:
        InvalidArgument: unknown compression, a corrupt payload, or more than ``max_bytes`` once
            decompressed.
    """
    try:
        raw = records.decompress(record.payload, record.compressionType, max_bytes)
    except ValueError as exc:
        raise InvalidArgument(str(exc)) from exc
    if len(raw) > max_bytes:
        raise InvalidArgument(f"a batch holds more than {max_bytes} bytes once decompressed")
    return raw


def check_batch(record: pb.BatchedRecord, max_records: int, max_bytes: int) -> None:
    """Checks what an Append is about to store: ``batchSize`` (1..``max_records``) records really are in
    the payload, which decompresses to at most ``max_bytes`` and parses as ``BatchHStreamRecords``.

    Raises:
        InvalidArgument: any of those does not hold.
    """
    if not 1 <= record.batchSize <= max_records:
        raise InvalidArgument(f"batchSize must be within 1..{max_records}, not {record.batchSize}")
    if not record.payload:
        raise InvalidArgument("empty batch payload")
    try:
        count = len(pb.BatchHStreamRecords.FromString(decompress(record, max_bytes)).records)
    except DecodeError as exc:
        raise InvalidArgument(f"the batch payload is not a BatchHStreamRecords: {exc}") from exc
    if count != record.batchSize:
        raise InvalidArgument(f"batchSize is {record.batchSize} but the payload holds {count} records")


def parse_stored(raw: bytes) -> pb.BatchedRecord:
    """A stored ``BatchedRecord`` (raises InvalidArgument if its bytes are not one)."""
    try:
        return pb.BatchedRecord.FromString(raw)  # type: ignore[no-any-return]
    except DecodeError as exc:
        raise InvalidArgument(f"a stored batch is not a BatchedRecord: {exc}") from exc


def check_stored(record: pb.BatchedRecord, size: int) -> None:
    """Checks that a stored batch decodes to its ``size`` records (raises InvalidArgument)."""
    if record.batchSize != size:
        raise InvalidArgument(f"a stored batch declares {record.batchSize} records, not {size}")
    check_batch(record, max(size, 1), _STORED_MAX_BYTES)


def subset(record: pb.BatchedRecord, indices: Sequence[int]) -> pb.BatchedRecord:
    """A copy of ``record`` holding only the records at ``indices`` (in that order), same compression.

    Raises:
        InvalidArgument: the batch cannot be decoded or holds fewer records than ``indices`` name.
    """
    try:
        batch = pb.BatchHStreamRecords.FromString(decompress(record))
        picked_records = [batch.records[i] for i in indices]
    except (DecodeError, IndexError) as exc:
        raise InvalidArgument(f"a stored batch cannot be decoded: {exc}") from exc
    picked = pb.BatchHStreamRecords(records=picked_records)
    return pb.BatchedRecord(
        compressionType=record.compressionType,
        publishTime=record.publishTime,
        batchSize=len(indices),
        payload=records.compress(picked.SerializeToString(), record.compressionType, gzip_level=1),
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
