"""``diffstore serve --workers N`` in real processes: any worker serves any request, commits of any process
wake every long poll, background work is done once, and a worker killed with SIGKILL is replaced with
nothing acknowledged lost and nothing half-written visible."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest

from diffstore.engine.store import Store
from diffstore.engine.types import StoreConfig
from tests.helpers import close_pipes, free_port, wait_until

from .conftest import es
from .test_cli import DRIVER, server_rx_queue, wait_healthy

DEADLINE_S = 60.0


class Served:
    """A ``diffstore serve --workers N`` process tree on a free port."""

    def __init__(self, data: Path, workers: int, *extra: str) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.process = subprocess.Popen(
            [sys.executable, "-c", DRIVER, "serve", "--data", str(data), "--port", str(self.port)]
            + ["--workers", str(workers), "--commit-delay-ms", "5", *extra],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )

    def workers(self) -> list[int]:
        """The live workers' pids (not one killed that its supervisor has yet to reap)."""
        pids = []
        for child in psutil.Process(self.process.pid).children():
            with contextlib.suppress(psutil.ZombieProcess, psutil.NoSuchProcess):
                if "spawn_main" in " ".join(child.cmdline()):
                    pids.append(child.pid)
        return pids

    def stop(self) -> str:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            code = self.process.wait(timeout=DEADLINE_S)
        finally:
            if self.process.poll() is None:
                self.process.kill()
                self.process.wait()
        output = self.process.stdout.read().decode() if self.process.stdout else ""
        close_pipes(self.process)
        assert code == 0, output
        return output


@contextmanager
def served(data: Path, workers: int = 2, *extra: str) -> Iterator[Served]:
    server = Served(data, workers, *extra)
    try:
        wait_healthy(server.url, "diffstore serve --workers to start")
        wait_until(lambda: len(server.workers()) == workers, timeout=DEADLINE_S, what="every worker to start")
        yield server
    finally:
        server.stop()


def post(url: str, path: str, body: Any) -> httpx.Response:
    # a new connection each time: the kernel hands connections to whichever worker accepts first
    return httpx.post(url + path, json=body, timeout=DEADLINE_S, headers={"connection": "close"})


def open_long_polls(server: Served, data: Path, collection: str, count: int = 6) -> list[socket.socket]:
    """``count`` long polls (300 s) on new connections, each read by a worker that listens for commits."""
    wait_until(
        lambda: len(list((data / "wake").iterdir())) == 2, timeout=DEADLINE_S, what="both workers to listen"
    )
    polls = []
    for _ in range(count):  # new connections: spread over the workers as the kernel hands them out
        poll = socket.create_connection(("127.0.0.1", server.port), timeout=DEADLINE_S)
        poll.sendall(
            f"GET /collections/{collection}/generationId/stream?generationId=&timeoutMs=300000 HTTP/1.1\r\n"
            "Host: x\r\nConnection: close\r\n\r\n".encode()
        )
        polls.append(poll)
    for poll in polls:  # each request was read by a worker (see test_cli.server_rx_queue)
        read = partial(server_rx_queue, server.port, poll.getsockname()[1])
        wait_until(lambda: read() == 0, timeout=DEADLINE_S, what="the poll read")  # noqa: B023 (used at once)
    return polls


def answers(polls: list[socket.socket]) -> list[bytes]:
    """Every poll's whole answer; a poll that missed the event would wait past the socket's deadline."""
    found = []
    for poll in polls:
        answer = b""
        while chunk := poll.recv(65536):
            answer += chunk
        poll.close()
        found.append(answer)
    return found


def test_a_commit_by_another_process_wakes_long_polls(tmp_path: Path) -> None:
    data = tmp_path / "data"
    with served(data) as server:
        assert post(server.url, "/collections/", {"collectionName": "m", "isManual": True}).status_code == 200
        polls = open_long_polls(server, data, "m")
        with Store.open(data, StoreConfig(background=False)) as store:  # an embedded store, as a script's
            coll = store.collection("m")
            coll.start_generation(b"1")
            coll.put(b"k", b"v", generation_id=b"1")
            coll.commit_generation(b"1")
        for answer in answers(polls):
            assert answer.startswith(b"HTTP/1.1 200 ") and answer.endswith(b'{"generationId":{"value":"1"}}')


def test_a_deletion_by_another_process_answers_long_polls_404(tmp_path: Path) -> None:
    data = tmp_path / "data"
    with served(data) as server:
        assert post(server.url, "/collections/", {"collectionName": "m", "isManual": True}).status_code == 200
        polls = open_long_polls(server, data, "m")
        with Store.open(data, StoreConfig(background=False)) as store:
            store.delete_collection("m")
        for answer in answers(polls):
            assert answer.startswith(b"HTTP/1.1 404 ") and b'"error":"noSuchCollection"' in answer


