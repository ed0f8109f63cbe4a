"""The pure half of ingestion (SPEC §5): windows of records and stored positions.

:class:`WindowAccumulator` is fed decoded records, the clock and what the streams server says, and says what
to ack at once, when a window is complete, and what a window commits. It never touches a socket or a store.

Invariants:
- ``positions[shard]`` (P) is the last RecordId of the shard applied to the collection (committed with it),
  and it is *contiguous*: every record of the shard at or below it was applied. A record at or below it
  is acked at once and never applied again. (Contiguity is what makes skipping safe: a position stored past
  a record that was never applied would drop that record for good when it arrives.)
- Per shard a *frontier* F >= the taken positions >= P: every record of the shard at or below F is applied,
  in a taken window or in the open window. The open window holds only records at or below F, so a window
  never moves a position past a record that was not applied.
- Records above F are *held* outside the window until they are known to follow F. Batch ids increase per
  shard but are not dense, so "follows" cannot be read from the ids alone. A held record follows F when
  (a) it is the next index of F's batch (a batch's indices are dense), or
  (b) it opens a batch (index 0) whose id is at most the server's committed position of the shard
      (:meth:`certify`; GetSubscription's offset: every record of the earlier batches is acked, acks follow
      commits, so each of them was applied and lies at or below P), or
  (c) the shard is *in order* for this consumer call.
- With ``resend_s`` 0 (a server that resends at once, ahead of newer batches: the embedded one) a shard's
  deliveries on a call come in shard order, so a shard is in order as soon as its lowest held record is
  known to follow F. Otherwise a shard is in order once F reached its *mark*, or a record above the mark
  is here. The mark is the shard's
  tail (GetTailRecordId), read ``resend_s`` after the shard's first delivery on the current call
  (:meth:`set_mark`). Why that is enough: by then this consumer owns the shard, and the server has sent it
  every record that was in flight elsewhere (records sent to a previous owner, which paused or died with
  them unacked, or on a broken call): it resends them at once on the owner change (``resend_s`` 0, the
  embedded server) or at their ack deadline (HStreamDB: ``resend_s`` = the ack timeout and a margin), to
  the shard's owner. A record appended after the mark is sent later on the same call, so when one is here,
  every unacked record below it is here too; and if F reached the mark, all of those are applied. So from
  then on each delivery above F continues F. The first delivery of a shard on a new call (a start, a
  reconnect) puts it out of order again.
- A record at or below F that is neither in the open window nor taken breaks the order this relied on
  (the server delivered the shard out of order on one call); it is applied late, never skipped, and
  counted in ``disorder``.
- A window is complete when it holds ``window_records`` records or its first record is ``window_ms`` old.
  Its records are applied in (shard, batch id, batch index) order, so each partition key keeps its order.
- After a window's commit, the positions it carried become the stored positions. Between take and
  commit, records at or below the taken window's positions are ignored (not acked: the commit may fail);
  they are acked with that window.

Generation ids and reader names of the target collection: see :mod:`diffstore.rounds`.
"""

from __future__ import annotations

import bisect
import heapq
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
class _ShardFrontier:
    """What this consumer knows of one shard's order (see the module invariants)."""

    frontier: RecordPosition | None
    call: int = -1  # the consumer call of the shard's latest delivery
    first_at: float = 0.0  # when the shard's first delivery on that call came
    in_order: bool = False
    mark: RecordPosition | None = None  # out of order: in order once a record above it is here
    high: RecordPosition = RecordPosition(0, 0)  # the highest record held on this call
    held: dict[RecordId, StreamRecord] = field(default_factory=dict)
    # the held record ids as a min-heap: the lowest is looked at on every arrival, and sorting them all each
    # time made a takeover's backlog (tens of thousands held) cost milliseconds per record
    held_order: list[RecordId] = field(default_factory=list)


@dataclass(slots=True)
class _Open:
    opened_at: float
    count: int = 0
    shards: dict[int, _ShardRun] = field(default_factory=dict)


_RECORD_ID = attrgetter("record_id")
_NOTHING = RecordPosition(0, 0)  # below every record: batch ids start at 1


