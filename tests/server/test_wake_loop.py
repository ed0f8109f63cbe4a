"""Commit notices of other processes read by the server's event loop itself (``Store.commit_notices``),
by a thread in a process without a loop, and what a burst larger than the socket's queue leaves behind.

Real processes, a real uvicorn (in-process or ``diffstore serve``) on free ports, waits with deadlines."""

from __future__ import annotations

import contextlib
import os
import select
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path

import httpx
import uvicorn

from diffstore.engine.store import Store
from diffstore.engine.types import StoreConfig
from diffstore.engine.wakeup import Wakeup
from diffstore.server import ServerConfig
from diffstore.server.app import create_app
from tests.helpers import close_pipes, free_port, serving, wait_until

from .conftest import live_server
from .test_cli import DRIVER, server_rx_queue, wait_healthy

DEADLINE_S = 60.0
ROOT = Path(__file__).resolve().parents[2]
# another process: commits generation argv[3] of collection argv[2] (started by it) with an embedded store
COMMIT = (
    "import sys; from diffstore import Store, StoreConfig\n"
    "with Store.open(sys.argv[1], StoreConfig(background=False)) as store:\n"
    "    c = store.collection(sys.argv[2])\n"
    "    c.start_generation(sys.argv[3].encode())\n"
    "    c.commit_generation(sys.argv[3].encode())\n"
)


def commit_elsewhere(data: Path, collection: str, generation: str) -> None:
    """Commits ``generation`` of ``collection`` in another process and waits for it to exit."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(
        [sys.executable, "-c", COMMIT, str(data), collection, generation],
        capture_output=True,
        text=True,
        env=env,
        timeout=DEADLINE_S,
    )
    assert proc.returncode == 0, proc.stderr


def queue_length() -> int:
    """How many datagrams Linux queues on a UNIX datagram socket (``net.unix.max_dgram_qlen``)."""
    try:
        return int(Path("/proc/sys/net/unix/max_dgram_qlen").read_text())
    except (OSError, ValueError):
        return 10


def wakeup_threads() -> list[threading.Thread]:
    return [thread for thread in threading.enumerate() if thread.name == "diffstore-wakeup"]


def long_poll(port: int, collection: str, given: str, timeout_ms: int = 300_000) -> socket.socket:
    poll = socket.create_connection(("127.0.0.1", port), timeout=DEADLINE_S)
    poll.sendall(
        f"GET /collections/{collection}/generationId/stream?generationId={given}&timeoutMs={timeout_ms}"
        " HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode()
    )
    return poll


def answer(poll: socket.socket) -> bytes:
    """The poll's whole answer (the server closes the connection after it); fails at the deadline."""
    data = b""
    while chunk := poll.recv(65536):
        data += chunk
    poll.close()
    return data


def test_the_server_loop_reads_other_processes_commits(tmp_path: Path) -> None:
    data = tmp_path / "data"
    with live_server(data) as live:
        live.ok("POST", "/collections/", {"collectionName": "m", "isManual": True})
        assert wakeup_threads() == []  # the loop reads the notices: no thread does
        port = int(live.url.rsplit(":", 1)[1])
        polls = [long_poll(port, "m", "") for _ in range(3)]
        hub = live.app.state.hub
        wait_until(lambda: hub.waiting("m") == 3, timeout=DEADLINE_S, what="the polls to wait")
        commit_elsewhere(data, "m", "1")
        for poll in polls:
            got = answer(poll)
            assert got.startswith(b"HTTP/1.1 200 ") and got.endswith(b'{"generationId":{"value":"1"}}')
        assert hub.written_directly == 3  # woken on the loop: the one-write fan-out pass


