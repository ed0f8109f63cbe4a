"""``GET /collections/{c}/refs?ref=TEXT`` over HTTP: every form of ref, and each bad one refused with its
status and code, nothing changed."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest

from .conftest import Live, es, unes


def _commit(live: Live, name: str, generation: str, keys: list[str]) -> None:
    live.ok("POST", f"/collections/{name}/generation/start", {"generationId": es(generation)})
    items = [{"key": es(k), "value": es(generation)} for k in keys]
    live.ok("POST", f"/collections/{name}/putMany", {"items": items, "generationId": es(generation)})
    live.ok("POST", f"/collections/{name}/generation/commit", {"generationId": es(generation)})


def _ref(live: Live, ref: str, name: str = "m") -> tuple[bytes | None, Any]:
    answer = live.ok("GET", f"/collections/{name}/refs", params={"ref": ref})
    assert set(answer) == {"generationId", "committedAtMs"}
    return unes(answer["generationId"]), answer["committedAtMs"]


def _instant(at_ms: int) -> datetime:
    """``at_ms`` exactly (no float rounding to the ms below)."""
    return datetime.fromtimestamp(at_ms // 1000, UTC) + timedelta(milliseconds=at_ms % 1000)


def _iso(at_ms: int) -> str:
    return "@" + _instant(at_ms).isoformat(timespec="milliseconds")


@pytest.fixture
def history(live: Live) -> dict[str, int]:
    """m: g1, g2, g3 committed (g4 open); n (at g1) and o (at g3) each own a reader r of m, o one named
    only, m a self-reader self/er (at g2); the commit times."""
    live.ok("POST", "/collections/", {"collectionName": "m", "isManual": True})
    for g in ("g1", "g2", "g3"):
        _commit(live, "m", g, ["a", g])
    live.ok("POST", "/collections/m/generation/start", {"generationId": es("g4")})
    for owner in ("n", "o"):
        live.ok("POST", "/collections/", {"collectionName": owner, "isManual": True})
    for owner, reader, at in (
        ("n", "r", "g1"),
        ("o", "r", "g3"),
        ("o", "only", "g3"),
        ("m", "self/er", "g2"),
    ):
        body = {"readerName": reader, "collectionName": "m", "generationId": es(at)}
        live.ok("POST", f"/collections/{owner}/readers/", body)
    items = live.ok("GET", "/collections/m/generations")["items"]
    return {unes(i["generationId"]).decode(): i["committedAtMs"] for i in items[:3]}  # type: ignore[union-attr]


def test_each_form_names_its_generation(live: Live, history: dict[str, int]) -> None:
    assert _ref(live, "@current") == (b"g3", history["g3"])
    assert _ref(live, "~0") == (b"g3", history["g3"])
    assert _ref(live, "~2") == (b"g1", history["g1"])
    assert _ref(live, "@open") == (b"g4", None)
    assert _ref(live, "g2") == (b"g2", history["g2"])
    assert _ref(live, "base64:ZzI=") == (b"g2", history["g2"])
    assert _ref(live, "g25") == (b"g25", None)  # between two committed generations: its SPEC meaning
    assert _ref(live, "@reader:only") == (b"g3", history["g3"])
    assert _ref(live, "@reader:n/r") == (b"g1", history["g1"])
    assert _ref(live, "@reader:o/r") == (b"g3", history["g3"])
    assert _ref(live, "@reader:m/self/er") == (b"g2", history["g2"])  # a self-reader, a name with '/'
    for g, at in history.items():  # the newest generation committed at or before (two may share a ms)
        newest = max(name for name, other in history.items() if other <= at)
        assert _ref(live, _iso(at)) == (newest.encode(), at)
        with_offset = _instant(at).astimezone(timezone(timedelta(hours=-5)))
        assert _ref(live, "@" + with_offset.isoformat())[0] == newest.encode(), g


GONE = ["m", "g1", "g2", "g3"]


@pytest.mark.parametrize(
    ("ref", "status", "code"),
    [
        ("@nonsense", 400, "invalidRequest"),
        ("~", 400, "invalidRequest"),
        ("~-1", 400, "invalidRequest"),
        ("~x", 400, "invalidRequest"),
        ("@reader:", 400, "invalidRequest"),
        ("@reader:/r", 400, "invalidRequest"),
        ("@reader:r", 400, "invalidRequest"),  # two collections own a reader r of m
        ("@2026-11-25T10:00:00", 400, "invalidRequest"),  # no zone
        ("base64:!!", 400, "invalidEncoding"),
        ("x" * 2000, 400, "invalidRequest"),
        ("~4", 404, "noSuchGeneration"),  # g3, g2, g1, "": three commits back at most
        ("zzz", 404, "noSuchGeneration"),  # above the current one, not the open one
        ("@2001-01-01T00:00:00Z", 404, "noSuchGeneration"),  # before the first commit
        ("@reader:nobody", 404, "noSuchReader"),
        ("@reader:n/nobody", 404, "noSuchReader"),
        ("@reader:nocollection/r", 404, "noSuchReader"),
        ("@reader:m/r", 404, "noSuchReader"),  # m owns no reader r
    ],
)
def test_bad_refs_are_refused_and_change_nothing(
    live: Live, history: dict[str, int], ref: str, status: int, code: str
) -> None:
    before = _state(live)
    answer = live.fail("GET", "/collections/m/refs", params={"ref": ref}, status=status, code=code)
    if ref == "@reader:r":
        assert "n, o" in answer["reason"] and "@reader:OWNER/r" in answer["reason"]
    assert _state(live) == before


def _state(live: Live) -> list[Any]:
    """What a ref could have changed: m's generations and data (the open one's too), every reader."""
    return [
        live.ok("GET", "/collections/m/generations")["items"],
        live.ok("GET", "/collections/m")["generationId"],
        live.ok("POST", "/collections/m/query/", {"limit": 100})["items"],
        live.ok("POST", "/collections/m/query/", {"limit": 100, "generationId": es("g4")})["items"],
        *(live.ok("GET", f"/collections/{c}/readers/") for c in ("m", "n", "o")),
    ]


def test_no_open_generation_and_unknown_collection(live: Live, history: dict[str, int]) -> None:
    live.ok("POST", "/collections/m/generation/abort", {"generationId": es("g4")})
    live.fail("GET", "/collections/m/refs", params={"ref": "@open"}, status=404, code="noSuchGeneration")
    live.fail("GET", "/collections/zz/refs", params={"ref": "@current"}, status=404, code="noSuchCollection")
    live.fail("GET", "/collections/m/refs", status=400, code="invalidRequest")  # no ref at all


def test_below_the_readers_minimum_is_gone(live: Live, history: dict[str, int]) -> None:
    # the readers of m move to g2 and g3: g1 is below their minimum, as reads answer
    live.ok("PUT", "/collections/n/readers/r", {"generationId": es("g2")})
    live.fail("GET", "/collections/m/refs", params={"ref": "~2"}, status=410, code="generationCollected")
    live.fail("GET", "/collections/m/refs", params={"ref": "g1"}, status=410, code="generationCollected")
    at_g1 = _iso(history["g1"])
    live.fail("GET", "/collections/m/refs", params={"ref": at_g1}, status=410, code="generationCollected")
    assert _ref(live, "~1") == (b"g2", history["g2"])


def test_time_refs_answer_like_as_of_reads(live: Live, history: dict[str, int]) -> None:
    at = history["g2"] + 1
    read = live.ok("POST", "/collections/m/get", {"key": es("a"), "asOfMs": at})
    assert unes(read["generationId"]) == _ref(live, _iso(at))[0]
