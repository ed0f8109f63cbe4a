"""The one module that knows uvicorn's insides: it matches the installed uvicorn, or the server says why and
serves with plain ASGI sends; half-sent requests are closed after the read timeouts."""

from __future__ import annotations

import json
import re
import socket
import tomllib
from pathlib import Path

import pytest
import uvicorn

from diffstore.server import ServerConfig, uvicorn_adapter
from diffstore.server.longpoll import CommitHub
from tests.engine.util import raw_state
from tests.helpers import wait_until

from .conftest import Live, es, live_server
from .test_long_poll import read_response

ROOT = Path(__file__).resolve().parents[2]


def test_the_installed_uvicorn_matches_the_adapter() -> None:
    # When this fails, uvicorn changed under us: check uvicorn_adapter against the new version's
    # httptools_impl and Server, then widen SUPPORTED and the pin in pyproject.toml together.
    assert uvicorn_adapter.mismatch() is None


def test_the_pin_in_pyproject_is_the_supported_range() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    server_extra = project["project"]["optional-dependencies"]["server"]  # uvicorn serves only 'serve'
    pins = [dep for dep in server_extra if dep.startswith("uvicorn")]
    assert len(pins) == 1
    bounds = dict(re.findall(r"(>=|<)([0-9.]+)", pins[0]))
    low, high = uvicorn_adapter.SUPPORTED
    assert tuple(int(x) for x in bounds[">="].split(".")) == low
    assert tuple(int(x) for x in bounds["<"].split(".")) == high


def hub(live: Live) -> CommitHub:
    return live.app.state.hub  # type: ignore[no-any-return]


def long_poll_answered_by_commit(live: Live) -> bytes:
    live.ok(
        "POST", "/collections/", {"collectionName": "m", "isManual": True, "initialGenerationId": es("0")}
    )
    port = int(live.url.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(b"GET /collections/m/generationId/stream?generationId=0 HTTP/1.1\r\nHost: x\r\n\r\n")
        wait_until(lambda: hub(live).waiting("m") == 1, what="the waiter")
        live.ok("POST", "/collections/m/generation/start", {"generationId": es("1")})
        live.ok("POST", "/collections/m/generation/commit", {"generationId": es("1")})
        return read_response(sock)


def test_matching_uvicorn_answers_long_polls_directly(tmp_path: Path) -> None:
    with live_server(tmp_path / "data") as live:
        assert long_poll_answered_by_commit(live) == b'{"generationId":{"value":"1"}}'
        assert hub(live).written_directly == 1


def test_a_mismatching_uvicorn_falls_back_to_plain_asgi_sends(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(
        uvicorn_adapter, "mismatch", lambda: f"uvicorn {uvicorn.__version__} (pretend) differs"
    )
    with live_server(tmp_path / "data") as live:
        assert live.server.config.http == "httptools"
        assert long_poll_answered_by_commit(live) == b'{"generationId":{"value":"1"}}'
        assert hub(live).written_directly == 0
        assert live.ok("GET", "/healthz") == {"ok": True}


def closed_by_server(sock: socket.socket) -> bool:
    """True once the server has closed the connection (reads what it sent before, if anything)."""
    sock.settimeout(30)
    while chunk := sock.recv(65536):
        del chunk
    return True


@pytest.fixture
def timeouts(tmp_path: Path):  # type: ignore[no-untyped-def]
    with live_server(tmp_path / "data", ServerConfig(header_timeout_s=0.2, body_timeout_s=0.2)) as live:
        live.ok("POST", "/collections/", {"collectionName": "m", "isManual": False})
        yield live


def connect(live: Live) -> socket.socket:
    return socket.create_connection(("127.0.0.1", int(live.url.rsplit(":", 1)[1])), timeout=30)


def test_a_connection_that_sends_nothing_is_closed(timeouts: Live) -> None:
    with connect(timeouts) as sock:
        assert closed_by_server(sock)
    assert timeouts.ok("GET", "/healthz") == {"ok": True}


def test_half_sent_headers_are_closed(timeouts: Live) -> None:
    with connect(timeouts) as sock:
        sock.sendall(b"POST /collections/m/put HTTP/1.1\r\nHost: x\r\nContent-Le")
        assert closed_by_server(sock)
    assert timeouts.ok("GET", "/healthz") == {"ok": True}


def test_a_stalled_body_is_closed_and_nothing_is_written(timeouts: Live) -> None:
    body = b'{"item": {"key": {"value": "k"}, "value": {"value": "v"}}}'
    with connect(timeouts) as sock:
        sock.sendall(
            b"POST /collections/m/put HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n" % len(body) + body[:20]
        )
        assert closed_by_server(sock)
    assert timeouts.ok("GET", "/healthz") == {"ok": True}
    coll = timeouts.store.collection("m")
    assert coll.get(b"k", generation_id=coll.next_generation_id) is None  # not even in the open generation


def test_a_whole_request_on_a_kept_alive_connection_is_not_cut(timeouts: Live) -> None:
    with connect(timeouts) as sock:
        for _ in range(3):
            sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            assert read_response(sock) == b'{"ok":true}'


@pytest.mark.parametrize(
    ("head", "cause"),
    [
        (b"GET /collections/m/" + b"a" * 70_000 + b" HTTP/1.1\r\nHost: x\r\n\r\n", "url is too long"),
        (
            b"POST /collections/m/put HTTP/1.1\r\nHost: x\r\nX-Bad: a\x01b\r\n\r\n",
            "Invalid header value char",
        ),
    ],
    ids=["url-over-64KiB", "bad-header-byte"],
)
def test_a_request_the_parser_refuses_gets_the_json_error_envelope(
    timeouts: Live, head: bytes, cause: str
) -> None:
    before = raw_state(timeouts.store)
    with connect(timeouts) as sock:
        sock.sendall(head)
        answer = b""
        while chunk := sock.recv(65536):  # the server closes the connection after it
            answer += chunk
    status_line, _, rest = answer.partition(b"\r\n")
    headers, _, body = rest.partition(b"\r\n\r\n")
    assert status_line == b"HTTP/1.1 400 Bad Request"
    assert b"content-type: application/json; charset=utf-8" in headers.split(b"\r\n")
    assert b"connection: close" in headers.split(b"\r\n")
    error = json.loads(body)
    assert error["error"] == "invalidRequest" and cause in error["reason"], error
    assert raw_state(timeouts.store) == before
    assert timeouts.ok("GET", "/healthz") == {"ok": True}
