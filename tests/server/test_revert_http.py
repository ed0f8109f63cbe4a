"""SPEC §8 revert over HTTP: ``POST /collections/{c}/revert`` restores a committed state into the open
generation (manual) or the next one (automatic); every refusal has its status and code and changes nothing.
A replica refuses it with 409 readOnlyReplica (tests/replica/test_read_only.py)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.helpers import wait_until

from .conftest import Live, es, unes


def _commit(live: Live, name: str, generation: str, items: dict[str, str | None]) -> None:
    live.ok("POST", f"/collections/{name}/generation/start", {"generationId": es(generation)})
    body = [{"key": es(k), "value": None if v is None else es(v)} for k, v in items.items()]
    live.ok("POST", f"/collections/{name}/putMany", {"items": body, "generationId": es(generation)})
    live.ok("POST", f"/collections/{name}/generation/commit", {"generationId": es(generation)})


def _rows(live: Live, name: str, generation: str | None = None) -> dict[bytes, bytes]:
    body = {} if generation is None else {"generationId": es(generation)}
    items = live.ok("POST", f"/collections/{name}/query/", body)["items"]
    return {unes(i["key"]): unes(i["value"]) for i in items}  # type: ignore[misc]


def _snapshot(live: Live, name: str) -> Any:
    """Everything a revert could change: the lifecycle, the open generation's rows, the history."""
    info = live.ok("GET", f"/collections/{name}")
    open_rows = (
        _rows(live, name, unes(info["nextGenerationId"]).decode()) if "nextGenerationId" in info else None
    )
    return info, open_rows, live.ok("GET", f"/collections/{name}/generations")


@pytest.fixture
def manual(live: Live) -> Live:
    """Collection m: "" -> 1 {a:1, b:1} -> 2 {a:2, b deleted, c:2}, generation 3 open with {d:3}."""
    live.ok("POST", "/collections/", {"collectionName": "m", "isManual": True})
    _commit(live, "m", "1", {"a": "1", "b": "1"})
    _commit(live, "m", "2", {"a": "2", "b": None, "c": "2"})
    live.ok("POST", "/collections/m/generation/start", {"generationId": es("3")})
    live.ok(
        "POST", "/collections/m/put", {"item": {"key": es("d"), "value": es("3")}, "generationId": es("3")}
    )
    return live


def test_revert_a_manual_collection(manual: Live) -> None:
    live = manual
    answer = live.ok("POST", "/collections/m/revert", {"toGenerationId": es("1"), "generationId": es("3")})
    assert answer == {"generationId": es("3"), "changedKeys": 4}  # a, b, c and the open write d
    assert _rows(live, "m", "3") == _rows(live, "m", "1") == {b"a": b"1", b"b": b"1"}
    assert _rows(live, "m") == {b"a": b"2", b"c": b"2"}  # nothing committed yet
    live.ok(
        "POST", "/collections/m/generation/commit", {"generationId": es("3"), "metadata": {"revert": "1"}}
    )
    assert _rows(live, "m") == {b"a": b"1", b"b": b"1"}
    newest = live.ok("GET", "/collections/m/generations")["items"][0]
    # changedKeys of a commit counts the keys the generation wrote: d was written, then restored to absent
    assert (newest["generationId"], newest["changedKeys"], newest["metadata"]) == (
        es("3"),
        4,
        {"revert": "1"},
    )


def test_revert_an_automatic_collection(live: Live) -> None:
    live.ok("POST", "/collections/", {"collectionName": "auto", "isManual": False})
    live.ok("POST", "/collections/auto/putMany", {"items": [{"key": es("a"), "value": es("1")}]})
    wait_until(lambda: _rows(live, "auto") == {b"a": b"1"})
    first = live.ok("GET", "/collections/auto")["generationId"]
    live.ok("POST", "/collections/auto/putMany", {"items": [{"key": es("a"), "value": es("2")}]})
    wait_until(lambda: _rows(live, "auto") == {b"a": b"2"})
    answer = live.ok("POST", "/collections/auto/revert", {"toGenerationId": first})
    assert answer["changedKeys"] == 1
    wait_until(lambda: _rows(live, "auto") == {b"a": b"1"})
    assert live.ok("GET", "/collections/auto")["generationId"] == answer["generationId"]


