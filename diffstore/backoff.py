"""How a long-running command rides out an outage of a server it needs: the retry policy, pure.

Every long-running command (``ingest`` against its diffstore server and its streams server, ``transform
--watch``, ``watch``, the consumers of :mod:`diffstore.consumer`) meets a server that does not answer for a
while -- a restart, a worker replaced by its supervisor, a link that drops -- and must neither exit nor
hammer the server. This module decides, and only decides: :class:`Outage` is a state machine fed
``failed(now)`` and ``succeeded(now)`` (time and randomness passed in, no sockets, no sleeping, h11 style),
answering how long to wait before the next attempt, whether this failure starts an outage (log it once),
whether a success ends one (log it once), and when to give up. :mod:`diffstore.outage` performs it.

States and transitions::

    UP       --failed(now)-->     WAITING   since = now, attempt 1   -> Retry(delay(1), starts=True)
    WAITING  --failed(now)-->     WAITING   attempt n + 1            -> Retry(delay(n + 1), starts=False)
             (now - since >= give_up_after_s)  -> GAVE_UP            -> GiveUp(now - since, attempts)
    WAITING  --succeeded(now)-->  UP                                 -> the outage's length (say "back")
    UP       --succeeded(now)-->  UP                                 -> None (nothing to say)
    GAVE_UP  is final: any event raises :class:`ValueError`

Invariants:
    * ``delay(n)`` = ``min(max_s, initial_s * multiplier ** (n - 1))`` less a random share of at most
      ``jitter`` of it: bounded by ``max_s``, never below ``(1 - jitter) * initial_s`` (many clients that
      lost one server come back spread out, not in one thundering herd).
    * With a limit, the last wait ends at the limit (a delay never carries an attempt past it), so a command
      gives up ``give_up_after_s`` after the first failure, give or take one call's own timeout.
    * One ``starts=True`` per outage and one length per recovery: exactly one line when a command starts
      waiting, one when it is back.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass

GIVE_UP_OPTION = "--give-up-after-s"
"""The option of every long-running command that bounds how long it waits for a server (default: never)."""

GIVE_UP_HELP = (
    "how long to keep retrying a server that does not answer (a restart, a broken link) before exiting 1:"
    " seconds, or 'never' (the default: wait with bounded back-off, log once when waiting starts and once"
    " when the server is back)"
)


def give_up_argument(text: str) -> float | None:
    """Parses :data:`GIVE_UP_OPTION`: ``never`` (None) or seconds >= 0 (0: give up at the first failure).

    Raises:
        ValueError: anything else (argparse turns it into a usage error).
    """
    if text.strip().lower() == "never":
        return None
    seconds = float(text)
    if not seconds >= 0 or seconds == float("inf"):
        raise ValueError(f"{GIVE_UP_OPTION} takes seconds >= 0 or 'never', not {text!r}")
    return seconds


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """Bounded exponential back-off with jitter, and how long to keep at it.

    Attributes:
        initial_s: the first wait.
        max_s: no wait is longer (the longest a command stays unaware that its server is back).
        multiplier: each wait is this many times the previous one, up to ``max_s``.
        jitter: the share (0..1) of each wait that is random: a wait of ``d`` is drawn from
            ``[d * (1 - jitter), d]``.
        give_up_after_s: how long after an outage's first failure to give up (None: never).
    """

    initial_s: float = 0.2
    max_s: float = 5.0
    multiplier: float = 2.0
    jitter: float = 0.5
    give_up_after_s: float | None = None

    def __post_init__(self) -> None:
        if not 0 < self.initial_s <= self.max_s or self.multiplier < 1:
            raise ValueError("need 0 < initial_s <= max_s and multiplier >= 1")
        if not 0 <= self.jitter <= 1:
            raise ValueError("jitter is a share: 0..1")
        if self.give_up_after_s is not None and not self.give_up_after_s >= 0:
            raise ValueError("give_up_after_s must be >= 0 (None: never)")

    def delay(self, attempt: int, draw: float) -> float:
        """The wait after the ``attempt``-th failure (1-based); ``draw`` is uniform in [0, 1)."""
        if attempt < 1 or not 0 <= draw <= 1:
            raise ValueError("attempt counts from 1 and draw is in [0, 1]")
        # exponent capped: past max_s the product would only overflow
        base = min(self.max_s, self.initial_s * self.multiplier ** min(attempt - 1, 64))
        return base * (1 - self.jitter * draw)


class State(enum.Enum):
    UP = "up"
    WAITING = "waiting"
    GAVE_UP = "gave_up"


@dataclass(frozen=True, slots=True)
class Retry:
    """Wait ``delay_s``, then try again; ``starts``: this failure began the outage (say so once)."""

    delay_s: float
    attempt: int
    starts: bool


@dataclass(frozen=True, slots=True)
class GiveUp:
    """The limit passed: stop retrying and fail."""

    waited_s: float
    attempts: int


class Outage:
    """The retry state of one server a command needs (see the module's table)."""

    def __init__(self, policy: RetryPolicy, draw: Callable[[], float]) -> None:
        self.policy = policy
        self._draw = draw
        self.state = State.UP
        self.since: float | None = None  # when the current outage began
        self.attempts = 0  # failures in the current outage
        self.outages = 0  # outages begun so far (a metric)

    def failed(self, now: float) -> Retry | GiveUp:
        """A call did not reach the server (refused, reset, timed out, unavailable)."""
        self._check()
        starts = self.state is State.UP
        if starts:
            self.state, self.since, self.attempts = State.WAITING, now, 0
            self.outages += 1
        assert self.since is not None
        self.attempts += 1
        waited = now - self.since
        limit = self.policy.give_up_after_s
        if limit is not None and waited >= limit:
            self.state = State.GAVE_UP
            return GiveUp(waited, self.attempts)
        delay = self.policy.delay(self.attempts, self._draw())
        if limit is not None:
            delay = min(delay, self.since + limit - now)  # the last attempt is made at the limit
        return Retry(delay, self.attempts, starts)

    def succeeded(self, now: float) -> float | None:
        """A call reached the server; returns how long the outage it ends lasted (None: there was none)."""
        self._check()
        if self.state is State.UP:
            return None
        assert self.since is not None
        length = now - self.since
        self.state, self.since, self.attempts = State.UP, None, 0
        return length

    @property
    def waiting(self) -> bool:
        return self.state is State.WAITING

    def _check(self) -> None:
        if self.state is State.GAVE_UP:
            raise ValueError("this outage was given up on: nothing follows")


__all__ = [
    "GIVE_UP_HELP",
    "GIVE_UP_OPTION",
    "GiveUp",
    "Outage",
    "Retry",
    "RetryPolicy",
    "State",
    "give_up_argument",
]
