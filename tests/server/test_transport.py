"""Transport-level behaviour: body limits while streaming, msgpack negotiation, bearer-token auth."""

from __future__ import annotations

import socket
import threading
from pathlib import Path

import httpx
import msgpack
import pytest

from diffstore.server import ServerConfig
from diffstore.server.config import Limit

from .conftest import Live, es, live_server

MiB = 1024 * 1024


def raw_request(live: Live, head: bytes, body_parts: list[bytes]) -> tuple[int, dict[str, str], bytes]:
    """Sends a hand-made request and reads the whole answer (the server closes the connection)."""
    port = int(live.url.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(head)
        for part in body_parts:
            sock.sendall(part)
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    status_line, _, rest = data.partition(b"\r\n")
    header_block, _, body = rest.partition(b"\r\n\r\n")
    headers = {}
    for line in header_block.split(b"\r\n"):
        name, _, value = line.partition(b":")
        headers[name.decode().lower()] = value.decode().strip()
    return int(status_line.split()[1]), headers, body


def test_declared_length_over_limit_is_refused_before_reading(live: Live) -> None:
    live.ok("POST", "/collections/", {"collectionName": "m", "isManual": True})
    head = (
        b"POST /collections/m/put HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Content-Length: 1000000000\r\n\r\n"
    )
    status, headers, body = raw_request(live, head, [b'{"item": '])  # 999,999,991 bytes never sent
    assert status == 413
    assert headers["connection"] == "close"
    limit = ServerConfig().limit(Limit.PUT)  # 4 MiB + the largest key
    assert httpx.Response(413, content=body).json() == {
        "error": "payloadTooLarge",
        "reason": f"body of 1000000000 bytes exceeds {limit}",
        "bytesMax": limit,
    }


def test_streamed_body_over_limit_is_refused_without_buffering(live: Live) -> None:
    """A chunked 1 GiB body: the server answers 413 after the limit and closes; the sender is cut off."""
    live.ok("POST", "/collections/", {"collectionName": "m", "isManual": True})
    port = int(live.url.rsplit(":", 1)[1])
    sock = socket.create_connection(("127.0.0.1", port), timeout=30)
    sock.sendall(
        b"POST /collections/m/putMany HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Transfer-Encoding: chunked\r\n\r\n"
    )
    chunk = b"%x\r\n%s\r\n" % (MiB, b" " * MiB)
    sent = {"bytes": 0, "error": None}

    def send_gigabyte() -> None:
        try:
            for _ in range(1024):
                sock.sendall(chunk)
                sent["bytes"] += MiB
        except OSError as exc:  # the server closed the connection: what we want
            sent["error"] = exc

    sender = threading.Thread(target=send_gigabyte, daemon=True)
    sender.start()
    data = b""
    while not data.endswith(b"}") and (part := sock.recv(65536)):
        data += part
    assert data.startswith(b"HTTP/1.1 413 "), data[:200]
    assert b'"bytesMax":%d' % ServerConfig().limit(Limit.PUT_MANY) in data
    sender.join(timeout=60)
    assert not sender.is_alive()
    assert sent["error"] is not None and sent["bytes"] < 256 * MiB
    sock.close()
    assert live.store.collection("m").next_generation_id is None


@pytest.mark.parametrize(
    ("path", "kind"),
    [
        ("/collections/", Limit.CREATE_COLLECTION),
        ("/collections/m/get", Limit.OTHER),
        ("/collections/m/put", Limit.PUT),
    ],
)
def test_limit_is_inclusive(live: Live, path: str, kind: Limit) -> None:
    limit = ServerConfig().limit(kind)
    live.ok("POST", "/collections/", {"collectionName": "m", "isManual": True})
    body = {"collectionName": "n", "isManual": True, "key": es("k"), "item": {"key": es("k"), "value": None}}
    raw = httpx.Request("POST", "/", json=body).content
    padded = raw[:-1] + b', "pad": "' + b"x" * (limit - len(raw) - 11) + b'"}'
    assert len(padded) == limit
    response = live.call("POST", path, content=padded)
    assert response.status_code in (200, 409), response.text  # put: 409 generationMismatch, not 413
    answer = live.fail("POST", path, content=padded + b" ", status=413, code="payloadTooLarge")
    assert answer["bytesMax"] == limit


def test_msgpack_round_trip(live: Live) -> None:
    pack = {"content-type": "application/msgpack", "accept": "application/msgpack"}
    created = live.call(
        "POST",
        "/collections/",
        content=msgpack.packb({"collectionName": "m", "isManual": True}),
        headers=pack,
    )
    assert created.headers["content-type"] == "application/msgpack"
    assert msgpack.unpackb(created.content) == {"generationId": b""}
    for body, path in [
        ({"generationId": b"\x00\x01"}, "generation/start"),
        (
            {
                "items": [{"key": b"\xff", "value": b"\x00"}, {"key": b"a", "value": None}],
                "generationId": b"\x00\x01",
            },
            "putMany",
        ),
        ({"generationId": b"\x00\x01"}, "generation/commit"),
    ]:
        answer = live.call("POST", f"/collections/m/{path}", content=msgpack.packb(body), headers=pack)
        assert answer.status_code == 200, answer.content
    got = live.call("POST", "/collections/m/get", content=msgpack.packb({"key": b"\xff"}), headers=pack)
    assert msgpack.unpackb(got.content) == {
        "generationId": b"\x00\x01",
        "item": {"key": b"\xff", "value": b"\x00"},
    }
    # JSON in, msgpack out; msgpack in, JSON out
    got = live.call(
        "POST", "/collections/m/get", {"key": es(b"\xff")}, headers={"accept": "application/msgpack"}
    )
    assert msgpack.unpackb(got.content)["item"]["value"] == b"\x00"
    got = live.call(
        "POST",
        "/collections/m/get",
        content=msgpack.packb({"key": b"\xff"}),
        headers={"content-type": "application/msgpack"},
    )
    assert got.json()["item"]["value"] == {"value": "AA==", "encoding": "base64"}
    diff = live.call(
        "POST", "/collections/m/diff/", content=msgpack.packb({"fromGenerationId": None}), headers=pack
    )
    assert msgpack.unpackb(diff.content)["items"] == [
        {"key": b"\xff", "fromValue": None, "intermediateValues": [], "toValue": b"\x00"}
    ]


def test_msgpack_errors(live: Live) -> None:
    pack = {"content-type": "application/msgpack", "accept": "application/msgpack"}
    bad = live.call("POST", "/collections/", content=b"\xc1", headers=pack)
    assert bad.status_code == 400 and bad.headers["content-type"] == "application/msgpack"
    assert msgpack.unpackb(bad.content)["error"] == "invalidJson"
    missing = live.call("POST", "/collections/nope/get", content=msgpack.packb({"key": b"k"}), headers=pack)
    assert (missing.status_code, msgpack.unpackb(missing.content)["error"]) == (404, "noSuchCollection")
    assert live.store.collections() == []


def test_bearer_token(tmp_path: Path) -> None:
    with live_server(tmp_path / "data", ServerConfig(token="s3cret")) as live:
        assert live.ok("GET", "/healthz") == {"ok": True}
        live.ok("POST", "/collections/", {"collectionName": "m", "isManual": True})
        for headers in (
            {"authorization": ""},
            {"authorization": "Bearer wrong"},
            {"authorization": "s3cret"},
        ):
            with httpx.Client(base_url=live.url, headers=headers) as anonymous:
                for method, path in [
                    ("GET", "/collections/"),
                    ("DELETE", "/collections/m"),
                    ("GET", "/nope"),
                ]:
                    response = anonymous.request(method, path)
                    assert response.status_code == 401
                    assert response.json()["error"] == "unauthorized"
                assert anonymous.get("/healthz").status_code == 200
        assert [c.name for c in live.store.collections()] == ["m"]
