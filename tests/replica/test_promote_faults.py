"""Promotion when the old primary cannot be asked: paused (SIGSTOP) during the promotion, cut off by a
TCP proxy, or killed (kill -9). The replica is promoted with what it holds; the old primary cannot be
stopped from taking writes while it is away (docs/replicas.md says so), and is fenced -- its writes
refused, the holds deleted -- as soon as it can be reached again."""

from __future__ import annotations

from pathlib import Path

import httpx

from diffstore.client import Client
from diffstore.client import _calls as calls
from tests.faults import TcpProxy, paused
from tests.helpers import wait_until

from .compare import caught_up, state
from .conftest import Server
from .promote_store import LIVE, live, replication, writable, write_answer
from .test_promote import FOLLOW_S, _holds

FENCE_S = 180.0  # the promoted replica retries the step-down (backing off to 5 s) until it is heard


def _follow(p: Client, replica: Server) -> None:
    with replica.client() as r:
        live(p, lambda: wait_until(lambda: caught_up(p, r), FOLLOW_S))
        wait_until(lambda: caught_up(p, r), FOLLOW_S, what="the replica to copy")


def _fenced_later(primary: Server, replica: Server) -> None:
    """The old primary, reachable again, is fenced by the promoted replica, and lets its holds go."""
    wait_until(lambda: write_answer(primary.url) == (409, "fenced"), FENCE_S, what="the old primary fenced")
    told = replication(primary.url)
    assert (told["role"], told["term"], told["fencedBy"]["primary"]) == ("fenced", 1, replica.url)
    with primary.client() as p:
        wait_until(lambda: not any(_holds(p).values()), FENCE_S, what="the holds deleted")
    assert writable(replica.url)


def test_promotion_while_the_old_primary_is_paused(
    tmp_path: Path, primary: Server, servers: list[Server]
) -> None:
    replica = Server(tmp_path / "replica", "--replica-of", primary.url)
    servers.append(replica.start())
    with primary.client() as p:
        _follow(p, replica)
        held = state(p)
    assert primary.process is not None
    with paused(primary.process), replica.client() as r:
        answer = r.execute(calls.promotion(wait_ms=1_000))  # its calls to the paused primary time out
        assert (answer["promoted"], answer["term"], answer["primaryReachable"], answer["steppedDown"]) == (
            True,
            1,
            False,
            False,
        )
        assert {c["collectionName"] for c in answer["collections"]} == set(LIVE)
        assert writable(replica.url) and state(r) == held
    _fenced_later(primary, replica)


def test_promotion_over_a_cut_link(tmp_path: Path, primary: Server, servers: list[Server]) -> None:
    with TcpProxy(primary.url.removeprefix("http://")) as proxy:
        replica = Server(tmp_path / "replica", "--replica-of", f"http://{proxy.address}")
        servers.append(replica.start())
        with primary.client() as p:
            _follow(p, replica)
            proxy.cut(refuse=True)
            with replica.client() as r:
                answer = r.execute(calls.promotion(wait_ms=1_000))
            assert (answer["primaryReachable"], answer["steppedDown"], answer["term"]) == (False, False, 1)
            # what cannot be prevented: cut off, the old primary still takes writes (a split brain until
            # the link is back; docs/replicas.md)
            assert writable(primary.url) and writable(replica.url)
            p.collection("M").write_generation(b"g9", [(b"lost", b"1")], [("r", b"g9")])
            proxy.accept()
        _fenced_later_through(proxy, primary, replica)
        with replica.client() as r:
            assert r.collection("M").generation_id == b"g2"  # the write during the cut is not on it


def _fenced_later_through(proxy: TcpProxy, primary: Server, replica: Server) -> None:
    wait_until(lambda: write_answer(primary.url) == (409, "fenced"), FENCE_S, what="the old primary fenced")
    assert replication(primary.url)["fencedBy"]["primary"] == replica.url
    with primary.client() as p:
        wait_until(lambda: not any(_holds(p).values()), FENCE_S, what="the holds deleted")


def test_promotion_after_kill9_of_the_old_primary(
    tmp_path: Path, primary: Server, servers: list[Server]
) -> None:
    replica = Server(tmp_path / "replica", "--replica-of", primary.url)
    servers.append(replica.start())
    with primary.client() as p:
        _follow(p, replica)
        held = state(p)
    primary.kill9()
    with replica.client() as r:
        answer = r.execute(calls.promotion(wait_ms=1_000))
        assert (answer["primaryReachable"], answer["steppedDown"], answer["term"]) == (False, False, 1)
        assert state(r) == held
    primary.start()  # it comes back on its port: the promoted replica tells it to step down
    _fenced_later(primary, replica)
    primary.kill9()  # and it stays fenced across a crash
    primary.start()
    assert write_answer(primary.url) == (409, "fenced")
    # kill -9 of the new primary: it comes back a primary at its term, with what it held
    replica.kill9()
    again = Server(replica.data)
    servers.append(again.start())
    assert (replication(again.url)["role"], replication(again.url)["term"]) == ("primary", 1)
    with again.client() as r:
        assert state(r) == held


def test_the_promotion_answer_says_which_collections_are_stalled(
    tmp_path: Path, primary: Server, servers: list[Server]
) -> None:
    replica = Server(tmp_path / "replica", "--replica-of", primary.url)
    servers.append(replica.start())
    with primary.client() as p, replica.client() as r:
        p.create_collection("A", manual=False).put(b"a", b"1")
        p.create_collection("B", manual=True)
        wait_until(lambda: caught_up(p, r), FOLLOW_S, what="the replica to copy")
    primary.kill9()

    def stalled() -> dict[str, object] | None:
        items = httpx.get(f"{replica.url}/replica", timeout=30).json()["collections"]
        found = {i["collectionName"]: i for i in items}
        return found if all(i["state"] == "stalled" for i in found.values()) else None

    seen = wait_until(stalled, FOLLOW_S, what="every collection stalled")
    with replica.client() as r:
        answer = r.execute(calls.promotion(wait_ms=1_000))
    assert answer["primaryReachable"] is False
    told = {c["collectionName"]: c for c in answer["collections"]}
    assert set(told) == set(seen) == {"A", "B"}
    for name, item in told.items():
        assert item["state"] == "stalled", item  # the follower's state, not "following"
        assert item["reason"] == seen[name]["reason"]  # type: ignore[index]
        assert "cannot reach the primary" in item["reason"]
