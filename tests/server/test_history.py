"""SPEC §8 over HTTP: commit time, changed keys and metadata of each generation; reads at unknown
generations answer 404 noSuchGeneration."""

from __future__ import annotations

import time
from typing import Any

import pytest

from tests.helpers import wait_until

from .conftest import Live, es, unes


def _generations(live: Live, name: str, **params: Any) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = live.ok("GET", f"/collections/{name}/generations", params=params)["items"]
    return items


def _write(live: Live, name: str, generation: str, keys: list[str], **commit: Any) -> None:
    live.ok("POST", f"/collections/{name}/generation/start", {"generationId": es(generation)})
    items = [{"key": es(k), "value": es("v")} for k in keys]
    live.ok("POST", f"/collections/{name}/putMany", {"items": items, "generationId": es(generation)})
    live.ok("POST", f"/collections/{name}/generation/commit", {"generationId": es(generation), **commit})


def test_commit_records_time_changed_keys_and_metadata(live: Live) -> None:
    live.ok("POST", "/collections/", {"collectionName": "m", "isManual": True})
    before_ms = int(time.time() * 1000)
    _write(live, "m", "g1", ["a", "b", "a"], metadata={"job": "nightly", "run": "42"})
    _write(live, "m", "g2", ["c"])
    after_ms = int(time.time() * 1000)
    g2, g1, initial = _generations(live, "m")
    assert unes(g2["generationId"]) == b"g2" and g2["changedKeys"] == 1 and g2["metadata"] is None
    assert unes(g1["generationId"]) == b"g1" and g1["changedKeys"] == 2
    assert g1["metadata"] == {"job": "nightly", "run": "42"}
    assert before_ms <= g1["committedAtMs"] <= g2["committedAtMs"] <= after_ms
    # the initial generation was never committed: nothing is known of it
    assert initial == {"generationId": es(""), "committedAtMs": None, "changedKeys": None, "metadata": None}


def test_automatic_commits_are_recorded(live: Live) -> None:
    live.ok("POST", "/collections/", {"collectionName": "auto", "isManual": False})
    items = [{"key": es(k), "value": es("v")} for k in ("x", "y", "z")]
    live.ok("POST", "/collections/auto/putMany", {"items": items})
    wait_until(lambda: _generations(live, "auto")[0]["changedKeys"] == 3)
    newest = _generations(live, "auto")[0]
    assert newest["committedAtMs"] is not None and newest["metadata"] is None


@pytest.mark.parametrize(
    "metadata",
    [
        {"big": "x" * 4096},  # over 4 KiB encoded
        {"n": 1},  # not a string
        {"nested": {"a": "b"}},
        ["a", "b"],  # not a map
        "text",
    ],
)
def test_bad_metadata_commits_nothing(live: Live, metadata: Any) -> None:
    live.ok("POST", "/collections/", {"collectionName": "m", "isManual": True})
    live.ok("POST", "/collections/m/generation/start", {"generationId": es("g1")})
    live.ok(
        "POST", "/collections/m/put", {"item": {"key": es("k"), "value": es("v")}, "generationId": es("g1")}
    )
    live.fail(
        "POST",
        "/collections/m/generation/commit",
        {"generationId": es("g1"), "metadata": metadata},
        status=400,
        code="invalidRequest",
    )
    info = live.ok("GET", "/collections/m")
    assert unes(info["generationId"]) == b"" and unes(info["nextGenerationId"]) == b"g1"
    assert [unes(i["generationId"]) for i in _generations(live, "m")] == [b""]
    # the generation is still open and commits with good metadata
    live.ok("POST", "/collections/m/generation/commit", {"generationId": es("g1"), "metadata": {"a": "b"}})
    assert _generations(live, "m")[0]["metadata"] == {"a": "b"}


def test_metadata_at_the_limit_is_kept(live: Live) -> None:
    live.ok("POST", "/collections/", {"collectionName": "m", "isManual": True})
    metadata = {"k": "x" * (4096 - len('{"k":""}'))}
    _write(live, "m", "g1", ["a"], metadata=metadata)
    assert _generations(live, "m")[0]["metadata"] == metadata


def test_generations_bad_input(live: Live) -> None:
    live.ok("POST", "/collections/", {"collectionName": "m", "isManual": True})
    _write(live, "m", "g1", ["a"])
    for params in (
        {"limit": 0},
        {"limit": 1001},
        {"limit": "x"},
        {"beforeEncoding": "hex"},
    ):
        live.fail("GET", "/collections/m/generations", status=400, code="invalidRequest", params=params)
    bad = {"before": "*", "beforeEncoding": "base64"}
    live.fail("GET", "/collections/m/generations", status=400, code="invalidEncoding", params=bad)
    live.fail("GET", "/collections/nope/generations", status=404, code="noSuchCollection")
    assert [unes(i["generationId"]) for i in _generations(live, "m")] == [b"g1", b""]


