"""The election of one fail-over member, as a pure state machine: events in, actions out, no I/O.

Patroni's model on etcd: the leader is whoever holds the cluster's leader key, created only where it is
absent (one transaction) and attached to the member's lease, which the member keeps alive. The key's
value names the member, its URL and the term it leads at; a separate ``term`` key only grows. Each
member also publishes how far it has applied (its position in every collection) under a key of its own,
held by the same lease. :mod:`diffstore.ha.member` feeds this machine what it observed and carries out
what it asks for; the machine decides alone, so every decision is tested without etcd or a store.

Invariants:
- A leader's writes are allowed until half a TTL after the last renewal *sent* that etcd acknowledged
  (``writable_until``); its lease (and so its key) lives at least a TTL after that send. So a leader cut
  off from etcd, or stopped, refuses writes before any other member can take the key: at no instant do
  two members accept writes (given clocks that run at the same rate over a TTL).
- A member campaigns only when no leader key exists, with the term one above every term it has seen
  (the ``term`` key's, the last leader's, its own store's); it takes the key in a transaction that also
  checks the term key is unchanged, so two winners of one term cannot exist.
- The most caught-up member campaigns first: a member defers to a live member that is ahead of it
  (every collection at least as far, one further) or as far and named first, for ``defer_s`` at most
  (TTL/2 by default: that member may be dead too, its key lives until its lease expires; a loaded machine
  may take a second or more to let the better member act, and a behind one that leads loses writes).
- A member that sees another member's key follows that leader (and a leader that sees one steps back).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

Positions = Mapping[str, str]  # collection name -> its current generation id, in lowercase hex


@dataclass(frozen=True, slots=True)
class LeaderKey:
    """The leader key's value: who leads, where, at which term (``ours``: held by our current lease)."""

    member: str
    url: str
    term: int
    ours: bool = False


@dataclass(frozen=True, slots=True)
class Peer:
    """A live member as it published itself: its name, URL and positions."""

    name: str
    url: str
    positions: Positions = field(default_factory=dict)


# --- events ---------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Tick:
    """Time passed (``now``: monotonic seconds)."""

    now: float


@dataclass(frozen=True, slots=True)
class Observed:
    """A read of the cluster's keys: the leader key (None: absent), the term key, the live members
    (``peers``, ourselves left out) and our own positions."""

    now: float
    leader: LeaderKey | None
    term: int
    peers: tuple[Peer, ...] = ()
    mine: Positions = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Renewed:
    """etcd acknowledged a renewal (or grant) of our lease that was sent at ``sent_at``."""

    sent_at: float


@dataclass(frozen=True, slots=True)
class LeaseExpired:
    """etcd says our lease is gone (expired): our keys are gone with it."""

    now: float


@dataclass(frozen=True, slots=True)
class Won:
    """Our transaction created the leader key at ``term``."""

    now: float
    term: int


@dataclass(frozen=True, slots=True)
class Lost:
    """Our transaction found the leader key taken (or the term moved): nothing changed."""

    now: float


Event = Tick | Observed | Renewed | LeaseExpired | Won | Lost


# --- actions --------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class NewLease:
    """Grant a new lease (then answer ``Renewed``) and publish our member key on it."""


@dataclass(frozen=True, slots=True)
class Renew:
    """Keep the lease alive (then answer ``Renewed`` or ``LeaseExpired``)."""


@dataclass(frozen=True, slots=True)
class Campaign:
    """Renew, then try to create the leader key at ``term`` (then answer ``Won`` or ``Lost``)."""

    term: int
    seen_term: int


@dataclass(frozen=True, slots=True)
class Lead:
    """Become the primary at ``term`` (accept writes until ``Election.writable_until``)."""

    term: int


@dataclass(frozen=True, slots=True)
class StepBack:
    """Stop accepting writes now (the lease was not renewed in time, or the key is gone)."""

    why: str


@dataclass(frozen=True, slots=True)
class Follow:
    """Become a replica of ``leader`` (a new leader, or the first one seen)."""

    leader: LeaderKey


@dataclass(frozen=True, slots=True)
class Publish:
    """The write deadline moved: store it for every process."""


Action = NewLease | Renew | Campaign | Lead | StepBack | Follow | Publish