def test_a_non_manual_collection_written_through_several_workers(tmp_path: Path) -> None:
    data = tmp_path / "data"
    with served(data) as server:
        assert (
            post(server.url, "/collections/", {"collectionName": "n", "isManual": False}).status_code == 200
        )
        per_thread, threads = 40, 4
        admitted: list[int] = []

        def write(me: int) -> None:
            for i in range(per_thread):
                item = {"key": es(f"t{me}-{i:03d}"), "value": es("v")}
                assert post(server.url, "/collections/n/put", {"item": item}).status_code == 200
                # every thread sends producer p's seqNos 1..per_thread: each is admitted once, by any worker
                body = {"items": [{"key": es("seq"), "value": es(str(i))}], "producerId": "p", "seqNo": i + 1}
                answer = post(server.url, "/collections/n/putMany", body)
                assert answer.status_code == 200, answer.text
                if not answer.json().get("skipped", False):
                    admitted.append(i + 1)

        workers = [threading.Thread(target=write, args=(me,)) for me in range(threads)]
        for thread in workers:
            thread.start()
        for thread in workers:
            thread.join(DEADLINE_S)
        expected = {f"t{me}-{i:03d}".encode() for me in range(threads) for i in range(per_thread)}
        with Store.open(data, StoreConfig(background=False)) as store:
            coll = store.collection("n")
            wait_until(
                lambda: {r.key for r in coll.query()} == expected | {b"seq"},
                timeout=DEADLINE_S,
                what="commits",
            )
            current = int.from_bytes(coll.generation_id, "big")
            seen: list[bytes] = []
            for g in range(1, current + 1):
                one = [i.key for i in coll.diff((g - 1).to_bytes(8, "big"), g.to_bytes(8, "big"))]
                assert one, f"generation {g} was committed empty (committed twice?)"
                seen += [k for k in one if k != b"seq"]
            assert sorted(seen) == sorted(expected)
        assert sorted(admitted) == list(range(1, per_thread + 1))


@pytest.mark.parametrize("sync", [True, False], ids=["sync", "nosync"])
def test_a_worker_killed_mid_write_is_replaced_and_loses_nothing(tmp_path: Path, sync: bool) -> None:
    data = tmp_path / "data"
    batch_size = 20
    with served(data, 2, *([] if sync else ["--no-sync"])) as server:
        assert (
            post(server.url, "/collections/", {"collectionName": "n", "isManual": False}).status_code == 200
        )
        acked: list[int] = []
        stop = threading.Event()
        lock = threading.Lock()
        counter = iter(range(10**6))

        def write() -> None:
            while not stop.is_set():
                with lock:
                    batch = next(counter)
                items = [
                    {"key": es(f"b{batch:06d}-{i:02d}"), "value": es(str(batch))} for i in range(batch_size)
                ]
                while not stop.is_set():
                    try:
                        answer = post(server.url, "/collections/n/putMany", {"items": items})
                    except httpx.TransportError:
                        continue  # the worker died under this request: try again (the same batch)
                    assert answer.status_code == 200, answer.text
                    acked.append(batch)
                    break

        writers = [threading.Thread(target=write, daemon=True) for _ in range(4)]
        for thread in writers:
            thread.start()
        wait_until(lambda: len(acked) >= 40, timeout=DEADLINE_S, what="writes to flow")
        victim = server.workers()[0]
        os.kill(victim, signal.SIGKILL)
        at_kill = len(acked)
        # the other worker keeps serving; the supervisor starts a replacement
        wait_until(
            lambda: len(acked) >= at_kill + 40, timeout=DEADLINE_S, what="writes to go on after the kill"
        )

        def replaced() -> bool:
            pids = server.workers()
            return len(pids) == 2 and victim not in pids

        wait_until(replaced, timeout=DEADLINE_S, what="the dead worker to be replaced")
        stop.set()
        for thread in writers:
            thread.join(DEADLINE_S)
        assert httpx.get(server.url + "/healthz", timeout=DEADLINE_S).json() == {"ok": True}
    with Store.open(data, StoreConfig(background=False)) as store:
        coll = store.collection("n")
        # acknowledged writes are committed, or still in the open generation (due for their commit)
        rows: dict[int, set[bytes]] = {}
        for record in coll.query():
            rows.setdefault(int(record.value), set()).add(record.key)
        for record in coll.query(generation_id=coll.next_generation_id):
            rows.setdefault(int(record.value), set()).add(record.key)
    # nothing acknowledged is lost; every batch is whole or absent (none was acknowledged half)
    assert set(acked) <= set(rows)
    for batch, keys in rows.items():
        assert keys == {f"b{batch:06d}-{i:02d}".encode() for i in range(batch_size)}, batch


