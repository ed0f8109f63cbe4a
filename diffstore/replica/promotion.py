"""Safe promotion of a read replica (``POST /replica/promote``, ``diffstore promote``), with fencing.

The steps, while the old primary answers (each call to it has a short timeout):

1. ask it its role and term (``GET /replication``). Stepped down already for another replica: refused,
   409 ``fenced`` naming that one (it is the primary now; force or not). For this same replica (an earlier
   attempt that did not finish): carry on.
2. wait (up to ``waitMs``) until the replica holds every collection of the primary. One it has not copied
   yet: 409 ``replicaBehind`` listing each collection's state and lag, and nothing changed -- unless
   ``force``.
3. tell it to step down at the new term, ``max(its term, ours) + 1`` (``POST /replica/stepDown``): from
   then on it refuses writes (409 ``fenced``), so its state is final.
4. wait (up to ``waitMs``) until the replica holds exactly that state: every collection at the primary's
   current generation, none the primary deleted. Still behind: the step-down is undone (``POST
   /replica/stepUp``: the old primary takes writes again) and 409 ``replicaBehind`` -- unless ``force``.
5. promote the store at the new term (one transaction), then delete its holds on the old primary for
   every collection, copied or not (a stepped-down primary still lets holds go).

A primary that does not answer (down, paused, cut off) cannot be asked: the replica is promoted at one
above its own term with what it holds, and nothing tells the old primary to step down now. The
follower's clean-up (:mod:`diffstore.replica._follow`) keeps trying to (and to delete the holds) until it
gets an answer, so an old primary that comes back is fenced at its first contact; writes it took in
between are not on the new primary. ``docs/replicas.md`` says what is and is not prevented.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from diffstore.client import Client, Collection
from diffstore.client import _calls as calls
from diffstore.client._transport import unreachable
from diffstore.engine.store import Store
from diffstore.engine.types import ReplicaLag
from diffstore.errors import (
    DiffstoreError,
    Fenced,
    Forbidden,
    NoSuchCollection,
    NoSuchRoute,
    NotReplica,
    ReplicaBehind,
)
from diffstore.replica._plan import reader_name
from diffstore.replica._status import COPYING, FOLLOWING, STALLED
from diffstore.tls import CertFiles
from diffstore.wire import Body

PRIMARY_TIMEOUT_S = 5.0  # each call to the old primary: a paused or cut-off one counts as away
DEFAULT_WAIT_MS = 10_000
MAX_WAIT_MS = 300_000
_POLL_S = 0.02  # the follower applies within tens of ms: look that often
_COUNT_MAX = 100_000  # a lag counted past this is shown as this


@dataclass(frozen=True, slots=True)
class Standing:
    """One collection of the primary (or of the replica only) as the promotion sees it.

    ``copied``: the replica holds it (``lag`` generations behind). ``state`` is its follower's, as
    ``GET /replica`` shows it: ``copying`` (never for a copied one), ``following``, or ``stalled`` with
    ``reason`` -- a collection whose follower cannot go on says so, not ``following``."""

    name: str
    state: str
    lag: int
    copied: bool = True
    reason: str | None = None

    def to_wire(self) -> Body:
        body: Body = {"collectionName": self.name, "state": self.state, "lagGenerations": self.lag}
        if self.reason is not None:
            body["reason"] = self.reason
        return body


def _standing(name: str, lag: int, copied: bool, follower: ReplicaLag | None) -> Standing:
    """A collection's standing, in its follower's state when the follower says it is stalled."""
    if follower is not None and follower.state == STALLED:
        return Standing(name, STALLED, lag, copied, follower.reason)
    return Standing(name, FOLLOWING if copied else COPYING, lag, copied)


@dataclass(frozen=True, slots=True)
class Promotion:
    """What a promotion asks; ``address``: the URL the replica is reached at (told to the old primary)."""

    address: str
    force: bool = False
    wait_ms: int = DEFAULT_WAIT_MS
    # how an https:// old primary is checked and shown a client certificate: the replica link's files
    ca_file: str | None = None
    cert: CertFiles | None = field(default=None, repr=False)


def promote(store: Store, primary_token: str | None, asked: Promotion) -> Body:
    """Promotes ``store`` (see the module); returns the answer of ``POST /replica/promote``. The old
    primary is reached with ``primary_token`` and, for an ``https://`` one, ``asked.ca_file`` and
    ``asked.cert`` (the replica link's own, ``ServerConfig.replica_ca_file``/``replica_cert``).

    Raises:
        NotReplica: the store is not a replica (a stepped-down primary without ``force`` raises ``Fenced``).
        ReplicaBehind: collections not copied or behind the primary (nothing changed), unless ``force``.
        Fenced: the old primary stepped down for another replica, or answers a term above ours.
    """
    state = store.replica_state()
    if not state.following:
        return _lift_fencing(store, asked)
    assert state.primary is not None
    replica_id = state.replica_id
    term = state.term + 1
    stepped_down = False
    standings: list[Standing] = []
    with Client(
        state.primary,
        token=primary_token,
        timeout_s=PRIMARY_TIMEOUT_S,
        ca_file=asked.ca_file,
        cert=asked.cert,
    ) as client:
        try:
            term = max(term, _old_primary_term(client, replica_id) + 1)
            standings = _wait(store, client, asked.wait_ms, copied_only=True)
            if any(not s.copied for s in standings):
                _refuse_if_behind(
                    standings, asked, "the replica has not copied every collection of its primary"
                )
            client.execute(calls.step_down(term, asked.address, replica_id))
            stepped_down = True
            standings = _wait(store, client, asked.wait_ms, copied_only=False)
            if not asked.force and _behind(standings):
                client.execute(calls.step_up(term, replica_id))  # the old primary takes writes again
                _refuse_if_behind(
                    standings, asked, "the replica did not catch up with its stepped-down primary"
                )
        except Forbidden as exc:  # the primary's answer, relayed: say which token to change
            raise Forbidden(
                f"the primary {state.primary} refused the replica's token: {exc.reason} (the replica's"
                " --replica-token-file needs scope admin there to fence it)",
                exc.scope,
            ) from exc
        except DiffstoreError as exc:
            if not unreachable(exc):
                raise
            reachable = False
            standings = _local_standings(store)  # before the promotion forgets the followers' states
        else:
            reachable = True
        term = store.promote_replica(term, asked.address)
        holds = _delete_holds(store, client, reader_name(replica_id or "")) if reachable else 0
    return {
        "promoted": True,
        "term": term,
        "primaryReachable": reachable,
        "steppedDown": stepped_down,
        "holdsDeleted": holds,
        "collections": [standing.to_wire() for standing in standings],
    }


def _lift_fencing(store: Store, asked: Promotion) -> Body:
    state = store.replica_state()
    if state.fenced is None:
        raise NotReplica("this server is not a replica")
    if not asked.force:
        by = f" for {state.fenced.primary}" if state.fenced.primary else ""
        raise Fenced(
            f"this server stepped down{by} at term {state.fenced.term}: promote it with force only once that"
            " primary is stopped for good (both would take writes)",
            state.term,
            state.fenced.primary,
        )
    term = store.unfence()
    return {
        "promoted": True,
        "term": term,
        "primaryReachable": False,
        "steppedDown": False,
        "unfenced": True,
        "collections": [],
    }


def _old_primary_term(client: Client, replica_id: str | None) -> int:
    """The old primary's term; refuses (``Fenced``) one that stepped down for another replica."""
    try:
        info = client.execute(calls.replication())
    except NoSuchRoute:
        return 0  # a server from before terms: it knows no fencing (it is not told to step down)
    fenced = info.get("fencedBy") if isinstance(info, dict) else None
    if isinstance(fenced, dict) and fenced.get("replicaId") != replica_id:
        who = fenced.get("primary") or "another server"
        raise Fenced(
            f"the primary stepped down already, for {who} at term {fenced.get('term')}: that is the primary"
            " now; follow it instead of promoting this replica",
            int(info.get("term") or 0),
            fenced.get("primary") if isinstance(fenced.get("primary"), str) else None,
        )
    return int(info.get("term") or 0) if isinstance(info, dict) else 0


def _wait(store: Store, client: Client, wait_ms: int, copied_only: bool) -> list[Standing]:
    """Each collection's standing once the replica holds every one (``copied_only``) or is level with the
    primary, or when ``wait_ms`` is over; the follower works meanwhile."""
    deadline = time.monotonic() + wait_ms / 1000
    while True:
        currents = _primary_currents(client)
        standings = _standings(store, currents, client=None)
        done = all(s.copied for s in standings) if copied_only else not _behind(standings)
        if done or time.monotonic() >= deadline:
            return _standings(store, currents, client) if not done else standings
        time.sleep(_POLL_S)


def _primary_currents(client: Client) -> dict[str, bytes | None]:
    """Each collection of the primary and its current generation (None: deleted while listed)."""
    currents: dict[str, bytes | None] = {}
    for info in client.collections():
        try:
            currents[info.name] = client.execute(calls.collection_state(info.name)).generation_id or b""
        except NoSuchCollection:
            currents[info.name] = None
    return currents


def _standings(store: Store, currents: dict[str, bytes | None], client: Client | None) -> list[Standing]:
    """Compares the replica with the primary's ``currents``; with ``client`` the lags are counted (pages
    of the primary's history), else a collection behind counts one."""
    local = {info.name for info in store.collections()}
    followers = {lag.collection: lag for lag in store.replica_state().lags}
    found: list[Standing] = []
    for name in sorted(currents.keys() | local):
        current, follower = currents.get(name), followers.get(name)
        if name not in local:
            if current is not None:
                lag = _count(client, name, None) if client else 1
                found.append(_standing(name, lag, False, follower))
            continue
        position = store.collection(name).generation_id
        if name not in currents:  # deleted on the primary, not yet here
            found.append(_standing(name, 1, True, follower))
        elif current is None or position == current:
            found.append(_standing(name, 0, True, follower))
        else:
            found.append(_standing(name, _count(client, name, position) if client else 1, True, follower))
    return found


def _count(client: Client, name: str, position: bytes | None) -> int:
    """How many of the primary's committed generations are above ``position`` (None: all of them)."""
    primary = Collection(client, name, True)  # the calls made here do not depend on the kind
    counted = 0
    before: bytes | None = None
    try:
        while counted < _COUNT_MAX:
            ids, more = primary.generations(before=before, limit=1000)
            for generation_id in ids:
                if position is not None and generation_id <= position:
                    return counted
                counted += 1
            if not more or not ids:
                return counted
            before = ids[-1]
    except NoSuchCollection:
        return counted
    return counted


def _behind(standings: list[Standing]) -> bool:
    return any(not s.copied or s.lag > 0 for s in standings)


def _refuse_if_behind(standings: list[Standing], asked: Promotion, why: str) -> None:
    if asked.force or not _behind(standings):
        return
    late = [s for s in standings if not s.copied or s.lag > 0]
    listed = ", ".join(f"{s.name} ({s.state}, {s.lag} behind)" for s in late[:10])
    more = f" and {len(late) - 10} more" if len(late) > 10 else ""
    raise ReplicaBehind(
        f"{why}: {listed}{more}; nothing changed. Wait and promote again, or force it (what is not copied is"
        " not on the new primary)",
        [s.to_wire() for s in standings],
    )


def _local_standings(store: Store) -> list[Standing]:
    """What the replica knows without its primary: each collection it holds and its last known lag."""
    lags = {lag.collection: lag for lag in store.replica_state().lags}
    found = []
    for info in store.collections():
        follower = lags.get(info.name)
        found.append(_standing(info.name, follower.generations if follower else 0, True, follower))
    return found


def _delete_holds(store: Store, client: Client, hold: str) -> int:
    """Deletes the replica's hold in every collection of the old primary (best effort); how many went."""
    try:
        names = {info.name for info in client.collections()}
    except DiffstoreError:
        return 0
    deleted = 0
    for name in sorted(names | {info.name for info in store.collections()}):
        try:
            Collection(client, name, True).delete_reader(hold)
            deleted += 1
        except DiffstoreError:
            continue
    return deleted
