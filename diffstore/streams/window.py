"""The pure half of ingestion (SPEC §5): windows of records and stored positions.

:class:`WindowAccumulator` is fed decoded records and the clock, and says what to ack at once, when a window
is complete, and what a window commits. It never touches a socket or a store.

Invariants:
- ``positions[shard]`` is the last RecordId of the shard applied to the collection (committed with it).
  A record at or below it was applied before: it is acked at once and never applied again.
- A record already in the open window (a resend while the window is still being gathered) is ignored;
  it is acked with the window, after the commit.
- A window is complete when it holds ``window_records`` records or its first record is ``window_ms`` old.
  Its records are applied in (shard, batch id, batch index) order, so each partition key keeps its order.
- After a window's commit, the positions it carried become the stored positions. Between take and
  commit, records at or below the taken window's positions are ignored (not acked: the commit may fail);
  they are acked with that window.

Generation ids and reader names of the target collection: see :mod:`diffstore.rounds`.
"""

from __future__ import annotations

import bisect
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from itertools import repeat
from operator import attrgetter

from diffstore.streams.records import RecordId, RecordPosition, StreamRecord


@dataclass(frozen=True, slots=True)
class IngestWindow:
    """What one generation applies and commits."""

    records: list[StreamRecord]
    positions: dict[int, RecordPosition]
    newest_publish_ns: int
    newest_publish_ns_by_shard: dict[int, int] = field(default_factory=dict)

    @property
    def record_ids(self) -> list[RecordId]:
        return [r.record_id for r in self.records]


@dataclass(slots=True)
class _ShardRun:
    """The open window's records of one shard, in position order unless ``unordered``."""

    records: list[StreamRecord] = field(default_factory=list)
    last: RecordPosition | None = None
    unordered: bool = False


@dataclass(slots=True)
class _Open:
    opened_at: float
    count: int = 0
    shards: dict[int, _ShardRun] = field(default_factory=dict)


_RECORD_ID = attrgetter("record_id")


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
        self._taken: dict[int, RecordPosition] = dict(self.positions)
        self._open: _Open | None = None

    def offer(self, records: Sequence[StreamRecord], now: float) -> list[RecordId]:
        """Adds delivered records; returns those to ack at once (already applied before).

        ``records`` as one delivery holds them (one batch of one shard, ascending) take a fast path when
        they all lie above everything known of their shard; anything else is handled record by record.
        """
        if not records:
            return []
        first, last = records[0].record_id, records[-1].record_id
        if first.shard_id == last.shard_id and first.batch_id == last.batch_id and first <= last:
            run = self._run_if_all_new(first, now)
            if run is not None:
                run.records.extend(records)
                run.last = RecordPosition(last.batch_id, last.batch_index)
                self._open.count += len(records)  # type: ignore[union-attr]
                return []
        return [rid for rid in map(self._offer_one, records, repeat(now)) if rid is not None]

    def _run_if_all_new(self, first: RecordId, now: float) -> _ShardRun | None:
        """The shard's run when ``first`` lies above its stored, taken and window positions."""
        position = RecordPosition(first.batch_id, first.batch_index)
        shard_id = first.shard_id
        taken = self._taken.get(shard_id)
        if taken is not None and position <= taken:
            return None
        run = self._run(shard_id, now)
        if run.last is not None and position <= run.last:
            return None
        return run

    def _run(self, shard_id: int, now: float) -> _ShardRun:
        window = self._open
        if window is None:
            window = self._open = _Open(now)
        run = window.shards.get(shard_id)
        if run is None:
            run = window.shards[shard_id] = _ShardRun()
        return run

    def _offer_one(self, record: StreamRecord, now: float) -> RecordId | None:
        rid = record.record_id
        shard_id = rid.shard_id
        position = RecordPosition(rid.batch_id, rid.batch_index)
        stored = self.positions.get(shard_id)
        if stored is not None and position <= stored:
            return rid  # applied before: ack at once
        taken = self._taken.get(shard_id)
        if taken is not None and position <= taken:
            return None  # in a taken window whose commit is under way: acked with that window
        run = self._run(shard_id, now)
        if run.last is not None and position <= run.last:
            if _contains(run, rid):
                return None  # a resend of a record already in the window
            run.unordered = True
        else:
            run.last = position
        run.records.append(record)
        self._open.count += 1  # type: ignore[union-attr]
        return None

    def __len__(self) -> int:
        return 0 if self._open is None else self._open.count

    def ready(self, now: float) -> bool:
        """True when the open window is complete (by count or age)."""
        deadline = self.deadline()
        if deadline is None:
            return False
        return len(self) >= self.window_records or now >= deadline

    def deadline(self) -> float | None:
        """When the open window completes by age (``None``: no window open)."""
        if self._open is None or not self._open.count:
            return None
        return self._open.opened_at + self.window_ms / 1000

    def take(self) -> IngestWindow:
        """Closes the open window and returns it in apply order (call :meth:`committed` after its commit)."""
        window = self._open
        if window is None or not window.count:
            raise ValueError("no open window")
        self._open = None
        records: list[StreamRecord] = []
        positions: dict[int, RecordPosition] = {}
        newest_by_shard: dict[int, int] = {}
        for shard_id in sorted(window.shards):
            run = window.shards[shard_id]
            if run.unordered:
                run.records.sort(key=_RECORD_ID)
            records.extend(run.records)
            newest_by_shard[shard_id] = max(map(attrgetter("publish_time_ns"), run.records))
            last = run.records[-1].record_id
            positions[shard_id] = RecordPosition(last.batch_id, last.batch_index)
            taken = self._taken.get(shard_id)
            if taken is None or positions[shard_id] > taken:
                self._taken[shard_id] = positions[shard_id]
        return IngestWindow(records, positions, max(newest_by_shard.values()), newest_by_shard)

    def committed(self, window: IngestWindow) -> None:
        """The window's generation is committed: its positions are now the stored ones."""
        for shard_id, position in window.positions.items():
            stored = self.positions.get(shard_id)
            if stored is None or position > stored:
                self.positions[shard_id] = position


def _contains(run: _ShardRun, rid: RecordId) -> bool:
    if run.unordered:
        return any(r.record_id == rid for r in run.records)
    i = bisect.bisect_left(run.records, rid, key=_RECORD_ID)
    return i < len(run.records) and run.records[i].record_id == rid
