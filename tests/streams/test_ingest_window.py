"""The pure half of ingestion: windows, stored positions, mapping (generation ids: tests/test_rounds.py)."""

from __future__ import annotations

import pytest

from diffstore.errors import InvalidRequest
from diffstore.streams.ingest import default_mapper, load_mapper, map_records
from diffstore.streams.records import (
    RecordFlag,
    RecordId,
    RecordPosition,
    StreamRecord,
    python_to_struct_bytes,
)
from diffstore.streams.window import WindowAccumulator


def rec(shard: int, batch: int, index: int, key: str = "k", payload: bytes = b"v") -> StreamRecord:
    return StreamRecord(RecordId(shard, batch, index), key, RecordFlag.RAW, payload, publish_time_ns=batch)


def test_window_closes_by_count_and_sorts_by_record_id() -> None:
    acc = WindowAccumulator(window_records=3, window_ms=10_000)
    assert acc.offer([rec(2, 5, 0), rec(1, 7, 1)], now=0.0) == []
    assert not acc.ready(0.0)
    acc.offer([rec(1, 7, 0)], now=0.0)
    assert acc.ready(0.0)
    window = acc.take()
    assert window.record_ids == [RecordId(1, 7, 0), RecordId(1, 7, 1), RecordId(2, 5, 0)]
    assert window.positions == {1: RecordPosition(7, 1), 2: RecordPosition(5, 0)}
    assert window.newest_publish_ns == 7
    assert len(acc) == 0 and acc.deadline() is None


def test_window_closes_by_age_from_its_first_record() -> None:
    acc = WindowAccumulator(window_records=100, window_ms=200)
    acc.offer([rec(1, 1, 0)], now=10.0)
    acc.offer([rec(1, 2, 0)], now=10.15)
    assert acc.deadline() == pytest.approx(10.2)
    assert not acc.ready(10.19)
    assert acc.ready(10.2)


def test_records_at_or_below_stored_positions_are_acked_and_skipped() -> None:
    acc = WindowAccumulator(10, 100, positions={1: RecordPosition(7, 1)})
    ack_now = acc.offer([rec(1, 7, 0), rec(1, 7, 1), rec(1, 7, 2), rec(2, 1, 0)], now=0.0)
    assert ack_now == [RecordId(1, 7, 0), RecordId(1, 7, 1)]
    assert acc.take().record_ids == [RecordId(1, 7, 2), RecordId(2, 1, 0)]


def test_resend_inside_open_window_is_ignored_and_commit_moves_positions() -> None:
    acc = WindowAccumulator(10, 100)
    acc.offer([rec(1, 3, 0), rec(1, 3, 1)], now=0.0)
    assert acc.offer([rec(1, 3, 1)], now=0.0) == []
    window = acc.take()
    assert len(window.records) == 2
    acc.committed(window)
    assert acc.positions == {1: RecordPosition(3, 1)}
    assert acc.offer([rec(1, 3, 0), rec(1, 3, 1)], now=1.0) == [RecordId(1, 3, 0), RecordId(1, 3, 1)]
    assert len(acc) == 0
    with pytest.raises(ValueError):
        acc.take()


def test_default_mapping_raw_and_json() -> None:
    raw = rec(1, 1, 0, key="k1", payload=b"\x00\xff")
    assert default_mapper(raw) == (b"k1", b"\x00\xff")
    js = StreamRecord(
        RecordId(1, 1, 1), "k2", RecordFlag.JSON, python_to_struct_bytes({"b": 1, "a": [True, "x"]})
    )
    assert default_mapper(js) == (b"k2", b'{"a":[true,"x"],"b":1}')


def mapper_for_test(record: StreamRecord) -> list[tuple[str, bytes | None]] | None:
    if record.payload == b"drop":
        return None
    if record.payload == b"delete":
        return [(record.partition_key, None)]
    return [(record.partition_key, record.payload), ("copy/" + record.partition_key, record.payload)]


def test_user_mapper_may_drop_rename_and_tombstone() -> None:
    mapper = load_mapper(f"{__name__}:mapper_for_test")
    items = map_records(
        mapper, [rec(1, 1, 0, "a", b"drop"), rec(1, 1, 1, "b", b"delete"), rec(1, 1, 2, "c", b"v")]
    )
    assert items == [(b"b", None), (b"c", b"v"), (b"copy/c", b"v")]
    with pytest.raises(InvalidRequest):
        load_mapper("no_colon")


def test_records_of_a_taken_window_are_ignored_until_its_commit() -> None:
    acc = WindowAccumulator(10, 100)
    acc.offer([rec(1, 3, 0), rec(1, 3, 1)], now=0.0)
    window = acc.take()  # being committed by the writer
    assert acc.offer([rec(1, 3, 1), rec(1, 4, 0)], now=0.1) == []  # the resend is neither kept nor acked
    assert [r.record_id for r in acc.take().records] == [RecordId(1, 4, 0)]
    acc.committed(window)
    assert acc.offer([rec(1, 3, 1)], now=0.2) == [RecordId(1, 3, 1)]


def test_out_of_order_records_in_a_shard_are_sorted() -> None:
    acc = WindowAccumulator(10, 100)
    acc.offer([rec(1, 5, 0), rec(1, 2, 0), rec(1, 2, 1)], now=0.0)
    window = acc.take()
    assert window.record_ids == [RecordId(1, 2, 0), RecordId(1, 2, 1), RecordId(1, 5, 0)]
    assert window.positions == {1: RecordPosition(5, 0)}
