"""A REAL uvicorn server on a free loopback port over a real Store in ``tmp_path``, and clients of it."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import uvicorn

from diffstore.client import Client, WireFormat
from diffstore.engine.store import Store
from diffstore.engine.types import StoreConfig
from diffstore.server import ServerConfig, create_app

DEADLINE_S = 10.0


def wait_until(condition: Callable[[], bool], what: str, deadline_s: float = DEADLINE_S) -> None:
    """Polls ``condition`` until it holds; fails at the deadline (a bound on hanging, not a timing test)."""
    end = time.monotonic() + deadline_s
    while not condition():
        if time.monotonic() > end:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.005)


@dataclass
class LiveServer:
    url: str
    store: Store
    token: str | None

    def client(self, format: WireFormat = "msgpack") -> Client:
        return Client(self.url, token=self.token, format=format)


@contextmanager
def running_server(
    data_dir: Path, token: str | None = None, store_config: StoreConfig | None = None
) -> Iterator[LiveServer]:
    """Serves a store in ``data_dir`` on 127.0.0.1:<free port> until the block ends."""
    store = Store.open(data_dir, store_config or StoreConfig(commit_delay_ms=10))
    app = create_app(store, ServerConfig(token=token))
    # IPPROTO_TCP explicitly: asyncio sets TCP_NODELAY only on sockets whose proto says TCP (else ~40 ms per
    # keep-alive request from Nagle + delayed ACK)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=2))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()

    def healthy() -> bool:
        try:
            return httpx.get(f"{url}/healthz").status_code == 200
        except httpx.TransportError:
            return False

    try:
        wait_until(healthy, "the server to start")
        yield LiveServer(url, store, token)
    finally:
        server.should_exit = True
        thread.join(timeout=15)
        sock.close()
        store.close()


@pytest.fixture
def server(tmp_path: Path) -> Iterator[LiveServer]:
    with running_server(tmp_path / "data") as live:
        yield live


@pytest.fixture(params=["msgpack", "json"])
def client(server: LiveServer, request: pytest.FixtureRequest) -> Iterator[Client]:
    with server.client(request.param) as c:
        yield c
