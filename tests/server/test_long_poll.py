"""``generationId/stream``: immediate answers, wake-up on commit, timeouts, 1,000 waiters, disconnects."""

from __future__ import annotations

import asyncio
import resource
import socket
import threading
from pathlib import Path
from typing import Any

import httpx
import msgpack
import pytest

from diffstore.server import ServerConfig
from diffstore.server.longpoll import CommitHub
from tests.helpers import wait_until

from .conftest import Live, es, live_server, unes


def hub(live: Live) -> CommitHub:
    return live.app.state.hub  # type: ignore[no-any-return]


class Poll(threading.Thread):
    """One long-poll request in a background thread."""

    def __init__(self, live: Live, collection: str, **params: Any) -> None:
        super().__init__(daemon=True)
        self.url = f"{live.url}/collections/{collection}/generationId/stream"
        self.params = params
        self.response: httpx.Response | None = None
        self.start()

    def run(self) -> None:
        self.response = httpx.get(self.url, params=self.params, timeout=60)

    def answer(self) -> bytes | None:
        self.join(timeout=30)
        assert self.response is not None and self.response.status_code == 200, self.response
        return unes(self.response.json()["generationId"])


@pytest.fixture
def manual(live: Live) -> Live:
    live.ok(
        "POST", "/collections/", {"collectionName": "m", "isManual": True, "initialGenerationId": es("0")}
    )
    live.ok("POST", "/collections/", {"collectionName": "other", "isManual": True})
    return live


def commit(live: Live, collection: str, generation: str) -> None:
    live.ok("POST", f"/collections/{collection}/generation/start", {"generationId": es(generation)})
    live.ok("POST", f"/collections/{collection}/generation/commit", {"generationId": es(generation)})


def test_without_generation_answers_at_once(manual: Live) -> None:
    assert manual.ok("GET", "/collections/m/generationId/stream") == {"generationId": {"value": "0"}}
    assert manual.ok("GET", "/collections/m/generationId/stream/", params={"generationId": "x"}) == {
        "generationId": {"value": "0"}
    }


def test_commit_wakes_waiters_of_that_collection_only(manual: Live) -> None:
    waiter = Poll(manual, "m", generationId="0")
    bystander = Poll(manual, "other", generationId="")
    wait_until(
        lambda: hub(manual).waiting("m") == 1 and hub(manual).waiting("other") == 1,
        what="two waiters",
    )
    commit(manual, "m", "1")
    assert waiter.answer() == b"1"
    assert bystander.is_alive() and hub(manual).waiting("other") == 1
    commit(manual, "other", "z")
    assert bystander.answer() == b"z"
    assert hub(manual).waiting() == 0


def test_timeout_answers_the_given_id(manual: Live) -> None:
    answer = manual.ok(
        "GET", "/collections/m/generationId/stream", params={"generationId": "0", "timeoutMs": 20}
    )
    assert answer == {"generationId": {"value": "0"}}
    params = {"generationId": "AA==", "generationIdEncoding": "base64", "timeoutMs": 0}
    assert manual.ok("GET", "/collections/m/generationId/stream", params=params) == {
        "generationId": {"value": "0"}  # differs from the given \x00: at once
    }
    assert hub(manual).waiting() == 0


def test_auto_commit_wakes_waiters(live: Live) -> None:
    live.ok("POST", "/collections/", {"collectionName": "auto", "isManual": False})
    waiter = Poll(live, "auto", generationId="AAAAAAAAAAA=", generationIdEncoding="base64")
    wait_until(lambda: hub(live).waiting("auto") == 1, what="a waiter")
    live.ok("POST", "/collections/auto/put", {"item": {"key": es("k"), "value": es("v")}})
    assert waiter.answer() == b"\0" * 7 + b"\1"


def test_bad_parameters(manual: Live) -> None:
    path = "/collections/m/generationId/stream"
    manual.fail(
        "GET", path, params={"generationId": "0", "timeoutMs": 300_001}, status=400, code="invalidRequest"
    )
    manual.fail("GET", path, params={"generationId": "0", "timeoutMs": -1}, status=400, code="invalidRequest")
    manual.fail(
        "GET",
        path,
        params={"generationId": "!", "generationIdEncoding": "base64"},
        status=400,
        code="invalidEncoding",
    )
    manual.fail(
        "GET",
        "/collections/none/generationId/stream",
        params={"generationId": "0"},
        status=404,
        code="noSuchCollection",
    )
    assert hub(manual).waiting() == 0


def test_disconnect_frees_the_waiter(manual: Live) -> None:
    port = int(manual.url.rsplit(":", 1)[1])
    sock = socket.create_connection(("127.0.0.1", port))
    sock.sendall(
        b"GET /collections/m/generationId/stream?generationId=0&timeoutMs=300000 HTTP/1.1\r\nHost: x\r\n\r\n"
    )
    wait_until(lambda: hub(manual).waiting("m") == 1, what="the waiter")
    sock.close()
    wait_until(lambda: hub(manual).waiting("m") == 0, what="the waiter to be freed")


def test_a_thousand_waiters_are_woken_by_one_commit(manual: Live) -> None:
    count = 1000
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < 2 * count + 200:  # both ends of every connection live here
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard if hard != resource.RLIM_INFINITY else 4096, hard))

    async def scenario() -> list[httpx.Response]:
        limits = httpx.Limits(max_connections=count + 10, max_keepalive_connections=0)
        async with httpx.AsyncClient(base_url=manual.url, limits=limits, timeout=120) as client:
            params = {"generationId": "0", "timeoutMs": 120_000}
            tasks = [
                asyncio.create_task(client.get("/collections/m/generationId/stream", params=params))
                for _ in range(count)
            ]
            await asyncio.to_thread(
                wait_until, lambda: hub(manual).waiting("m") == count, 60.0, what="1000 waiters"
            )
            await asyncio.to_thread(commit, manual, "m", "1")
            return await asyncio.gather(*tasks)

    responses = asyncio.run(scenario())
    assert [r.status_code for r in responses] == [200] * count
    assert {r.content for r in responses} == {b'{"generationId":{"value":"1"}}'}
    assert hub(manual).waiting() == 0


