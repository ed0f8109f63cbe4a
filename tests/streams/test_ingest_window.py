"""The pure half of ingestion: windows, stored positions, mapping (generation ids: tests/test_rounds.py)."""

from __future__ import annotations

import pytest

from diffstore.engine.history import validate_metadata
from diffstore.errors import InvalidRequest
from diffstore.streams.ingest import default_mapper, load_mapper, map_records, window_metadata
from diffstore.streams.ingest_window import WindowAccumulator
from diffstore.streams.records import (
    RecordFlag,
    RecordId,
    RecordPosition,
    StreamRecord,
    python_to_struct_bytes,
)


def rec(shard: int, batch: int, index: int, key: str = "k", payload: bytes = b"v") -> StreamRecord:
    return StreamRecord(RecordId(shard, batch, index), key, RecordFlag.RAW, payload, publish_time_ns=batch)


def offer(acc: WindowAccumulator, records: list[StreamRecord], now: float) -> list[RecordId]:
    """Offers records on call 0 and tells the accumulator that each shard's tail, read after its first
    delivery, was empty: the shards are in order, every record goes to the window as it comes."""
    acks = acc.offer(records, now)
    for shard in acc.marks_needed(now):
        acc.set_mark(shard, RecordPosition(0, 0), now)
    return acks


def test_window_closes_by_count_and_sorts_by_record_id() -> None:
    acc = WindowAccumulator(window_records=3, window_ms=10_000)
    assert offer(acc, [rec(2, 5, 0), rec(1, 7, 1)], now=0.0) == []
    assert not acc.ready(0.0)
    offer(acc, [rec(1, 7, 0)], now=0.0)
    assert acc.ready(0.0)
    window = acc.take()
    assert window.record_ids == [RecordId(1, 7, 0), RecordId(1, 7, 1), RecordId(2, 5, 0)]
    assert window.positions == {1: RecordPosition(7, 1), 2: RecordPosition(5, 0)}
    assert window.newest_publish_ns == 7
    assert len(acc) == 0 and acc.deadline() is None


def test_window_closes_by_age_from_its_first_record() -> None:
    acc = WindowAccumulator(window_records=100, window_ms=200)
    offer(acc, [rec(1, 1, 0)], now=10.0)
    offer(acc, [rec(1, 2, 0)], now=10.15)
    assert acc.deadline() == pytest.approx(10.2)
    assert not acc.ready(10.19)
    assert acc.ready(10.2)


def test_records_at_or_below_stored_positions_are_acked_and_skipped() -> None:
    acc = WindowAccumulator(10, 100, positions={1: RecordPosition(7, 1)})
    ack_now = offer(acc, [rec(1, 7, 0), rec(1, 7, 1), rec(1, 7, 2), rec(2, 1, 0)], now=0.0)
    assert ack_now == [RecordId(1, 7, 0), RecordId(1, 7, 1)]
    assert acc.take().record_ids == [RecordId(1, 7, 2), RecordId(2, 1, 0)]


def test_resend_inside_open_window_is_ignored_and_commit_moves_positions() -> None:
    acc = WindowAccumulator(10, 100)
    offer(acc, [rec(1, 3, 0), rec(1, 3, 1)], now=0.0)
    assert offer(acc, [rec(1, 3, 1)], now=0.0) == []
    window = acc.take()
    assert len(window.records) == 2
    acc.committed(window)
    assert acc.positions == {1: RecordPosition(3, 1)}
    assert offer(acc, [rec(1, 3, 0), rec(1, 3, 1)], now=1.0) == [RecordId(1, 3, 0), RecordId(1, 3, 1)]
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
    offer(acc, [rec(1, 3, 0), rec(1, 3, 1)], now=0.0)
    window = acc.take()  # being committed by the writer
    assert offer(acc, [rec(1, 3, 1), rec(1, 4, 0)], now=0.1) == []  # the resend is neither kept nor acked
    assert [r.record_id for r in acc.take().records] == [RecordId(1, 4, 0)]
    acc.committed(window)
    assert offer(acc, [rec(1, 3, 1)], now=0.2) == [RecordId(1, 3, 1)]


def test_out_of_order_records_in_a_shard_are_sorted() -> None:
    acc = WindowAccumulator(10, 100)
    offer(acc, [rec(1, 5, 0), rec(1, 2, 0), rec(1, 2, 1)], now=0.0)
    window = acc.take()
    assert window.record_ids == [RecordId(1, 2, 0), RecordId(1, 2, 1), RecordId(1, 5, 0)]
    assert window.positions == {1: RecordPosition(5, 0)}


