"""Keeping a lease, for any front (ingest, transform, consumer): a pure state machine and a thin driver.

:class:`LeaseKeeper` decides, from the time it is given and the answers it is fed, when to acquire, when to
renew, and when the lease must be taken as lost. It does no I/O. :class:`LeaseGuard` drives it over any
:class:`~diffstore.collection.Collection` (embedded or HTTP) in one background thread, and tells the front
when it became active (with the fencing token to put on its rounds, see :class:`diffstore.rounds.Round`)
and when it must stop.

States and transitions (``now`` is the keeper's monotonic clock, in seconds)::

    STANDBY --acquire ok(lease, sent_at)--> ACTIVE    valid_until := sent_at + ttl - margin
    STANDBY --acquire refused(now)-------> STANDBY    next try := now + standby_poll
    ACTIVE  --renew ok(lease, sent_at)---> ACTIVE     valid_until := sent_at + ttl - margin
    ACTIVE  --renew refused(now)---------> STANDBY    (another version holds it: lost)
    ACTIVE  --now >= valid_until---------> STANDBY    (renewals failed too long: lost)
    ACTIVE  --release--------------------> STANDBY
    any     --failure(now) (store unreachable)-> same state, retried after ``retry``

Invariants:
    * The keeper is active only before ``valid_until``, which is computed from when the request that
      acquired or renewed the lease was *sent*, on the keeper's own clock: the store's expiry (its clock,
      when the request arrived, plus ttl) is never earlier, whatever the skew between the two clocks. So
      a keeper never believes it holds a lease that another owner may already hold (the store's fencing
      refuses its writes anyway: this only stops doomed work early).
    * Renewal happens every ``renew_every`` (default ttl/3): two renewals may fail before the margin
      (default ttl/5) is reached.
    * A standby costs one read of the store every ``standby_poll`` (default 250 ms, at most ttl/4)
      and sleeps in between: under 1% of a core (``benchmarks/takeover.py``). A takeover happens at most
      ``standby_poll`` after the holder's lease expired, so within ttl + ``standby_poll`` of its death.
"""

from __future__ import annotations

import enum
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass

from diffstore.collection import Collection
from diffstore.engine.types import MAX_LEASE_TTL_MS, Lease, LeaseToken
from diffstore.errors import DiffstoreError, LeaseLost

DEFAULT_TTL_MS = 10_000
"""The lease ttl of fronts that keep a lease when none is given (``diffstore ingest --lease-ttl-ms``)."""

_log = logging.getLogger("diffstore.lease_keeper")


