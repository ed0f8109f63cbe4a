"""Hostile input over HTTP (issue 13): every refusal has its SPEC §2 status and code, and changes nothing.

Forged cursors, null bodies, unaddressable collection names, the largest keys, a diff naming both starts,
a long poll on a deleted collection, reader generations null and ``""``, and empty tokens.
"""

from __future__ import annotations

import base64
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import msgpack
import pytest

from diffstore.server import ServerConfig
from diffstore.server.cli import is_loopback
from diffstore.server.config import Limit
from tests.engine.util import raw_state
from tests.helpers import wait_until

from .conftest import Live, es, live_server, unes
from .test_cli import DRIVER

PACK = {"content-type": "application/msgpack", "accept": "application/msgpack"}


@pytest.fixture
def filled(live: Live) -> Live:
    """Manual ``m`` at generation ``1`` holding k00..k09, and open generation ``2`` holding n00..n09."""
    live.ok("POST", "/collections/", {"collectionName": "m", "isManual": True})
    live.ok("POST", "/collections/m/generation/start", {"generationId": es("1")})
    items = [{"key": es(f"k{i:02}"), "value": es(f"v{i}")} for i in range(10)]
    live.ok("POST", "/collections/m/putMany", {"items": items, "generationId": es("1")})
    live.ok("POST", "/collections/m/generation/commit", {"generationId": es("1")})
    live.ok("POST", "/collections/m/generation/start", {"generationId": es("2")})
    items = [{"key": es(f"n{i:02}"), "value": es("new")} for i in range(10)]
    live.ok("POST", "/collections/m/putMany", {"items": items, "generationId": es("2")})
    return live


def _edit(token: str, at: int) -> str:
    raw = bytearray(base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)))
    raw[at] ^= 0x01
    return base64.urlsafe_b64encode(bytes(raw)).rstrip(b"=").decode()


# --- cursors ------------------------------------------------------------------------------------------


def test_an_edited_cursor_is_no_such_cursor(filled: Live) -> None:
    query = filled.ok("POST", "/collections/m/query/", {"limit": 3})
    diff = filled.ok("POST", "/collections/m/diff/", {"fromGenerationId": None, "limit": 3})
    before = raw_state(filled.store)
    for kind, token in (("query", query["cursorId"]), ("diff", diff["cursorId"])):
        for at in (0, 15, 16, 30, -1):
            filled.fail("GET", f"/collections/m/{kind}/{_edit(token, at)}", status=404, code="noSuchCursor")
        filled.fail("GET", f"/collections/m/{kind}/{token[:-3]}", status=404, code="noSuchCursor")
        filled.fail("GET", f"/collections/m/{kind}/%FF%00", status=404, code="noSuchCursor")
        filled.fail("GET", f"/collections/m/{kind}/{'A' * 5000}", status=404, code="noSuchCursor")
    filled.fail("GET", f"/collections/m/query/{diff['cursorId']}", status=404, code="noSuchCursor")
    assert raw_state(filled.store) == before
    page = filled.ok("GET", f"/collections/m/query/{query['cursorId']}")  # the real one still works
    assert [unes(i["key"]) for i in page["items"]] == [b"k03", b"k04", b"k05"]


def test_a_cursor_over_an_aborted_generation_is_expired(filled: Live) -> None:
    first = filled.ok("POST", "/collections/m/query/", {"generationId": es("2"), "limit": 5})
    token = first["cursorId"]
    page = filled.ok("GET", f"/collections/m/query/{token}")
    assert page["generationId"] == es("2")
    filled.ok("POST", "/collections/m/generation/abort", {"generationId": es("2")})
    before = raw_state(filled.store)
    filled.fail("GET", f"/collections/m/query/{token}", status=410, code="cursorExpired")
    assert raw_state(filled.store) == before
    filled.ok("POST", "/collections/m/generation/start", {"generationId": es("2")})  # the same id, reopened
    filled.fail("GET", f"/collections/m/query/{token}", status=410, code="cursorExpired")


# --- null bodies ----------------------------------------------------------------------------------------

_OBJECT_ROUTES = [
    "/collections/",
    "/collections/m/get",
    "/collections/m/getKeysAround",
    "/collections/m/put",
    "/collections/m/putMany",
    "/collections/m/readers/",
    "/collections/m/generation/start",
    "/collections/m/generation/commit",
    "/collections/m/generation/abort",
    "/collections/m/phantom/start",
    "/collections/m/query/",
    "/collections/m/diff/",
]