# -- the frontier: positions advance only over records known to be contiguous (#25) -------------------------


def batch(shard: int, batch_id: int, size: int, first: int = 0) -> list[StreamRecord]:
    return [rec(shard, batch_id, i) for i in range(first, size)]


def test_a_new_owner_holds_newer_batches_until_the_older_ones_are_applied() -> None:
    """The loss of #25: a new owner gets the shard's newer batches first, the previous owner's unacked ones
    later. Nothing above the gap may commit: the position would pass the older records, which then arrive
    below it and would be skipped as duplicates."""
    acc = WindowAccumulator(1000, 100, positions={1: RecordPosition(123, 24)}, resend_s=3.0)
    assert acc.offer(batch(1, 202, 25), now=0.0) == []
    assert acc.marks_needed(0.0) == [] and acc.marks_needed(3.0) == [1]
    acc.set_mark(1, RecordPosition(202, 24), now=3.0)  # the tail, read that long after the first delivery
    acc.certify({1: 150}, now=0.0)  # the server: batch 150 still has unacked records
    assert acc.window_count == 0 and acc.held == 25 and acc.stalled
    assert len(acc) == 25
    acc.offer(batch(1, 150, 25), now=1.0)  # the previous owner's records, resent
    acc.certify({1: 150}, now=1.0)
    window = acc.take()  # batch 150 only: whether a batch lies between 150 and 202 is not known yet
    assert window.positions == {1: RecordPosition(150, 24)}
    acc.committed(window)
    acc.offer(batch(1, 170, 10), now=2.0)
    acc.certify({1: 170}, now=2.0)  # 150 acked: nothing unacked below 170
    window = acc.take()
    assert window.positions == {1: RecordPosition(170, 9)}
    acc.committed(window)
    acc.certify({1: 202}, now=3.0)
    window = acc.take()
    assert window.positions == {1: RecordPosition(202, 24)} and acc.held == 0
    acc.committed(window)
    assert acc.offer(batch(1, 205, 3), now=4.0) == []  # the mark is reached: in order, straight in
    assert acc.window_count == 3 and not acc.stalled


def test_the_next_index_of_the_frontier_batch_follows_without_asking() -> None:
    acc = WindowAccumulator(1000, 100, positions={1: RecordPosition(5, 3)}, resend_s=3.0)
    acc.offer([rec(1, 5, 5), rec(1, 5, 4)], now=0.0)
    assert acc.window_count == 2 and acc.held == 0
    acc.offer([rec(1, 9, 1)], now=0.0)
    acc.certify({1: 9}, now=0.0)  # all batches below 9 acked, but (9, 0) is neither applied nor here
    assert acc.held == 1
    acc.offer([rec(1, 9, 0)], now=0.0)
    assert acc.held == 2  # (9, 0) opens a batch: it follows only once the server says so
    acc.certify({1: 9}, now=0.0)
    assert acc.take().positions == {1: RecordPosition(9, 1)}


def test_an_empty_shard_at_the_first_delivery_is_in_order_at_once() -> None:
    acc = WindowAccumulator(1000, 100)
    acc.offer(batch(1, 1, 4), now=0.0)
    acc.set_mark(1, RecordPosition(0, 0), now=0.0)  # the tail was read before this append... or it is
    assert acc.window_count == 4  # empty: every record comes to this consumer in order


def test_a_reconnect_puts_each_shard_out_of_order_at_its_first_delivery() -> None:
    acc = WindowAccumulator(1000, 100, resend_s=3.0)
    acc.offer(batch(1, 1, 2), now=0.0)
    acc.set_mark(1, RecordPosition(0, 0), now=3.0)
    assert acc.offer(batch(1, 3, 2), now=3.0) == [] and acc.window_count == 4  # in order on call 0
    acc.offer(batch(1, 8, 2), now=4.0, call=1)  # batches 4..7 may have been lost with call 0
    assert acc.window_count == 4 and acc.held == 2 and acc.marks_needed(7.0) == [1]
    acc.set_mark(1, RecordPosition(8, 1), now=7.0)
    acc.certify({1: 4}, now=1.0)
    assert acc.held == 2
    acc.offer(batch(1, 4, 1), now=1.1, call=1)  # resent
    acc.certify({1: 4}, now=1.1)
    assert acc.held == 2 and acc.window_count == 5
    acc.certify({1: 8}, now=1.2)
    assert acc.held == 0 and acc.window_count == 7
    assert acc.take().positions == {1: RecordPosition(8, 1)}


