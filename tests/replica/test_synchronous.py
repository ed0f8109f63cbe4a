"""``serve --synchronous N`` with real replica processes: what an acknowledged write promises, under
kill -9 and SIGSTOP of the replica, and with fewer replicas than required."""

from __future__ import annotations

import concurrent.futures
from pathlib import Path

import httpx
import pytest

from diffstore.client import Client
from diffstore.errors import NotReplicated
from tests.faults import paused
from tests.helpers import wait_until

from .conftest import Server

FOLLOW_S = 120.0


def _synchronous(
    tmp_path: Path, servers: list[Server], required: int, timeout_s: float, *extra: str
) -> tuple[Server, Server]:
    args = ("--synchronous", str(required), "--synchronous-timeout-s", str(timeout_s), *extra)
    primary = Server(tmp_path / "primary", *args)
    servers.append(primary)
    primary.start()
    replica = Server(tmp_path / "replica", "--replica-of", primary.url)
    servers.append(replica)
    replica.start()
    return primary, replica


def _setup(p: Client, r: Client) -> None:
    """M (manual) and A (automatic), each with history, both copied by the replica before the test writes
    (a replica's first copy of a collection is not a confirmation: see docs/replicas.md)."""
    m = p.create_collection("M", manual=True)
    p.create_collection("A", manual=False)
    m.create_reader("keep", generation_id=None)
    wait_until(lambda: {c.name for c in r.collections()} >= {"M", "A"}, FOLLOW_S, what="M and A copied")


def _commit(p: Client, g: bytes) -> None:
    m = p.collection("M")
    m.start_generation(g)
    m.put_many([(b"k%d" % i, g) for i in range(100)], generation_id=g)
    m.commit_generation(g)


def _has(r: Client, g: bytes) -> bool:
    try:
        return r.collection("M").get(b"k7").value == g
    except Exception:  # noqa: BLE001 -- the replica is starting
        return False


def test_every_acknowledged_write_is_on_the_replica_when_answered(
    tmp_path: Path, servers: list[Server]
) -> None:
    primary, replica = _synchronous(tmp_path, servers, 1, 60)
    with primary.client() as p, replica.client() as r:
        _setup(p, r)
        a_primary, m_replica, a_replica = p.collection("A"), r.collection("M"), r.collection("A")
        for n in range(1, 31):
            g = b"g%03d" % n
            _commit(p, g)
            # read right after the answer: never missing, never older
            assert m_replica.generation_id == g
            assert m_replica.get(b"k99").value == g  # type: ignore[union-attr]
            if n % 5 == 0:  # a reader moved outside a commit is not a write the replicas confirm
                p.collection("M").update_reader("keep", g)
            put = a_primary.put(b"a%d" % (n % 3), g)
            found = a_replica.get(b"a%d" % (n % 3))
            assert found is not None and (found.value, found.generation_id) == (g, put.generation_id)
            many = a_primary.put_many([(b"b%d" % i, g) for i in range(50)])
            assert a_replica.get(b"b49").generation_id == many.generation_id  # type: ignore[union-attr]
        # new collections: the first commit waits for the replica's first copy, which confirms only once
        # applied (its hold is placed at null, moved to the copied generation after)
        for name in ("N1", "N2", "N3"):
            fresh = p.create_collection(name, manual=True)
            fresh.start_generation(b"g1")
            fresh.put(b"k", b"v", generation_id=b"g1")
            fresh.commit_generation(b"g1")
            assert r.collection(name).get(b"k").value == b"v"  # type: ignore[union-attr]
        shown = httpx.get(f"{primary.url}/replication").json()["synchronous"]
        replica_id = httpx.get(f"{replica.url}/replication").json()["replicaId"]
        assert shown["required"] == 1
        assert [(x["replicaId"], x["collections"], x["inSync"]) for x in shown["replicas"]] == [
            (replica_id, 5, True)
        ]


def test_with_two_workers_a_hold_moved_through_the_other_worker_answers_the_write(
    tmp_path: Path, servers: list[Server]
) -> None:
    # the replica's hold moves reach either worker; the waiting one re-reads the holds (docs/replicas.md)
    primary, replica = _synchronous(tmp_path, servers, 1, 60, "--workers", "2")
    with primary.client() as p, replica.client() as r:
        _setup(p, r)
        for n in range(1, 11):
            g = b"g%03d" % n
            _commit(p, g)
            assert r.collection("M").get(b"k7").value == g  # type: ignore[union-attr]


def test_kill9_of_the_replica_times_commits_out_and_they_resume_when_it_is_back(
    tmp_path: Path, servers: list[Server]
) -> None:
    primary, replica = _synchronous(tmp_path, servers, 1, 10)
    with primary.client() as p:
        with replica.client() as r:
            _setup(p, r)
        _commit(p, b"g1")
        replica.kill9()
        with pytest.raises(NotReplicated) as caught:
            _commit(p, b"g2")
        assert (caught.value.generation_id, caught.value.replicated, caught.value.required) == (b"g2", 0, 1)
        assert p.collection("M").get(b"k7").value == b"g2"  # type: ignore[union-attr]  # committed here
        replica.start()
        with replica.client() as r:
            wait_until(lambda: _has(r, b"g2"), FOLLOW_S, what="the replica to apply g2 after its restart")
            _commit(p, b"g3")
            assert r.collection("M").get(b"k7").value == b"g3"  # type: ignore[union-attr]


def test_a_commit_waits_while_the_replica_is_stopped_and_answers_once_it_applied_it(
    tmp_path: Path, servers: list[Server]
) -> None:
    primary, replica = _synchronous(tmp_path, servers, 1, 0)  # 0: wait for ever, as PostgreSQL does
    assert replica.process is not None
    with primary.client() as p, replica.client() as r:
        _setup(p, r)
        _commit(p, b"g1")
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            with paused(replica.process):
                committing = pool.submit(_commit, p, b"g2")
                wait_until(lambda: p.collection("M").generation_id == b"g2", FOLLOW_S, what="g2 committed")
                # other writers go on meanwhile (the wait holds no lock)
                with Client(primary.url) as other:
                    other.collection("M").start_generation(b"g3")
                    other.collection("M").put(b"x", b"y", generation_id=b"g3")
                    other.collection("M").abort_generation(b"g3")
                # whatever the time it took: no answer while the replica cannot apply it
                assert not committing.done()
            committing.result(FOLLOW_S)
            assert r.collection("M").get(b"k7").value == b"g2"  # type: ignore[union-attr]


def test_two_required_and_one_replica_answer_not_replicated_with_the_write_kept(
    tmp_path: Path, servers: list[Server]
) -> None:
    primary, replica = _synchronous(tmp_path, servers, 2, 2)
    with primary.client() as p, replica.client() as r:
        _setup(p, r)
        for g in (b"g1", b"g2"):
            with pytest.raises(NotReplicated) as caught:
                _commit(p, g)
            assert (caught.value.generation_id, caught.value.required) == (g, 2)
            assert caught.value.replicated <= 1  # the one replica, when it was quick enough
            assert p.collection("M").get(b"k7").value == g  # type: ignore[union-attr]
            wait_until(lambda: _has(r, g), FOLLOW_S, what="the replica to apply it")  # noqa: B023
        with pytest.raises(NotReplicated):
            p.collection("A").put(b"a", b"v")
        assert p.collection("A").get(b"a").value == b"v"  # type: ignore[union-attr]
