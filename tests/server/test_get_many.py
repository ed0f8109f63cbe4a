"""``getMany`` (beyond SPEC): many keys in one request, answered in order, and every bad request refused."""

from __future__ import annotations

from pathlib import Path

import msgpack
import pytest

from diffstore.server import ServerConfig

from .conftest import Live, es, live_server, unes


@pytest.fixture
def filled(live: Live) -> Live:
    """Manual ``m``: ``a``=1, ``b``=2, ``\\x00\\xff``=binary in ``g1``; ``a``=10, ``b`` deleted in ``g2``."""
    c = live.store.create_collection("m", manual=True)
    c.start_generation(b"g1")
    c.put_many([(b"a", b"1"), (b"b", b"2"), (b"\x00\xff", b"\n")], generation_id=b"g1")
    c.commit_generation(b"g1")
    c.start_generation(b"g2")
    c.put_many([(b"a", b"10"), (b"b", None)], generation_id=b"g2")
    c.commit_generation(b"g2")
    return live


def _records(live: Live) -> list[tuple[bytes, bytes]]:
    return [(r.key, r.value) for r in live.store.collection("m").query()]


def test_items_in_request_order_with_null_for_missing(filled: Live) -> None:
    keys = [es("b"), es("zz"), es("a"), es(b"\x00\xff"), es("a")]
    got = filled.ok("POST", "/collections/m/getMany", {"keys": keys})
    assert got == {
        "generationId": {"value": "g2"},
        "items": [
            None,  # deleted in g2
            None,  # never written
            {"key": {"value": "a"}, "value": {"value": "10"}, "generationId": {"value": "g2"}},
            {
                "key": {"value": "AP8=", "encoding": "base64"},
                "value": {"value": "Cg==", "encoding": "base64"},
                "generationId": {"value": "g1"},
            },
            {"key": {"value": "a"}, "value": {"value": "10"}, "generationId": {"value": "g2"}},
        ],
    }
    # an older generation; the slash twin; no keys at all
    old = filled.ok("POST", "/collections/m/getMany/", {"keys": [es("a"), es("b")], "generationId": es("g1")})
    assert old["generationId"] == {"value": "g1"}
    assert [unes(item["value"]) for item in old["items"]] == [b"1", b"2"]
    assert filled.ok("POST", "/collections/m/getMany", {"keys": []}) == {
        "generationId": {"value": "g2"},
        "items": [],
    }


def test_msgpack_and_phantom(filled: Live) -> None:
    c = filled.store.collection("m")
    phantom = c.start_phantom()
    c.put(b"a", b"ghost", generation_id=b"g2", phantom_id=phantom)
    body = msgpack.packb({"keys": [b"a", b"b", b"\x00\xff"], "phantomId": phantom})
    response = filled.call(
        "POST",
        "/collections/m/getMany",
        content=body,
        headers={"content-type": "application/msgpack", "accept": "application/msgpack"},
    )
    assert response.status_code == 200 and response.headers["content-type"] == "application/msgpack"
    answer = msgpack.unpackb(response.content)
    assert answer["generationId"] == b"g2"
    assert [None if i is None else i["value"] for i in answer["items"]] == [b"ghost", None, b"\n"]


def test_bad_requests_change_nothing(filled: Live) -> None:
    before = _records(filled)
    path = "/collections/m/getMany"
    filled.fail("POST", path, {}, status=400, code="invalidRequest")  # no keys
    filled.fail("POST", path, content=b"", status=400, code="invalidRequest")
    filled.fail("POST", path, content=b"null", status=400, code="invalidRequest")
    filled.fail("POST", path, content=b"[1,", status=400, code="invalidJson")
    filled.fail("POST", path, {"keys": es("a")}, status=400, code="invalidRequest")  # not a list
    filled.fail("POST", path, {"keys": [1]}, status=400, code="invalidRequest")
    filled.fail("POST", path, {"keys": [None]}, status=400, code="invalidRequest")
    bad_encoding = {"keys": [es("a"), {"value": "a", "encoding": "b64"}]}
    filled.fail("POST", path, bad_encoding, status=400, code="invalidEncoding")
    filled.fail(
        "POST", path, {"keys": [{"value": "***", "encoding": "base64"}]}, status=400, code="invalidEncoding"
    )
    too_many = {"keys": [es(f"k{i}") for i in range(10_001)]}
    answer = filled.fail("POST", path, too_many, status=400, code="invalidRequest")
    assert "10000" in answer["reason"]
    filled.fail(
        "POST", path, {"keys": [es("a")], "generationId": es("g" * 256)}, status=400, code="invalidRequest"
    )
    filled.fail("POST", "/collections/none/getMany", {"keys": [es("a")]}, status=404, code="noSuchCollection")
    filled.fail("GET", path, status=405, code="methodNotAllowed")
    filled.fail(
        "POST",
        path,
        content=b'{"keys": []}',
        headers={"content-type": "text/plain"},
        status=400,
        code="invalidRequest",
    )
    # past put's 4 MiB + the largest key, streamed without Content-Length
    chunks = (part for part in [b'{"keys": [{"value": "', b"x" * (28 << 20), b'"}]}'])
    answer = filled.fail("POST", path, content=chunks, status=413, code="payloadTooLarge")
    assert answer["bytesMax"] > 4 * 1024 * 1024
    assert _records(filled) == before


def test_behind_the_token(tmp_path: Path) -> None:
    with live_server(tmp_path / "data", ServerConfig(token="tok")) as live:
        live.store.create_collection("m", manual=True)
        for anonymous in ({"authorization": ""}, {"authorization": "Bearer wrong"}):
            live.fail(
                "POST",
                "/collections/m/getMany",
                {"keys": [es("a")]},
                status=401,
                code="unauthorized",
                headers=anonymous,
            )
        got = live.ok("POST", "/collections/m/getMany", {"keys": [es("a")]})  # the fixture sends the token
        assert got == {"generationId": {"value": ""}, "items": [None]}


def test_listed_in_openapi(live: Live) -> None:
    schema = live.call("GET", "/openapi.json").json()
    operation = schema["paths"]["/collections/{c}/getMany"]["post"]
    assert "requestBody" in operation and "200" in operation["responses"]
