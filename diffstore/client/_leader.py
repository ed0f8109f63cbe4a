"""Which of several servers a client sends a call to, and when it looks for the leader again: a pure state
machine, fed what the servers answered (no sockets, no clock; h11 style). :mod:`diffstore.client._failover`
performs it.

A client given several URLs (``Client("http://a,http://b")``) treats them as the members of one cluster:
one leader takes writes, the others are replicas (or a primary that stepped down). Reads and writes both
go to the leader (leader-first: a client reads its own writes); while no member is the leader, reads go
to a member that answered (a replica's data, maybe behind).

State: ``leader`` (a member, or None: unknown) and ``epoch`` (how many times the leader changed, so
that a call can tell it crossed a fail-over).

Events and transitions::

    answered(url)             url answered a call: nothing changes
    unreachable(url)          url == leader  -> leader := None              (find it again)
    refused(url, hint)        url refused a write (409 readOnlyReplica/fenced)
                              url == leader  -> leader := None
                              hint a member other than url -> leader := hint (no probe needed)
    probed(url, Role)         what GET /ha (or GET /replication) said of url, during a probe round:
                              a member that takes writes becomes a candidate; the round's end (see
                              :meth:`LeaderFinder.end_round`) makes the candidate of the highest term
                              (the first listed on a tie) the leader, or else the member named as leader
                              by the others (it is then asked directly, next round)

Invariants:
    * ``leader`` is always one of ``members`` (a hint naming a URL that was not given is not followed:
      the URLs given are what the client may reach; a probe round finds the leader among them).
    * ``epoch`` rises by one each time a known leader is dropped or replaced (finding the first is no
      change), so a call that sees it move crossed a fail-over.
    * a probe round asks a member named as leader first, then the others in the order given.
"""

from __future__ import annotations

from dataclasses import dataclass, field

LEADER_ROLES = frozenset({"leader", "primary"})
"""What ``GET /ha`` (``leader``) and ``GET /replication`` (``primary``) call the member that takes writes."""


@dataclass(frozen=True, slots=True)
class Role:
    """What a member says of itself: whether it takes writes, the leader it names, its term."""

    writable: bool
    leader: str | None = None
    term: int = 0

    @classmethod
    def from_ha(cls, body: object) -> Role | None:
        """``GET /ha``'s ``{role, leader: {member, url} | null, term}``; None: not that shape."""
        if not isinstance(body, dict) or body.get("role") not in ("leader", "replica", "candidate", "fenced"):
            return None
        leader = body.get("leader")
        url = leader.get("url") if isinstance(leader, dict) else None
        term = body.get("term")
        return cls(
            body["role"] == "leader",
            url if isinstance(url, str) else None,
            term if isinstance(term, int) else 0,
        )

    @classmethod
    def from_replication(cls, body: object) -> Role | None:
        """``GET /replication``'s ``{role: primary | replica | fenced, term, primary}``; None: another
        shape."""
        if not isinstance(body, dict) or body.get("role") not in ("primary", "replica", "fenced"):
            return None
        primary, term = body.get("primary"), body.get("term")
        return cls(
            body["role"] in LEADER_ROLES,
            primary if isinstance(primary, str) else None,
            term if isinstance(term, int) else 0,
        )


def split_urls(urls: str | list[str] | tuple[str, ...]) -> tuple[str, ...]:
    """The members a client was given: a comma-separated string or a list (each item may hold commas),
    blanks dropped, trailing slashes removed, duplicates once, in order.

    Raises:
        ValueError: no URL at all.
    """
    parts = [urls] if isinstance(urls, str) else list(urls)
    found: list[str] = []
    for part in parts:
        for url in part.split(","):
            url = url.strip().rstrip("/")
            if url and url not in found:
                found.append(url)
    if not found:
        raise ValueError(f"no server URL in {urls!r}")
    return tuple(found)