@pytest.mark.parametrize("path", _OBJECT_ROUTES)
def test_a_null_body_is_invalid(filled: Live, path: str) -> None:
    before = raw_state(filled.store)
    filled.fail("POST", path, content=b"null", status=400, code="invalidRequest")
    filled.fail(
        "POST",
        path,
        content=b" null ",
        headers={"content-type": "application/json"},
        status=400,
        code="invalidRequest",
    )
    response = filled.call("POST", path, content=msgpack.packb(None), headers=PACK)
    assert response.status_code == 400
    assert msgpack.unpackb(response.content)["error"] == "invalidRequest"
    filled.fail("PUT", "/collections/m/readers/r", content=b"null", status=400, code="invalidRequest")
    assert raw_state(filled.store) == before


def test_query_and_phantom_start_still_take_no_body(filled: Live) -> None:
    assert len(filled.ok("POST", "/collections/m/query/")["items"]) == 10
    assert filled.ok("POST", "/collections/m/phantom/start")["phantomId"]


# --- collection names -----------------------------------------------------------------------------------


@pytest.mark.parametrize("name", [".", "..", "a\u0085b", "\u0080", "x\u009f", "\u007f"])
def test_unaddressable_and_c1_names_are_refused(live: Live, name: str) -> None:
    before = raw_state(live.store)
    live.fail(
        "POST", "/collections/", {"collectionName": name, "isManual": True}, status=400, code="invalidRequest"
    )
    packed = msgpack.packb({"collectionName": name, "isManual": False})
    response = live.call("POST", "/collections/", content=packed, headers=PACK)
    assert response.status_code == 400 and msgpack.unpackb(response.content)["error"] == "invalidRequest"
    assert raw_state(live.store) == before
    assert live.ok("GET", "/collections/") == {"items": []}


def test_names_near_the_refused_ones_still_work(live: Live) -> None:
    for name in ("...", ".a", "a.", "\u00a0", "\u00e9"):
        live.ok("POST", "/collections/", {"collectionName": name, "isManual": True})


# --- the largest keys -----------------------------------------------------------------------------------


@pytest.mark.parametrize("binary", [False, True], ids=["json", "msgpack"])
def test_a_key_that_can_be_written_can_be_read(live: Live, binary: bool) -> None:
    big = b"K" + bytes(range(256)) * 273 + b"\xff" * 111  # 70,000 bytes: base64 in JSON
    assert len(big) == 70_000
    live.ok("POST", "/collections/", {"collectionName": "m", "isManual": True})
    live.ok("POST", "/collections/m/generation/start", {"generationId": es("1")})
    for key in (b"A", b"K", big, big + b"\x00", b"Z"):
        live.ok(
            "POST",
            "/collections/m/put",
            {"item": {"key": es(key), "value": es(b"v" + key[:3])}, "generationId": es("1")},
        )
    live.ok("POST", "/collections/m/generation/commit", {"generationId": es("1")})

    def call(route: str, body: dict[str, Any]) -> Any:
        if not binary:
            return live.ok("POST", f"/collections/m/{route}", body)
        raw = msgpack.packb(_to_bin(body), use_bin_type=True)
        response = live.call("POST", f"/collections/m/{route}", content=raw, headers=PACK)
        assert response.status_code == 200, response.content[:300]
        return _from_bin(msgpack.unpackb(response.content, raw=False))

    got = call("get", {"key": es(big)})
    assert unes(got["item"]["key"]) == big and unes(got["item"]["value"]) == b"vK\x00\x01"
    around = call("getKeysAround", {"key": es(big), "requireKeyExistance": True, "limit": 10})
    assert [unes(k) for k in around["left"]] == [b"K", b"A"]
    assert [unes(k) for k in around["right"]] == [big + b"\x00", b"Z"]
    query = call("query/", {"fromKey": es(big), "toKey": es(big + b"\x00\x00")})
    assert [unes(i["key"]) for i in query["items"]] == [big, big + b"\x00"]
    diff = call("diff/", {"fromGenerationId": None, "fromKey": es(b"K\x00"), "toKey": es(big + b"\x00")})
    assert [unes(i["key"]) for i in diff["items"]] == [big]


