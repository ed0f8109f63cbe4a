"""The leader-finding state machine and the fail-over plan of a client of several servers, without sockets:
members are functions answering calls, time is a counter. What goes where, what is sent again, and what
is never sent twice."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from contextlib import nullcontext
from typing import Any

import httpx
import pytest

from diffstore.client import _calls
from diffstore.client._calls import Call, Replay
from diffstore.client._failover import perform, replay_of, run_async, run_sync
from diffstore.client._leader import LeaderFinder, Role, split_urls
from diffstore.client._transport import never_sent, unreachable
from diffstore.engine.types import ReaderUpdate
from diffstore.errors import (
    BadVersion,
    Fenced,
    GenerationMismatch,
    LeaderChanged,
    NoLeader,
    NoSuchRoute,
    ReadOnlyReplica,
    StorageError,
)
from diffstore.outage import is_outage
from diffstore.wire import JSON
from diffstore.wire_requests import WriteOptions

A, B, C = "http://a", "http://b", "http://c"


def refused_connection() -> StorageError:
    try:
        raise StorageError("refused") from httpx.ConnectError("refused")
    except StorageError as exc:
        return exc


def lost_answer() -> StorageError:
    try:
        raise StorageError("reset") from httpx.ReadError("reset")
    except StorageError as exc:
        return exc


class Cluster:
    """Members by URL: each is ``role`` (for the probes) and ``answer(call)`` (raises or returns)."""

    def __init__(self) -> None:
        self.roles: dict[str, Any] = {}
        self.answers: dict[str, Callable[[Call[Any]], Any]] = {}
        self.sent: list[tuple[str, str, str]] = []
        self.now = 0.0

    def execute(self, url: str, call: Call[Any]) -> Any:
        self.sent.append((url, call.method, call.path))
        if call.path == "/ha":
            raise NoSuchRoute("no /ha")
        if call.path == "/replication":
            role = self.roles[url]
            if isinstance(role, Exception):
                raise role
            return role
        answer = self.answers[url](call)
        return call.parse(answer, JSON) if isinstance(answer, dict) else answer  # as the transport does

    def run(self, call: Call[Any], finder: LeaderFinder, wait_s: float = 30.0) -> Any:
        plan = perform(call, finder, lambda: self.now, unreachable, never_sent, wait_s)
        return run_sync(plan, self.execute, self.sleep, nullcontext())

    def sleep(self, seconds: float) -> None:
        self.now += seconds

    def writes(self) -> list[str]:
        return [url for url, method, path in self.sent if path not in ("/ha", "/replication")]


def primary(term: int = 0) -> dict[str, Any]:
    return {"role": "primary", "term": term, "primary": None}


def replica_of(url: str | None) -> dict[str, Any]:
    return {"role": "replica", "term": 0, "primary": url}


def put() -> Call[Any]:
    return _calls.put("c", b"k", b"v", False, WriteOptions())


def test_urls_split_on_commas_and_lists_once_in_order() -> None:
    assert split_urls("http://a, http://b/,,http://a") == ("http://a", "http://b")
    assert split_urls(["http://a,http://b", "http://c"]) == ("http://a", "http://b", "http://c")
    with pytest.raises(ValueError):
        split_urls(" , ")


def test_roles_from_ha_and_replication_answers() -> None:
    assert Role.from_ha({"role": "leader", "leader": {"member": "m", "url": A}, "term": 3}) == Role(
        True, A, 3
    )
    assert Role.from_ha({"role": "candidate", "leader": None, "term": 2}) == Role(False, None, 2)
    assert Role.from_ha({"cluster": "x"}) is None
    assert Role.from_replication({"role": "replica", "term": 1, "primary": B}) == Role(False, B, 1)
    assert Role.from_replication({"role": "fenced", "term": 4, "primary": B}) == Role(False, B, 4)
    assert Role.from_replication([]) is None


def test_the_finder_follows_a_hint_among_its_members_only_and_counts_changes() -> None:
    finder = LeaderFinder((A, B))
    assert finder.target(write=True) is None and finder.probe_order() == [A, B]
    assert finder.probed(A, Role(False, B)) is False
    assert finder.probed(B, Role(True)) is True
    assert finder.end_round() == B and finder.epoch == 0  # the first leader is no change
    finder.refused(B, "http://elsewhere")  # not a member: dropped, not followed
    assert finder.leader is None and finder.epoch == 1
    assert finder.target(write=False) == A  # a read goes to a member that answered meanwhile
    finder.refused(A, B)
    assert finder.leader == B and finder.epoch == 1
    finder.unreachable(B)
    assert finder.leader is None and finder.epoch == 2


def test_two_writable_members_the_higher_term_wins_and_named_leaders_are_asked_first() -> None:
    finder = LeaderFinder((A, B, C))
    finder.probe_order()
    finder.probed(A, Role(False, C, 5))
    assert finder.end_round() is None
    assert finder.probe_order() == [C, A, B]
    finder.probe_order()
    finder._candidates.update({A: 1, B: 2})
    assert finder.end_round() == B


def test_every_write_route_says_what_a_resend_does() -> None:
    auto = WriteOptions()
    named = WriteOptions(generation_id=b"g")
    producer = WriteOptions(producer_id="p", seq_no=3)
    assert replay_of(_calls.put("c", b"k", b"v", False, auto)) is Replay.ONCE
    assert replay_of(_calls.put("c", b"k", b"v", True, named)) is Replay.ONCE
    assert replay_of(_calls.put("c", b"k", b"v", False, named)) is Replay.SAFE
    assert replay_of(_calls.put_many("c", [(b"k", b"v")], producer)) is Replay.SAFE
    assert replay_of(_calls.start_generation("c", b"g", True)) is Replay.SAFE
    assert replay_of(_calls.commit_generation("c", b"g", [])) is Replay.CHECKED
    assert replay_of(_calls.abort_generation("c", b"g")) is Replay.CHECKED
    assert replay_of(_calls.update_reader("c", "r", b"g")) is Replay.SAFE
    assert replay_of(_calls.update_reader("c", "r", b"g", expected=b"f")) is Replay.CHECKED
    assert replay_of(_calls.acquire_lease("c", "l", "me", 1000)) is Replay.SAFE
    assert replay_of(_calls.renew_lease("c", "l", "me", 3, None)) is Replay.SAFE
    assert replay_of(_calls.release_lease("c", "l", "me", 3)) is Replay.CHECKED
    assert replay_of(_calls.create_collection("c", True, None)) is Replay.ONCE
    assert replay_of(_calls.create_reader("c", "r", None, None)) is Replay.ONCE
    assert replay_of(_calls.delete_collection("c")) is Replay.ONCE
    assert replay_of(_calls.get("c", b"k", _calls.ReadAt())) is Replay.READ
    assert replay_of(_calls.generation_stream("c", None)) is Replay.READ


def test_a_write_refused_by_a_replica_goes_to_the_leader_it_names() -> None:
    cluster = Cluster()
    cluster.roles = {A: primary(), B: replica_of(A)}
    finder = LeaderFinder((B, A))
    finder.leader = B  # a stale belief: B was the leader
    cluster.answers = {B: lambda call: (_ for _ in ()).throw(ReadOnlyReplica("no", A)), A: lambda call: "ok"}
    assert cluster.run(put(), finder) == "ok"
    assert cluster.writes() == [B, A] and finder.leader == A


def test_a_fenced_primary_a_dead_one_and_a_probe_round_lead_to_the_new_leader() -> None:
    cluster = Cluster()
    cluster.roles = {
        A: refused_connection(),
        B: {"role": "fenced", "term": 2, "primary": None},
        C: primary(2),
    }

    def dead(call: Call[Any]) -> Any:
        raise refused_connection()

    def fenced(call: Call[Any]) -> Any:
        raise Fenced("stepped down", 2, None)

    cluster.answers = {A: dead, B: fenced, C: lambda call: "ok"}
    finder = LeaderFinder((A, B, C))
    finder.leader = A
    assert cluster.run(put(), finder) == "ok"
    assert cluster.writes() == [A, C] and finder.leader == C


def test_a_write_whose_answer_was_lost_is_not_sent_again_unless_a_resend_is_harmless() -> None:
    cluster = Cluster()
    cluster.roles = {A: refused_connection(), B: primary(1)}
    applied: list[str] = []

    def lost(call: Call[Any]) -> Any:
        applied.append(call.path)
        raise lost_answer()

    cluster.answers = {A: lost, B: lambda call: applied.append(call.path) or "ok"}
    finder = LeaderFinder((A, B))
    finder.leader = A
    with pytest.raises(StorageError) as raised:
        cluster.run(put(), finder)  # an automatic collection's put: it may have been applied on A
    assert unreachable(raised.value) and applied == ["/collections/c/put"]
    finder.leader = A
    named = _calls.put("c", b"k", b"v", False, WriteOptions(generation_id=b"g"))
    assert cluster.run(named, finder) == "ok"  # the same value into the same generation: harmless
    assert applied[1:] == ["/collections/c/put", "/collections/c/put"]


def test_a_commit_whose_answer_was_lost_is_confirmed_not_applied_twice() -> None:
    cluster = Cluster()
    cluster.roles = {A: refused_connection(), B: primary(1)}
    commits: list[str] = []

    def lost(call: Call[Any]) -> Any:
        commits.append("A")
        raise lost_answer()

    def new_leader(call: Call[Any]) -> Any:
        if call.path.endswith("/generation/commit"):
            raise GenerationMismatch("no open generation")  # A's commit reached B before A died
        assert call.path.endswith("/generations") and call.params is not None
        return {"items": [{"generationId": {"value": "g"}}]}

    cluster.answers = {A: lost, B: new_leader}
    finder = LeaderFinder((A, B))
    finder.leader = A
    call = _calls.commit_generation("c", b"g", [ReaderUpdate("r", b"g")])
    assert cluster.run(call, finder) is None
    assert commits == ["A"]


def test_a_commit_the_new_leader_never_saw_raises_leader_changed() -> None:
    cluster = Cluster()
    cluster.roles = {A: refused_connection(), B: primary(1)}

    def lost(call: Call[Any]) -> Any:
        raise lost_answer()

    def new_leader(call: Call[Any]) -> Any:
        if call.path.endswith("/generation/commit"):
            raise GenerationMismatch("no open generation")
        return {"items": [{"generationId": {"value": "f"}}]}  # its newest is below g: g was lost

    cluster.answers = {A: lost, B: new_leader}
    finder = LeaderFinder((A, B))
    finder.leader = A
    with pytest.raises(LeaderChanged) as raised:
        cluster.run(_calls.commit_generation("c", b"g", []), finder)
    assert isinstance(raised.value.__cause__, GenerationMismatch)
    assert is_outage(raised.value)  # long-running commands redo the round


def test_a_put_into_a_generation_opened_before_the_leader_changed_raises_leader_changed() -> None:
    cluster = Cluster()
    cluster.roles = {A: primary(0), B: primary(1)}

    def mismatch(call: Call[Any]) -> Any:
        raise GenerationMismatch("not open")

    cluster.answers = {A: lambda call: None, B: mismatch}
    finder = LeaderFinder((A, B))
    finder.leader = A
    assert cluster.run(_calls.start_generation("c", b"g", True), finder) is None
    finder.unreachable(A)  # another thread found A gone
    finder.leader = B
    named = _calls.put("c", b"k", b"v", False, WriteOptions(generation_id=b"g"))
    with pytest.raises(LeaderChanged):
        cluster.run(named, finder)
    with pytest.raises(GenerationMismatch):  # once: the next refusal is the new leader's own
        cluster.run(named, finder)


def test_a_cas_refused_by_someone_else_is_raised_as_it_is() -> None:
    cluster = Cluster()
    cluster.roles = {A: primary(0), B: replica_of(A)}

    def moved(call: Call[Any]) -> Any:
        raise BadVersion("moved")

    cluster.answers = {A: moved}
    finder = LeaderFinder((B, A))
    with pytest.raises(BadVersion):
        cluster.run(_calls.update_reader("c", "r", b"g", expected=b"f"), finder)
    assert cluster.writes() == [A]


def test_no_leader_within_the_wait_raises_no_leader_and_writes_nothing() -> None:
    cluster = Cluster()
    cluster.roles = {A: replica_of(None), B: {"role": "fenced", "term": 1, "primary": None}}
    cluster.answers = {}
    finder = LeaderFinder((A, B))
    with pytest.raises(NoLeader) as raised:
        cluster.run(put(), finder, wait_s=5.0)
    assert cluster.writes() == [] and cluster.now >= 5.0
    assert is_outage(raised.value)


def test_reads_go_to_a_member_that_answers_while_there_is_no_leader() -> None:
    cluster = Cluster()
    cluster.roles = {A: refused_connection(), B: replica_of(A)}
    cluster.answers = {B: lambda call: "read"}
    finder = LeaderFinder((A, B))
    assert cluster.run(_calls.collection_state("c"), finder) == "read"
    assert cluster.writes() == [B]


def test_the_async_driver_runs_the_same_plan() -> None:
    cluster = Cluster()
    cluster.roles = {A: refused_connection(), B: primary(1)}

    def dead(call: Call[Any]) -> Any:
        raise refused_connection()

    cluster.answers = {A: dead, B: lambda call: "ok"}
    finder = LeaderFinder((A, B))
    finder.leader = A

    async def execute(url: str, call: Call[Any]) -> Any:
        return cluster.execute(url, call)

    async def sleep(seconds: float) -> None:
        cluster.sleep(seconds)

    plan = perform(put(), finder, lambda: cluster.now, unreachable, never_sent)
    assert asyncio.run(run_async(plan, execute, sleep)) == "ok"
    assert cluster.writes() == [A, B] and finder.leader == B


def test_a_leased_write_with_a_token_from_the_old_leader_is_not_sent_to_the_new_one() -> None:
    cluster = Cluster()
    cluster.roles = {A: primary(0), B: primary(1)}
    writes: list[str] = []

    def lease_answer(call: Call[Any]) -> Any:
        writes.append(call.path)
        if call.path.endswith("/acquire") or call.path.endswith("/renew"):
            return {"owner": "me", "version": 1, "expiresAtMs": 1}
        return None

    cluster.answers = {A: lease_answer, B: lease_answer}
    finder = LeaderFinder((A, B))
    finder.leader = A
    token = cluster.run(_calls.acquire_lease("c", "l", "me", 10_000), finder).token
    start = _calls.start_generation("c", b"g", True, lease=token)
    assert cluster.run(start, finder) is None
    finder.unreachable(A)
    finder.leader = B  # a fail-over: B's copy of the lease may lag, and version 1 be someone else's there
    before = list(writes)
    with pytest.raises(LeaderChanged):
        cluster.run(start, finder)
    assert writes == before  # not sent
    cluster.run(_calls.renew_lease("c", "l", "me", 1, None), finder)  # B says the token holds there
    assert cluster.run(start, finder) is None
