"""Pure codec tests: record positions, batch encoding and compression, JSON payloads."""

from __future__ import annotations

import pytest

from diffstore.streams._proto import hstream_pb2 as pb
from diffstore.streams.records import (
    Compression,
    RecordFlag,
    RecordId,
    RecordPosition,
    build_batch,
    compact_json,
    compress,
    decode_batch,
    decompress,
    encode_batch,
    encode_header,
    encode_records,
    python_to_struct_bytes,
    struct_bytes_to_python,
)


def test_position_is_12_bytes_big_endian_and_orders_like_bytes() -> None:
    pos = RecordPosition(0x0102030405060708, 0x090A0B0C)
    assert pos.to_bytes() == bytes(range(1, 13))
    assert RecordPosition.from_bytes(pos.to_bytes()) == pos
    samples = [RecordPosition(b, i) for b in (0, 1, 255, 256, 2**40, 2**64 - 1) for i in (0, 1, 2**32 - 1)]
    assert sorted(samples) == sorted(samples, key=lambda p: p.to_bytes())
    with pytest.raises(ValueError):
        RecordPosition.from_bytes(b"\x00" * 11)


def test_record_id_round_trips_through_proto() -> None:
    rid = RecordId(7, 123456789, 42)
    assert RecordId.from_proto(rid.to_proto()) == rid
    assert rid.position == RecordPosition(123456789, 42)


@pytest.mark.parametrize("compression", list(Compression))
def test_fast_encoding_parses_as_proto_and_round_trips(compression: Compression) -> None:
    payloads = [b"", b"x", b"y" * 200, bytes(range(256)) * 70]
    header = encode_header(RecordFlag.RAW, "key-\u00e9", {"a": "b"})
    publish_ns = 1_700_000_000_123_456_789
    batch = build_batch(encode_records(header, payloads), len(payloads), compression, publish_ns)
    parsed = pb.BatchedRecord.FromString(batch.SerializeToString())
    assert parsed.compressionType == compression
    assert parsed.batchSize == len(payloads)
    ids = [pb.RecordId(shardId=3, batchId=9, batchIndex=i) for i in range(len(payloads))]
    records = decode_batch(parsed, ids)
    assert [r.payload for r in records] == payloads
    assert {r.partition_key for r in records} == {"key-\u00e9"}
    assert records[0].attributes == {"a": "b"}
    assert records[1].record_id == RecordId(3, 9, 1)
    assert records[0].publish_time_ns == publish_ns
    assert all(r.flag is RecordFlag.RAW for r in records)


def test_encode_records_equals_protobuf_parse() -> None:
    header = encode_header(RecordFlag.JSON, "")
    data = encode_records(header, [b"a", b"bb"])
    parsed = pb.BatchHStreamRecords.FromString(data)
    assert [r.payload for r in parsed.records] == [b"a", b"bb"]
    assert [r.header.flag for r in parsed.records] == [pb.HStreamRecordHeader.JSON] * 2


def test_mixed_batch_and_resend_subset_decode_by_batch_index() -> None:
    records = [
        pb.HStreamRecord(
            header=pb.HStreamRecordHeader(flag=pb.HStreamRecordHeader.RAW, key="k1"), payload=b"r"
        ),
        pb.HStreamRecord(
            header=pb.HStreamRecordHeader(flag=pb.HStreamRecordHeader.JSON, key="k2"),
            payload=python_to_struct_bytes({"n": 1, "f": 1.5, "s": "t", "l": [True, None]}),
        ),
    ]
    batch = encode_batch(records, Compression.ZSTD)
    only_second = decode_batch(batch, [pb.RecordId(shardId=1, batchId=5, batchIndex=1)])
    assert len(only_second) == 1
    assert only_second[0].is_json and only_second[0].partition_key == "k2"
    assert only_second[0].json() == {"n": 1, "f": 1.5, "s": "t", "l": [True, None]}
    with pytest.raises(ValueError):
        decode_batch(batch, [pb.RecordId(shardId=1, batchId=5, batchIndex=2)])


def test_unknown_compression_is_an_error() -> None:
    with pytest.raises(ValueError):
        decode_batch(pb.BatchedRecord(compressionType=7, payload=b""))
    with pytest.raises(ValueError):
        Compression.parse("lz4")
    assert Compression.parse("ZsTd") is Compression.ZSTD


@pytest.mark.parametrize("compression", list(Compression))
def test_decompress_stops_past_its_limit(compression: Compression) -> None:
    data = b"x" * 100_000
    packed = compress(data, compression)
    assert decompress(packed, compression) == data
    assert decompress(packed, compression, max_bytes=len(data)) == data
    if compression is not Compression.NONE:  # a bomb costs no more than the limit (plus one byte)
        assert len(decompress(packed, compression, max_bytes=1_000)) == 1_001


def test_struct_json_is_compact_and_sorted() -> None:
    value = struct_bytes_to_python(python_to_struct_bytes({"b": 2, "a": {"z": "\u00e9", "y": [1, 2.5]}}))
    assert compact_json(value) == '{"a":{"y":[1,2.5],"z":"\u00e9"},"b":2}'.encode()
