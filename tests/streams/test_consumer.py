"""Consumer: the pure ack bookkeeping, then the real consumer against the embedded server."""

from __future__ import annotations

from diffstore.streams.consumer import AckBook
from diffstore.streams.records import RecordId


def _ids(*indices: int) -> list[RecordId]:
    return [RecordId(1, 10, i) for i in indices]


def test_acks_are_grouped_by_count() -> None:
    book = AckBook(ack_batch_records=3, ack_flush_ms=1000)
    book.delivered(_ids(0, 1, 2, 3))
    assert book.unacked == 4
    book.ack(_ids(0, 1), now=0.0)
    assert book.take(0.0) == []
    book.ack(_ids(2), now=0.0)
    assert book.take(0.0) == _ids(0, 1, 2)
    assert book.unacked == 1 and book.pending == 0


def test_acks_are_sent_by_age_and_forced() -> None:
    book = AckBook(ack_batch_records=100, ack_flush_ms=50)
    book.ack(_ids(5), now=1.0)
    assert book.next_deadline() == 1.05
    assert book.take(1.04) == []
    assert book.take(1.05) == _ids(5)
    assert book.next_deadline() is None
    book.ack(_ids(6), now=2.0)
    assert book.take(2.0, force=True) == _ids(6)
    assert book.take(2.0, force=True) == []


def test_duplicate_acks_are_sent_once_and_redelivery_is_idempotent() -> None:
    book = AckBook(ack_batch_records=1, ack_flush_ms=0)
    book.delivered(_ids(1))
    book.delivered(_ids(1))
    assert book.unacked == 1
    book.ack(_ids(1) + _ids(1), now=0.0)
    assert book.take(0.0) == _ids(1)
    assert book.unacked == 0
