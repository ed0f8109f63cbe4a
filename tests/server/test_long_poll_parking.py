"""Parked long polls under a real uvicorn server: the ASGI call ends at once, the connection is held for
the answer, what the client sends meanwhile waits its turn, and the bookkeeping after a fan-out is done
when the connection needs it (its next request) or later in a sweep."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from diffstore.server import longpoll, uvicorn_adapter
from diffstore.server.longpoll import CommitHub
from diffstore.server.metrics import ServerMetrics
from tests.helpers import wait_until

from .conftest import Live, es, live_server
from .test_long_poll import commit, read_response

POLL = b"GET /collections/m/generationId/stream?generationId=0&timeoutMs=300000 HTTP/1.1\r\nHost: x\r\n\r\n"
ROUTE = "/collections/{c}/generationId/stream"


def hub(live: Live) -> CommitHub:
    return live.app.state.hub  # type: ignore[no-any-return]


def parked(live: Live) -> list[longpoll.Waiter]:
    return [waiter for group in hub(live)._waiters.values() for waiter in group if waiter.parked is not None]


def parked_protocol(live: Live) -> Any:
    """The uvicorn protocol of the one parked waiter's connection."""
    (waiter,) = parked(live)
    assert waiter.parked is not None
    return waiter.parked.protocol


def tasks(live: Live) -> int:
    return len(live.server.server_state.tasks)


@pytest.fixture
def manual(tmp_path: Path) -> Iterator[Live]:
    with live_server(tmp_path / "data") as live:
        live.ok(
            "POST",
            "/collections/",
            {"collectionName": "m", "isManual": True, "initialGenerationId": es("0")},
        )
        yield live


def connect(live: Live) -> socket.socket:
    return socket.create_connection(("127.0.0.1", int(live.url.rsplit(":", 1)[1])), timeout=30)


def read_bodies(sock: socket.socket, count: int) -> list[bytes]:
    """The bodies of the next ``count`` responses on ``sock`` (each a 200 with a Content-Length)."""
    data, bodies = b"", list[bytes]()
    while len(bodies) < count:
        while b"\r\n\r\n" not in data:
            data += sock.recv(65536)
        head, _, data = data.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200 "), head
        length = next(
            int(line.split(b":")[1])
            for line in head.split(b"\r\n")
            if line.lower().startswith(b"content-length:")
        )
        while len(data) < length:
            data += sock.recv(65536)
        bodies.append(data[:length])
        data = data[length:]
    assert data == b""
    return bodies


def requests_counted(live: Live, status: str) -> float:
    response = live.http.get("/metrics")
    for family in text_string_to_metric_families(response.text):
        for sample in family.samples:
            if sample.name == "diffstore_http_requests_total" and sample.labels == {
                "route": ROUTE,
                "method": "GET",
                "status": status,
            }:
                return sample.value
    return 0.0


def test_a_waiting_long_poll_holds_no_asgi_call(manual: Live) -> None:
    with connect(manual) as sock:
        sock.sendall(POLL)
        wait_until(lambda: len(parked(manual)) == 1, what="the parked waiter")
        wait_until(lambda: tasks(manual) == 0, what="the long poll's ASGI call to end")
        commit(manual, "m", "1")
        assert read_response(sock) == b'{"generationId":{"value":"1"}}'


