"""The ingestion window against every delivery order the HStream protocol allows (issue 25, item 1).

A model of one subscription's server side plays the protocol (SPEC §4) with hypothesis choosing the
schedule, and the test plays the ingestor (SPEC §5): it offers each delivery to a
:class:`~diffstore.streams.ingest_window.WindowAccumulator`, asks the server what the accumulator needs
(marks, the committed position), "commits" windows into a model collection and acks them only then.

What the server may do, and the model does:
- Per shard, batch ids increase but are not dense; a new batch is sent once, in batch order, to the current
  consumer call, whole.
- Every sent record stays unacked until acked; a resend carries the still-unacked records of one batch.
  A record in flight to the current call may be resent at any time (its ack deadline passed).
- A reconnect or an owner change (``takeover``: the lease moved, a fresh accumulator starts from the stored
  positions; a window being committed then is fenced out) kills the call: its unacked records are *orphans*,
  owed to the new call. A server that resends at once (the embedded one, ``resend_s`` 0) sends a shard's
  orphans, in batch order, before any newer batch of it. One that resends at the ack deadline (HStreamDB)
  sends them in any order, mixed with newer batches, but by their deadline: within the ack timeout of the
  call's end, which is shorter than the accumulator's ``resend_s``.
- GetSubscription's offset of a shard is the first sent batch with an unacked record (else the last sent
  batch); an older answer (lower) is allowed too. GetTailRecordId is the shard's last record.
- A crash after a commit but before its acks (``finish(ack=False)``) is followed by a takeover.

Checked: an ack only ever names an applied record (an acked record never comes again); no record is applied
twice; a stored position never passes a record that was not applied (contiguity); and once the server has
delivered everything it owes, every record is applied exactly once.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import hypothesis.strategies as st
from hypothesis import HealthCheck, settings
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from diffstore.streams.ingest_window import IngestWindow, WindowAccumulator
from diffstore.streams.records import RecordFlag, RecordId, RecordPosition, StreamRecord

SHARDS = (0, 1)
RESEND_S = 3.0  # the accumulator's: the ack timeout and a margin
ACK_TIMEOUT_S = 2.0  # the server's


@dataclass
class InFlight:
    """The unacked records of one sent batch, the call they were last sent on, and for orphans (sent on a
    call that ended) by when the server resends them."""

    unacked: set[int]
    call: int
    due_by: float = float("inf")


@dataclass
class ShardLog:
    batches: list[tuple[int, int]] = field(default_factory=list)  # (batch id, size), appended in order
    sent: int = 0  # batches sent at least once
    inflight: dict[int, InFlight] = field(default_factory=dict)  # batch id -> unacked records

    def tail(self) -> RecordPosition:
        if not self.batches:
            return RecordPosition(0, 0)
        batch_id, size = self.batches[-1]
        return RecordPosition(batch_id, size - 1)

    def acked_below(self) -> int:
        """GetSubscription's offset: the first sent batch with an unacked record, else the last sent one."""
        unacked = [batch_id for batch_id, f in self.inflight.items() if f.unacked]
        if unacked:
            return min(unacked)
        return self.batches[self.sent - 1][0] if self.sent else 0


def record(shard: int, batch_id: int, index: int) -> StreamRecord:
    return StreamRecord(RecordId(shard, batch_id, index), f"k{shard}", RecordFlag.RAW, b"v", batch_id)


