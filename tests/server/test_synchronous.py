"""``serve --synchronous N`` in one process: a real server, its waits, answered by holds a test moves.

A replica confirms a generation by moving its hold (the reader ``diffstore-replica:<id>``) there; these
tests play the replica's part by hand, so that each step is decided by the test, not by timing. The real
replica processes, and kill -9 and SIGSTOP of them, are in ``tests/replica/test_synchronous.py``.
"""

from __future__ import annotations

import concurrent.futures
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest
import uvicorn

from diffstore.client import Client
from diffstore.engine.store import Store
from diffstore.engine.types import StoreConfig
from diffstore.errors import InvalidRequest, NotReplicated
from diffstore.server import ServerConfig, create_app
from tests.helpers import serving, wait_until

HOLD = "diffstore-replica:r1"
WAIT_S = 60.0


@contextmanager
def synchronous_server(data: Path, required: int, timeout_s: float) -> Iterator[tuple[str, Store]]:
    store = Store.open(data, StoreConfig(commit_delay_ms=10))
    config = ServerConfig(synchronous=required, synchronous_timeout_s=timeout_s)
    app = create_app(store, config)
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=2))
    try:
        with serving(server) as url:
            yield url, store
    finally:
        store.close()


def _waiting(url: str) -> float:
    """How many writes have finished waiting, from ``/metrics``'s histogram (its _count)."""
    for line in httpx.get(f"{url}/metrics").text.splitlines():
        if line.startswith("diffstore_synchronous_wait_seconds_count"):
            return float(line.split()[-1])
    return 0.0


def test_a_commit_answers_once_a_hold_reaches_it_and_other_writers_go_on_meanwhile(tmp_path: Path) -> None:
    with synchronous_server(tmp_path / "d", 1, 0) as (url, store), Client(url) as client:
        m = client.create_collection("M", manual=True)
        other = client.create_collection("O", manual=True)
        m.create_reader(HOLD, generation_id=None)  # a replica's hold, at the start
        m.start_generation(b"g1")
        m.put(b"k", b"v", generation_id=b"g1")
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            committing = pool.submit(m.commit_generation, b"g1")
            # committed and visible here while it waits for the replica
            wait_until(lambda: store.collection("M").generation_id == b"g1", WAIT_S, what="the commit")
            assert not committing.done()
            # the wait holds no lock: other writes go through meanwhile
            other.start_generation(b"x")
            other.put(b"k", b"v", generation_id=b"x")
            other.put_many([(b"k2", b"v")], generation_id=b"x")
            other.abort_generation(b"x")
            assert not committing.done()
            m.update_reader(HOLD, b"g0")  # below the commit: not enough
            assert not committing.done()
            m.update_reader(HOLD, b"g1")  # the replica applied g1
            committing.result(WAIT_S)


def test_a_collection_without_replicas_waits_until_a_hold_appears(tmp_path: Path) -> None:
    with synchronous_server(tmp_path / "d", 1, 0) as (url, _), Client(url) as client:
        m = client.create_collection("M", manual=True)
        m.start_generation(b"g1")
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            committing = pool.submit(m.commit_generation, b"g1")
            wait_until(lambda: m.generation_id == b"g1", WAIT_S, what="the commit")
            assert not committing.done()
            m.create_reader(HOLD, generation_id=b"g1")  # a replica's first copy of M, at g1
            committing.result(WAIT_S)


def test_an_automatic_put_answers_once_its_generation_is_committed_and_applied(tmp_path: Path) -> None:
    with synchronous_server(tmp_path / "d", 1, 0) as (url, store), Client(url) as client:
        a = client.create_collection("A", manual=False)
        a.create_reader(HOLD, generation_id=None)
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            putting = pool.submit(a.put, b"k", b"v")
            # the auto-commit (10 ms) comes; the put still waits for the replica
            committed = wait_until(lambda: store.collection("A").get(b"k"), WAIT_S, what="the auto-commit")
            assert not putting.done()
            a.update_reader(HOLD, committed.generation_id)
            assert putting.result(WAIT_S).generation_id == committed.generation_id
        # a put that writes nothing does not wait (its generation may never commit)
        assert not a.put(b"k", b"other", if_not_present=True).was_put
        # a manual collection's put does not wait: its commit does
        m = client.create_collection("M", manual=True)
        m.start_generation(b"g1")
        m.put(b"k", b"v", generation_id=b"g1")
        m.put_many([(b"k2", b"v")], generation_id=b"g1")


