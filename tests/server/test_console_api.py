"""The API routes the console needs: ``GET /overview`` and ``GET /collections/{c}/generations``."""

from __future__ import annotations

import threading
from pathlib import Path

import httpx

from diffstore.server import ServerConfig
from tests.helpers import wait_until

from .conftest import Live, es, live_server, unes


def _commit(live: Live, name: str, generation: str) -> None:
    live.ok("POST", f"/collections/{name}/generation/start", {"generationId": es(generation)})
    live.ok("POST", f"/collections/{name}/generation/commit", {"generationId": es(generation)})


def test_overview_lists_collections_readers_and_lag(live: Live) -> None:
    live.ok("POST", "/collections/", {"collectionName": "a", "isManual": True})
    live.ok("POST", "/collections/", {"collectionName": "auto", "isManual": False})
    live.ok("POST", "/collections/", {"collectionName": "c", "isManual": True})
    _commit(live, "a", "g1")
    live.ok("POST", "/collections/c/readers/", {"readerName": "from_a", "collectionName": "a"})
    live.ok("POST", "/collections/c/readers/", {"readerName": "pos", "collectionName": "hstream://s"})
    _commit(live, "a", "g2")
    answer = live.ok("GET", "/overview")
    by_name = {c["name"]: c for c in answer["collections"]}
    assert [c["name"] for c in answer["collections"]] == ["a", "auto", "c"]
    assert by_name["a"]["isManual"] and unes(by_name["a"]["generationId"]) == b"g2"
    assert by_name["a"]["nextGenerationId"] is None and by_name["a"]["readers"] == []
    assert not by_name["auto"]["isManual"] and unes(by_name["auto"]["nextGenerationId"]) == bytes(7) + b"\x01"
    readers = {r["readerName"]: r for r in by_name["c"]["readers"]}
    assert readers["from_a"]["target"] == "a" and readers["from_a"]["targetIsCollection"]
    assert readers["from_a"]["generationId"] is None and readers["from_a"]["lagGenerations"] == 2
    assert readers["pos"]["lagGenerations"] is None and not readers["pos"]["targetIsCollection"]
    assert answer["storeSizeBytes"] > 0


def test_generations_newest_first(live: Live) -> None:
    live.ok("POST", "/collections/", {"collectionName": "m", "isManual": True})
    for g in ("g1", "g2", "g3"):
        _commit(live, "m", g)
    live.ok("POST", "/collections/m/generation/start", {"generationId": es("g4")})  # open: not listed
    items = live.ok("GET", "/collections/m/generations", params={"limit": 2})["items"]
    assert [unes(i["generationId"]) for i in items] == [b"g3", b"g2"]
    every = live.ok("GET", "/collections/m/generations/")["items"]
    assert [unes(i["generationId"]) for i in every] == [b"g3", b"g2", b"g1", b""]


def test_generations_bad_input(live: Live) -> None:
    live.ok("POST", "/collections/", {"collectionName": "m", "isManual": True})
    _commit(live, "m", "g1")
    live.fail("GET", "/collections/nope/generations", status=404, code="noSuchCollection")
    live.fail("GET", "/collections/m/generations", status=400, code="invalidRequest", params={"limit": 0})
    live.fail("GET", "/collections/m/generations", status=400, code="invalidRequest", params={"limit": "x"})
    live.fail("POST", "/overview", status=405, code="methodNotAllowed")
    items = live.ok("GET", "/collections/m/generations")["items"]
    assert [unes(i["generationId"]) for i in items] == [b"g1", b""]


def test_console_shell_is_open_and_the_api_is_not(tmp_path: Path) -> None:
    with live_server(tmp_path / "data", ServerConfig(token="tok")) as live:
        with httpx.Client(base_url=live.url) as bare:
            for path in ("/ui/", "/ui/app.js", "/ui/app.css", "/docs", "/openapi.json"):  # no data in them
                response = bare.get(path)
                assert response.status_code == 200, path
            assert bare.get("/ui", follow_redirects=False).headers["location"] == "/ui/"
            assert bare.get("/", follow_redirects=False).headers["location"] == "/ui/"
            for path in ("/overview", "/collections/", "/metrics"):
                refused = bare.get(path)
                assert refused.status_code == 401 and refused.json()["error"] == "unauthorized", path
            assert bare.get("/ui/../collections/").status_code in (401, 404)
            assert bare.get("/ui/nothing.js").status_code == 404
        assert live.ok("GET", "/overview")["collections"] == []


def test_overview_changes_is_a_long_poll(live: Live) -> None:
    first = live.ok("GET", "/overview/changes")["version"]
    # nothing changes: the same version comes back at the timeout
    assert live.ok("GET", "/overview/changes", params={"since": first, "timeoutMs": 50})["version"] == first
    answers: list[str] = []
    thread = threading.Thread(
        target=lambda: answers.append(
            live.ok("GET", "/overview/changes", params={"since": first, "timeoutMs": 30000})["version"]
        )
    )
    thread.start()
    try:
        live.ok("POST", "/collections/", {"collectionName": "new", "isManual": True})
        wait_until(lambda: bool(answers), timeout=10, what="the long poll to answer the change")
    finally:
        thread.join(timeout=30)
    assert answers[0] != first
    # a reader moving changes it too, with no commit
    live.ok("POST", "/collections/new/readers/", {"readerName": "r", "collectionName": "new"})
    assert (
        live.ok("GET", "/overview/changes", params={"since": answers[0], "timeoutMs": 5000})["version"]
        != answers[0]
    )
    live.fail("GET", "/overview/changes", status=400, code="invalidRequest", params={"timeoutMs": 60001})
    live.fail("GET", "/overview/changes", status=400, code="invalidRequest", params={"timeoutMs": -1})


def test_generations_page_back_with_before(live: Live) -> None:
    live.ok("POST", "/collections/", {"collectionName": "m", "isManual": True})
    for g in ("g1", "g2", "g3"):
        _commit(live, "m", g)
    first = live.ok("GET", "/collections/m/generations", params={"limit": 2})
    assert [unes(i["generationId"]) for i in first["items"]] == [b"g3", b"g2"]
    assert unes(first["nextBefore"]) == b"g2"
    rest = live.ok("GET", "/collections/m/generations", params={"limit": 2, "before": "g2"})
    assert [unes(i["generationId"]) for i in rest["items"]] == [b"g1", b""] and "nextBefore" not in rest
    encoded = live.ok(
        "GET", "/collections/m/generations", params={"before": "ZzI=", "beforeEncoding": "base64"}
    )
    assert [unes(i["generationId"]) for i in encoded["items"]] == [b"g1", b""]
