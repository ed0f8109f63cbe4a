"""The manual generation lifecycle, phantoms, and readers with compare-and-set, over HTTP."""

from __future__ import annotations

import pytest

from .conftest import Live, es


@pytest.fixture
def manual(live: Live) -> Live:
    live.ok("POST", "/collections/", {"collectionName": "m", "isManual": True})
    live.ok("POST", "/collections/", {"collectionName": "auto", "isManual": False})
    return live


def state(live: Live, name: str = "m") -> tuple[bytes, bytes | None]:
    c = live.store.collection(name)
    return c.generation_id, c.next_generation_id


def test_lifecycle(manual: Live) -> None:
    manual.ok("POST", "/collections/m/generation/start", {"generationId": es("b")})
    manual.ok("POST", "/collections/m/generation/start", {"generationId": es("b")})  # idempotent
    assert manual.ok("GET", "/collections/m")["nextGenerationId"] == {"value": "b"}
    manual.fail(
        "POST",
        "/collections/m/generation/start",
        {"generationId": es("c")},
        status=409,
        code="outdatedGeneration",
    )
    manual.ok(
        "POST", "/collections/m/put", {"item": {"key": es("k"), "value": es("v")}, "generationId": es("b")}
    )
    manual.ok("POST", "/collections/m/generation/start", {"generationId": es("c"), "abortOutdated": True})
    assert state(manual) == (b"", b"c")
    assert manual.store.collection("m").get(b"k", generation_id=b"c") is None  # b's records are gone
    manual.fail(
        "POST",
        "/collections/m/generation/commit",
        {"generationId": es("b")},
        status=409,
        code="generationMismatch",
    )
    manual.fail(
        "POST",
        "/collections/m/generation/abort",
        {"generationId": es("b")},
        status=409,
        code="generationMismatch",
    )
    assert state(manual) == (b"", b"c")
    manual.ok("POST", "/collections/m/generation/abort", {"generationId": es("c")})
    assert state(manual) == (b"", None)
    manual.ok("POST", "/collections/m/generation/start", {"generationId": es("d")})
    manual.ok("POST", "/collections/m/generation/commit", {"generationId": es("d")})
    assert state(manual) == (b"d", None)
    manual.fail(
        "POST",
        "/collections/m/generation/start",
        {"generationId": es("d")},
        status=409,
        code="outdatedGeneration",
    )
    manual.fail(
        "POST",
        "/collections/m/generation/start",
        {"generationId": es("a")},
        status=409,
        code="outdatedGeneration",
    )
    assert state(manual) == (b"d", None)


def test_not_manual(manual: Live) -> None:
    before = state(manual, "auto")
    for verb in ("start", "commit", "abort"):
        manual.fail(
            "POST",
            f"/collections/auto/generation/{verb}",
            {"generationId": es("x")},
            status=409,
            code="notManual",
        )
    assert state(manual, "auto") == before


def test_bad_generation_bodies(manual: Live) -> None:
    manual.fail("POST", "/collections/m/generation/start", {}, status=400, code="invalidRequest")
    manual.fail(
        "POST",
        "/collections/m/generation/start",
        {"generationId": es("x"), "abortOutdated": "y"},
        status=400,
        code="invalidRequest",
    )
    manual.fail(
        "POST",
        "/collections/m/generation/start",
        {"generationId": es("x" * 256)},
        status=400,
        code="invalidRequest",
    )
    assert state(manual) == (b"", None)