def test_two_required_and_one_replica_times_out_with_the_write_committed(tmp_path: Path) -> None:
    with synchronous_server(tmp_path / "d", 2, 0.5) as (url, store), Client(url) as client:
        m = client.create_collection("M", manual=True)
        m.create_reader(HOLD, generation_id=None)
        for n in range(1, 4):
            g = b"g%d" % n
            m.start_generation(g)
            m.put(b"k", g, generation_id=g)
            with concurrent.futures.ThreadPoolExecutor(1) as pool:
                committing = pool.submit(m.commit_generation, g)
                wait_until(lambda: m.generation_id == g, WAIT_S, what="the commit")  # noqa: B023
                m.update_reader(HOLD, g)  # one replica applied it; the second never comes
                with pytest.raises(NotReplicated) as caught:
                    committing.result(WAIT_S)
            assert (caught.value.generation_id, caught.value.replicated, caught.value.required) == (g, 1, 2)
            assert "committed on this server" in caught.value.reason
            # committed all the same, and the next generation starts after it
            assert store.collection("M").get(b"k") == (b"k", g, g)
        body = httpx.post(
            f"{url}/collections/M/generation/start", json={"generationId": {"value": "g4"}}
        ).raise_for_status()
        answer = httpx.post(f"{url}/collections/M/generation/commit", json={"generationId": {"value": "g4"}})
        assert answer.status_code == 503, body
        assert answer.json() == {
            "error": "notReplicated",
            "reason": answer.json()["reason"],
            "generationId": {"value": "g4"},
            "replicated": 0,
            "required": 2,
        }
        assert store.collection("M").generation_id == b"g4"
        assert _waiting(url) == 4


def test_replication_and_metrics_show_the_replicas_that_count(tmp_path: Path) -> None:
    with synchronous_server(tmp_path / "d", 1, 0.5) as (url, _), Client(url) as client:
        m = client.create_collection("M", manual=True)
        n = client.create_collection("N", manual=True)
        m.create_reader(HOLD, generation_id=None)
        n.create_reader("diffstore-replica:r2", generation_id=None)
        m.start_generation(b"g1")
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            committing = pool.submit(m.commit_generation, b"g1")
            wait_until(lambda: m.generation_id == b"g1", WAIT_S, what="the commit")
            m.update_reader(HOLD, b"g1")
            committing.result(WAIT_S)
        n.start_generation(b"h1")
        with pytest.raises(NotReplicated):
            n.commit_generation(b"h1")  # r2 never applies it
        shown = httpx.get(f"{url}/replication").json()["synchronous"]
        assert shown["required"] == 1 and shown["timeoutS"] == 0.5
        r1, r2 = shown["replicas"]
        assert (r1["replicaId"], r1["collections"], r1["behind"], r1["inSync"]) == ("r1", 1, 0, True)
        assert r1["lastMovedMs"] is not None
        assert (r2["replicaId"], r2["collections"], r2["behind"], r2["inSync"]) == ("r2", 1, 1, False)
        text = httpx.get(f"{url}/metrics").text
        assert "diffstore_synchronous_replicas 1.0" in text
        assert "diffstore_synchronous_replicas_required 1.0" in text
        assert _waiting(url) == 2
        assert 'diffstore_synchronous_wait_seconds_bucket{le="0.25"} 1.0' in text  # the time-out is not


def test_without_synchronous_nothing_waits_and_replication_does_not_show_it(tmp_path: Path) -> None:
    with synchronous_server(tmp_path / "d", 0, 10) as (url, _), Client(url) as client:
        m = client.create_collection("M", manual=True)
        m.create_reader(HOLD, generation_id=None)
        m.start_generation(b"g1")
        m.commit_generation(b"g1")  # no replica applied it: answered all the same
        assert "synchronous" not in httpx.get(f"{url}/replication").json()
        assert "diffstore_synchronous_replicas " not in httpx.get(f"{url}/metrics").text


def test_serve_refuses_a_bad_synchronous_setting_before_it_opens_anything(tmp_path: Path) -> None:
    for bad in (["--synchronous", "-1"], ["--synchronous", "1", "--synchronous-timeout-s", "-2"]):
        done = subprocess.run(
            [sys.executable, "-m", "diffstore.cli", "serve", "--data", str(tmp_path / "d"), *bad],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 2 and "diffstore serve: error: synchronous" in done.stderr, done.stderr
        assert not (tmp_path / "d").exists()  # nothing created


def test_synchronous_settings_are_checked() -> None:
    with pytest.raises(InvalidRequest, match="synchronous must be within"):
        ServerConfig(synchronous=-1)
    with pytest.raises(InvalidRequest, match="synchronous_timeout_s"):
        ServerConfig(synchronous=1, synchronous_timeout_s=-1)