def test_a_store_without_a_loop_hears_other_processes_through_its_thread_again_after_a_loop(
    tmp_path: Path,
) -> None:
    data = tmp_path / "data"
    with Store.open(data, StoreConfig(background=False)) as store:
        store.create_collection("m", manual=True)
        heard: list[tuple[str, bytes]] = []
        got = threading.Event()

        def listener(name: str, generation: bytes) -> None:
            heard.append((name, generation))
            got.set()

        store.add_commit_listener(listener)
        assert len(wakeup_threads()) == 1
        commit_elsewhere(data, "m", "1")
        assert got.wait(DEADLINE_S)
        assert heard == [("m", b"1")]

        # handed over to a "loop" (this test's thread): the thread stops; drain delivers here
        notices = store.commit_notices()
        assert notices is not None
        assert store.commit_notices() is None  # one loop at a time
        wait_until(lambda: wakeup_threads() == [], timeout=DEADLINE_S, what="the thread to stop")
        got.clear()
        commit_elsewhere(data, "m", "2")
        readable, _, _ = select.select([notices.fileno()], [], [], DEADLINE_S)
        assert readable
        caller = threading.get_ident()
        threads: list[int] = []
        store.add_commit_listener(lambda name, generation: threads.append(threading.get_ident()))
        assert notices.drain() == 1
        assert heard[-1] == ("m", b"2") and threads == [caller]
        assert notices.drain() == 0  # nothing left, and it does not block

        # released: the thread reads again
        notices.release()
        assert len(wakeup_threads()) == 1
        got.clear()
        commit_elsewhere(data, "m", "3")
        assert got.wait(DEADLINE_S)
        assert heard[-1] == ("m", b"3")
    assert wakeup_threads() == []


def test_the_events_of_one_transaction_travel_in_one_datagram(tmp_path: Path) -> None:
    """A transaction that commits more collections than a UNIX datagram queue holds (10) loses none."""
    heard: list[tuple[str, bytes | None]] = []
    listening, committing = Wakeup(tmp_path), Wakeup(tmp_path)
    try:
        notices = listening.hand_over(lambda name, generation: heard.append((name, generation)))
        assert notices is not None
        events: list[tuple[str, bytes | None]] = [(f"c{i:03d}", b"%d" % i) for i in range(50)]
        committing.notify([*events, ("gone", None)])
        assert committing.dropped == 0
        readable, _, _ = select.select([notices.fileno()], [], [], DEADLINE_S)
        assert readable and notices.drain() == 1
        assert heard == [*events, ("gone", None)]
        assert listening.received == 1
    finally:
        committing.close()
        listening.close()


def test_events_past_one_datagram_travel_in_as_few_as_fit(tmp_path: Path) -> None:
    heard: list[tuple[str, bytes | None]] = []
    listening, committing = Wakeup(tmp_path), Wakeup(tmp_path)
    try:
        notices = listening.hand_over(lambda name, generation: heard.append((name, generation)))
        assert notices is not None
        events: list[tuple[str, bytes | None]] = [("c" * 200 + f"{i:05d}", b"%d" % i) for i in range(400)]
        committing.notify(events)  # about 85 KB of events: more than one recv takes (64 KiB)
        assert committing.dropped == 0
        taken = 0
        while len(heard) < len(events):
            readable, _, _ = select.select([notices.fileno()], [], [], DEADLINE_S)
            assert readable, f"{len(heard)} of {len(events)} events arrived"
            taken += notices.drain()
        assert heard == events
        assert taken == 2 and listening.received == 2 and listening.malformed == 0
    finally:
        committing.close()
        listening.close()


