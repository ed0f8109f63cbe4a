"""Real ``diffstore serve`` processes (a primary and its replicas) over real data directories."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from diffstore.client import Client
from tests.helpers import close_pipes, free_port, wait_until

STARTUP_S = 60.0


class Server:
    """One ``diffstore serve --workers 1`` process; ``start`` again after ``kill9``/``stop``."""

    def __init__(self, data: Path, *args: str, token: str | None = None) -> None:
        self.data = data
        self.args = args
        self.token = token
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = data.parent / f"{data.name}.log"
        self.process: subprocess.Popen[bytes] | None = None

    def command(self) -> list[str]:
        command = [sys.executable, "-m", "diffstore.cli", "serve", "--data", str(self.data)]
        command += ["--port", str(self.port), "--workers", "1", "--commit-delay-ms", "20", *self.args]
        return command

    def start(self, wait: bool = True) -> Server:
        env = {**os.environ}
        if self.token:
            env["DIFFSTORE_TOKEN"] = self.token
        with self.log.open("ab") as log:
            self.process = subprocess.Popen(self.command(), stdout=log, stderr=subprocess.STDOUT, env=env)
        if wait:
            wait_until(self.healthy, STARTUP_S, what=f"{self.url} to answer /healthz")
        return self

    def healthy(self) -> bool:
        assert self.process is not None
        if self.process.poll() is not None:
            raise AssertionError(f"the server exited with {self.process.returncode}: {self.log.read_text()}")
        try:
            return httpx.get(f"{self.url}/healthz", timeout=5).status_code == 200
        except httpx.TransportError:
            return False

    def client(self) -> Client:
        return Client(self.url, token=self.token, timeout_s=60)

    def kill9(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(30)
        self._close()

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(30)
        self._close()

    def _close(self) -> None:
        if self.process is not None:
            close_pipes(self.process)
            self.process = None


@pytest.fixture
def servers(tmp_path: Path) -> Iterator[list[Server]]:
    """Servers a test starts go here; every one is stopped at the end."""
    started: list[Server] = []
    try:
        yield started
    finally:
        for server in started:
            server.kill9()


@pytest.fixture
def primary(tmp_path: Path, servers: list[Server]) -> Server:
    server = Server(tmp_path / "primary")
    servers.append(server)
    return server.start()


@pytest.fixture
def replica(tmp_path: Path, servers: list[Server], primary: Server) -> Server:
    server = Server(tmp_path / "replica", "--replica-of", primary.url)
    servers.append(server)
    return server.start()