@pytest.mark.parametrize("when", ["starting", "serving"])
def test_workers_end_when_the_supervisor_is_killed(tmp_path: Path, when: str) -> None:
    server = Served(tmp_path / "data", 2)
    procs: list[psutil.Process] = []
    try:
        if when == "serving":
            wait_healthy(server.url, "diffstore serve --workers to start")
        # spawned; while "starting" they are most likely still importing, before they could ask to be told
        wait_until(lambda: len(server.workers()) == 2, timeout=DEADLINE_S, what="both workers to be spawned")
        for pid in server.workers():
            with contextlib.suppress(psutil.NoSuchProcess):
                procs.append(psutil.Process(pid))
        server.process.kill()
        server.process.wait(DEADLINE_S)
        _, alive = psutil.wait_procs(procs, timeout=DEADLINE_S)
        assert not alive, f"workers outlived their supervisor: {alive}"
    finally:
        for proc in procs:
            with contextlib.suppress(psutil.NoSuchProcess):
                proc.kill()
        if server.process.poll() is None:
            server.process.kill()
            server.process.wait()
        close_pipes(server.process)


def test_connections_are_spread_over_the_workers_and_a_second_server_cannot_share_the_port(
    tmp_path: Path,
) -> None:
    with served(tmp_path / "data") as server:

        def per_worker(status: str) -> list[int]:
            counts = []
            for pid in server.workers():
                held = psutil.Process(pid).net_connections("tcp")
                counts.append(sum(1 for c in held if c.status == status))
            return counts

        wait_until(
            lambda: min(per_worker(psutil.CONN_LISTEN)) == 1,
            timeout=DEADLINE_S,
            what="every worker to listen",
        )
        # connections opened together: with one shared listening socket the first worker to wake
        # accepted them all; with a socket per worker (SO_REUSEPORT) the kernel spreads them
        connections = [socket.create_connection(("127.0.0.1", server.port)) for _ in range(40)]
        try:
            established = partial(per_worker, psutil.CONN_ESTABLISHED)
            wait_until(lambda: sum(established()) == 40, timeout=DEADLINE_S, what="every connection accepted")
            assert min(established()) > 0, established()  # 40 connections on one of 2: odds 2^-39
        finally:
            for connection in connections:
                connection.close()
        # a second server on the same port is refused (it must not quietly take half the connections)
        second = subprocess.run(
            [sys.executable, "-c", DRIVER, "serve", "--data", str(tmp_path / "other")]
            + ["--port", str(server.port), "--workers", "2"],
            capture_output=True,
            timeout=DEADLINE_S,
        )
        assert second.returncode != 0
        assert post(server.url, "/collections/", {"collectionName": "m", "isManual": True}).status_code == 200


def test_a_stopped_worker_is_killed_and_replaced(tmp_path: Path) -> None:
    """A SIGSTOPped worker keeps its listening socket, and the kernel its share of new connections: the
    supervisor hears no heartbeat from it, kills it and starts another; then every new request is answered."""
    server = Served(tmp_path / "data", 2, "--worker-timeout-s", "2")
    victim = 0
    try:
        # two workers start in 25 s at a load average of 22
        wait_healthy(server.url, "diffstore serve --workers to start", 2 * DEADLINE_S)
        wait_until(lambda: len(server.workers()) == 2, timeout=DEADLINE_S, what="every worker to start")
        wait_until(
            lambda: accepting(server), timeout=2 * DEADLINE_S, what="both workers to accept (and beat)"
        )
        victim = server.workers()[0]
        os.kill(victim, signal.SIGSTOP)

        def replaced() -> bool:
            pids = server.workers()
            return len(pids) == 2 and victim not in pids

        wait_until(replaced, timeout=DEADLINE_S, what="the stopped worker to be killed and replaced")
        assert not psutil.pid_exists(victim) or psutil.Process(victim).status() == psutil.STATUS_ZOMBIE
        # new connections, spread by the kernel over both listening workers: all answered
        for i in range(40):
            body = {"collectionName": f"c{i}", "isManual": True}
            assert post(server.url, "/collections/", body).status_code == 200
    finally:
        if victim and psutil.pid_exists(victim):
            with contextlib.suppress(ProcessLookupError):
                os.kill(victim, signal.SIGKILL)  # never leave a stopped process behind
        output = server.stop()
    lines = [line for line in output.splitlines() if "starting a replacement" in line]
    assert len(lines) == 1 and f"worker {victim} has not answered its supervisor" in lines[0], output


def accepting(server: Served) -> bool:
    """Whether every worker has accepted a connection: its event loop runs (and beats, from the same start).

    Opens connections, which the kernel hands out by a hash of their addresses, until each worker holds one.
    """
    connections = [socket.create_connection(("127.0.0.1", server.port)) for _ in range(20)]
    try:
        for _ in range(20):
            held = [psutil.Process(pid).net_connections("tcp") for pid in server.workers()]
            if len(held) == 2 and all(any(c.status == psutil.CONN_ESTABLISHED for c in one) for one in held):
                return True
            time.sleep(0.1)
        return False
    finally:
        for connection in connections:
            connection.close()