@pytest.mark.parametrize(
    ("path", "body", "status", "code"),
    [
        ("/collections/nope/revert", {"toGenerationId": es("1")}, 404, "noSuchCollection"),
        (
            "/collections/m/revert",
            {"toGenerationId": es("1x"), "generationId": es("3")},
            404,
            "noSuchGeneration",
        ),
        (
            "/collections/m/revert",
            {"toGenerationId": es("9"), "generationId": es("3")},
            404,
            "noSuchGeneration",
        ),
        (
            "/collections/m/revert",
            {"toGenerationId": es("3"), "generationId": es("3")},
            404,
            "noSuchGeneration",
        ),
        ("/collections/m/revert", {"toGenerationId": 1, "generationId": es("3")}, 400, "invalidRequest"),
        ("/collections/m/revert", {"toGenerationId": es("1"), "generationId": "3"}, 400, "invalidRequest"),
        ("/collections/m/revert", {"generationId": es("3")}, 400, "invalidRequest"),
        ("/collections/m/revert", [], 400, "invalidRequest"),
        ("/collections/m/revert", {"toGenerationId": es("1"), "lease": {"name": 1}}, 400, "invalidRequest"),
        ("/collections/m/revert", {"toGenerationId": es("1")}, 409, "generationMismatch"),  # names none
        (
            "/collections/m/revert",
            {"toGenerationId": es("1"), "generationId": es("4")},
            409,
            "generationMismatch",
        ),
    ],
)
def test_bad_reverts_change_nothing(manual: Live, path: str, body: Any, status: int, code: str) -> None:
    before = _snapshot(manual, "m")
    manual.fail("POST", path, body, status=status, code=code)
    assert _snapshot(manual, "m") == before


def test_revert_without_an_open_generation_is_refused(manual: Live) -> None:
    live = manual
    live.ok("POST", "/collections/m/generation/commit", {"generationId": es("3")})
    before = _snapshot(live, "m")
    body = {"toGenerationId": es("1"), "generationId": es("4")}
    live.fail("POST", "/collections/m/revert", body, status=409, code="generationMismatch")
    assert _snapshot(live, "m") == before


def test_revert_below_the_readers_minimum_is_collected(manual: Live) -> None:
    live = manual
    live.ok("POST", "/collections/m/readers/", {"readerName": "r", "generationId": es("2")})
    before = _snapshot(live, "m")
    body = {"toGenerationId": es("1"), "generationId": es("3")}
    live.fail("POST", "/collections/m/revert", body, status=410, code="generationCollected")
    assert _snapshot(live, "m") == before


def test_a_revert_into_a_leased_generation_needs_its_lease(live: Live) -> None:
    live.ok("POST", "/collections/", {"collectionName": "m", "isManual": True})
    _commit(live, "m", "1", {"a": "1"})
    lease = live.ok("POST", "/collections/m/leases/w/acquire", {"owner": "me", "ttlMs": 60_000})
    token = {"name": "w", "version": lease["version"]}
    live.ok("POST", "/collections/m/generation/start", {"generationId": es("2"), "lease": token})
    body = {"item": {"key": es("a"), "value": es("2")}, "generationId": es("2"), "lease": token}
    live.ok("POST", "/collections/m/put", body)
    before = _snapshot(live, "m")
    body = {"toGenerationId": es("1"), "generationId": es("2")}
    live.fail("POST", "/collections/m/revert", body, status=409, code="leaseLost")
    assert _snapshot(live, "m") == before
    answer = live.ok("POST", "/collections/m/revert", body | {"lease": token})
    assert answer == {"generationId": es("2"), "changedKeys": 1}
    assert _rows(live, "m", "2") == {b"a": b"1"}