def ahead(a: Positions, b: Positions) -> bool:
    """Whether positions ``a`` are strictly further than ``b``: no collection behind, one further (a
    collection missing counts as the least position; hex of big-endian ids sorts as the bytes do)."""
    further = False
    for name in a.keys() | b.keys():
        mine, theirs = a.get(name), b.get(name)
        if mine == theirs:
            continue
        if theirs is None or (mine is not None and mine > theirs):
            further = True
        else:
            return False
    return further


class Election:
    """One member's election (see the module). Feed :meth:`handle` events; carry out its actions."""

    def __init__(
        self, member: str, url: str, ttl_s: float, term: int = 0, defer_s: float | None = None
    ) -> None:
        if ttl_s <= 0:
            raise ValueError("ttl_s must be > 0")
        self.member = member
        self.url = url
        self.ttl_s = ttl_s
        self.defer_s = ttl_s / 2 if defer_s is None else defer_s
        self.role = "candidate"
        self.term = term
        self.leader: LeaderKey | None = None
        self.renewed_at: float | None = None  # when the last acknowledged renewal was sent
        self.leaderless_since: float | None = None
        self.failovers = 0

    @property
    def writable_until(self) -> float:
        """Until when (monotonic seconds) this member accepts writes (never, when it does not lead)."""
        if self.role != "leader" or self.renewed_at is None:
            return 0.0
        return self.renewed_at + self.ttl_s / 2

    def handle(self, event: Event) -> list[Action]:
        if isinstance(event, Tick):
            return self._tick(event.now)
        if isinstance(event, Renewed):
            self.renewed_at = max(self.renewed_at or event.sent_at, event.sent_at)
            return [Publish()] if self.role == "leader" else []
        if isinstance(event, LeaseExpired):
            self.renewed_at = None
            return self._step_back("the lease on etcd expired") + [NewLease()]
        if isinstance(event, Observed):
            return self._observed(event)
        if isinstance(event, Won):
            if self.leader is not None and self.leader.member != self.member:
                self.failovers += 1
            self.role = "leader"
            self.term = max(self.term, event.term)
            self.leader = LeaderKey(self.member, self.url, self.term, ours=True)
            self.leaderless_since = None
            return [Lead(self.term)]
        return []  # Lost: the next observation tells who won

    def _tick(self, now: float) -> list[Action]:
        if self.renewed_at is None or now - self.renewed_at >= self.ttl_s:
            self.renewed_at = None
            return self._step_back("the lease on etcd expired") + [NewLease()]
        actions: list[Action] = []
        if self.role == "leader" and now >= self.writable_until:
            actions += self._step_back(f"no renewal of the lease acknowledged for {self.ttl_s / 2:g} s")
        if now - self.renewed_at >= self.ttl_s / 3:
            actions.append(Renew())
        return actions

    def _step_back(self, why: str) -> list[Action]:
        if self.role != "leader":
            return []
        self.role = "fenced"
        return [StepBack(why)]

    def _observed(self, seen: Observed) -> list[Action]:
        self.term = max(self.term, seen.term, seen.leader.term if seen.leader else 0)
        leader = seen.leader
        if leader is not None and leader.ours:
            self.leaderless_since = None
            if self.role != "leader" and seen.now < (self.renewed_at or 0.0) + self.ttl_s / 2:
                self.role, self.leader, self.term = "leader", leader, max(self.term, leader.term)
                return [Lead(self.term)]  # stepped back for a late renewal; the key stayed ours
            return []
        if leader is not None and leader.member != self.member:
            self.leaderless_since = None
            actions = self._step_back(f"{leader.member} holds the leader key")
            changed = self.leader != leader or self.role != "replica"
            self.role, self.leader = "replica", leader
            return actions + ([Follow(leader)] if changed else [])
        # no leader key (or a key of our previous life, under a lease that is not ours: it expires)
        actions = self._step_back("the leader key is gone")
        if self.leaderless_since is None:
            self.leaderless_since = seen.now
        if self.role == "replica":
            self.role = "candidate"
        if leader is not None or self.renewed_at is None:
            return actions
        if self._first(seen) or seen.now - self.leaderless_since >= self.defer_s:
            actions.append(Campaign(max(self.term, seen.term) + 1, seen.term))
        return actions

    def _first(self, seen: Observed) -> bool:
        """Whether no live member should campaign before us (see the module)."""
        for peer in seen.peers:
            if peer.name == self.member:
                continue
            if ahead(peer.positions, seen.mine):
                return False
            if not ahead(seen.mine, peer.positions) and peer.name < self.member:
                return False
        return True
