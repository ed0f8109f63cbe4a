"""Parked long polls under churn: 200 keep-alive clients re-poll after every answer while commits land,
some pipeline a request behind their poll, some hang up and come back. Every client must see each answer
in order, never an older generation than it asked past, and end at the last commit."""

from __future__ import annotations

import random
import selectors
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from diffstore.server import longpoll

from .conftest import Live, es, live_server

CLIENTS = 200
COMMITS = 30
DEADLINE_S = 60.0
HEALTH = b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"


def poll(generation: int) -> bytes:
    path = b"/collections/m/generationId/stream?generationId=%06d&timeoutMs=30000" % generation
    return b"GET %s HTTP/1.1\r\nHost: x\r\n\r\n" % path


class Client:
    """One connection's expectations: the answers it is owed, in order."""

    def __init__(self, port: int, rng: random.Random) -> None:
        self.port = port
        self.rng = rng
        self.sock: socket.socket | None = None
        self.buffer = b""
        self.expected: list[str] = []  # "poll" or "health", in the order the server must answer
        self.seen = 0  # the newest generation this client has been told of
        self.reconnects = 0
        self.pipelined = 0

    def connect(self, selector: selectors.BaseSelector) -> None:
        self.sock = socket.create_connection(("127.0.0.1", self.port), timeout=30)
        self.sock.setblocking(False)
        self.buffer, self.expected = b"", []
        selector.register(self.sock, selectors.EVENT_READ, self)
        self.send_poll()

    def send_poll(self) -> None:
        assert self.sock is not None
        data = poll(self.seen)
        self.expected.append("poll")
        if self.rng.random() < 0.2:  # a request pipelined behind the long poll: answered after it
            data += HEALTH
            self.expected.append("health")
            self.pipelined += 1
        self.sock.sendall(data)

    def responses(self) -> Iterator[bytes]:
        while b"\r\n\r\n" in self.buffer:
            head, _, rest = self.buffer.partition(b"\r\n\r\n")
            length = next(
                int(line.split(b":")[1])
                for line in head.split(b"\r\n")
                if line.lower().startswith(b"content-length:")
            )
            if len(rest) < length:
                return
            assert head.startswith(b"HTTP/1.1 200 "), head
            self.buffer = rest[length:]
            yield rest[:length]

    def on_readable(self, selector: selectors.BaseSelector) -> None:
        assert self.sock is not None
        chunk = self.sock.recv(65536)
        assert chunk, f"the server closed a kept-alive connection owing {self.expected}"
        self.buffer += chunk
        for body in self.responses():
            if self.expected.pop(0) == "health":
                assert body == b'{"ok":true}', body
            else:
                assert body.startswith(b'{"generationId":{"value":"'), body
                generation = int(body[len(b'{"generationId":{"value":"') : -3])
                assert generation >= self.seen, (generation, self.seen)  # never older than asked past
                self.seen = generation
            if self.expected:
                continue  # a pipelined request's answer is still to come
            if self.rng.random() < 0.1:  # hang up and come back
                selector.unregister(self.sock)
                self.sock.close()
                self.reconnects += 1
                self.connect(selector)
                return
            self.send_poll()


@pytest.fixture
def manual(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Live]:
    monkeypatch.setattr(longpoll, "FINISH_AFTER_S", 0.02)  # sweeps run while clients re-poll
    with live_server(tmp_path / "data") as live:
        live.ok(
            "POST",
            "/collections/",
            {"collectionName": "m", "isManual": True, "initialGenerationId": es("000000")},
        )
        yield live


def test_churning_clients_see_every_answer_in_order(manual: Live) -> None:
    rng = random.Random(20261124)
    port = int(manual.url.rsplit(":", 1)[1])
    selector = selectors.DefaultSelector()
    clients = [Client(port, random.Random(rng.random())) for _ in range(CLIENTS)]
    for client in clients:
        client.connect(selector)

    def committer() -> None:
        for generation in range(1, COMMITS + 1):
            body = {"generationId": es(f"{generation:06d}")}
            manual.ok("POST", "/collections/m/generation/start", body)
            manual.ok("POST", "/collections/m/generation/commit", body)
            time.sleep(pacing.random() * 0.02)  # commits at irregular intervals, some during sweeps

    pacing = random.Random(rng.random())
    commits = threading.Thread(target=committer, daemon=True)
    commits.start()
    deadline = time.monotonic() + DEADLINE_S
    try:
        while any(client.seen < COMMITS for client in clients):
            assert time.monotonic() < deadline, "clients still waiting for the last commit"
            for key, _ in selector.select(timeout=0.5):
                key.data.on_readable(selector)
    finally:
        commits.join(timeout=30)
        for client in clients:
            if client.sock is not None:
                client.sock.close()
    assert all(client.seen == COMMITS for client in clients)
    assert (
        sum(client.reconnects for client in clients) > 0 and sum(client.pipelined for client in clients) > 0
    )
    assert manual.app.state.hub.written_directly > CLIENTS  # the fan-out passes wrote the answers