def test_shutdown_answers_open_long_polls(tmp_path: Path) -> None:
    with live_server(tmp_path / "data") as live:
        live.ok("POST", "/collections/", {"collectionName": "m", "isManual": True})
        waiter = Poll(live, "m", generationId="", timeoutMs=300_000)
        wait_until(lambda: hub(live).waiting("m") == 1, what="the waiter")
        live.server.should_exit = True
        assert waiter.answer() == b""


def test_each_waiter_gets_the_format_it_accepts(manual: Live) -> None:
    path = "/collections/m/generationId/stream/"  # the slash twin waits too
    plain = Poll(manual, "m", generationId="0")
    as_msgpack: list[httpx.Response] = []
    thread = threading.Thread(
        target=lambda: as_msgpack.append(
            httpx.get(
                manual.url + path,
                params={"generationId": "0"},
                headers={"accept": "application/msgpack"},
                timeout=60,
            )
        ),
        daemon=True,
    )
    thread.start()
    wait_until(lambda: hub(manual).waiting("m") == 2, what="two waiters")
    commit(manual, "m", "0\x01")
    thread.join(30)
    assert plain.answer() == b"0\x01"
    assert as_msgpack[0].status_code == 200
    assert as_msgpack[0].headers["content-type"] == "application/msgpack"
    assert msgpack.unpackb(as_msgpack[0].content) == {"generationId": b"0\x01"}


def test_more_bad_parameters_and_methods(manual: Live) -> None:
    path = "/collections/m/generationId/stream"
    manual.fail(
        "GET", path, params={"generationId": "0", "timeoutMs": "soon"}, status=400, code="invalidRequest"
    )
    manual.fail(
        "GET",
        path,
        params={"generationId": "0", "generationIdEncoding": "hex"},
        status=400,
        code="invalidRequest",
    )
    manual.fail("POST", path, status=405, code="methodNotAllowed")
    manual.fail("GET", "/collections/m/generationId/streams", status=404, code="noSuchRoute")
    refused = manual.call(
        "GET", "/collections/none/generationId/stream/", headers={"accept": "application/msgpack"}
    )
    assert refused.status_code == 404 and refused.headers["content-type"] == "application/msgpack"
    assert msgpack.unpackb(refused.content)["error"] == "noSuchCollection"
    assert hub(manual).waiting() == 0


def test_the_connection_serves_on_after_an_answer(manual: Live) -> None:
    port = int(manual.url.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(b"GET /collections/m/generationId/stream?generationId=0 HTTP/1.1\r\nHost: x\r\n\r\n")
        wait_until(lambda: hub(manual).waiting("m") == 1, what="the waiter")
        commit(manual, "m", "1")
        assert read_response(sock) == b'{"generationId":{"value":"1"}}'
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")  # the same keep-alive connection
        assert read_response(sock) == b'{"ok":true}'
    # the answer went out as one write through uvicorn's cycle (pins the installed uvicorn's internals)
    assert hub(manual).written_directly == 1


def test_a_waiter_that_asked_to_close_gets_its_answer_and_the_end(manual: Live) -> None:
    port = int(manual.url.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(
            b"GET /collections/m/generationId/stream?generationId=0 HTTP/1.1\r\n"
            b"Host: x\r\nConnection: close\r\n\r\n"
        )
        wait_until(lambda: hub(manual).waiting("m") == 1, what="the waiter")
        commit(manual, "m", "1")
        data = b""
        while chunk := sock.recv(65536):  # the server closes the connection after the answer
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    assert lines[0] == b"HTTP/1.1 200 OK"
    headers = dict(line.split(b": ", 1) for line in lines[1:])
    assert headers[b"connection"] == b"close"
    assert headers[b"content-type"] == b"application/json; charset=utf-8"
    assert int(headers[b"content-length"]) == len(body)
    assert b"date" in headers and body == b'{"generationId":{"value":"1"}}'
    assert hub(manual).written_directly == 1


def read_response(sock: socket.socket) -> bytes:
    """One Content-Length response from a raw socket; returns its body."""
    data = b""
    while b"\r\n\r\n" not in data:
        data += sock.recv(65536)
    head, _, body = data.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 "), head
    length = int(
        next(
            v
            for k, _, v in (h.partition(b":") for h in head.split(b"\r\n"))
            if k.lower() == b"content-length"
        )
    )
    while len(body) < length:
        body += sock.recv(65536)
    assert len(body) == length, (body, length)
    return body


def test_the_long_poll_needs_the_token(tmp_path: Path) -> None:
    with live_server(tmp_path / "data", ServerConfig(token="s3cret")) as live:
        live.ok("POST", "/collections/", {"collectionName": "m", "isManual": True})
        path = "/collections/m/generationId/stream"
        refused = httpx.get(live.url + path, params={"generationId": "", "timeoutMs": 0})
        assert refused.status_code == 401 and refused.json()["error"] == "unauthorized"
        answers: list[Any] = []
        thread = threading.Thread(
            target=lambda: answers.append(live.ok("GET", path, params={"generationId": ""})), daemon=True
        )
        thread.start()
        wait_until(lambda: hub(live).waiting("m") == 1, what="the waiter")
        commit(live, "m", "1")
        thread.join(30)
        assert answers == [{"generationId": {"value": "1"}}]
