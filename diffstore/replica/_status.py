"""What each followed collection is doing, and when its follower tries again: pure state, no I/O.

The follower (:mod:`diffstore.replica._follow`) reports every outcome of a collection's work here and
does what the answer says: store the new state (``GET /replica``, metrics, the console) and log one line
when the state changed, or when a failure is the first of a run.

States (SPEC §9): ``copying`` (no copy yet, or taking one again), ``following`` (copied; applies the
primary's generations as they come), ``stalled`` (the last attempt failed; ``reason`` says why).

Invariants:
- A collection is in exactly one state; ``since_ms`` is when it entered it (a repeated failure with the
  same reason is no change: no new line, no new ``since_ms``).
- After ``n`` failures in a row the next attempt waits ``min(cap, base * 2**(n-1))`` scaled by a random
  factor in [0.5, 1] (jitter: many collections, or many replicas, do not retry in step). Any success
  resets the count.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

COPYING = "copying"
FOLLOWING = "following"
STALLED = "stalled"


@dataclass(frozen=True, slots=True)
class Backoff:
    """Bounded exponential back-off with jitter."""

    base_s: float = 0.2
    cap_s: float = 10.0

    def delay_s(self, failures: int, rng: random.Random) -> float:
        """How long to wait after the ``failures``-th failure in a row (0 after none)."""
        if failures <= 0:
            return 0.0
        full = min(self.cap_s, self.base_s * 2.0 ** min(failures - 1, 30))
        return full * (0.5 + rng.random() / 2)


@dataclass(frozen=True, slots=True)
class Change:
    """What a report changed: whether to store and log it (``line``: the one log line, or None)."""

    state: str
    reason: str | None
    since_ms: int
    changed: bool
    line: str | None


@dataclass(slots=True)
class Status:
    """One collection's follower: its state, why, since when, and its run of failures."""

    state: str = COPYING
    reason: str | None = None
    since_ms: int = 0
    failures: int = 0
    retry_at: float = 0.0  # monotonic: not before this


@dataclass(slots=True)
class Tracker:
    """Every collection's :class:`Status`; :meth:`ok` and :meth:`failed` report outcomes."""

    backoff: Backoff = field(default_factory=Backoff)
    rng: random.Random = field(default_factory=random.Random)
    statuses: dict[str, Status] = field(default_factory=dict)

    def get(self, name: str) -> Status:
        status = self.statuses.get(name)
        if status is None:
            status = self.statuses[name] = Status()
        return status

    def forget(self, name: str) -> None:
        self.statuses.pop(name, None)

    def ok(self, name: str, state: str, now_ms: int, detail: str = "") -> Change:
        """The work on ``name`` went through; it is now ``state`` (``copying`` or ``following``)."""
        status = self.get(name)
        failures, was, was_reason = status.failures, status.state, status.reason
        status.failures = 0
        status.retry_at = 0.0
        if state == was and status.since_ms:
            return Change(state, None, status.since_ms, False, None)
        status.state, status.reason, status.since_ms = state, None, now_ms
        line = f"replica: {name}: {state}{detail}"
        if was == STALLED:
            line += f" again (stalled after {failures} failed attempt{'s' * (failures != 1)}: {was_reason})"
        return Change(state, None, now_ms, True, line)

    def failed(self, name: str, reason: str, now_ms: int, now: float) -> Change:
        """The work on ``name`` failed for ``reason`` (one line); it is ``stalled`` and waits to retry."""
        status = self.get(name)
        status.failures += 1
        delay = self.backoff.delay_s(status.failures, self.rng)
        status.retry_at = now + delay
        if status.state == STALLED and status.reason == reason:
            return Change(STALLED, reason, status.since_ms, False, None)
        first = status.state != STALLED
        status.state, status.reason, status.since_ms = STALLED, reason, now_ms
        what = "stalled" if first else "still stalled"
        line = f"replica: {name}: {what}: {reason}; retrying with back-off (next in {delay:.1f}s)"
        return Change(STALLED, reason, now_ms, True, line)

    def unreachable(self, name: str, reason: str, now_ms: int) -> Change:
        """The primary cannot be reached at all: ``name`` is stalled with the follower's ``reason``, with
        no back-off of its own and no line of its own (the follower logs one line for all)."""
        status = self.get(name)
        if status.state == STALLED and status.reason == reason:
            return Change(STALLED, reason, status.since_ms, False, None)
        status.state, status.reason, status.since_ms = STALLED, reason, now_ms
        return Change(STALLED, reason, now_ms, True, None)

    def due(self, name: str, now: float) -> bool:
        """Whether ``name`` may be tried now (its back-off has passed)."""
        status = self.statuses.get(name)
        return status is None or status.retry_at <= now

    def next_retry(self, now: float) -> float | None:
        """Seconds until the first back-off ends (None: nobody waits)."""
        # a copy (one step under the GIL): the follower's workers add statuses while its watcher asks
        waits = [s.retry_at - now for s in list(self.statuses.values()) if s.retry_at > now]
        return min(waits) if waits else None
