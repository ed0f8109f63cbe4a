"""The server-wide budget of request body bytes in flight: 503 ``overloaded`` + ``Retry-After`` beyond it.

Bytes count as they are received (a slow sender holds what it sent, not what it declared), one request may
hold at most ``inflight_connection_max_bytes`` while others hold some, and a body below the minimum rate is
closed: trickling sockets cannot hold the budget, nor its bytes for long."""

from __future__ import annotations

import json
import select
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import msgpack
import pytest

from diffstore.server import ServerConfig
from diffstore.server.config import Limit
from tests.engine.util import raw_state
from tests.helpers import wait_until

from .conftest import Live, es, live_server
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


def _start(live: Live, size: int) -> socket.socket:
    """A connection that has sent the head of a put declaring ``size`` bytes, and nothing of its body."""
    port = int(live.url.rsplit(":", 1)[1])
    sock = socket.create_connection(("127.0.0.1", port), timeout=30)
    sock.sendall(
        b"POST /collections/m/put HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n" % size
    )
    return sock


def _hold(live: Live, size: int) -> socket.socket:
    """Starts a put declaring ``size`` bytes and sends all but the last one: it holds them meanwhile."""
    sock = _start(live, size)
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
    wait_until(lambda: budget.in_flight == 7_999, what="the first body to hold what it sent")
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
    wait_until(lambda: budget.in_flight == 7_999, what="the first body to hold what it sent")
    before = raw_state(tight.store)
    # no Content-Length: counted as it arrives
    chunks = (part for part in [b'{"key": {"value": "k"}, "pad": "', b"x" * 3_000, b'"}'])
    response = tight.call("POST", path, content=chunks)
    assert response.status_code == 503, response.text
    assert response.json()["error"] == "overloaded" and response.headers["retry-after"] == "1"
    assert raw_state(tight.store) == before
    assert budget.in_flight == 7_999  # the refused request gave back what it had taken
    assert _finish(held, 8_000).startswith(b"HTTP/1.1 200 ")
    wait_until(lambda: budget.in_flight == 0, what="the share to be given back")


def test_a_body_above_every_limit_gets_413_not_503(tight: Live) -> None:
    """Retrying would not help it: its route refuses it before reading, whatever else is in flight."""
    budget = tight.app.state.budget
    held = _hold(tight, 8_000)
    wait_until(lambda: budget.in_flight == 7_999, what="the first body to hold what it sent")
    declared = tight.app.state.config.limit(Limit.PUT_MANY) + 1
    head = (
        b"POST /collections/m/put HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n" % declared
    )
    status, _, body = raw_request(tight, head, [])
    assert status == 413 and json.loads(body)["error"] == "payloadTooLarge"
    assert budget.in_flight == 7_999 and budget.refused == 0
    assert _finish(held, 8_000).startswith(b"HTTP/1.1 200 ")


def test_a_request_alone_is_let_in_whatever_its_size(tight: Live) -> None:
    assert tight.call("POST", "/collections/m/put", content=_put_body("big", 3 * BUDGET)).status_code == 200
    chunks = (part for part in [_put_body("big2", 3 * BUDGET)])
    assert tight.call("POST", "/collections/m/put", content=chunks).status_code == 200
    assert tight.app.state.budget.refused == 0


def test_trickling_bodies_hold_what_they_sent_not_what_they_declared(tight: Live) -> None:
    """Four connections declaring 99.6% of the budget and sending a byte now and then: writes go on."""
    budget = tight.app.state.budget
    body = _put_body("t", 2_490)
    tricklers = [_start(tight, 2_490) for _ in range(4)]
    try:
        for sent in range(1, 4):
            for sock in tricklers:
                sock.sendall(body[sent - 1 : sent])
            wait_until(lambda: budget.in_flight == 4 * sent, what="every trickled byte to be counted")  # noqa: B023
            small = {"item": {"key": es(f"small{sent}"), "value": es("v")}, "generationId": es("1")}
            response = tight.call("POST", "/collections/m/put", small)
            assert response.status_code == 200, response.text
        assert budget.refused == 0
    finally:
        for sock in tricklers:
            sock.close()
    wait_until(lambda: budget.in_flight == 0, what="the closed connections to give their bytes back")
    coll = tight.store.collection("m")
    assert [coll.get(b"small%d" % sent, generation_id=b"1") is not None for sent in range(1, 4)] == [True] * 3
    assert coll.get(b"t", generation_id=b"1") is None  # the trickled bodies were never applied


