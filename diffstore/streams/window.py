"""The pure half of ingestion (SPEC §5): windows of records, stored positions, generation ids.

:class:`WindowAccumulator` is fed decoded records and the clock, and says what to ack at once, when a window
is complete, and what a window commits. It never touches a socket or a store.

Invariants:
- ``positions[shard]`` is the last RecordId of the shard applied to the collection (committed with it).
  A record at or below it was applied before: it is acked at once and never applied again.
- A record already in the open window (a resend while the window is still being gathered) is ignored;
  it is acked with the window, after the commit.
- A window is complete when it holds ``window_records`` records or its first record is ``window_ms`` old.
  Its records are applied in (shard, batch id, batch index) order, so each partition key keeps its order.
- After a window's commit, the positions it carried become the stored positions.

Generation ids of the target collection: see :func:`next_generation_id`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from diffstore.streams.records import RecordId, RecordPosition, StreamRecord

COUNTER_SIZE = 8


def next_generation_id(current: bytes) -> bytes:
    """The generation id after ``current``: always bytewise greater, hence monotonic.

    The last 8 bytes are a big-endian counter: ``""`` → ``00..01``, ``00..07`` → ``00..08``, and a
    prefix is kept as is (``b"v1" + 00..03`` → ``b"v1" + 00..04``). A current id shorter than 8 bytes
    (a user-chosen initial id) gets the counter appended, which sorts after it because a prefix sorts first;
    a saturated counter gets another counter appended for the same reason.
    """
    if len(current) < COUNTER_SIZE:
        return current + (1).to_bytes(COUNTER_SIZE, "big")
    counter = int.from_bytes(current[-COUNTER_SIZE:], "big")
    if counter == (1 << (8 * COUNTER_SIZE)) - 1:
        return current + (1).to_bytes(COUNTER_SIZE, "big")
    return current[:-COUNTER_SIZE] + (counter + 1).to_bytes(COUNTER_SIZE, "big")


def reader_name(subscription_id: str, shard_id: int) -> str:
    """The reader of the target collection holding a shard's position: ``hstream/<sub>/<shard>``."""
    return f"hstream/{subscription_id}/{shard_id}"


def reader_target(stream_name: str) -> str:
    """The target of the position readers: ``hstream://<stream>``."""
    return f"hstream://{stream_name}"


@dataclass(frozen=True, slots=True)
class IngestWindow:
    """What one generation applies and commits."""

    records: list[StreamRecord]
    positions: dict[int, RecordPosition]
    newest_publish_ns: int

    @property
    def record_ids(self) -> list[RecordId]:
        return [r.record_id for r in self.records]


@dataclass(slots=True)
class _Open:
    opened_at: float
    records: list[StreamRecord] = field(default_factory=list)
    ids: set[RecordId] = field(default_factory=set)


class WindowAccumulator:
    """Gathers records into windows and filters what is already applied; pure (time is passed in)."""

    def __init__(
        self, window_records: int, window_ms: float, positions: Mapping[int, RecordPosition] | None = None
    ) -> None:
        if window_records < 1 or window_ms < 0:
            raise ValueError("window_records must be >= 1 and window_ms >= 0")
        self.window_records = window_records
        self.window_ms = window_ms
        self.positions: dict[int, RecordPosition] = dict(positions or {})
        self._open: _Open | None = None

    def offer(self, records: Iterable[StreamRecord], now: float) -> list[RecordId]:
        """Adds delivered records; returns those to ack at once (already applied before)."""
        ack_now: list[RecordId] = []
        for record in records:
            rid = record.record_id
            stored = self.positions.get(rid.shard_id)
            if stored is not None and rid.position <= stored:
                ack_now.append(rid)
                continue
            if self._open is None:
                self._open = _Open(now)
            if rid in self._open.ids:
                continue
            self._open.ids.add(rid)
            self._open.records.append(record)
        return ack_now

    def __len__(self) -> int:
        return 0 if self._open is None else len(self._open.records)

    def ready(self, now: float) -> bool:
        """True when the open window is complete (by count or age)."""
        if self._open is None or not self._open.records:
            return False
        return len(self._open.records) >= self.window_records or now >= self.deadline()  # type: ignore[operator]

    def deadline(self) -> float | None:
        """When the open window completes by age (``None``: no window open)."""
        if self._open is None or not self._open.records:
            return None
        return self._open.opened_at + self.window_ms / 1000

    def take(self) -> IngestWindow:
        """Closes the open window and returns it in apply order (call :meth:`committed` after its commit)."""
        if self._open is None or not self._open.records:
            raise ValueError("no open window")
        records = sorted(self._open.records, key=lambda r: r.record_id)
        self._open = None
        positions: dict[int, RecordPosition] = {}
        for record in records:
            positions[record.record_id.shard_id] = record.record_id.position  # sorted: the last one wins
        newest = max(r.publish_time_ns for r in records)
        return IngestWindow(records, positions, newest)

    def committed(self, window: IngestWindow) -> None:
        """The window's generation is committed: its positions are now the stored ones."""
        for shard_id, position in window.positions.items():
            stored = self.positions.get(shard_id)
            if stored is None or position > stored:
                self.positions[shard_id] = position
