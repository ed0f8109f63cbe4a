"""One call of a client given several servers, across a fail-over: written once as a generator and run by
the sync and the async transport (as :mod:`diffstore.client._plans` are).

The plan yields :class:`Send` (the driver performs the call on that server and sends back ``(True,
answer)`` or ``(False, exception)``) and :class:`Sleep`; it decides, from :class:`~diffstore.client.
_leader.LeaderFinder` and the call's :class:`~diffstore.client._calls.Replay`, where the call goes and
whether it may go again.

What happens to a call (reads and writes go to the leader, found by asking ``GET /ha``, or ``GET
/replication`` where there is no ``/ha``):

* answered: done. A member that refuses a write (409 ``readOnlyReplica``/``fenced``: nothing changed)
  makes the client follow the leader it names, or look for one; the write is sent there.
* no answer because no connection opened: nothing was sent; the call goes to the leader found next.
* no answer after it was sent (reset, timed out): it may or may not have been applied. A read, and a
  ``SAFE`` or ``CHECKED`` write, is sent again to the leader found next; a ``ONCE`` write is not: its
  failure is raised as it is (a ``StorageError``, which long-running commands wait out as an outage).
* a ``CHECKED`` write sent again and refused (``generationMismatch`` for a commit, ``badVersion`` for a
  CAS, ``leaseLost`` for a release): ``confirm`` asks whether the first one made it -- yes: success, once.
* a write into an open generation refused by a leader that is not the one the generation was opened on
  (``generationMismatch``, ``leaseLost``, ``noSuchCollection``): the generation was lost with the old
  leader, :class:`~diffstore.errors.LeaderChanged` (the caller redoes its round).
* a write carrying a lease's fencing token taken under another leader is not sent:
  :class:`~diffstore.errors.LeaderChanged` (the new leader's copy of the lease may lag, and the same
  version be issued there to a standby: the holder takes the lease again, and stands by if it lost it).
* no leader for ``wait_s`` (every member a replica, fenced or away): :class:`~diffstore.errors.NoLeader`,
  or the last connection failure when no member answered at all.
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, TypeVar

from diffstore.client._calls import Call, Replay
from diffstore.client._leader import LeaderFinder, Role
from diffstore.engine.types import Lease
from diffstore.errors import (
    Conflict,
    DiffstoreError,
    Fenced,
    LeaderChanged,
    NoLeader,
    NotFound,
    ReadOnlyReplica,
)
from diffstore.wire_routes import is_write

T = TypeVar("T")

PROBE_TIMEOUT_S = 5.0
"""How long a member may take to say whom it follows (a stopped one should not hold a round for long)."""
DEFAULT_WAIT_S = 30.0
"""How long a call waits for a leader (an etcd fail-over takes its ttl + 2 s; a manual one, a person)."""


@dataclass(frozen=True, slots=True)
class Send:
    url: str
    call: Call[Any]


@dataclass(frozen=True, slots=True)
class Sleep:
    seconds: float


Step = Send | Sleep
Outcome = tuple[bool, Any]
FailoverPlan = Generator[Step, Outcome, T]


def replay_of(call: Call[Any]) -> Replay:
    """The call's :class:`Replay`: its own, else a read or ``ONCE`` by the route."""
    if call.replay is not None:
        return call.replay
    return Replay.ONCE if is_write(call.method, call.path) else Replay.READ


def ha_probe() -> Call[Any]:
    return Call("GET", "/ha", lambda obj, codec: obj, timeout_s=PROBE_TIMEOUT_S)


def replication_probe() -> Call[Any]:
    return Call("GET", "/replication", lambda obj, codec: obj, timeout_s=PROBE_TIMEOUT_S)


def _delay(attempt: int) -> float:
    return min(1.0, 0.05 * 2.0 ** min(attempt, 10))


def perform(
    call: Call[T],
    finder: LeaderFinder,
    clock: Callable[[], float],
    unreachable: Callable[[BaseException], bool],
    never_sent: Callable[[BaseException], bool],
    wait_s: float = DEFAULT_WAIT_S,
) -> FailoverPlan[T]:
    """The plan of one call (see the module). ``unreachable``: whether a failure got no answer;
    ``never_sent``: whether it never left (no connection opened)."""
    replay = replay_of(call)
    write = replay is not Replay.READ
    deadline = clock() + wait_s
    epoch, tried = finder.epoch, ""
    maybe_applied = False  # an earlier attempt's answer was lost after the call was sent
    last: BaseException | None = None
    attempt = 0
    while True:
        url = finder.target(write)
        if url is None:
            url = yield from find_leader(finder, write, unreachable)
        if url is None:
            if clock() >= deadline:
                raise _no_leader(finder, last)
            yield Sleep(_delay(attempt))
            attempt += 1
            continue
        if call.lease is not None and finder.lease_stale(
            call.lease[0], call.lease[1].name, call.lease[1].version
        ):
            raise LeaderChanged(
                f"{call.method} {call.path}: the leader changed to {url} since lease {call.lease[1].name!r}"
                f" version {call.lease[1].version} was taken: take the lease again there (not sent)"
            )
        ok, answer = yield Send(url, call)
        if ok:
            if call.generation_of is not None:
                finder.wrote_generation(call.generation_of)
            if call.holds_lease is not None and isinstance(answer, Lease):
                finder.lease_held(call.holds_lease, answer.name, answer.version)
            return answer  # type: ignore[no-any-return]
        exc: BaseException = answer
        moved = url != tried and tried != ""
        tried = url
        if write and isinstance(exc, ReadOnlyReplica | Fenced):
            finder.refused(url, exc.leader if isinstance(exc, ReadOnlyReplica) else exc.primary)
        elif unreachable(exc):
            finder.unreachable(url)
            if not never_sent(exc):
                if replay is Replay.ONCE:
                    raise exc  # it may have been applied: not sent again
                maybe_applied = True
        else:
            raise (yield from _answered(call, url, exc, finder, epoch, moved, maybe_applied))
        last = exc
        if clock() >= deadline:
            raise exc if unreachable(exc) else _no_leader(finder, exc)
        if finder.target(write) in (None, url):
            yield Sleep(_delay(attempt))
            attempt += 1