def default_owner() -> str:
    """An owner name unique to this process: ``host:pid:random`` (a restarted process is another owner)."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


@dataclass(frozen=True, slots=True)
class LeaseConfig:
    """One lease to keep.

    Attributes:
        name: the lease's name in the collection (e.g. ``ingest:<subscription>``; no ``/``).
        owner: who asks (default :func:`default_owner`: unique per process).
        ttl_ms: how long each acquire or renewal holds the lease.
        renew_every_ms: the renewal period (default ttl/3).
        margin_ms: the lease is taken as lost this long before it would expire (default ttl/5).
        standby_poll_ms: how often a standby tries to acquire (default 250 ms, at most ttl/4: a
            poll costs ~1 ms of CPU over HTTP, so a standby stays under 1% of a core whatever the ttl).
        retry_ms: how soon a failed request (store unreachable) is retried (default: ``standby_poll_ms``).
    """

    name: str
    owner: str = ""
    ttl_ms: int = DEFAULT_TTL_MS
    renew_every_ms: int | None = None
    margin_ms: int | None = None
    standby_poll_ms: int | None = None
    retry_ms: int | None = None

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("a lease needs a name")
        if not 1 <= self.ttl_ms <= MAX_LEASE_TTL_MS:
            raise ValueError(f"ttl_ms must be within 1..{MAX_LEASE_TTL_MS}")
        if not self.owner:
            object.__setattr__(self, "owner", default_owner())
        if not 0 < self.renew_every_s < self.ttl_ms / 1000:
            raise ValueError("renew_every_ms must be within 1..ttl_ms-1")
        if not 0 <= self.margin_s < self.ttl_ms / 1000 - self.renew_every_s:
            raise ValueError("margin_ms must leave time to renew: margin + renew_every < ttl")
        if self.standby_poll_s <= 0 or self.retry_s <= 0:
            raise ValueError("standby_poll_ms and retry_ms must be >= 1")

    @property
    def ttl_s(self) -> float:
        return self.ttl_ms / 1000

    @property
    def renew_every_s(self) -> float:
        return (self.ttl_ms / 3 if self.renew_every_ms is None else self.renew_every_ms) / 1000

    @property
    def margin_s(self) -> float:
        return (self.ttl_ms / 5 if self.margin_ms is None else self.margin_ms) / 1000

    @property
    def standby_poll_s(self) -> float:
        if self.standby_poll_ms is not None:
            return self.standby_poll_ms / 1000
        return min(250, self.ttl_ms / 4) / 1000

    @property
    def retry_s(self) -> float:
        return self.standby_poll_s if self.retry_ms is None else self.retry_ms / 1000


class Action(enum.Enum):
    """What the keeper wants done now."""

    WAIT = "wait"
    ACQUIRE = "acquire"
    RENEW = "renew"


class LeaseKeeper:
    """The pure state machine of one lease (see the module): fed times and answers, it says what to do."""

    def __init__(self, config: LeaseConfig) -> None:
        self.config = config
        self.lease: Lease | None = None  # the held lease (ACTIVE), else None (STANDBY)
        self.valid_until = 0.0
        self._next = 0.0  # when the next acquire (standby) or renewal (active) is due

    @property
    def active(self) -> bool:
        return self.lease is not None

    @property
    def token(self) -> LeaseToken | None:
        """The fencing token while active."""
        return None if self.lease is None else self.lease.token

    def holds(self, now: float) -> bool:
        """Active, and the lease cannot have expired yet (see the module's invariants)."""
        return self.lease is not None and now < self.valid_until

    def due(self, now: float) -> Action:
        """What to do at ``now`` (a lease past its validity is dropped first)."""
        if self.lease is not None and now >= self.valid_until:
            self.lost(now)
        if now < self._next:
            return Action.WAIT
        return Action.RENEW if self.lease is not None else Action.ACQUIRE

    def wait_s(self, now: float) -> float:
        """How long nothing needs doing: until the next request, or until the lease must count as lost."""
        until = self._next
        if self.lease is not None:
            until = min(until, self.valid_until)
        return max(0.0, until - now)

    def granted(self, lease: Lease, sent_at: float) -> None:
        """An acquire or a renewal sent at ``sent_at`` succeeded."""
        if self.lease is not None and lease.version != self.lease.version:
            raise ValueError("a renewal cannot change the version")
        self.lease = lease
        self.valid_until = sent_at + self.config.ttl_s - self.config.margin_s
        self._next = sent_at + self.config.renew_every_s

    def refused(self, now: float) -> None:
        """The store said ``leaseLost``: a standby polls again later; an active keeper lost the lease."""
        self.lost(now)

    def lost(self, now: float) -> None:
        """Back to standby: the next acquire is one poll away."""
        self.lease = None
        self.valid_until = 0.0
        self._next = now + self.config.standby_poll_s

    def failed(self, now: float) -> None:
        """The request did not reach the store (or it failed): retry soon, the state stays."""
        self._next = now + self.config.retry_s

    def released(self, now: float) -> None:
        self.lost(now)


class LeaseGuard:
    """Keeps one lease of ``collection`` in a background thread (see the module).

    Usage::

        with LeaseGuard(collection, LeaseConfig("ingest:sub")) as guard:
            while (token := guard.wait_active(stop)) is not None:
                ... rounds with Round.next(collection, lease=token) while guard.holds(token) ...

    Args:
        collection: where the lease lives (the engine's or the client's handle).
        config: the lease.
        clock: a monotonic clock in seconds (tests pass their own).
    """

    def __init__(
        self, collection: Collection, config: LeaseConfig, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.collection = collection
        self.config = config
        self.clock = clock
        self.keeper = LeaseKeeper(config)
        self.error: DiffstoreError | None = None  # the last failure of a request (cleared by a success)
        self._changed = threading.Condition()
        self._closed = False
        self._thread = threading.Thread(target=self._run, name=f"lease:{config.name}", daemon=True)
        self._thread.start()

    def __enter__(self) -> LeaseGuard:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    @property
    def owner(self) -> str:
        return self.config.owner

    def holds(self, token: LeaseToken | None = None) -> bool:
        """Whether the lease is held now (and, given ``token``, still at that version)."""
        with self._changed:
            if not self.keeper.holds(self.clock()):
                return False
            return token is None or self.keeper.token == token

    @property
    def token(self) -> LeaseToken | None:
        """The fencing token while the lease is held, else None."""
        with self._changed:
            return self.keeper.token if self.keeper.holds(self.clock()) else None

    def wait_active(
        self, stop: threading.Event | None = None, timeout_s: float | None = None
    ) -> LeaseToken | None:
        """Blocks while standby; the fencing token once the lease is held (None: ``stop`` set or timeout).

        ``stop`` is looked at every ``standby_poll`` (a front's stop request ends the wait that soon).
        """
        deadline = None if timeout_s is None else self.clock() + timeout_s
        with self._changed:
            while True:
                token = self.keeper.token if self.keeper.holds(self.clock()) else None
                if token is not None:
                    return token
                if self._closed or (stop is not None and stop.is_set()):
                    return None
                wait = self.config.standby_poll_s
                if deadline is not None:
                    left = deadline - self.clock()
                    if left <= 0:
                        return None
                    wait = min(wait, left)
                self._changed.wait(wait)

    def report_lost(self, token: LeaseToken | None, reason: str = "a fenced write was refused") -> None:
        """The store refused ``token`` (``LeaseLost`` on a fenced write), or the front gave it up
        (``reason``): stand by now, without waiting for the next renewal to find out."""
        with self._changed:
            if token is not None and self.keeper.token == token:
                _log.warning("lease %r lost: %s", self.config.name, reason)
                self.keeper.refused(self.clock())
                self._changed.notify_all()

    def _release(self) -> None:
        """Gives the lease up at once (a standby takes over without waiting for its expiry)."""
        with self._changed:
            lease = self.keeper.lease
            self.keeper.released(self.clock())
            self._changed.notify_all()
        if lease is not None:
            try:
                self.collection.release_lease(lease.name, lease.owner or self.owner, lease.version)
            except DiffstoreError as exc:  # lost meanwhile, or the store is away: it expires by itself
                _log.info("releasing lease %r failed: %s", lease.name, exc)

    def close(self, release: bool = True) -> None:
        """Stops the thread; releases the lease if held (unless ``release`` is False)."""
        with self._changed:
            if self._closed:
                return
            self._closed = True
            self._changed.notify_all()
        self._thread.join()
        if release:
            self._release()

    def _run(self) -> None:
        keeper = self.keeper
        while True:
            with self._changed:
                if self._closed:
                    return
                now = self.clock()
                was_active = keeper.active
                action = keeper.due(now)
                if was_active and not keeper.active:
                    _log.warning("lease %r lost: not renewed in time", self.config.name)
                    self._changed.notify_all()
                if action is Action.WAIT:
                    self._changed.wait(keeper.wait_s(now))
                    continue
                lease = keeper.lease
            self._request(action, lease)

    def _request(self, action: Action, lease: Lease | None) -> None:
        """One acquire or renewal, outside the lock (a slow store must not block ``holds``)."""
        config = self.config
        sent_at = self.clock()
        try:
            if action is Action.ACQUIRE:
                got = self.collection.acquire_lease(config.name, config.owner, config.ttl_ms)
            else:
                assert lease is not None
                got = self.collection.renew_lease(config.name, config.owner, lease.version)
        except LeaseLost as exc:
            with self._changed:
                if action is Action.RENEW and self.keeper.active:
                    _log.warning("lease %r lost: %s", config.name, exc.reason)
                if action is Action.ACQUIRE or self.keeper.token == (lease.token if lease else None):
                    self.keeper.refused(self.clock())
                self.error = None
                self._changed.notify_all()
            return
        except Exception as exc:  # the store is unreachable or failed: retried, the state stays
            with self._changed:
                first = self.error is None
                self.keeper.failed(self.clock())
                self.error = exc if isinstance(exc, DiffstoreError) else DiffstoreError(repr(exc))
                self._changed.notify_all()
            if first:  # once, not at every retry
                _log.warning("lease %r: %s failed (retrying): %s", config.name, action.value, exc)
            return
        with self._changed:
            if action is Action.RENEW and self.keeper.token != got.token:
                return  # released or lost while the renewal was in flight
            self.keeper.granted(got, sent_at)
            self.error = None
            self._changed.notify_all()
        if action is Action.ACQUIRE:
            _log.info("lease %r acquired by %s (version %d)", config.name, config.owner, got.version)
