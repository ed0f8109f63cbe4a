"""Performs the retry policy of :mod:`diffstore.backoff` for a command: which failures are an outage, the
two log lines of an outage, and the metric.

A command keeps one :class:`OutageWatch` per server it needs (``ingest``: its diffstore server and its
streams server). Around each unit of work it calls :meth:`OutageWatch.succeeded` when a call got an
answer, and on a failure asks :func:`is_outage`: an outage goes to :meth:`OutageWatch.failed`, which
says how long to wait before trying again (or re-raises the failure once the command's
``--give-up-after-s`` passed); anything else is a real error and ends the command as before.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable

from diffstore.backoff import GiveUp, Outage, RetryPolicy, State
from diffstore.errors import Overloaded, StorageError

GATEWAY_STATUSES = frozenset({502, 503, 504})
"""What a proxy in front of a server answers while the server restarts (an answer that is not diffstore's)."""


def is_outage(exc: BaseException) -> bool:
    """Whether ``exc`` is a call that did not reach a working server -- refused, reset, timed out (an
    HTTP call that never got an answer), a 503 ``overloaded``, a proxy's 502/503/504 (a server restarting
    behind it), a fail-over seen by a client of several servers (``NoLeader``, ``LeaderChanged``), or a
    streams call that was UNAVAILABLE, DEADLINE_EXCEEDED or CANCELLED -- rather than an
    answer the server gave (those are not retried)."""
    if isinstance(exc, Overloaded) or getattr(exc, "http_status", None) in GATEWAY_STATUSES:
        return True
    if getattr(exc, "retryable", False) is True:  # a streams call UNAVAILABLE; a fail-over (NoLeader, ...)
        return True
    if isinstance(exc, StorageError):
        # the client's transport edge raises StorageError from the httpx failure (diffstore.client): the
        # cause's module says it without importing httpx into every command
        cause = exc.__cause__
        return cause is not None and type(cause).__module__.startswith(("httpx", "httpcore"))
    return False


class OutageWatch:
    """One server's :class:`~diffstore.backoff.Outage`, with its log lines and an optional listener.

    Args:
        server: how the log lines name the server (``"the diffstore server http://..."``).
        policy: back-off and limit.
        logger: gets one WARNING when an outage starts, one INFO when the server is back, one ERROR when
            the command gives up.
        on_change: told ``True`` when an outage starts and ``False`` when it ends (a metric).
    """

    def __init__(
        self,
        server: str,
        policy: RetryPolicy,
        logger: logging.Logger,
        on_change: Callable[[bool], None] | None = None,
        *,
        draw: Callable[[], float] = random.random,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.server = server
        self.outage = Outage(policy, draw)
        self.logger = logger
        self.on_change = on_change
        self.clock = clock
        self._lock = threading.Lock()  # a command's threads may share a watch (ingest and its subscriber)

    @property
    def waiting(self) -> bool:
        return self.outage.waiting

    def failed(self, exc: BaseException) -> float:
        """Records a failed call (an outage, see :func:`is_outage`); returns how long to wait before the next
        attempt. Re-raises ``exc`` once the policy's limit has passed (and at every call after that)."""
        with self._lock:
            if self.outage.state is State.GAVE_UP:
                raise exc
            decision = self.outage.failed(self.clock())
        if isinstance(decision, GiveUp):
            self.logger.error(
                "%s: gave up after %.1f s and %d attempts: %s",
                self.server,
                decision.waited_s,
                decision.attempts,
                exc,
                extra={"server": self.server, "waited_s": round(decision.waited_s, 3)},
            )
            raise exc
        if decision.starts:
            limit = self.outage.policy.give_up_after_s
            until = "until it answers" if limit is None else f"for up to {limit:g} s"
            self.logger.warning(
                "%s does not answer; retrying with back-off %s: %s",
                self.server,
                until,
                exc,
                extra={"server": self.server, "error": str(exc)},
            )
            if self.on_change is not None:
                self.on_change(True)
        return decision.delay_s

    def succeeded(self) -> None:
        """Records a call that got an answer: ends an outage (one log line), else nothing."""
        if not self.outage.waiting:
            return  # the common case: one attribute read per call
        with self._lock:
            if self.outage.state is State.GAVE_UP:
                return
            length = self.outage.succeeded(self.clock())
        if length is None:
            return
        self.logger.info(
            "%s is back after %.1f s", self.server, length, extra={"server": self.server, "outage_s": length}
        )
        if self.on_change is not None:
            self.on_change(False)


__all__ = ["OutageWatch", "is_outage"]