def _answered(
    call: Call[Any],
    url: str,
    exc: BaseException,
    finder: LeaderFinder,
    epoch: int,
    moved: bool,
    maybe_applied: bool,
) -> Generator[Step, Outcome, BaseException]:
    """The error to raise for a server's answer to a write (or a read) that is not a refusal; a
    ``CHECKED`` write confirmed as applied returns by raising :class:`_Done`."""
    if not isinstance(exc, Conflict | NotFound):
        return exc
    if maybe_applied and call.confirm is not None:
        ok, applied = yield Send(url, call.confirm())
        if ok and applied is True:
            return _Done()
    crossed = moved or finder.epoch != epoch
    lost = call.generation_of is not None and finder.generation_lost(call.generation_of)
    if call.generation_of is not None and (crossed or lost):
        changed = LeaderChanged(
            f"{call.method} {call.path}: the leader changed to {url} and it refused the call"
            f" ({exc.code}: the open generation was on the old leader only): redo the round"
        )
        changed.__cause__ = exc
        return changed
    return exc


class _Done(Exception):
    """A ``CHECKED`` write that its confirmation found applied (the driver answers None)."""


def _no_leader(finder: LeaderFinder, last: BaseException | None) -> BaseException:
    error = NoLeader(
        f"none of {', '.join(finder.members)} took writes: "
        + (f"{type(last).__name__}: {last}" if last is not None else "no member answered")
    )
    error.__cause__ = last
    return error


def find_leader(
    finder: LeaderFinder, write: bool, unreachable: Callable[[BaseException], bool]
) -> Generator[Step, Outcome, str | None]:
    """One probe round: asks the members whom they follow until one takes writes; returns where the call
    goes now (None: nowhere yet)."""
    for member in finder.probe_order():
        role: Role | None = None
        if finder.ha_routes:
            ok, body = yield Send(member, ha_probe())
            if ok:
                role = Role.from_ha(body)
            elif unreachable(body):
                finder.unreachable(member)
                continue
            elif isinstance(body, NotFound):
                finder.ha_routes = False  # a server without fail-over on etcd (older, or not in a cluster)
        if role is None:
            ok, body = yield Send(member, replication_probe())
            if not ok:
                if unreachable(body):
                    finder.unreachable(member)
                continue
            role = Role.from_replication(body)
        if role is not None and finder.probed(member, role):
            break
    finder.end_round()
    return finder.target(write)


def run_sync(
    plan: FailoverPlan[T],
    execute: Callable[[str, Call[Any]], Any],
    sleep: Callable[[float], None],
    lock: AbstractContextManager[Any],
) -> T:
    """Drives a plan with a blocking ``execute(url, call)``; the plan runs under ``lock`` (threads share
    the finder), the calls and sleeps outside it."""
    outcome: Outcome | None = None
    try:
        while True:
            with lock:
                step = plan.send(outcome) if outcome is not None else next(plan)
            if isinstance(step, Sleep):
                sleep(step.seconds)
                outcome = (True, None)
                continue
            try:
                outcome = (True, execute(step.url, step.call))
            except DiffstoreError as exc:
                outcome = (False, exc)
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]
    except _Done:
        return None  # type: ignore[return-value]


async def run_async(
    plan: FailoverPlan[T], execute: Callable[[str, Call[Any]], Any], sleep: Callable[[float], Any]
) -> T:
    """Drives a plan with an awaitable ``execute(url, call)``."""
    outcome: Outcome | None = None
    try:
        while True:
            step = plan.send(outcome) if outcome is not None else next(plan)
            if isinstance(step, Sleep):
                await sleep(step.seconds)
                outcome = (True, None)
                continue
            try:
                outcome = (True, await execute(step.url, step.call))
            except DiffstoreError as exc:
                outcome = (False, exc)
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]
    except _Done:
        return None  # type: ignore[return-value]


__all__ = ["DEFAULT_WAIT_S", "Send", "Sleep", "find_leader", "perform", "replay_of", "run_async", "run_sync"]
