"""Promotion on a store with a life behind it, while the old primary answers: it is fenced first, so
exactly one primary takes writes and every write the old one acknowledged is on the new one; a replica
that has not copied everything is refused (nothing changed) unless forced; one that cannot catch up
lets the old primary write again; a request carrying a higher term fences a primary."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from diffstore.client import Client
from diffstore.client import _calls as calls
from diffstore.errors import Fenced, NoSuchCollection, ReplicaBehind
from diffstore.replica import READER_PREFIX
from tests.faults import paused
from tests.helpers import wait_until

from .compare import caught_up, every_read, generations, state
from .conftest import Server
from .promote_store import LIVE, Writer, live, replication, writable, write_answer

FOLLOW_S = 180.0


def _replica_of(tmp_path: Path, servers: list[Server], primary: Server, name: str, *args: str) -> Server:
    server = Server(tmp_path / name, "--replica-of", primary.url, *args)
    servers.append(server)
    return server.start()


def _holds(p: Client) -> dict[str, list[str]]:
    """The replicas' holds on the primary, by collection."""
    return {
        info.name: sorted(
            r.name for r in p.collection(info.name).readers() if r.name.startswith(READER_PREFIX)
        )
        for info in p.collections()
    }


def _lags(collections: list[dict[str, object]]) -> dict[object, tuple[object, object]]:
    return {c["collectionName"]: (c["state"], c["lagGenerations"]) for c in collections}


def test_promotion_while_the_old_primary_answers_leaves_one_writable_primary(
    tmp_path: Path, servers: list[Server]
) -> None:
    primary = Server(tmp_path / "primary", "--workers", "2")
    servers.append(primary.start())
    first = _replica_of(tmp_path, servers, primary, "first")
    second = _replica_of(tmp_path, servers, primary, "second")
    with primary.client() as p, first.client() as r1, second.client() as r2:
        copied = lambda: wait_until(lambda: caught_up(p, r1) and caught_up(p, r2), FOLLOW_S)  # noqa: E731
        live(p, copied)  # the replicas follow its whole life
        p.create_collection("W", manual=False)
        copied()
        writer = Writer(primary.url)
        writer.start()
        wait_until(lambda: len(writer.acked) >= 20, FOLLOW_S, what="the writer to write")
        answer = r1.execute(calls.promotion(wait_ms=60_000))  # a generous deadline: it answers once caught up
        writer.join(60)  # it stops at its first refused write
        assert isinstance(writer.refused, Fenced), writer.refused
        assert writer.refused.primary == first.url and writer.refused.term == 1
        assert (
            answer["promoted"],
            answer["term"],
            answer["primaryReachable"],
            answer["steppedDown"],
        ) == (
            True,
            1,
            True,
            True,
        )
        assert _lags(answer["collections"]) == {name: ("following", 0) for name in (*LIVE, "W")}
        # the two hold the same, and every write the old primary acknowledged is on the new one
        assert state(r1) == state(p)
        held, copied_ids = generations(p), generations(r1)
        # the generations both hold (a replica starts a collection where it first saw it: replicas.md)
        common = {name: [g for g in ids if g in set(copied_ids[name])] for name, ids in held.items()}
        chosen = {"M": common["M"], "T": common["T"], "D": common["D"], "W": common["W"][-3:]}
        assert chosen["M"][-1] == b"g2" and chosen["W"][-1] == writer.acked[-1][1]
        assert every_read(r1, chosen) == every_read(p, chosen)
        keys = [key for key, _ in writer.acked]
        found = r1.collection("W").get_many(keys).records
        assert [(r.key, r.generation_id) for r in found if r is not None] == writer.acked
        # exactly one primary takes writes: the old one refuses them (every worker), the new one takes
        for _ in range(6):
            assert write_answer(primary.url) == (409, "fenced")
        with pytest.raises(Fenced):
            p.collection("W").put(b"late", b"x")
        assert writable(first.url)
        r1.collection("W").put(b"after", b"promotion")
        assert replication(primary.url)["fencedBy"]["primary"] == first.url
        assert replication(primary.url)["role"] == "fenced"
        told = replication(first.url)
        assert (told["role"], told["term"], told["promotedFrom"]) == ("primary", 1, primary.url)
        # its holds on the old primary went, in every collection; the other replica's stay
        second_hold = READER_PREFIX + replication(second.url)["replicaId"]
        assert _holds(p) == {name: [second_hold] for name in (*LIVE, "W")}
        # the other replica cannot become a second primary: the old one stepped down for the first
        with pytest.raises(Fenced) as refused:
            r2.promote()
        assert refused.value.primary == first.url
        assert replication(second.url)["role"] == "replica" and not writable(second.url)
        # it goes on following the stepped-down primary to its final state
        wait_until(lambda: state(r2) == state(p), FOLLOW_S, what="the other replica to reach the final state")
    # durable: kill -9 both, and each comes back as it was (the new one started as the primary it is)
    primary.kill9()
    first.kill9()
    primary.start()
    again = Server(first.data)
    servers.append(again.start())
    # (the killed supervisor's workers may still answer /healthz a moment before they end: wait for the new)
    wait_until(lambda: _role(primary.url) == "fenced", FOLLOW_S, what="the old primary to be back, fenced")
    assert write_answer(primary.url) == (409, "fenced")
    assert replication(again.url)["term"] == 1 and writable(again.url)
    with again.client() as r1:
        assert r1.collection("W").get(b"after").value == b"promotion"  # type: ignore[union-attr]


