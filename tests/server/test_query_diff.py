"""Paged query and diff with self-contained cursors, key ranges, intermediate values, and splits."""

from __future__ import annotations

import pytest

from .conftest import Live, es, unes


def keys(items: list[dict]) -> list[bytes]:  # type: ignore[type-arg]
    return [unes(item["key"]) for item in items]  # type: ignore[misc]


@pytest.fixture
def filled(live: Live) -> Live:
    """Manual ``m``: generation 1 writes k00..k24 = "1"; generation 2 rewrites k00..k04, deletes k05."""
    live.ok("POST", "/collections/", {"collectionName": "m", "isManual": True})
    live.ok("POST", "/collections/m/generation/start", {"generationId": es("1")})
    items = [{"key": es(f"k{i:02}"), "value": es("1")} for i in range(25)]
    live.ok("POST", "/collections/m/putMany", {"items": items, "generationId": es("1")})
    live.ok("POST", "/collections/m/generation/commit", {"generationId": es("1")})
    live.ok("POST", "/collections/m/generation/start", {"generationId": es("2")})
    items = [{"key": es(f"k{i:02}"), "value": es("2")} for i in range(5)] + [
        {"key": es("k05"), "value": None}
    ]
    live.ok("POST", "/collections/m/putMany", {"items": items, "generationId": es("2")})
    live.ok("POST", "/collections/m/generation/commit", {"generationId": es("2")})
    return live


def test_query_pages_follow_cursors(filled: Live) -> None:
    page = filled.ok("POST", "/collections/m/query/", {"limit": 10})
    seen = keys(page["items"])
    assert page["generationId"] == {"value": "2"}
    first_cursor = page["cursorId"]
    while "cursorId" in page:
        page = filled.ok("GET", f"/collections/m/query/{page['cursorId']}")
        seen += keys(page["items"])
    assert seen == [f"k{i:02}".encode() for i in range(25) if i != 5]
    # the same cursor twice gives the same page; deleting a cursor is harmless
    again = filled.ok("GET", f"/collections/m/query/{first_cursor}")
    assert again == filled.ok("GET", f"/collections/m/query/{first_cursor}/")
    assert filled.ok("DELETE", f"/collections/m/query/{first_cursor}") == {}


def test_query_at_generation_and_range(filled: Live) -> None:
    page = filled.ok(
        "POST", "/collections/m/query", {"generationId": es("1"), "fromKey": es("k03"), "toKey": es("k06")}
    )
    assert [(unes(i["key"]), unes(i["value"])) for i in page["items"]] == [
        (b"k03", b"1"),
        (b"k04", b"1"),
        (b"k05", b"1"),
    ]
    assert "cursorId" not in page
    assert filled.ok("POST", "/collections/m/query/", content=b"")["generationId"] == {"value": "2"}


def test_query_bad_requests(filled: Live) -> None:
    filled.fail("POST", "/collections/m/query/", {"limit": 0}, status=400, code="invalidRequest")
    filled.fail("POST", "/collections/m/query/", {"limit": 10_001}, status=400, code="invalidRequest")
    filled.fail("GET", "/collections/m/query/not-a-cursor", status=404, code="noSuchCursor")
    filled.fail("GET", "/collections/m/diff/not-a-cursor", status=404, code="noSuchCursor")


def test_diff_between_generations(filled: Live) -> None:
    page = filled.ok("POST", "/collections/m/diff/", {"fromGenerationId": es("1"), "toGenerationId": es("2")})
    assert page["fromGenerationId"] == {"value": "1"} and page["toGenerationId"] == {"value": "2"}
    assert page["items"][0] == {
        "key": {"value": "k00"},
        "fromValue": {"value": "1"},
        "intermediateValues": [],
        "toValue": {"value": "2"},
    }
    assert page["items"][5] == {
        "key": {"value": "k05"},
        "fromValue": {"value": "1"},
        "intermediateValues": [],
        "toValue": None,
    }
    assert len(page["items"]) == 6


def test_diff_from_the_beginning_with_intermediates_and_paging(filled: Live) -> None:
    body = {"fromGenerationId": None, "omitIntermediateValues": False, "limit": 4}
    page = filled.ok("POST", "/collections/m/diff", body)
    items = page["items"]
    while "cursorId" in page:
        page = filled.ok("GET", f"/collections/m/diff/{page['cursorId']}")
        items += page["items"]
    assert len(items) == 24  # k05 was created then deleted: absent at both ends
    assert items[0] == {
        "key": {"value": "k00"},
        "fromValue": None,
        "intermediateValues": [{"value": "1"}],
        "toValue": {"value": "2"},
    }


def test_diff_from_reader_and_errors(filled: Live) -> None:
    filled.ok("POST", "/collections/m/readers/", {"readerName": "r", "generationId": es("1")})
    page = filled.ok("POST", "/collections/m/diff/", {"fromReader": {"readerName": "r"}})
    assert page["fromGenerationId"] == {"value": "1"} and len(page["items"]) == 6
    filled.fail("POST", "/collections/m/diff/", {}, status=400, code="invalidRequest")
    filled.fail(
        "POST",
        "/collections/m/diff/",
        {"fromGenerationId": es("1"), "toGenerationId": es("3")},
        status=404,
        code="noSuchGeneration",  # above the current generation (SPEC §8)
    )
    filled.fail(
        "POST",
        "/collections/m/diff/",
        {"fromReader": {"readerName": "nobody"}},
        status=404,
        code="noSuchReader",
    )
    filled.fail(
        "POST",
        "/collections/m/diff/",
        {"fromGenerationId": {"value": "x", "encoding": "?"}},
        status=400,
        code="invalidEncoding",
    )