def test_a_record_below_the_frontier_never_seen_is_applied_late_not_skipped() -> None:
    acc = WindowAccumulator(1000, 100)
    offer(acc, batch(1, 10, 2), now=0.0)
    window = acc.take()
    acc.committed(window)
    acc.offer(batch(1, 12, 1), now=0.0)
    assert acc.offer([rec(1, 11, 0)], now=0.0) == []  # the order the frontier relied on did not hold
    assert acc.disorder == 1
    assert acc.take().record_ids == [RecordId(1, 11, 0), RecordId(1, 12, 0)]


def test_against_resends_at_the_deadline_the_mark_is_read_that_long_after_the_first_delivery() -> None:
    """HStreamDB resends records in flight to a previous owner only at their ack deadline: the mark (the tail
    read once that time has passed) bounds them, and a record above it proves every earlier one is here."""
    acc = WindowAccumulator(1000, 100, positions={1: RecordPosition(123, 24)}, resend_s=3.0)
    acc.offer(batch(1, 202, 5), now=0.0)  # newer ones first
    assert acc.marks_needed(1.0) == [] and acc.next_mark_at() == 3.0
    acc.offer(batch(1, 150, 5), now=2.0)  # resent at their deadline
    acc.offer(batch(1, 170, 5), now=2.5)
    assert acc.marks_needed(3.0) == [1]
    acc.set_mark(1, RecordPosition(260, 4), now=3.0)  # meanwhile the tail moved on
    acc.offer(batch(1, 230, 5), now=3.1)
    assert acc.window_count == 0 and acc.held == 20
    acc.offer(batch(1, 261, 2), now=3.2)  # appended after the mark, so sent after every resend
    assert acc.held == 0
    window = acc.take()
    assert [r.record_id.batch_id for r in window.records][::5] == [150, 170, 202, 230, 261]
    assert window.positions == {1: RecordPosition(261, 1)}


def test_a_server_that_resends_at_once_delivers_in_order_after_the_first_certified_record() -> None:
    """The embedded server (``resend_s`` 0) sends a new owner the previous owner's unacked records first:
    once the lowest held record is known to follow the frontier, every later delivery does."""
    acc = WindowAccumulator(1000, 100, positions={1: RecordPosition(123, 24)})
    acc.offer(batch(1, 150, 5), now=0.0)  # resent at once, ahead of anything newer
    assert acc.held == 5
    acc.certify({1: 150}, now=0.0)
    assert acc.held == 0 and acc.window_count == 5
    acc.offer(batch(1, 170, 5), now=0.1)
    acc.offer(batch(1, 202, 5), now=0.2)
    assert acc.held == 0 and acc.window_count == 15
    assert acc.take().positions == {1: RecordPosition(202, 4)}


def test_window_metadata_names_the_subscription_and_each_shards_first_and_last_record() -> None:
    acc = WindowAccumulator(window_records=100, window_ms=10_000)
    offer(acc, [rec(1, 7, 0), rec(0, 3, 1), rec(1, 7, 1), rec(0, 3, 2), rec(1, 9, 0), rec(0, 3, 0)], now=0)
    window = acc.take()
    assert window_metadata("sub", "s", window) == {
        "subscription": "sub",
        "stream": "s",
        "records": "6",
        "shard.0": "3-0..3-2",
        "shard.1": "7-0..9-0",
    }


def test_window_metadata_of_many_shards_stays_within_the_limit_and_counts_what_it_left_out() -> None:
    acc = WindowAccumulator(window_records=10_000, window_ms=10_000)
    offer(acc, [rec(shard, 10**12, 10**6) for shard in range(300)], now=0)
    metadata = window_metadata("s" * 200, "t" * 200, acc.take())
    assert validate_metadata(metadata) == metadata  # a map of strings within 4 KiB: the store keeps it
    kept = [key for key in metadata if key.startswith("shard.")]
    assert 0 < len(kept) < 300 and int(metadata["shards.omitted"]) == 300 - len(kept)
    assert metadata["shard.0"] == f"{10**12}-{10**6}..{10**12}-{10**6}"