def test_readers_crud_and_cas(manual: Live) -> None:
    manual.ok("POST", "/collections/m/readers/", {"readerName": "self"})
    manual.ok("POST", "/collections/m/readers/", {"readerName": "self"})  # same data: OK
    manual.ok(
        "POST", "/collections/m/readers", {"readerName": "r", "collectionName": "auto", "generationId": None}
    )
    manual.fail(
        "POST",
        "/collections/m/readers/",
        {"readerName": "r", "collectionName": "m"},
        status=409,
        code="readerExists",
    )
    listed = manual.ok("GET", "/collections/m/readers/")["items"]
    assert sorted(listed, key=lambda r: r["readerName"]) == [
        {"readerName": "r", "collectionName": "auto", "generationId": None},
        {"readerName": "self", "collectionName": "m", "generationId": None},
    ]
    manual.ok("PUT", "/collections/m/readers/r", {"generationId": es(b"\0" * 8)})
    manual.ok(
        "PUT", "/collections/m/readers/r/", {"generationId": es("x"), "expectedGenerationId": es(b"\0" * 8)}
    )
    manual.fail(
        "PUT",
        "/collections/m/readers/r",
        {"generationId": es("y"), "expectedGenerationId": None},
        status=409,
        code="badVersion",
    )
    manual.fail(
        "PUT", "/collections/m/readers/nobody", {"generationId": es("y")}, status=404, code="noSuchReader"
    )
    assert {r.name: r.generation_id for r in manual.store.collection("m").readers()} == {
        "r": b"x",
        "self": None,
    }
    manual.ok("DELETE", "/collections/m/readers/r")
    manual.ok("DELETE", "/collections/m/readers/r")  # missing reader: OK
    assert [r.name for r in manual.store.collection("m").readers()] == ["self"]


def test_commit_with_reader_updates_is_atomic(manual: Live) -> None:
    manual.ok("POST", "/collections/m/readers/", {"readerName": "a", "collectionName": "auto"})
    manual.ok("POST", "/collections/m/generation/start", {"generationId": es("1")})
    manual.ok(
        "POST", "/collections/m/put", {"item": {"key": es("k"), "value": es("v")}, "generationId": es("1")}
    )
    bad = {
        "generationId": es("1"),
        "updateReaders": [{"readerName": "a", "generationId": es("x"), "expectedGenerationId": es("wrong")}],
    }
    manual.fail("POST", "/collections/m/generation/commit", bad, status=409, code="badVersion")
    unknown = {"generationId": es("1"), "updateReaders": [{"readerName": "ghost", "generationId": es("x")}]}
    manual.fail("POST", "/collections/m/generation/commit", unknown, status=404, code="noSuchReader")
    assert state(manual) == (b"", b"1")
    assert manual.store.collection("m").readers()[0].generation_id is None
    good = {
        "generationId": es("1"),
        "updateReaders": [{"readerName": "a", "generationId": es("x"), "expectedGenerationId": None}],
    }
    manual.ok("POST", "/collections/m/generation/commit", good)
    assert state(manual) == (b"1", None)
    assert manual.store.collection("m").readers()[0].generation_id == b"x"


def test_phantom_writes_are_private(manual: Live) -> None:
    manual.ok("POST", "/collections/m/generation/start", {"generationId": es("1")})
    manual.ok(
        "POST", "/collections/m/put", {"item": {"key": es("k"), "value": es("base")}, "generationId": es("1")}
    )
    manual.ok("POST", "/collections/m/generation/commit", {"generationId": es("1")})
    phantom = manual.ok("POST", "/collections/m/phantom/start", {"ttlSeconds": 60})["phantomId"]
    assert manual.ok("POST", "/collections/m/phantom/start", content=b"")["phantomId"] != phantom
    write = {"item": {"key": es("k"), "value": es("ph")}, "generationId": es("1"), "phantomId": phantom}
    manual.ok("POST", "/collections/m/put", write)
    seen = manual.ok("POST", "/collections/m/get", {"key": es("k"), "phantomId": phantom})
    assert seen["item"]["value"] == {"value": "ph"}
    assert manual.ok("POST", "/collections/m/get", {"key": es("k")})["item"]["value"] == {"value": "base"}
    manual.fail("POST", "/collections/m/phantom/start", {"ttlSeconds": 0}, status=400, code="invalidRequest")
    no_generation = {"item": {"key": es("k"), "value": None}, "phantomId": phantom}
    manual.fail("POST", "/collections/m/put", no_generation, status=400, code="invalidRequest")
