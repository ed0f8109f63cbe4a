"""Batch payload handling on the server: stored batches are kept as received; a partial resend needs a
batch holding only the unacked records, re-encoded with the batch's own compression.
"""

from __future__ import annotations

import gzip
from collections.abc import Sequence

import zstandard

from diffstore.streams._proto import hstream_pb2 as pb

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