@dataclass
class LeaderFinder:
    """The state machine of the module docstring, over ``members`` (at least one URL)."""

    members: tuple[str, ...]
    leader: str | None = None
    epoch: int = 0
    _reachable: str | None = None  # a member that answered the last probe round (reads while no leader)
    _candidates: dict[str, int] = field(default_factory=dict)  # this round's writable members -> term
    _named: dict[str, int] = field(default_factory=dict)  # leaders named by the others -> highest term
    ha_routes: bool = True  # whether to ask GET /ha first (False once a member answered it 404)
    _opened: dict[str, int] = field(default_factory=dict)  # collection -> epoch of its last generation write
    _leases: dict[tuple[str, str, int], int] = field(default_factory=dict)  # a token -> the epoch it held in

    def __post_init__(self) -> None:
        if not self.members:
            raise ValueError("a client needs at least one server URL")

    def _set_leader(self, url: str | None) -> None:
        if url != self.leader:
            if self.leader is not None:  # finding the first leader is no change of leader
                self.epoch += 1
            self.leader = url

    def target(self, write: bool) -> str | None:
        """Where a call goes now: the leader; for a read while none is known, a member that answered the
        last probe round. None: probe first (:meth:`probe_order`)."""
        if self.leader is not None:
            return self.leader
        return None if write else self._reachable

    def probe_order(self) -> list[str]:
        """The members to ask whom they follow: those named as leader first (highest term first), then
        every other one in the order given. Starts a probe round."""
        self._candidates.clear()
        by_term = sorted(self._named.items(), key=lambda item: -item[1])
        named = [m for m, _ in by_term if m in self.members]
        self._named.clear()
        self._reachable = None
        return named + [m for m in self.members if m not in named]

    def wrote_generation(self, collection: str) -> None:
        """A write into ``collection``'s open generation was answered (by the current leader)."""
        self._opened[collection] = self.epoch

    def lease_held(self, collection: str, name: str, version: int) -> None:
        """The leader answered an acquire or renew of this token: it holds there, now."""
        self._leases[(collection, name, version)] = self.epoch

    def lease_stale(self, collection: str, name: str, version: int) -> bool:
        """Whether a fencing token was last seen holding under another leader: the new leader's lease row
        may lag (a replica copies leases late), so the same version may be issued there to someone else.
        A token first seen here counts from now (its holder's client tracks it)."""
        return self._leases.setdefault((collection, name, version), self.epoch) != self.epoch

    def generation_lost(self, collection: str) -> bool:
        """Whether the leader changed since the last write into ``collection``'s open generation (which
        then stayed behind: replicas copy committed generations only). Answers True once per change."""
        lost = self._opened.get(collection, self.epoch) != self.epoch
        self._opened[collection] = self.epoch
        return lost

    def unreachable(self, url: str) -> None:
        """``url`` did not answer (refused, reset, timed out)."""
        if url == self.leader:
            self._set_leader(None)
        if url == self._reachable:
            self._reachable = None

    def refused(self, url: str, hint: str | None) -> None:
        """``url`` refused a write as not the leader; ``hint``: the leader it named, if any."""
        hint = hint.rstrip("/") if hint is not None else None
        if hint is not None and hint != url and hint in self.members:
            self._set_leader(hint)
        elif url == self.leader:
            self._set_leader(None)

    def probed(self, url: str, role: Role) -> bool:
        """What ``url`` said of itself during a probe round. Returns True when the round can stop: the
        member takes writes (two that do -- a split brain the servers' fencing exists to prevent -- are
        told apart by term only when both were asked)."""
        if self._reachable is None:
            self._reachable = url
        if role.writable:
            self._candidates[url] = role.term
            return True
        named = role.leader.rstrip("/") if role.leader is not None else None
        if named is not None and named in self.members and named != url:
            self._named[named] = max(role.term, self._named.get(named, 0))
        return False

    def end_round(self) -> str | None:
        """Ends a probe round: the writable member of the highest term (the first listed on a tie)
        becomes the leader. Returns it (None: none took writes; the named leaders are asked first next)."""
        if self._candidates:
            best = max(self._candidates.values())
            self._set_leader(next(m for m in self.members if self._candidates.get(m) == best))
        return self.leader
