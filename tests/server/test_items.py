"""Point reads and writes: get, put, putMany, getKeysAround, and their error codes."""

from __future__ import annotations

import msgpack
import pytest

from .conftest import Live, es, unes


@pytest.fixture
def manual(live: Live) -> Live:
    """A manual collection ``m`` with an open generation ``g1``."""
    live.ok("POST", "/collections/", {"collectionName": "m", "isManual": True})
    live.ok("POST", "/collections/m/generation/start", {"generationId": es("g1")})
    return live


def test_put_get_tombstone_and_binary(manual: Live) -> None:
    put = manual.ok(
        "POST", "/collections/m/put", {"item": {"key": es("k"), "value": es("v")}, "generationId": es("g1")}
    )
    assert put == {"generationId": {"value": "g1"}, "wasPut": True}
    # the writer reads its own uncommitted generation
    got = manual.ok("POST", "/collections/m/get", {"key": es("k"), "generationId": es("g1")})
    assert got == {"generationId": {"value": "g1"}, "item": {"key": {"value": "k"}, "value": {"value": "v"}}}
    # the current generation ("") does not see it yet
    assert manual.ok("POST", "/collections/m/get", {"key": es("k")}) == {
        "generationId": {"value": ""},
        "item": None,
    }
    manual.ok("POST", "/collections/m/generation/commit", {"generationId": es("g1")})
    got = manual.ok("POST", "/collections/m/get", {"key": es("k")})
    assert got["item"]["value"] == {"value": "v"}
    # binary key and value (every byte not printable ASCII comes back as base64)
    manual.ok("POST", "/collections/m/generation/start", {"generationId": es("g2")})
    binary = {"key": es(b"\x00\xff"), "value": es(b"\n")}
    manual.ok("POST", "/collections/m/put", {"item": binary, "generationId": es("g2")})
    manual.ok(
        "POST", "/collections/m/put", {"item": {"key": es("k"), "value": None}, "generationId": es("g2")}
    )
    manual.ok("POST", "/collections/m/generation/commit", {"generationId": es("g2")})
    got = manual.ok("POST", "/collections/m/get", {"key": es(b"\x00\xff")})
    assert got["item"] == {
        "key": {"value": "AP8=", "encoding": "base64"},
        "value": {"value": "Cg==", "encoding": "base64"},
    }
    assert manual.ok("POST", "/collections/m/get", {"key": es("k")})["item"] is None
    # an older generation still sees the old value
    assert (
        manual.ok("POST", "/collections/m/get", {"key": es("k"), "generationId": es("g1")})["item"]
        is not None
    )
    assert manual.store.collection("m").get(b"\x00\xff").value == b"\n"  # type: ignore[union-attr]


def test_put_many_last_item_wins_and_if_not_present(manual: Live) -> None:
    items = [
        {"key": es("a"), "value": es("1")},
        {"key": es("a"), "value": es("2")},
        {"key": es("b"), "value": es("x")},
    ]
    answer = manual.ok("POST", "/collections/m/putMany", {"items": items, "generationId": es("g1")})
    assert answer == {"generationId": {"value": "g1"}}
    manual.ok("POST", "/collections/m/generation/commit", {"generationId": es("g1")})
    c = manual.store.collection("m")
    assert c.get(b"a").value == b"2"  # type: ignore[union-attr]
    manual.ok("POST", "/collections/m/generation/start", {"generationId": es("g2")})
    body = {"item": {"key": es("b"), "value": es("y"), "ifNotPresent": True}, "generationId": es("g2")}
    answer = manual.ok("POST", "/collections/m/put", body)
    assert answer["wasPut"] is False
    assert unes(answer["generationId"]) == b"g1"  # the existing record's generation
    assert c.get(b"b", generation_id=b"g2").value == b"x"  # type: ignore[union-attr]


def test_auto_collection_commits_by_itself(live: Live) -> None:
    live.ok("POST", "/collections/", {"collectionName": "auto", "isManual": False})
    answer = live.ok("POST", "/collections/auto/put", {"item": {"key": es("k"), "value": es("v")}})
    assert unes(answer["generationId"]) == b"\0" * 7 + b"\1"
    from tests.helpers import wait_until

    wait_until(lambda: live.store.collection("auto").generation_id == b"\0" * 7 + b"\1", what="auto commit")
    assert live.ok("POST", "/collections/auto/get", {"key": es("k")})["item"]["value"] == {"value": "v"}


def test_skip_unchanged_and_producers(manual: Live) -> None:
    base = {"generationId": es("g1"), "producerId": "p1"}
    items = [{"key": es("a"), "value": es("1")}]
    assert (
        manual.ok("POST", "/collections/m/putMany", {**base, "items": items, "seqNo": 3}).get("skipped")
        is None
    )
    answer = manual.ok(
        "POST", "/collections/m/putMany", {**base, "items": [{"key": es("z"), "value": None}], "seqNo": 2}
    )
    assert answer["skipped"] is True
    assert manual.ok("GET", "/collections/m/producers/p1") == {"lastSeqNo": 3}
    assert manual.ok("GET", "/collections/m/producers/other") == {"lastSeqNo": 0}
    put = {**base, "item": {"key": es("b"), "value": es("2")}, "seqNo": 3}
    assert manual.ok("POST", "/collections/m/put", put)["skipped"] is True
    assert manual.store.collection("m").get(b"b", generation_id=b"g1") is None