def test_reads_at_an_unknown_generation_answer_404(live: Live) -> None:
    live.ok("POST", "/collections/", {"collectionName": "m", "isManual": True})
    _write(live, "m", "g1", ["a"])
    _write(live, "m", "g3", ["b"])
    live.ok("POST", "/collections/m/generation/start", {"generationId": es("g5")})
    reads: list[tuple[str, dict[str, Any]]] = [
        ("get", {"key": es("a")}),
        ("getMany", {"keys": [es("a")]}),
        ("query/", {}),
        ("getKeysAround", {"key": es("a"), "requireKeyExistance": False, "limit": 2}),
    ]
    for route, body in reads:
        for unknown in ("g4", "g9", "nosuchgen"):
            live.fail(
                "POST",
                f"/collections/m/{route}",
                {**body, "generationId": es(unknown)},
                status=404,
                code="noSuchGeneration",
            )
        # between two committed generations, and the open one: as before
        live.ok("POST", f"/collections/m/{route}", {**body, "generationId": es("g2")})
        live.ok("POST", f"/collections/m/{route}", {**body, "generationId": es("g5")})
    live.fail(
        "POST",
        "/collections/m/diff/",
        {"fromGenerationId": es(""), "toGenerationId": es("g9")},
        status=404,
        code="noSuchGeneration",
    )
    got = live.ok("POST", "/collections/m/get", {"key": es("a"), "generationId": es("g2")})
    assert unes(got["item"]["value"]) == b"v"


def test_reads_as_of_an_instant(live: Live) -> None:
    live.ok("POST", "/collections/", {"collectionName": "m", "isManual": True})
    _write(live, "m", "g1", ["a"])
    g1_ms = _generations(live, "m")[0]["committedAtMs"]
    wait_until(lambda: int(time.time() * 1000) > g1_ms + 1)
    live.ok("POST", "/collections/m/generation/start", {"generationId": es("g2")})
    live.ok(
        "POST", "/collections/m/put", {"item": {"key": es("a"), "value": es("new")}, "generationId": es("g2")}
    )
    live.ok("POST", "/collections/m/generation/commit", {"generationId": es("g2")})
    g2_ms = _generations(live, "m")[0]["committedAtMs"]
    assert g2_ms > g1_ms
    at_g1 = live.ok("POST", "/collections/m/get", {"key": es("a"), "asOfMs": g2_ms - 1})
    assert unes(at_g1["item"]["value"]) == b"v" and unes(at_g1["generationId"]) == b"g1"
    at_g2 = live.ok("POST", "/collections/m/query/", {"asOfMs": g2_ms})
    assert unes(at_g2["generationId"]) == b"g2"
    around = {"key": es("a"), "requireKeyExistance": False, "limit": 2, "asOfMs": g1_ms}
    assert live.ok("POST", "/collections/m/getKeysAround", around)["foundKey"]
    many = live.ok("POST", "/collections/m/getMany", {"keys": [es("a")], "asOfMs": g1_ms})
    assert unes(many["generationId"]) == b"g1"
    # before the first commit: none; both ways of naming a generation: refused
    live.fail(
        "POST",
        "/collections/m/get",
        {"key": es("a"), "asOfMs": g1_ms - 1},
        status=404,
        code="noSuchGeneration",
    )
    both = {"key": es("a"), "asOfMs": g1_ms, "generationId": es("g1")}
    live.fail("POST", "/collections/m/get", both, status=400, code="invalidRequest")
    live.fail("POST", "/collections/m/get", {"key": es("a"), "asOfMs": -1}, status=400, code="invalidRequest")


def test_diff_between_instants(live: Live) -> None:
    live.ok("POST", "/collections/", {"collectionName": "m", "isManual": True})
    _write(live, "m", "g1", ["a"])
    g1_ms = _generations(live, "m")[0]["committedAtMs"]
    wait_until(lambda: int(time.time() * 1000) > g1_ms + 1)
    _write(live, "m", "g2", ["b"])
    g2_ms = _generations(live, "m")[0]["committedAtMs"]
    page = live.ok("POST", "/collections/m/diff/", {"fromAsOfMs": g1_ms, "toAsOfMs": g2_ms})
    assert [unes(i["key"]) for i in page["items"]] == [b"b"] and unes(page["toGenerationId"]) == b"g2"
    page = live.ok("POST", "/collections/m/diff/", {"fromAsOfMs": g1_ms, "toAsOfMs": g2_ms - 1})
    assert page["items"] == []
    live.fail("POST", "/collections/m/diff/", {"fromAsOfMs": g1_ms - 1}, status=404, code="noSuchGeneration")
    both = {"fromAsOfMs": g1_ms, "fromGenerationId": es("g1")}
    live.fail("POST", "/collections/m/diff/", both, status=400, code="invalidRequest")
    both = {"fromAsOfMs": g1_ms, "toAsOfMs": g2_ms, "toGenerationId": es("g1")}
    live.fail("POST", "/collections/m/diff/", both, status=400, code="invalidRequest")