def test_the_next_request_on_the_connection_does_not_wait_for_the_sweep(
    manual: Live, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(longpoll, "FINISH_AFTER_S", 3600.0)  # the sweep never comes within the test
    with connect(manual) as sock:
        sock.sendall(POLL)
        wait_until(lambda: len(parked(manual)) == 1, what="the parked waiter")
        commit(manual, "m", "1")
        assert read_response(sock) == b'{"generationId":{"value":"1"}}'
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")  # finishes the answered request first
        assert read_response(sock) == b'{"ok":true}'
        sock.sendall(POLL.replace(b"generationId=0", b"generationId=1"))  # and it can park again
        wait_until(lambda: len(parked(manual)) == 1, what="the second parked waiter")
        commit(manual, "m", "2")
        assert read_response(sock) == b'{"generationId":{"value":"2"}}'


def test_a_request_sent_while_parked_is_answered_after_the_long_poll(manual: Live) -> None:
    with connect(manual) as sock:
        sock.sendall(POLL)
        wait_until(lambda: len(parked(manual)) == 1, what="the parked waiter")
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")  # pipelined behind the long poll
        wait_until(lambda: parked_protocol(manual).held_back != b"", what="the bytes held back")
        commit(manual, "m", "1")
        assert read_bodies(sock, 2) == [b'{"generationId":{"value":"1"}}', b'{"ok":true}']


def test_pipelined_requests_are_answered_in_order(manual: Live) -> None:
    with connect(manual) as sock:
        sock.sendall(POLL + b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")  # both in one segment
        wait_until(lambda: hub(manual).waiting("m") == 1, what="the waiter")
        commit(manual, "m", "1")
        assert read_bodies(sock, 2) == [b'{"generationId":{"value":"1"}}', b'{"ok":true}']


def test_a_client_gone_while_parked_frees_its_waiter(manual: Live) -> None:
    sock = connect(manual)
    sock.sendall(POLL)
    wait_until(lambda: len(parked(manual)) == 1, what="the parked waiter")
    waiter = parked(manual)[0]
    sock.close()
    wait_until(lambda: hub(manual).waiting("m") == 0, what="the waiter to be freed")
    assert waiter.timer is not None and waiter.timer.cancelled()
    commit(manual, "m", "1")  # nothing to answer, nothing fails
    assert manual.ok("GET", "/healthz") == {"ok": True}


def test_a_client_gone_after_its_answer_leaves_no_timer(
    manual: Live, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(longpoll, "FINISH_AFTER_S", 3600.0)
    sock = connect(manual)
    sock.sendall(POLL)
    wait_until(lambda: len(parked(manual)) == 1, what="the parked waiter")
    waiter = parked(manual)[0]
    commit(manual, "m", "1")
    assert read_response(sock) == b'{"generationId":{"value":"1"}}'
    sock.close()
    wait_until(lambda: waiter.timer is not None and waiter.timer.cancelled(), what="the timer cancelled")


def test_parked_answers_are_counted_once_with_their_status(manual: Live) -> None:
    before = requests_counted(manual, "200")
    with connect(manual) as first, connect(manual) as second:
        first.sendall(POLL)
        second.sendall(POLL)
        wait_until(lambda: len(parked(manual)) == 2, what="two parked waiters")
        assert requests_counted(manual, "200") == before  # not counted when the ASGI call ended
        commit(manual, "m", "1")
        read_response(first), read_response(second)
    wait_until(lambda: requests_counted(manual, "200") == before + 2, what="two answers counted")
    with connect(manual) as sock:
        sock.sendall(POLL.replace(b"generationId=0", b"generationId=1"))
        wait_until(lambda: len(parked(manual)) == 1, what="the parked waiter")
        manual.ok("DELETE", "/collections/m")
        data = b""
        while b"noSuchCollection" not in data:
            data += sock.recv(65536)
        assert data.startswith(b"HTTP/1.1 404 ")
    wait_until(lambda: requests_counted(manual, "404") >= 1, what="the 404 counted")
    assert requests_counted(manual, "200") == before + 2


def test_a_shutdown_answers_parked_waiters(tmp_path: Path) -> None:
    with live_server(tmp_path / "data") as live:
        live.ok(
            "POST",
            "/collections/",
            {"collectionName": "m", "isManual": True, "initialGenerationId": es("0")},
        )
        sock = connect(live)
        sock.sendall(POLL)
        wait_until(lambda: len(parked(live)) == 1, what="the parked waiter")
        live.server.should_exit = True
        assert read_response(sock) == b'{"generationId":{"value":"0"}}'
        sock.close()


@pytest.mark.parametrize(
    "seconds",
    [[], [0.001], [0.0, 0.005, 0.005, 0.0051, 7.5, 10.0, 11.0, 1e9], [0.3] * 50 + [2.5] * 7],
)
def test_observe_many_is_observe_one_by_one(tmp_path: Path, seconds: list[float]) -> None:
    from diffstore.engine import Store

    with Store.open(tmp_path / "data") as store:
        many = ServerMetrics(store, CommitHub())
        one = ServerMetrics(store, CommitHub())
        many.observe_many(ROUTE, "GET", 200, seconds)
        for value in seconds:
            one.observe(ROUTE, "GET", 200, value)
        samples_many = _samples(many.registry)
        samples_one = _samples(one.registry)
    assert samples_many == samples_one
    labels = frozenset({"route": ROUTE, "method": "GET"}.items())
    assert samples_one.get(("diffstore_http_request_seconds_count", labels), 0.0) == len(seconds)


def _samples(registry: CollectorRegistry) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(generate_latest(registry).decode())
        if family.name.startswith("diffstore_http")
        for sample in family.samples
        if not sample.name.endswith("_created")
    }


def test_the_sweep_finishes_an_answered_connection_that_stays_idle(
    manual: Live, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(longpoll, "FINISH_AFTER_S", 0.01)
    with connect(manual) as sock:
        sock.sendall(POLL)
        wait_until(lambda: len(parked(manual)) == 1, what="the parked waiter")
        protocol = parked_protocol(manual)
        commit(manual, "m", "1")
        assert read_response(sock) == b'{"generationId":{"value":"1"}}'
        # uvicorn's end of response, done by the sweep: the connection reads on, its keep-alive timer armed
        wait_until(lambda: protocol.parked is None, what="the sweep")
        assert protocol.timeout_keep_alive_task is not None
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        assert read_response(sock) == b'{"ok":true}'


def test_a_client_that_pipelines_much_while_parked_gets_every_answer_in_order(manual: Live) -> None:
    health = b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"
    count = 2 * uvicorn_adapter.HELD_BACK_MAX_BYTES // len(health)  # twice what a parked one reads ahead
    with connect(manual) as sock:
        sock.sendall(POLL)
        wait_until(lambda: len(parked(manual)) == 1, what="the parked waiter")
        protocol = parked_protocol(manual)
        sock.sendall(health * count)
        wait_until(lambda: protocol.flow.read_paused, what="reading paused")
        commit(manual, "m", "1")
        bodies = read_bodies(sock, 1 + count)
    assert bodies[0] == b'{"generationId":{"value":"1"}}'
    assert set(bodies[1:]) == {b'{"ok":true}'}


def test_a_parked_long_poll_that_asked_to_close_is_closed_with_its_answer(
    manual: Live, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(longpoll, "FINISH_AFTER_S", 3600.0)  # the close must not wait for the sweep
    with connect(manual) as sock:
        sock.sendall(POLL.replace(b"Host: x\r\n", b"Host: x\r\nConnection: close\r\n"))
        wait_until(lambda: len(parked(manual)) == 1, what="the parked waiter")
        commit(manual, "m", "1")
        data = b""
        while chunk := sock.recv(65536):  # ends when the server closes the connection
            data += chunk
    assert data.startswith(b"HTTP/1.1 200 OK") and b"connection: close\r\n" in data
    assert data.endswith(b'{"generationId":{"value":"1"}}')


def test_a_gone_client_with_a_request_behind_its_long_poll_breaks_no_fan_out(manual: Live) -> None:
    # uvicorn marks only the newest request of a closed connection disconnected: the long poll in front
    # of a pipelined request is neither parked nor told, and writing to it would fail on uvloop
    gone = connect(manual)
    gone.sendall(POLL + b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
    with connect(manual) as sock:
        sock.sendall(POLL)
        wait_until(lambda: hub(manual).waiting("m") == 2, what="two waiters")
        assert len(parked(manual)) == 1
        gone.close()
        commit(manual, "m", "1")
        assert read_response(sock) == b'{"generationId":{"value":"1"}}'
    wait_until(lambda: tasks(manual) == 0, what="the gone client's ASGI call to end")
    assert manual.ok("GET", "/healthz") == {"ok": True}
