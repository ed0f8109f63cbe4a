"""The server-wide budget of request body bytes in flight: 503 ``overloaded`` + ``Retry-After`` beyond it."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from pathlib import Path

import msgpack
import pytest

from diffstore.server import ServerConfig
from diffstore.server.config import Limit
from tests.engine.util import raw_state

from .conftest import Live, es, live_server, wait_until
from .test_transport import raw_request

BUDGET = 10_000


@pytest.fixture
def tight(tmp_path: Path) -> Iterator[Live]:
    with live_server(tmp_path / "data", ServerConfig(inflight_body_max_bytes=BUDGET)) as running:
        running.ok("POST", "/collections/", {"collectionName": "m", "isManual": True})
        running.ok("POST", "/collections/m/generation/start", {"generationId": es("1")})
        yield running


def _put_body(key: str, size: int) -> bytes:
    shape = {"item": {"key": es(key), "value": es("v")}, "generationId": es("1"), "pad": ""}
    body = json.dumps(shape).encode()
    return body[:-2] + b"x" * (size - len(body)) + b'"}'


def _hold(live: Live, size: int) -> socket.socket:
    """Starts a put declaring ``size`` bytes and sends all but the last one: it holds its share meanwhile."""
    port = int(live.url.rsplit(":", 1)[1])
    sock = socket.create_connection(("127.0.0.1", port), timeout=30)
    sock.sendall(
        b"POST /collections/m/put HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n" % size
    )
    sock.sendall(_put_body("held", size)[:-1])
    return sock


def _finish(sock: socket.socket, size: int) -> bytes:
    sock.sendall(_put_body("held", size)[-1:])
    data = b""
    while not data.endswith(b"}") and (part := sock.recv(65536)):
        data += part
    sock.close()
    return data


def test_a_declared_body_beyond_the_budget_is_refused_at_once(tight: Live) -> None:
    budget = tight.app.state.budget
    held = _hold(tight, 8_000)
    wait_until(lambda: budget.in_flight == 8_000, what="the first body to hold its share")
    before = raw_state(tight.store)
    head = (
        b"POST /collections/m/put HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Content-Length: 3000\r\n\r\n"
    )
    status, headers, body = raw_request(tight, head, [])  # nothing of the body needs to be sent
    assert status == 503
    assert headers["retry-after"] == "1" and headers["connection"] == "close"
    assert json.loads(body)["error"] == "overloaded"
    # msgpack when asked, and a small body still fits beside the held one
    response = tight.call(
        "POST", "/collections/m/get", content=b"x" * 2_500, headers={"accept": "application/msgpack"}
    )
    assert response.status_code == 503 and msgpack.unpackb(response.content)["error"] == "overloaded"
    assert response.headers["retry-after"] == "1"
    assert tight.call("POST", "/collections/m/get", {"key": es("k")}).status_code == 200
    assert raw_state(tight.store) == before
    assert budget.refused == 2
    assert _finish(held, 8_000).startswith(b"HTTP/1.1 200 ")
    wait_until(lambda: budget.in_flight == 0, what="the share to be given back")
    assert tight.call("POST", "/collections/m/put", content=_put_body("after", 3_000)).status_code == 200


@pytest.mark.parametrize("path", ["/collections/m/put", "/collections/m/get", "/collections/m/query/"])
def test_a_chunked_body_is_counted_as_it_arrives(tight: Live, path: str) -> None:
    budget = tight.app.state.budget
    held = _hold(tight, 8_000)
    wait_until(lambda: budget.in_flight == 8_000, what="the first body to hold its share")
    before = raw_state(tight.store)
    # no Content-Length: counted as it arrives
    chunks = (part for part in [b'{"key": {"value": "k"}, "pad": "', b"x" * 3_000, b'"}'])
    response = tight.call("POST", path, content=chunks)
    assert response.status_code == 503, response.text
    assert response.json()["error"] == "overloaded" and response.headers["retry-after"] == "1"
    assert raw_state(tight.store) == before
    assert budget.in_flight == 8_000  # the refused request gave back what it had taken
    assert _finish(held, 8_000).startswith(b"HTTP/1.1 200 ")
    wait_until(lambda: budget.in_flight == 0, what="the share to be given back")


def test_a_body_above_every_limit_gets_413_not_503(tight: Live) -> None:
    """Retrying would not help it: its route refuses it before reading, whatever else is in flight."""
    budget = tight.app.state.budget
    held = _hold(tight, 8_000)
    wait_until(lambda: budget.in_flight == 8_000, what="the first body to hold its share")
    declared = tight.app.state.config.limit(Limit.PUT_MANY) + 1
    head = (
        b"POST /collections/m/put HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n" % declared
    )
    status, _, body = raw_request(tight, head, [])
    assert status == 413 and json.loads(body)["error"] == "payloadTooLarge"
    assert budget.in_flight == 8_000 and budget.refused == 0
    assert _finish(held, 8_000).startswith(b"HTTP/1.1 200 ")


def test_a_request_alone_is_let_in_whatever_its_size(tight: Live) -> None:
    assert tight.call("POST", "/collections/m/put", content=_put_body("big", 3 * BUDGET)).status_code == 200
    chunks = (part for part in [_put_body("big2", 3 * BUDGET)])
    assert tight.call("POST", "/collections/m/put", content=chunks).status_code == 200
    assert tight.app.state.budget.refused == 0