class DeliveryMachine(RuleBasedStateMachine):
    """The server model, the ingestor's side, and the model collection."""

    def __init__(self) -> None:
        super().__init__()
        self.now = 0.0
        self.call = 0
        self.shards = {sid: ShardLog() for sid in SHARDS}
        self.applied: set[RecordId] = set()
        self.stored: dict[int, RecordPosition] = {}  # the collection's position readers
        self.offsets: list[dict[int, int]] = []  # GetSubscription answers, oldest first
        self.pending: IngestWindow | None = None
        self.at_once = True
        self.window_records = 1
        self.acc = WindowAccumulator(1, 0)

    @initialize(at_once=st.booleans(), window_records=st.integers(1, 6))
    def start(self, at_once: bool, window_records: int) -> None:
        self.at_once = at_once
        self.window_records = window_records
        self.acc = self._accumulator()
        self._remember_offsets()

    def _accumulator(self) -> WindowAccumulator:
        return WindowAccumulator(
            self.window_records, 100.0, self.stored, resend_s=0.0 if self.at_once else RESEND_S
        )

    # -- the server ------------------------------------------------------------------------------------

    def _remember_offsets(self) -> None:
        self.offsets.append({sid: log.acked_below() for sid, log in self.shards.items()})

    def _orphans(self, shard: int) -> list[int]:
        return sorted(b for b, f in self.shards[shard].inflight.items() if f.unacked and f.call != self.call)

    def _send(self, shard: int, batch_id: int) -> None:
        """One delivery: the unacked records of one batch, to the current call, offered to the accumulator."""
        inflight = self.shards[shard].inflight[batch_id]
        inflight.call = self.call
        inflight.due_by = float("inf")
        records = [record(shard, batch_id, i) for i in sorted(inflight.unacked)]
        self._ack(self.acc.offer(records, self.now, self.call))

    def _ack(self, record_ids: list[RecordId]) -> None:
        for rid in record_ids:
            assert rid in self.applied, f"{rid} acked but never applied: the server will not send it again"
            inflight = self.shards[rid.shard_id].inflight.get(rid.batch_id)
            if inflight is not None:
                inflight.unacked.discard(rid.batch_index)

    def _end_call(self) -> None:
        """The consumer call ends: every record in flight to it is owed to the next call."""
        for log in self.shards.values():
            for inflight in log.inflight.values():
                if inflight.unacked and inflight.call == self.call:
                    inflight.due_by = self.now + ACK_TIMEOUT_S
        self.call += 1

    @rule(
        shard=st.sampled_from(SHARDS),
        batches=st.lists(st.tuples(st.integers(1, 3), st.integers(1, 3)), min_size=1, max_size=3),
    )
    def append(self, shard: int, batches: list[tuple[int, int]]) -> None:
        """Producers append batches (gap to the previous batch id, size)."""
        log = self.shards[shard]
        for gap, size in batches:
            last = log.batches[-1][0] if log.batches else 0
            log.batches.append((last + gap, size))

    @rule(shard=st.sampled_from(SHARDS), count=st.integers(1, 3))
    def deliver_new(self, shard: int, count: int = 1) -> None:
        """The next ``count`` new batches of the shard, in order, one delivery each."""
        log = self.shards[shard]
        for _ in range(count):
            if log.sent == len(log.batches) or (self.at_once and self._orphans(shard)):
                return  # nothing new, or (resending at once) the orphans go first
            batch_id, size = log.batches[log.sent]
            log.sent += 1
            log.inflight[batch_id] = InFlight(set(range(size)), self.call)
            self._send(shard, batch_id)

    @rule(shard=st.sampled_from(SHARDS), pick=st.integers(0, 50))
    def resend(self, shard: int, pick: int) -> None:
        log = self.shards[shard]
        current = [b for b, f in log.inflight.items() if f.unacked and f.call == self.call]
        orphans = self._orphans(shard)
        # resending at once: the orphans in batch order; at the deadline: in any order
        candidates = current + (orphans[:1] if self.at_once else orphans)
        if candidates:
            self._send(shard, candidates[pick % len(candidates)])

    @rule()
    def reconnect(self) -> None:
        self._end_call()

    @rule(data=st.data(), dt=st.sampled_from([0.1, 0.5, 1.0, 2.5, 3.5]))
    def advance_clock(self, data: st.DataObject, dt: float) -> None:
        """Time passes; a server resending at the deadline sends the orphans that fall due meanwhile, in any
        order."""
        due = self._due(dt)
        for sid, b in data.draw(st.permutations(due)) if due else ():
            self._send(sid, b)
        self.now += dt

    def _due(self, dt: float) -> list[tuple[int, int]]:
        if self.at_once:
            return []
        return [
            (sid, b)
            for sid, log in self.shards.items()
            for b, f in log.inflight.items()
            if f.unacked and f.call != self.call and f.due_by <= self.now + dt
        ]

    # -- the ingestor ----------------------------------------------------------------------------------

    @precondition(lambda self: self.pending is None)
    @rule(stale=st.integers(0, 3))
    def probe(self, stale: int) -> None:
        """What Ingestor._probe asks: the tail of shards whose mark is due, the committed positions."""
        for sid in self.acc.marks_needed(self.now):
            self.acc.set_mark(sid, self.shards[sid].tail(), self.now)
        if self.acc.held:
            self._remember_offsets()  # the answer now; an older one may still be what a replica says
            self.acc.certify(self.offsets[max(0, len(self.offsets) - 1 - stale)], self.now)

    @precondition(lambda self: self.pending is None)
    @rule()
    def take(self) -> None:
        if self.acc.window_count:
            self.pending = self.acc.take()

    @precondition(lambda self: self.pending is not None)
    @rule(ack=st.booleans())
    def finish(self, ack: bool) -> None:
        """The pending window's generation commits with its positions; then its acks, or a crash before."""
        window = self.pending
        assert window is not None
        self.pending = None
        for r in window.records:
            assert r.record_id not in self.applied, f"{r.record_id} applied twice"
            self.applied.add(r.record_id)
        for sid, position in window.positions.items():
            self.stored[sid] = max(position, self.stored.get(sid, position))
        self.acc.committed(window)
        if ack:
            self._ack(window.record_ids)
        else:
            self.takeover()

    @precondition(lambda self: self.pending is None)
    @rule()
    def commit(self) -> None:
        """A window taken and committed at once (the common case), acked."""
        if self.acc.window_count:
            self.take()
            self.finish(ack=True)

    @rule()
    def takeover(self) -> None:
        """Another ingestor takes the lease: it starts from the stored positions on a new call; a window
        the previous one was committing is fenced out."""
        self.pending = None
        self._end_call()
        self.acc = self._accumulator()

    # -- the checks ------------------------------------------------------------------------------------

    @invariant()
    def positions_pass_only_applied_records(self) -> None:
        for sid, position in self.stored.items():
            for batch_id, size in self.shards[sid].batches:
                for i in range(size):
                    if RecordPosition(batch_id, i) > position:
                        break
                    assert RecordId(sid, batch_id, i) in self.applied, (
                        f"shard {sid} stored at {position} past {RecordId(sid, batch_id, i)}, never applied"
                    )

    def teardown(self) -> None:
        """The server delivers everything it owes, fairly: then every record is applied exactly once."""
        everything = {
            RecordId(sid, b, i)
            for sid, log in self.shards.items()
            for b, size in log.batches
            for i in range(size)
        }
        rounds = sum(len(log.batches) for log in self.shards.values()) * 2 + 5
        for _ in range(rounds):
            if self.pending is not None:
                self.finish(ack=True)
            for sid, b in self._due(RESEND_S + 0.5):
                self._send(sid, b)
            self.now += RESEND_S + 0.5
            for sid, log in self.shards.items():
                for b in self._orphans(sid):
                    self._send(sid, b)
                while log.sent < len(log.batches):
                    self.deliver_new(sid)
            self.probe(stale=0)
            if self.acc.window_count:
                self.take()
                self.finish(ack=True)
            if self.applied == everything and not self.acc.held:
                break
        missing = sorted(everything - self.applied)
        assert not missing, (
            f"never applied though delivered: {missing[:5]} ({len(missing)}); held {self.acc.held}"
        )
        self.positions_pass_only_applied_records()


DeliveryMachine.TestCase.settings = settings(
    max_examples=200, stateful_step_count=150, deadline=None, suppress_health_check=list(HealthCheck)
)
TestWindowUnderAnyDeliveryOrder = DeliveryMachine.TestCase