def _to_bin(body: Any) -> Any:
    """A JSON request body in its msgpack form: every EncodedString a raw ``bin``."""
    if isinstance(body, dict):
        if set(body) <= {"value", "encoding"} and "value" in body:
            return unes(body)
        return {k: _to_bin(v) for k, v in body.items()}
    if isinstance(body, list):
        return [_to_bin(v) for v in body]
    return body


def _from_bin(answer: Any) -> Any:
    """A msgpack answer in the JSON form (``bin`` back to EncodedStrings), for the same assertions."""
    if isinstance(answer, bytes):
        return es(answer)
    if isinstance(answer, dict):
        return {k: _from_bin(v) for k, v in answer.items()}
    if isinstance(answer, list):
        return [_from_bin(v) for v in answer]
    return answer


def test_a_body_over_the_raised_limit_is_still_refused(live: Live) -> None:
    live.ok("POST", "/collections/", {"collectionName": "m", "isManual": True})
    limit = live.app.state.config.limit(Limit.OTHER)
    assert limit == 64 * 1024 + 22_369_620  # 64 KiB + the largest key (2^24-1 bytes) as base64
    chunks = (part for part in [b'{"key": {"value": "', b"x" * limit, b'"}}'])  # no Content-Length
    answer = live.fail("POST", "/collections/m/get", content=chunks, status=413, code="payloadTooLarge")
    assert answer["bytesMax"] == limit


# --- diff starts ----------------------------------------------------------------------------------------


def test_a_diff_naming_both_starts_uses_from_generation_id(filled: Live) -> None:
    filled.ok("POST", "/collections/m/generation/commit", {"generationId": es("2")})
    filled.ok("POST", "/collections/m/readers/", {"readerName": "r", "generationId": es("1")})
    both = {"fromGenerationId": None, "fromReader": {"readerName": "r"}}
    answer = filled.ok("POST", "/collections/m/diff/", both)
    assert answer["fromGenerationId"] == es("") and len(answer["items"]) == 20
    unknown = {"fromGenerationId": es("1"), "fromReader": {"readerName": "nobody"}}
    answer = filled.ok("POST", "/collections/m/diff/", unknown)
    assert answer["fromGenerationId"] == es("1") and len(answer["items"]) == 10
    engine = filled.store.collection("m").diff_page(from_generation_id=b"", from_reader="r")
    assert engine.from_generation_id == b"" and len(engine.items) == 20
    reader_only = filled.ok("POST", "/collections/m/diff/", {"fromReader": {"readerName": "r"}})
    assert reader_only["fromGenerationId"] == es("1")


# --- long poll on a deleted collection --------------------------------------------------------------------


@pytest.mark.parametrize("binary", [False, True], ids=["json", "msgpack"])
def test_a_long_poll_on_a_deleted_collection_answers_404_at_once(live: Live, binary: bool) -> None:
    live.ok("POST", "/collections/", {"collectionName": "m", "isManual": True})
    answers: list[httpx.Response] = []
    headers = {"accept": "application/msgpack"} if binary else {}

    def poll() -> None:
        with httpx.Client(base_url=live.url, timeout=60) as http:
            url = "/collections/m/generationId/stream?generationId=&timeoutMs=300000"
            answers.append(http.get(url, headers=headers))

    thread = threading.Thread(target=poll)
    thread.start()
    hub = live.app.state.hub
    wait_until(lambda: hub.waiting("m") == 1, what="the long poll to wait")
    live.ok("DELETE", "/collections/m")
    thread.join(timeout=30)  # far below the poll's 300 s timeout
    assert not thread.is_alive()
    [answer] = answers
    assert answer.status_code == 404
    body = msgpack.unpackb(answer.content) if binary else answer.json()
    assert body["error"] == "noSuchCollection"
    assert hub.waiting() == 0
    live.fail("GET", "/collections/m/generationId/stream?generationId=", status=404, code="noSuchCollection")


# --- reader generations null and "" -------------------------------------------------------------------------


