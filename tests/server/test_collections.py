"""``/collections/``: create, list, describe, delete; name rules; trailing slashes."""

from __future__ import annotations

import pytest

from .conftest import Live, es


def test_create_list_describe_delete(live: Live) -> None:
    assert live.ok("POST", "/collections/", {"collectionName": "m", "isManual": True}) == {
        "generationId": {"value": ""}
    }
    assert live.ok("POST", "/collections/", {"collectionName": "auto", "isManual": False}) == {
        "generationId": {"value": "AAAAAAAAAAA=", "encoding": "base64"}
    }
    assert live.ok("GET", "/collections/") == {
        "items": [{"name": "auto", "isManual": False}, {"name": "m", "isManual": True}]
    }
    assert live.ok("GET", "/collections/m") == {"isManual": True, "generationId": {"value": ""}}
    assert live.ok("GET", "/collections/auto") == {
        "isManual": False,
        "generationId": {"value": "AAAAAAAAAAA=", "encoding": "base64"},
        "nextGenerationId": {"value": "AAAAAAAAAAE=", "encoding": "base64"},
    }
    assert live.ok("GET", "/collections/auto", params={"fields": "nextGenerationId"}) == {
        "isManual": False,
        "nextGenerationId": {"value": "AAAAAAAAAAE=", "encoding": "base64"},
    }
    assert live.ok("DELETE", "/collections/m") == {}
    assert [c.name for c in live.store.collections()] == ["auto"]


def test_initial_generation_id(live: Live) -> None:
    body = {"collectionName": "m", "isManual": True, "initialGenerationId": es(b"\x00\x01")}
    assert live.ok("POST", "/collections/", body) == {"generationId": {"value": "AAE=", "encoding": "base64"}}
    assert live.store.collection("m").generation_id == b"\x00\x01"


def test_trailing_slash_both_ways(live: Live) -> None:
    live.ok("POST", "/collections", {"collectionName": "a", "isManual": True})
    assert live.ok("GET", "/collections")["items"] == [{"name": "a", "isManual": True}]
    assert live.ok("GET", "/collections/a/")["isManual"] is True
    assert live.ok("GET", "/collections/a/readers")["items"] == []
    assert live.ok("POST", "/collections/a/get/", {"key": es("k")})["item"] is None


def test_collection_exists_changes_nothing(live: Live) -> None:
    live.ok("POST", "/collections/", {"collectionName": "a", "isManual": True})
    live.fail(
        "POST",
        "/collections/",
        {"collectionName": "a", "isManual": False},
        status=409,
        code="collectionExists",
    )
    assert live.store.collection("a").manual is True


def test_no_such_collection(live: Live) -> None:
    for method, path, body in [
        ("GET", "/collections/x", None),
        ("DELETE", "/collections/x", None),
        ("POST", "/collections/x/get", {"key": es("k")}),
        ("POST", "/collections/x/put", {"item": {"key": es("k"), "value": None}}),
        ("GET", "/collections/x/readers/", None),
        ("POST", "/collections/x/query/", {}),
        ("GET", "/collections/x/producers/p", None),
        ("DELETE", "/collections/x/query/abc", None),
    ]:
        live.fail(method, path, body, status=404, code="noSuchCollection")
    assert live.store.collections() == []


@pytest.mark.parametrize(
    "body",
    [
        {"collectionName": "", "isManual": True},
        {"collectionName": "a\x01b", "isManual": True},
        {"collectionName": "x" * 256, "isManual": True},
        {"collectionName": "a/b", "isManual": True},
        {"collectionName": "a", "isManual": "yes"},
        {"collectionName": 5, "isManual": True},
        {"collectionName": "a", "isManual": False, "initialGenerationId": es("g")},
        [],
    ],
)
def test_invalid_create_changes_nothing(live: Live, body: object) -> None:
    live.fail("POST", "/collections/", body, status=400, code="invalidRequest")
    assert live.store.collections() == []


def test_invalid_json_and_encoding(live: Live) -> None:
    live.fail("POST", "/collections/", content=b"{nope", status=400, code="invalidJson")
    body = {
        "collectionName": "a",
        "isManual": True,
        "initialGenerationId": {"value": "!", "encoding": "base64"},
    }
    live.fail("POST", "/collections/", body, status=400, code="invalidEncoding")
    body["initialGenerationId"] = {"value": "a", "encoding": "rot13"}
    live.fail("POST", "/collections/", body, status=400, code="invalidEncoding")
    assert live.store.collections() == []


def test_content_type_checks(live: Live) -> None:
    body = b'{"collectionName": "a", "isManual": true}'
    live.fail(
        "POST",
        "/collections/",
        content=body,
        headers={"content-type": "text/plain"},
        status=400,
        code="invalidRequest",
    )
    live.fail(
        "POST",
        "/collections/",
        content=body,
        headers={"content-type": "application/json; charset=latin-1"},
        status=400,
        code="invalidRequest",
    )
    assert live.store.collections() == []
    live.ok(
        "POST", "/collections/", content=body, headers={"content-type": "Application/JSON; Charset=UTF-8"}
    )
    live.ok("POST", "/collections/", content=body.replace(b'"a"', b'"b"'))  # no Content-Type at all
    assert [c.name for c in live.store.collections()] == ["a", "b"]


def test_unknown_route_and_method(live: Live) -> None:
    live.fail("GET", "/nope", status=404, code="noSuchRoute")
    live.fail("GET", "/collections/a/b/c/d/e", status=404, code="noSuchRoute")
    live.fail("PATCH", "/collections/", status=405, code="methodNotAllowed")
    live.fail("GET", "/collections/a/put", status=405, code="methodNotAllowed")


def test_delete_collection_drops_readers_targeting_it(live: Live) -> None:
    live.ok("POST", "/collections/", {"collectionName": "a", "isManual": True})
    live.ok("POST", "/collections/", {"collectionName": "b", "isManual": True})
    live.ok("POST", "/collections/b/readers/", {"readerName": "r", "collectionName": "a"})
    live.ok("DELETE", "/collections/a")
    assert live.ok("GET", "/collections/b/readers/") == {"items": []}