def test_a_burst_past_the_socket_queue_drops_notices_and_the_stalled_worker_rechecks(tmp_path: Path) -> None:
    """The worker is stopped (SIGSTOP) while another process commits more often than its wake-up socket
    can queue: the committer counts the notices it could not send and marks the worker; once the worker
    runs again it sees the mark and re-reads the collections its polls wait for, so every poll answers
    with the new generation -- not at its timeout (20 s) with the id it was given -- and the loop's
    reader still wakes later polls."""
    data = tmp_path / "data"
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    server = subprocess.Popen(
        [sys.executable, "-c", DRIVER, "serve", "--data", str(data), "--port", str(port), "--workers", "1"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    stopped = False
    names = [f"late{i:02d}" for i in range(16)]
    try:
        wait_healthy(url, "diffstore serve --workers 1 to start")
        for name in ("burst", *names):
            created = httpx.post(url + "/collections/", json={"collectionName": name, "isManual": True})
            assert created.status_code == 200
        wait_until(
            lambda: len(list((data / "wake").iterdir())) == 1, timeout=DEADLINE_S, what="the server to listen"
        )
        polls = [long_poll(port, name, "", timeout_ms=20_000) for name in names]

        def waiting(count: int) -> bool:
            text = httpx.get(url + "/metrics").text
            return f"diffstore_longpoll_waiters {count}.0" in text

        wait_until(lambda: waiting(len(names)), timeout=DEADLINE_S, what="the polls to wait")
        os.kill(server.pid, signal.SIGSTOP)
        stopped = True
        with Store.open(data, StoreConfig(background=False, sync=False)) as store:
            burst = store.collection("burst")
            for n in range(1, queue_length() + 21):  # one notice per transaction: more than the queue holds
                burst.start_generation(b"%06d" % n)
                burst.commit_generation(b"%06d" % n)
            for name in names:  # their notices find the queue full too
                late = store.collection(name)
                late.start_generation(b"1")
                late.commit_generation(b"1")
            assert store.commit_notices_dropped >= len(names)
        os.kill(server.pid, signal.SIGCONT)
        stopped = False
        for poll in polls:
            got = answer(poll)
            assert got.startswith(b"HTTP/1.1 200 ") and got.endswith(b'{"generationId":{"value":"1"}}'), got

        # the loop's reader survived the burst: the next commit wakes a waiting poll
        poll = long_poll(port, names[0], "1")
        wait_until(
            lambda: server_rx_queue(port, poll.getsockname()[1]) == 0,
            timeout=DEADLINE_S,
            what="the poll read",
        )
        wait_until(lambda: waiting(1), timeout=DEADLINE_S, what="the poll to wait")
        commit_elsewhere(data, names[0], "2")
        assert answer(poll).endswith(b'{"generationId":{"value":"2"}}')
    finally:
        if stopped:
            os.kill(server.pid, signal.SIGCONT)
        server.send_signal(signal.SIGTERM)
        try:
            code = server.wait(timeout=DEADLINE_S)
        finally:
            if server.poll() is None:
                server.kill()
                server.wait()
        output = server.stdout.read().decode() if server.stdout else ""
        close_pipes(server)
    assert code == 0, output


def test_a_committer_marks_a_peer_whose_queue_is_full_and_the_peer_sees_it_once(tmp_path: Path) -> None:
    listening, committing = Wakeup(tmp_path), Wakeup(tmp_path)
    try:
        notices = listening.hand_over(lambda name, generation: None)
        assert notices is not None
        assert listening.check_missed() == 0
        for n in range(queue_length() + 5):  # nobody drains: the queue fills
            committing.notify([("c", b"%d" % n)])
        assert committing.dropped >= 1
        assert listening.check_missed() == 1  # marked: re-read what is waited for
        assert listening.check_missed() == 1  # seen once; the marks are cleared
        assert notices.drain() + committing.dropped == queue_length() + 5
    finally:
        committing.close()
        listening.close()


def test_two_servers_over_one_store_are_both_woken_by_another_process(tmp_path: Path) -> None:
    """One loop reads the store's notices; the other server's hub hears them from that loop's thread."""
    data = tmp_path / "data"
    with Store.open(data, StoreConfig(background=False)) as store, contextlib.ExitStack() as running:
        store.create_collection("m", manual=True)
        servers = [
            uvicorn.Server(uvicorn.Config(create_app(store, ServerConfig()), log_level="warning"))
            for _ in range(2)
        ]
        urls = [running.enter_context(serving(server)) for server in servers]
        polls = [long_poll(int(url.rsplit(":", 1)[1]), "m", "") for url in urls]
        hubs = [server.config.app.state.hub for server in servers]
        wait_until(
            lambda: all(hub.waiting("m") == 1 for hub in hubs), timeout=DEADLINE_S, what="both polls to wait"
        )
        commit_elsewhere(data, "m", "1")
        for poll in polls:
            assert answer(poll).endswith(b'{"generationId":{"value":"1"}}')
