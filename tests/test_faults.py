"""Tests of the fault harness (tests/faults.py): the proxy passes, delays, stalls and cuts; a paused process
really stops and resumes; kill9 of a group kills its children too."""

from __future__ import annotations

import os
import socket
import socketserver
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.faults import TcpProxy, kill9, pause, paused, process_state, wait_stopped
from tests.helpers import close_pipes, wait_until

WAIT_S = 30.0

COUNTER = """
import os, sys, time
path, n = sys.argv[1], 0
while True:
    n += 1
    with open(path + ".tmp", "w") as f:
        f.write(str(n))
    os.replace(path + ".tmp", path)
    time.sleep(0.002)
"""


class _Echo(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        server: EchoServer = self.server  # type: ignore[assignment]
        while data := self.request.recv(65536):
            server.received += len(data)
            self.request.sendall(data)


class EchoServer(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True
    received = 0


@pytest.fixture
def proxy() -> Iterator[TcpProxy]:
    echo = EchoServer(("127.0.0.1", 0), _Echo)
    thread = threading.Thread(target=echo.serve_forever, daemon=True)
    thread.start()
    try:
        with TcpProxy(f"127.0.0.1:{echo.server_address[1]}") as tcp:
            tcp.echo = echo  # type: ignore[attr-defined]
            yield tcp
    finally:
        echo.shutdown()
        echo.server_close()
        thread.join(WAIT_S)


def connect(proxy: TcpProxy) -> socket.socket:
    return socket.create_connection(("127.0.0.1", proxy.port), timeout=WAIT_S)


def receive(sock: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        assert chunk, f"connection closed after {data!r}"
        data += chunk
    return data


def test_proxy_passes_bytes_both_ways(proxy: TcpProxy) -> None:
    with connect(proxy) as sock:
        payload = os.urandom(300_000)
        threading.Thread(target=sock.sendall, args=(payload,), daemon=True).start()
        assert receive(sock, len(payload)) == payload
    assert proxy.connections == 1 and proxy.forwarded == 2 * len(payload)


def test_proxy_delays_each_chunk(proxy: TcpProxy) -> None:
    proxy.delay(200)
    with connect(proxy) as sock:
        started = time.monotonic()
        sock.sendall(b"ping")
        assert receive(sock, 4) == b"ping"
        # a lower bound only (a slow machine makes it longer): the request and the answer each waited
        assert time.monotonic() - started >= 0.2
        proxy.passing()
        sock.sendall(b"pong")
        assert receive(sock, 4) == b"pong"


def test_proxy_stall_holds_bytes_until_released(proxy: TcpProxy) -> None:
    echo: EchoServer = proxy.echo  # type: ignore[attr-defined]
    with connect(proxy) as sock:
        sock.sendall(b"first")
        assert receive(sock, 5) == b"first"
        proxy.stall()
        sock.sendall(b"held back")
        wait_until(lambda: proxy.held == 1, WAIT_S, what="the proxy holding the chunk")
        assert echo.received == 5  # the held chunk never reached the server
        proxy.passing()
        assert receive(sock, 9) == b"held back"
        assert echo.received == 14


def test_proxy_cut_closes_connections_and_refuses_new_ones(proxy: TcpProxy) -> None:
    with connect(proxy) as sock:
        sock.sendall(b"a")
        assert receive(sock, 1) == b"a"
        proxy.cut()
        assert proxy.open_connections == 0
        with pytest.raises((ConnectionError, AssertionError)):
            sock.sendall(b"b")
            receive(sock, 1)
    # accepted by the listener, then reset at once (the reset may already fail the connect)
    with pytest.raises((ConnectionError, AssertionError)), connect(proxy) as refused:
        refused.sendall(b"c")
        receive(refused, 1)
    proxy.accept()
    with connect(proxy) as sock:
        sock.sendall(b"d")
        assert receive(sock, 1) == b"d"
    assert proxy.connections == 2


def test_proxy_cut_without_refusing_serves_new_connections(proxy: TcpProxy) -> None:
    with connect(proxy) as old:
        old.sendall(b"w")
        assert receive(old, 1) == b"w"  # the link is up (a cut before it would find nothing to cut)
        proxy.cut(refuse=False)
        with pytest.raises((ConnectionError, AssertionError)):
            old.sendall(b"x")
            receive(old, 1)
    with connect(proxy) as sock:
        sock.sendall(b"y")
        assert receive(sock, 1) == b"y"


def _counter(path: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-c", COUNTER, str(path)])


def _count(path: Path) -> int:
    try:
        return int(path.read_text() or 0)
    except FileNotFoundError:
        return 0


def test_paused_process_stops_and_resumes(tmp_path: Path) -> None:
    frozen, clock = tmp_path / "frozen", tmp_path / "clock"
    processes = [_counter(frozen), _counter(clock)]
    try:
        wait_until(lambda: _count(frozen) > 0 and _count(clock) > 0, WAIT_S, what="both counting")
        with paused(processes[0]):
            assert process_state(processes[0].pid) in "tT"
            at_stop = _count(frozen)
            start = _count(clock)
            # the other counter is the clock: it advances, the paused one does not
            wait_until(lambda: _count(clock) > start + 50, WAIT_S, what="the clock counter advancing")
            assert _count(frozen) == at_stop
        wait_until(lambda: _count(frozen) > at_stop, WAIT_S, what="the resumed counter advancing")
        pause(processes[0], 0.05)  # a timed pause also resumes it
        moved = _count(frozen)
        wait_until(lambda: _count(frozen) > moved, WAIT_S, what="the counter advancing after pause()")
    finally:
        for process in processes:
            kill9(process)


def test_paused_resumes_even_when_the_body_raises(tmp_path: Path) -> None:
    process = _counter(tmp_path / "n")
    try:
        with pytest.raises(RuntimeError), paused(process):
            raise RuntimeError("the test failed while the process was stopped")
        wait_until(lambda: process_state(process.pid) not in "tT", WAIT_S, what="the process resumed")
    finally:
        kill9(process)
    assert process.returncode == -9


def test_kill9_of_a_group_kills_its_children(tmp_path: Path) -> None:
    script = (
        "import subprocess, sys, time\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'])\n"
        "print(child.pid, flush=True)\n"
        "time.sleep(600)\n"
    )
    leader = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, start_new_session=True)
    try:
        assert leader.stdout is not None
        child = int(leader.stdout.readline())
        with paused(leader, group=True):
            wait_stopped(child)  # the group's SIGSTOP reached the child as well
        kill9(leader, group=True)
        # the orphaned child is reaped by init (or left a zombie, if a subreaper does not reap it)
        wait_until(lambda: _gone(child), WAIT_S, what="the child killed with its group")
    finally:
        if leader.poll() is None:
            kill9(leader)
        close_pipes(leader)


def test_kill9_refuses_the_test_process_group(tmp_path: Path) -> None:
    process = _counter(tmp_path / "n")
    try:
        with pytest.raises(ValueError):
            kill9(process, group=True)
    finally:
        kill9(process)


def _gone(pid: int) -> bool:
    try:
        return process_state(pid) == "Z"
    except FileNotFoundError:
        return True