def test_reader_generation_null_and_empty_are_one_value(filled: Live) -> None:
    filled.ok("POST", "/collections/m/readers/", {"readerName": "e", "generationId": es("")})
    filled.ok("POST", "/collections/m/readers/", {"readerName": "n", "generationId": None})
    before = raw_state(filled.store)
    filled.ok("POST", "/collections/m/readers/", {"readerName": "e", "generationId": None})  # same data
    filled.ok("POST", "/collections/m/readers/", {"readerName": "n", "generationId": es("")})
    filled.ok("POST", "/collections/m/readers/", {"readerName": "n"})
    assert raw_state(filled.store) == before
    listed = filled.ok("GET", "/collections/m/readers/")["items"]
    assert {r["readerName"]: r["generationId"] for r in listed} == {"e": None, "n": None}
    filled.fail(
        "POST",
        "/collections/m/readers/",
        {"readerName": "n", "generationId": es("1")},
        status=409,
        code="readerExists",
    )
    # CAS: either form matches a reader at either form
    filled.ok("PUT", "/collections/m/readers/e", {"generationId": es("1"), "expectedGenerationId": None})
    filled.ok("PUT", "/collections/m/readers/n", {"generationId": es("1"), "expectedGenerationId": es("")})
    filled.ok("PUT", "/collections/m/readers/n", {"generationId": es(""), "expectedGenerationId": es("1")})
    filled.ok("PUT", "/collections/m/readers/n", {"generationId": None, "expectedGenerationId": es("")})
    before = raw_state(filled.store)
    filled.fail(
        "PUT",
        "/collections/m/readers/n",
        {"generationId": es("1"), "expectedGenerationId": es("1")},
        status=409,
        code="badVersion",
    )
    assert raw_state(filled.store) == before
    coll = filled.store.collection("m")  # the engine agrees
    coll.create_reader("n", generation_id=b"")
    coll.update_reader("n", b"1", expected=b"")
    assert {r.name: r.generation_id for r in coll.readers()} == {"e": b"1", "n": b"1"}


# --- tokens -----------------------------------------------------------------------------------------------


@pytest.fixture
def guarded(tmp_path: Path) -> Iterator[Live]:
    with live_server(tmp_path / "data", ServerConfig(token="tok")) as running:
        yield running


@pytest.mark.parametrize("scheme", ["Bearer", "bearer", "BEARER", "bEaReR"])
def test_the_bearer_scheme_is_case_insensitive(guarded: Live, scheme: str) -> None:
    answer = httpx.get(f"{guarded.url}/collections/", headers={"authorization": f"{scheme} tok"})
    assert answer.status_code == 200, answer.text


@pytest.mark.parametrize("value", ["Bearer tok2", "Bearer", "Basic tok", "tok", "Bearertok", "Bearer TOK"])
def test_a_wrong_authorization_is_refused(guarded: Live, value: str) -> None:
    answer = httpx.post(
        f"{guarded.url}/collections/",
        json={"collectionName": "m", "isManual": True},
        headers={"authorization": value},
    )
    assert answer.status_code == 401 and answer.json()["error"] == "unauthorized"
    assert guarded.ok("GET", "/collections/") == {"items": []}


@pytest.mark.parametrize(
    ("args", "env_token", "source"),
    [(["--token", ""], None, "--token"), ([], "", "DIFFSTORE_TOKEN"), (["--token", "  "], "x", "--token")],
)
def test_an_empty_token_is_refused_in_one_line(
    tmp_path: Path, args: list[str], env_token: str | None, source: str
) -> None:
    env = {k: v for k, v in os.environ.items() if k != "DIFFSTORE_TOKEN"}
    if env_token is not None:
        env["DIFFSTORE_TOKEN"] = env_token
    data = tmp_path / "data"
    done = subprocess.run(
        [sys.executable, "-c", DRIVER, "serve", "--data", str(data), "--port", "0", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert done.stdout == ""
    assert done.stderr.count("\n") == 1 and source in done.stderr and "Traceback" not in done.stderr
    assert not data.exists()  # refused before anything was opened


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "example.org"])
def test_a_reachable_host_without_a_token_is_refused_in_one_line(tmp_path: Path, host: str) -> None:
    env = {k: v for k, v in os.environ.items() if k != "DIFFSTORE_TOKEN"}
    data = tmp_path / "data"
    done = subprocess.run(
        [sys.executable, "-c", DRIVER, "serve", "--data", str(data), "--port", "0", "--host", host],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.count("\n") == 1 and "--allow-unauthenticated" in done.stderr
    assert "Traceback" not in done.stderr
    assert not data.exists()  # refused before anything was opened


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("127.0.0.1", True),
        ("127.1.2.3", True),
        ("localhost", True),
        ("::1", True),
        ("[::1]", True),
        ("0.0.0.0", False),
        ("::", False),
        ("192.0.2.1", False),
        ("example.org", False),
    ],
)
def test_which_hosts_count_as_loopback(host: str, loopback: bool) -> None:
    assert is_loopback(host) is loopback