def test_generation_collected(filled: Live) -> None:
    filled.ok("POST", "/collections/m/readers/", {"readerName": "gc", "generationId": es("2")})
    c = filled.store.collection("m")

    def collected() -> bool:
        filled.store.run_background_once()
        return (
            filled.call("POST", "/collections/m/get", {"key": es("k10"), "generationId": es("1")}).status_code
            == 410
        )

    from tests.helpers import wait_until

    wait_until(collected, what="generation 1 to be collected")
    filled.fail(
        "POST", "/collections/m/diff/", {"fromGenerationId": es("1")}, status=410, code="generationCollected"
    )
    filled.fail(
        "POST", "/collections/m/query/", {"generationId": es("1")}, status=410, code="generationCollected"
    )
    assert c.get(b"k10").value == b"1"  # type: ignore[union-attr]


def test_splits(filled: Live) -> None:
    c = filled.store.collection("m")
    answer = filled.ok("GET", "/collections/m/splits", params={"count": 4})
    assert keys([{"key": k} for k in answer["keys"]]) == c.splits(4)
    assert answer["keys"], "25 keys cut in 4 ranges need at least one cut"
    answer = filled.ok("GET", "/collections/m/splits/", params={"count": 3, "generationId": "1"})
    assert keys([{"key": k} for k in answer["keys"]]) == c.splits(3, generation_id=b"1")
    filled.fail("GET", "/collections/m/splits", params={"count": 1}, status=400, code="invalidRequest")
    filled.fail("GET", "/collections/m/splits", params={"count": 1025}, status=400, code="invalidRequest")
    filled.fail("GET", "/collections/m/splits", params={"count": "x"}, status=400, code="invalidRequest")
    filled.fail("GET", "/collections/m/splits", status=400, code="invalidRequest")
    bad = {"count": 2, "generationId": "!", "generationIdEncoding": "base64"}
    filled.fail("GET", "/collections/m/splits", params=bad, status=400, code="invalidEncoding")


def test_splits_of_a_diff(filled: Live) -> None:
    """``fromGenerationId`` cuts the keys changed in (from, generationId]: generation 2 changed k00..k05."""
    c = filled.store.collection("m")
    params = {"count": 3, "generationId": "2", "fromGenerationId": "1"}
    cuts = keys([{"key": k} for k in filled.ok("GET", "/collections/m/splits", params=params)["keys"]])
    assert cuts == c.splits(3, b"2", from_generation_id=b"1") and len(cuts) == 2
    assert set(cuts) <= {b"k%02d" % i for i in range(6)}
    params = {"count": 3, "fromGenerationId": "MQ==", "generationIdEncoding": "base64"}  # "1", to the current
    assert filled.ok("GET", "/collections/m/splits", params=params)["keys"] == [
        {"value": k.decode()} for k in cuts
    ]
    before = c.diff_page(b"1", b"2")
    for params, status, code in [
        ({"count": 3, "generationId": "1", "fromGenerationId": "2"}, 400, "invalidRequest"),  # from above to
        ({"count": 3, "generationId": "9", "fromGenerationId": "1"}, 404, "noSuchGeneration"),
        ({"count": 1, "fromGenerationId": "1"}, 400, "invalidRequest"),
        ({"count": 3, "fromGenerationId": "!", "generationIdEncoding": "base64"}, 400, "invalidEncoding"),
    ]:
        filled.fail("GET", "/collections/m/splits", params=params, status=status, code=code)
    assert c.diff_page(b"1", b"2") == before and c.generation_id == b"2"  # nothing changed


def test_cursor_expired(filled: Live) -> None:
    from tests.helpers import wait_until

    query = filled.ok("POST", "/collections/m/query/", {"generationId": es("1"), "limit": 3})
    diff = filled.ok(
        "POST", "/collections/m/diff/", {"fromGenerationId": es("1"), "toGenerationId": es("2"), "limit": 2}
    )
    filled.ok("POST", "/collections/m/readers/", {"readerName": "gc", "generationId": es("2")})

    def expired() -> bool:
        filled.store.run_background_once()
        return filled.call("GET", f"/collections/m/query/{query['cursorId']}").status_code == 410

    wait_until(expired, what="the query cursor to expire")
    filled.fail("GET", f"/collections/m/query/{query['cursorId']}", status=410, code="cursorExpired")
    filled.fail("GET", f"/collections/m/diff/{diff['cursorId']}", status=410, code="cursorExpired")
    filled.ok("POST", "/collections/", {"collectionName": "n", "isManual": True})
    filled.fail("GET", f"/collections/n/query/{query['cursorId']}", status=404, code="noSuchCursor")