def test_a_replica_that_has_not_copied_everything_is_refused_unless_forced(
    tmp_path: Path, primary: Server, servers: list[Server]
) -> None:
    # the follower runs in the supervisor of a server with workers: paused, the workers still answer
    replica = _replica_of(tmp_path, servers, primary, "replica", "--workers", "2")
    with primary.client() as p, replica.client() as r:
        live(p, lambda: wait_until(lambda: caught_up(p, r), FOLLOW_S))
        replica_id = replication(replica.url)["replicaId"]
        hold = READER_PREFIX + replica_id
        wait_until(lambda: caught_up(p, r), FOLLOW_S, what="the replica to copy")
        assert replica.process is not None
        with paused(replica.process):
            late = p.create_collection("late", manual=True)
            late.write_generation(b"1", [(b"k", b"v")])
            late.create_reader(hold, generation_id=b"1")  # what a copy that never finished leaves
            p.collection("M").write_generation(b"g3", [(b"a", b"3")], [("r", b"g3")])
            before = state(r), state(p), _holds(p)
            with pytest.raises(ReplicaBehind) as refused:
                r.execute(calls.promotion(wait_ms=500))
            lags = _lags(refused.value.collections)
            assert lags["late"][0] == "copying" and lags["M"] == ("following", 1)
            assert {name: lags[name] for name in ("D", "E", "L", "S", "T")} == dict.fromkeys(
                ("D", "E", "L", "S", "T"), ("following", 0)
            )
            # nothing changed: the primary takes writes, the replica does not, the holds stay
            assert (state(r), state(p), _holds(p)) == before
            assert writable(primary.url) and not writable(replica.url)
            assert replication(primary.url)["term"] == 0 and replication(replica.url)["role"] == "replica"
            # the command says the same, one collection a line, and fails in one line
            cli = subprocess.run(
                [sys.executable, "-m", "diffstore.cli", "promote", "--url", replica.url, "--wait", "0.5"],
                capture_output=True,
                text=True,
                timeout=120,
            )
            assert cli.returncode == 1, cli.stderr
            lines = cli.stderr.strip().splitlines()
            assert (
                "  late: copying, 2 generations behind" in lines
                or "  late: copying, 1 generation behind" in lines
            )
            assert "  M: following, 1 generation behind" in lines
            assert lines[-1].startswith("diffstore promote: ") and "(replicaBehind)" in lines[-1]
            assert (state(r), state(p)) == before[:2]
            # forced: promoted with what it holds; the old primary stepped down; every hold went
            forced = r.execute(calls.promotion(force=True, wait_ms=500))
            assert forced["promoted"] and forced["steppedDown"] and forced["term"] == 1
            assert _lags(forced["collections"])["late"][0] == "copying"
            assert write_answer(primary.url) == (409, "fenced") and writable(replica.url)
            assert all(not holds for holds in _holds(p).values()), _holds(p)
            with pytest.raises(NoSuchCollection):
                r.collection("late")
            assert r.collection("M").generation_id == b"g2"  # what it had applied stays