@pytest.fixture
def capped(tmp_path: Path) -> Iterator[Live]:
    config = ServerConfig(inflight_body_max_bytes=BUDGET, inflight_connection_max_bytes=4_000)
    with live_server(tmp_path / "data", config) as running:
        running.ok("POST", "/collections/", {"collectionName": "m", "isManual": True})
        running.ok("POST", "/collections/m/generation/start", {"generationId": es("1")})
        yield running


def test_one_request_holds_at_most_its_cap_while_others_hold_bytes(capped: Live) -> None:
    budget = capped.app.state.budget
    held = _hold(capped, 3_000)
    wait_until(lambda: budget.in_flight == 2_999, what="the first body to hold what it sent")
    before = raw_state(capped.store)
    # 2,999 + 5,000 fits the budget, but 5,000 is more than one request may hold beside another
    response = capped.call("POST", "/collections/m/put", content=_put_body("big", 5_000))
    assert response.status_code == 503 and response.json()["error"] == "overloaded"
    assert response.headers["retry-after"] == "1"
    chunks = (part for part in [_put_body("big", 5_000)])
    response = capped.call("POST", "/collections/m/put", content=chunks)
    assert response.status_code == 503 and response.json()["error"] == "overloaded"
    assert raw_state(capped.store) == before and budget.refused == 2
    # within the cap it goes in beside the other
    assert capped.call("POST", "/collections/m/put", content=_put_body("fits", 3_500)).status_code == 200
    assert _finish(held, 3_000).startswith(b"HTTP/1.1 200 ")
    wait_until(lambda: budget.in_flight == 0, what="the share to be given back")
    # alone, a request is let in whatever its size
    assert capped.call("POST", "/collections/m/put", content=_put_body("alone", 6_000)).status_code == 200


def _closed_while_trickling(sock: socket.socket, body: bytes, deadline_s: float = 60.0) -> bool:
    """Sends ``body`` a byte every 0.1 s until the server closes the connection (True) or it is all sent."""
    end = time.monotonic() + deadline_s
    for i in range(len(body)):
        if time.monotonic() > end:
            return False
        try:
            sock.sendall(body[i : i + 1])
        except (BrokenPipeError, ConnectionResetError):
            return True
        readable, _, _ = select.select([sock], [], [], 0.1)
        if readable:
            try:
                return sock.recv(65536) == b""
            except ConnectionResetError:
                return True
    return False


def test_a_body_below_the_minimum_rate_is_closed(tmp_path: Path) -> None:
    """A byte every 0.1 s never stalls 1 s between chunks, but is far below 1,000 bytes/s: it is closed."""
    config = ServerConfig(body_timeout_s=1.0, body_min_rate_bytes_s=1_000)
    with live_server(tmp_path / "data", config) as live:
        live.ok("POST", "/collections/", {"collectionName": "m", "isManual": True})
        live.ok("POST", "/collections/m/generation/start", {"generationId": es("1")})
        before = raw_state(live.store)
        with _start(live, 2_000) as sock:
            assert _closed_while_trickling(sock, _put_body("slow", 2_000))
        wait_until(
            lambda: live.app.state.budget.in_flight == 0,
            what="the closed body to give its bytes back",
        )
        assert raw_state(live.store) == before
        assert live.call("POST", "/collections/m/put", content=_put_body("fast", 2_000)).status_code == 200