def test_keys_around(manual: Live) -> None:
    items = [{"key": es(k), "value": es("v")} for k in "abcdef"]
    manual.ok("POST", "/collections/m/putMany", {"items": items, "generationId": es("g1")})
    manual.ok("POST", "/collections/m/generation/commit", {"generationId": es("g1")})
    answer = manual.ok(
        "POST", "/collections/m/getKeysAround", {"key": es("c"), "requireKeyExistance": True, "limit": 2}
    )
    assert answer == {
        "generationId": {"value": "g1"},
        "left": [{"value": "b"}, {"value": "a"}],
        "right": [{"value": "d"}, {"value": "e"}],
        "hasMoreOnTheLeft": False,
        "hasMoreOnTheRight": True,
        "foundKey": True,
    }
    answer = manual.ok(
        "POST", "/collections/m/getKeysAround", {"key": es("cc"), "requireKeyExistance": False, "limit": 1}
    )
    assert (answer["left"], answer["right"], answer["foundKey"]) == (
        [{"value": "c"}],
        [{"value": "d"}],
        False,
    )


@pytest.mark.parametrize(
    ("body", "code"),
    [
        ({"item": {"key": es("k")}, "generationId": es("g1")}, "invalidRequest"),  # value must be present
        ({"item": {"key": es("k"), "value": 7}, "generationId": es("g1")}, "invalidRequest"),
        ({"item": {"value": None}, "generationId": es("g1")}, "invalidRequest"),
        ({"generationId": es("g1")}, "invalidRequest"),
        (
            {"item": {"key": {"value": "%%", "encoding": "base64"}, "value": None}, "generationId": es("g1")},
            "invalidEncoding",
        ),
        (
            {
                "item": {"key": es("k"), "value": None},
                "generationId": es("g1"),
                "seqNo": 0,
                "producerId": "p",
            },
            "invalidRequest",
        ),
    ],
)
def test_bad_put_changes_nothing(manual: Live, body: object, code: str) -> None:
    manual.fail("POST", "/collections/m/put", body, status=400, code=code)
    manual.fail("POST", "/collections/m/putMany", {"items": [body]}, status=400, code="invalidRequest")
    assert list(manual.store.collection("m").query(generation_id=b"g1")) == []


def test_generation_mismatch_on_manual_put(manual: Live) -> None:
    item = {"key": es("k"), "value": es("v")}
    manual.fail("POST", "/collections/m/put", {"item": item}, status=409, code="generationMismatch")
    manual.fail(
        "POST",
        "/collections/m/put",
        {"item": item, "generationId": es("g0")},
        status=409,
        code="generationMismatch",
    )
    manual.fail(
        "POST",
        "/collections/m/putMany",
        {"items": [item], "generationId": es("zz")},
        status=409,
        code="generationMismatch",
    )
    assert list(manual.store.collection("m").query(generation_id=b"g1")) == []


def test_get_bad_requests(manual: Live) -> None:
    manual.fail("POST", "/collections/m/get", {}, status=400, code="invalidRequest")
    manual.fail("POST", "/collections/m/get", content=b"", status=400, code="invalidRequest")
    manual.fail("POST", "/collections/m/get", content=b"[1,", status=400, code="invalidJson")
    manual.fail(
        "POST",
        "/collections/m/get",
        {"key": {"value": "a", "encoding": "b64"}},
        status=400,
        code="invalidEncoding",
    )
    body = {"key": es("k"), "requireKeyExistance": True, "limit": 1001}
    manual.fail("POST", "/collections/m/getKeysAround", body, status=400, code="invalidRequest")


def test_get_more_bad_requests_and_methods(manual: Live) -> None:
    # get is served before FastAPI's router (the fast lane): the same codes as every other route
    manual.fail(
        "POST",
        "/collections/m/get",
        content=b'{"key": {"value": "k"}}',
        headers={"content-type": "text/plain"},
        status=400,
        code="invalidRequest",
    )
    manual.fail("POST", "/collections/none/get/", {"key": es("k")}, status=404, code="noSuchCollection")
    manual.fail("GET", "/collections/m/get", status=405, code="methodNotAllowed")
    manual.fail("POST", "/collections/m/get/more", {"key": es("k")}, status=404, code="noSuchRoute")
    # no Content-Length; past 64 KiB + the largest key (a 70,000-byte key is fine: test_hardening.py)
    chunks = (part for part in [b'{"key": {"value": "', b"x" * (24 << 20), b'"}}'])
    manual.fail("POST", "/collections/m/get", content=chunks, status=413, code="payloadTooLarge")


def test_get_of_a_large_value(manual: Live) -> None:
    big = bytes(range(256)) * 1024  # 256 KiB, base64 in JSON: encoded off the event loop
    manual.store.collection("m").put(b"big", big, generation_id=b"g1")
    manual.ok("POST", "/collections/m/generation/commit", {"generationId": es("g1")})
    got = manual.ok("POST", "/collections/m/get", {"key": es("big")})
    assert unes(got["item"]["value"]) == big and got["generationId"] == {"value": "g1"}
    packed = manual.call(
        "POST", "/collections/m/get", {"key": es("big")}, headers={"accept": "application/msgpack"}
    )
    assert msgpack.unpackb(packed.content)["item"] == {"key": b"big", "value": big}