def test_a_promotion_that_cannot_catch_up_lets_the_old_primary_write_again(
    tmp_path: Path, primary: Server, servers: list[Server]
) -> None:
    replica = _replica_of(tmp_path, servers, primary, "replica", "--workers", "2")
    with primary.client() as p, replica.client() as r:
        live(p, lambda: wait_until(lambda: caught_up(p, r), FOLLOW_S))
        wait_until(lambda: caught_up(p, r), FOLLOW_S, what="the replica to copy")
        assert replica.process is not None
        with paused(replica.process):
            p.collection("M").write_generation(b"g3", [(b"a", b"3")], [("r", b"g3")])
            with pytest.raises(ReplicaBehind) as refused:
                r.execute(calls.promotion(wait_ms=500))
            assert _lags(refused.value.collections)["M"] == ("following", 1)
            # the old primary was stepped down, and up again: it takes writes (at the term it saw)
            assert writable(primary.url)
            assert (replication(primary.url)["role"], replication(primary.url)["term"]) == ("primary", 1)
            p.collection("M").write_generation(b"g4", [(b"b", b"4")], [("r", b"g4")])
            assert not writable(replica.url)
        wait_until(lambda: caught_up(p, r), FOLLOW_S, what="the resumed replica to catch up")
        answer = r.execute(calls.promotion(wait_ms=60_000))
        assert answer["term"] == 2 and answer["steppedDown"]
        assert write_answer(primary.url) == (409, "fenced") and writable(replica.url)
        assert r.collection("M").generation_id == b"g4"


def test_a_request_carrying_a_higher_term_fences_a_primary(tmp_path: Path, servers: list[Server]) -> None:
    primary = Server(tmp_path / "primary", "--workers", "2")
    servers.append(primary.start())
    with primary.client() as p:
        live(p)
        before = state(p)
    with httpx.Client(base_url=primary.url, timeout=60) as http:
        for bad in ("-1", "two", "1" * 30, "1.5"):
            answer = http.get("/replication", headers={"Diffstore-Term": bad})
            assert answer.status_code == 400 and answer.json()["error"] == "invalidRequest", bad
        assert writable(primary.url) and replication(primary.url)["term"] == 0
        assert http.get("/healthz", headers={"Diffstore-Term": "0"}).status_code == 200  # not above: nothing
        assert writable(primary.url)
        # a client that learnt of term 3 (a newer primary) tells this one, on any request
        with Client(primary.url, term=3) as newer:  # the Python client carries it when told (term=)
            assert [info.name for info in newer.collections()] == sorted(before)
        for _ in range(6):  # every worker process refuses
            refused = http.post("/collections/", json={"collectionName": "X", "isManual": True})
            assert refused.status_code == 409 and refused.json()["error"] == "fenced"
            assert refused.json()["term"] == 3 and "primary" not in refused.json()
        told = replication(primary.url)
        assert (told["role"], told["term"], told["fencedBy"]["primary"]) == ("fenced", 3, None)
    with primary.client() as p:
        assert state(p) == before
        # making it a primary again is an operator's decision: refused without force, then one term above
        with pytest.raises(Fenced):
            p.promote()
        cli = subprocess.run(
            [sys.executable, "-m", "diffstore.cli", "promote", "--url", primary.url, "--force"],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert cli.returncode == 0, cli.stderr
        assert (
            cli.stdout.strip() == f"promoted: {primary.url} is a primary again at term 4 (its fencing lifted)"
        )
        assert (replication(primary.url)["role"], replication(primary.url)["term"]) == ("primary", 4)
        assert writable(primary.url) and state(p) == before


def _role(url: str) -> str | None:
    """The role ``GET /replication`` answers, None while nothing answers."""
    try:
        return str(replication(url)["role"])
    except httpx.TransportError:
        return None
