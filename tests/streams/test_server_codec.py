"""Hand-encoded responses equal what protobuf builds; partial batches keep their compression."""

from __future__ import annotations

import gzip

import pytest
from hypothesis import given
from hypothesis import strategies as st

from diffstore.streams._proto import hstream_pb2 as pb
from diffstore.streams.records import Compression, compress, length_prefix, varint
from diffstore.streams.server import codec

U64 = st.integers(0, 2**64 - 1)


@given(U64, U64, st.lists(st.integers(0, 2**32 - 1), max_size=40), st.binary(max_size=300))
def test_fetch_response_bytes_equal_the_message(
    shard: int, batch: int, indices: list[int], payload: bytes
) -> None:
    record = pb.BatchedRecord(compressionType=1, batchSize=3, payload=payload)  # type: ignore[arg-type]
    raw = codec.fetch_response(shard, batch, indices, record.SerializeToString())
    ids = [pb.RecordId(shardId=shard, batchId=batch, batchIndex=i) for i in indices]
    expected = pb.StreamingFetchResponse(receivedRecords=pb.ReceivedRecord(recordIds=ids, record=record))
    assert pb.StreamingFetchResponse.FromString(raw) == expected


@given(st.text(max_size=40), U64, U64, st.integers(1, 3000))
def test_append_response_bytes_equal_the_message(stream: str, shard: int, batch: int, size: int) -> None:
    ids = [pb.RecordId(shardId=shard, batchId=batch, batchIndex=i) for i in range(size)]
    expected = pb.AppendResponse(streamName=stream, shardId=shard, recordIds=ids)
    assert pb.AppendResponse.FromString(codec.append_response(stream, shard, batch, size)) == expected


def test_varint_matches_protobuf() -> None:
    for value in (0, 1, 127, 128, 300, 2**14 - 1, 2**14, 2**63, 2**64 - 1):
        assert pb.RecordId.FromString(b"\x10" + varint(value)).batchId == value
        assert length_prefix(value) == varint(value)  # the small-value table agrees, at its edge too


@pytest.mark.parametrize("compression", list(Compression))
def test_subset_keeps_the_chosen_records_and_the_compression(compression: int) -> None:
    records = [
        pb.HStreamRecord(header=pb.HStreamRecordHeader(key=f"k{i}"), payload=b"p%d" % i) for i in range(5)
    ]
    raw = compress(pb.BatchHStreamRecords(records=records).SerializeToString(), compression)
    batch = pb.BatchedRecord(compressionType=compression, batchSize=5, payload=raw)  # type: ignore[arg-type]
    part = codec.subset(batch, [1, 4])
    assert part.compressionType == compression and part.batchSize == 2
    kept = pb.BatchHStreamRecords.FromString(codec.decompress(part)).records
    assert [(r.header.key, r.payload) for r in kept] == [("k1", b"p1"), ("k4", b"p4")]


def test_a_corrupt_payload_is_an_invalid_argument() -> None:
    from diffstore.streams.server.errors import InvalidArgument

    with pytest.raises(InvalidArgument):
        codec.decompress(pb.BatchedRecord(compressionType=1, payload=b"not gzip"))  # type: ignore[arg-type]
    assert gzip.decompress(compress(b"abc", Compression.GZIP)) == b"abc"