class WindowAccumulator:
    """Gathers records into windows and filters what is already applied; pure (time is passed in)."""

    def __init__(
        self,
        window_records: int,
        window_ms: float,
        positions: Mapping[int, RecordPosition] | None = None,
        resend_s: float = 0.0,
    ) -> None:
        """Args:
        window_records, window_ms: when a window is complete.
        positions: the stored positions (P) per shard.
        resend_s: how long after a shard changes owner the server may still resend records that were in
            flight to the previous owner (0: at once, before newer batches; else the ack timeout and some):
            a shard's mark is read that long after its first delivery on a call.
        """
        if window_records < 1 or window_ms < 0 or resend_s < 0:
            raise ValueError("window_records must be >= 1, window_ms and resend_s >= 0")
        self.window_records = window_records
        self.window_ms = window_ms
        self.resend_s = resend_s
        self.positions: dict[int, RecordPosition] = dict(positions or {})
        self._taken: dict[int, RecordPosition] = dict(self.positions)
        self._shards: dict[int, _ShardFrontier] = {}
        self._open: _Open | None = None
        self._held = 0
        self._stalled = False
        self.disorder = 0  # records that arrived below the frontier, unseen (applied late; see invariants)

    # -- records in ----------------------------------------------------------------------------------

    def offer(self, records: Sequence[StreamRecord], now: float, call: int = 0) -> list[RecordId]:
        """Adds records delivered on consumer call ``call``; returns those to ack at once (applied before).

        ``records`` as one delivery holds them (one batch of one shard, ascending) take a fast path when
        their shard is in order and they all lie above its frontier; anything else goes record by record.
        """
        if not records:
            return []
        first, last = records[0].record_id, records[-1].record_id
        if first.shard_id == last.shard_id and first.batch_id == last.batch_id and first <= last:
            run = self._run_if_in_order(first, now, call)
            if run is not None:
                run.records.extend(records)
                run.last = RecordPosition(last.batch_id, last.batch_index)
                self._shards[first.shard_id].frontier = run.last
                self._open.count += len(records)  # type: ignore[union-attr]
                return []
        return [rid for rid in map(self._offer_one, records, repeat(now), repeat(call)) if rid is not None]

    def _shard(self, shard_id: int, call: int, now: float) -> _ShardFrontier:
        shard = self._shards.get(shard_id)
        if shard is None:
            shard = self._shards[shard_id] = _ShardFrontier(self._taken.get(shard_id))
        if call > shard.call:  # the shard's first delivery on a new call: out of order until re-marked
            shard.call = call
            shard.first_at = now
            shard.in_order = False
            shard.mark = None
            shard.high = _NOTHING
        return shard

    def _run_if_in_order(self, first: RecordId, now: float, call: int) -> _ShardRun | None:
        """The shard's run when the shard is in order on ``call`` and ``first`` lies above its frontier."""
        shard = self._shards.get(first.shard_id)
        if shard is None or not shard.in_order or call != shard.call:
            return None
        if shard.frontier is not None and RecordPosition(first.batch_id, first.batch_index) <= shard.frontier:
            return None
        return self._run(first.shard_id, now)

    def _run(self, shard_id: int, now: float) -> _ShardRun:
        window = self._open
        if window is None:
            window = self._open = _Open(now)
        run = window.shards.get(shard_id)
        if run is None:
            run = window.shards[shard_id] = _ShardRun()
        return run

    def _add(self, run: _ShardRun, record: StreamRecord, position: RecordPosition) -> None:
        if run.last is not None and position <= run.last:
            run.unordered = True
        else:
            run.last = position
        run.records.append(record)
        self._open.count += 1  # type: ignore[union-attr]

    def _offer_one(self, record: StreamRecord, now: float, call: int) -> RecordId | None:
        rid = record.record_id
        shard_id = rid.shard_id
        position = RecordPosition(rid.batch_id, rid.batch_index)
        stored = self.positions.get(shard_id)
        if stored is not None and position <= stored:
            return rid  # applied before: ack at once
        shard = self._shard(shard_id, call, now)
        taken = self._taken.get(shard_id)
        if taken is not None and position <= taken:
            return None  # in a taken window whose commit is under way: acked with that window
        if shard.frontier is not None and position <= shard.frontier:
            run = self._run(shard_id, now)
            if not _contains(run, rid):  # never seen, yet below the frontier: apply it late, never skip it
                self.disorder += 1
                self._add(run, record, position)
            return None  # else a resend of a record already in the window
        if shard.in_order:
            self._add(self._run(shard_id, now), record, position)
            shard.frontier = position
            return None
        if rid not in shard.held:
            shard.held[rid] = record
            heapq.heappush(shard.held_order, rid)
            self._held += 1
            shard.high = max(shard.high, position)
            self._extend(shard_id, shard, now, None)
        return None

    # -- what the server says --------------------------------------------------------------------------

    def marks_needed(self, now: float) -> list[int]:
        """Shards holding records whose mark is unknown and due: ``resend_s`` after their first delivery on
        the current call."""
        return [
            sid
            for sid, shard in self._shards.items()
            if shard.held and shard.mark is None and now >= shard.first_at + self.resend_s
        ]

    def next_mark_at(self) -> float | None:
        """When the next mark falls due (``None``: none is waited for)."""
        due = [s.first_at + self.resend_s for s in self._shards.values() if s.held and s.mark is None]
        return min(due, default=None)

    def set_mark(self, shard_id: int, tail: RecordPosition, now: float) -> None:
        """The shard's tail position, read ``resend_s`` after its first delivery on the current call."""
        shard = self._shards[shard_id]
        shard.mark = tail
        self._extend(shard_id, shard, now, None)

    def certify(self, committed_batches: Mapping[int, int], now: float) -> None:
        """The server's committed position per shard (GetSubscription: the batch of the first unacked
        record): held records opening a batch up to it follow the frontier."""
        for shard_id, shard in self._shards.items():
            if shard.held and shard_id in committed_batches:
                self._extend(shard_id, shard, now, committed_batches[shard_id])
        self._stalled = self._held > 0

    def _extend(self, shard_id: int, shard: _ShardFrontier, now: float, committed_batch: int | None) -> None:
        """Moves held records that follow the frontier into the open window, lowest first."""
        if not shard.in_order and shard.mark is not None:
            # a record above the mark is here: every record below it is applied or held (see invariants)
            shard.in_order = (shard.frontier or _NOTHING) >= shard.mark or shard.high > shard.mark
        if not shard.held:
            return
        while shard.held_order:
            rid = shard.held_order[0]
            position = RecordPosition(rid.batch_id, rid.batch_index)
            frontier = shard.frontier
            follows = (
                shard.in_order
                or (frontier is not None and position == (frontier.batch_id, frontier.batch_index + 1))
                or (
                    position.batch_index == 0
                    and committed_batch is not None
                    and rid.batch_id <= committed_batch
                )
            )
            if not follows:
                return
            heapq.heappop(shard.held_order)
            self._add(self._run(shard_id, now), shard.held.pop(rid), position)
            self._held -= 1
            shard.frontier = position
            if not self.resend_s:
                # a server that resends at once delivers each shard in order on a call: the first record
                # known to follow the frontier is followed by every later one
                shard.in_order = True
            if not shard.in_order and shard.mark is not None and position >= shard.mark:
                shard.in_order = True  # everything up to the mark is applied or in the window

    @property
    def held(self) -> int:
        """Records held above a frontier (waiting to be known to follow it)."""
        return self._held

    @property
    def stalled(self) -> bool:
        """The server's committed position, last asked, left records held: the open window should commit
        now, its acks are what moves that position (one batch at a time while a shard is out of order)."""
        return self._stalled and self._held > 0

    # -- windows ----------------------------------------------------------------------------------------

    def __len__(self) -> int:
        """Records gathered and not yet taken: the open window's and the held ones."""
        return self.window_count + self._held

    @property
    def window_count(self) -> int:
        """Records in the open window (those a :meth:`take` would return)."""
        return 0 if self._open is None else self._open.count

    def ready(self, now: float) -> bool:
        """True when the open window is complete: by count or age, or at once when :attr:`stalled`."""
        deadline = self.deadline()
        if deadline is None:
            return False
        return self.window_count >= self.window_records or now >= deadline or self.stalled

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
