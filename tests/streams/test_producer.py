"""Producer: the pure buffering and dispatch logic, then the real producer against the embedded server."""

from __future__ import annotations

import pytest

from diffstore.streams.producer import BatchBuffer, OrderedDispatch, PendingBatch, ProducerConfig
from diffstore.streams.records import RecordFlag


def _buffer(**kw: float) -> BatchBuffer[int]:
    return BatchBuffer(ProducerConfig(**kw))  # type: ignore[arg-type]


def test_batch_sealed_by_record_count() -> None:
    buf = _buffer(batch_max_records=3, linger_ms=1000)
    assert not buf.add("k", RecordFlag.RAW, b"a", 1, 0.0)
    assert not buf.add("k", RecordFlag.RAW, b"b", 2, 0.0)
    (sealed,) = buf.add("k", RecordFlag.RAW, b"c", 3, 0.0)
    assert sealed.payloads == [b"a", b"b", b"c"] and sealed.tickets == [1, 2, 3]
    assert buf.empty


def test_batch_sealed_by_bytes() -> None:
    buf = _buffer(batch_max_bytes=10, linger_ms=1000)
    assert not buf.add("k", RecordFlag.RAW, b"12345", 1, 0.0)
    (sealed,) = buf.add("k", RecordFlag.RAW, b"67890", 2, 0.0)
    assert sealed.size_bytes == 10


def test_batches_are_per_key_and_sealed_by_age() -> None:
    buf = _buffer(linger_ms=100)
    buf.add("a", RecordFlag.RAW, b"1", 1, 0.0)
    buf.add("b", RecordFlag.RAW, b"2", 2, 0.05)
    buf.add("a", RecordFlag.RAW, b"3", 3, 0.06)
    assert buf.next_deadline() == pytest.approx(0.1)
    assert buf.due(0.09) == []
    (due_a,) = buf.due(0.1)
    assert due_a.partition_key == "a" and due_a.tickets == [1, 3]
    assert buf.next_deadline() == pytest.approx(0.15)
    assert [b.partition_key for b in buf.drain()] == ["b"]
    assert buf.next_deadline() is None


def test_flag_change_seals_the_open_batch_first() -> None:
    buf = _buffer(linger_ms=1000)
    buf.add("k", RecordFlag.RAW, b"raw", 1, 0.0)
    (sealed,) = buf.add("k", RecordFlag.JSON, b"json", 2, 0.0)
    assert sealed.flag is RecordFlag.RAW and sealed.tickets == [1]
    (rest,) = buf.drain()
    assert rest.flag is RecordFlag.JSON and rest.tickets == [2]


def test_zero_linger_seals_every_record() -> None:
    buf = _buffer(linger_ms=0)
    assert len(buf.add("k", RecordFlag.RAW, b"x", 1, 0.0)) == 1


def test_dispatch_runs_keys_concurrently_and_each_key_in_order() -> None:
    def batch(key: str, n: int) -> PendingBatch[int]:
        return PendingBatch(key, RecordFlag.RAW, 0.0, [b""], [n])

    dispatch: OrderedDispatch[PendingBatch[int]] = OrderedDispatch(lambda b: b.partition_key)
    a1, a2, a3, b1 = batch("a", 1), batch("a", 2), batch("a", 3), batch("b", 1)
    assert dispatch.submit(a1) is True
    assert dispatch.submit(a2) is False
    assert dispatch.submit(b1) is True  # another key: concurrent
    assert dispatch.submit(a3) is False
    assert dispatch.finished("a") is a2
    assert dispatch.finished("b") is None
    assert dispatch.finished("a") is a3
    assert dispatch.busy
    assert dispatch.finished("a") is None
    assert not dispatch.busy


def test_config_is_validated() -> None:
    with pytest.raises(ValueError):
        ProducerConfig(batch_max_records=0)
    with pytest.raises(ValueError):
        ProducerConfig(linger_ms=-1)
