"""Retention over HTTP (SPEC §9): set at create, shown by ``GET /collections/{c}``, changed with
``PUT /collections/{c}/retention``; bad policies are 400s that change nothing; GC keeps what it keeps."""

from __future__ import annotations

from pathlib import Path

import pytest

from diffstore.engine.types import RetentionPolicy, StoreConfig
from tests.engine.util import raw_state, run_background

from .conftest import Live, es, live_server


def _commits(live: Live, name: str, count: int) -> None:
    for number in range(1, count + 1):
        gen = es(f"g{number}")
        live.ok("POST", f"/collections/{name}/generation/start", {"generationId": gen})
        live.ok(
            "POST",
            f"/collections/{name}/putMany",
            {"generationId": gen, "items": [{"key": es("k"), "value": es(f"v{number}")}]},
        )
        live.ok("POST", f"/collections/{name}/generation/commit", {"generationId": gen})


def test_create_with_a_policy_shows_it_and_put_changes_it(live: Live) -> None:
    live.ok(
        "POST",
        "/collections/",
        {
            "collectionName": "c",
            "isManual": True,
            "retention": {"keepMs": 604_800_000, "keepGenerations": 100},
        },
    )
    assert live.ok("GET", "/collections/c") == {
        "isManual": True,
        "generationId": {"value": ""},
        "retention": {"keepMs": 604_800_000, "keepGenerations": 100},
    }
    assert live.ok("GET", "/collections/c?fields=generationId") == {
        "isManual": True,
        "generationId": {"value": ""},
    }
    assert live.ok("GET", "/collections/c/retention") == {
        "retention": {"keepMs": 604_800_000, "keepGenerations": 100}
    }
    assert live.ok("PUT", "/collections/c/retention", {"keepGenerations": 3}) == {
        "retention": {"keepGenerations": 3}
    }
    assert live.ok("GET", "/collections/c")["retention"] == {"keepGenerations": 3}
    assert live.ok("PUT", "/collections/c/retention/", {}) == {"retention": {}}
    assert "retention" not in live.ok("GET", "/collections/c")
    live.ok("POST", "/collections/", {"collectionName": "plain", "isManual": False})
    assert "retention" not in live.ok("GET", "/collections/plain")


@pytest.mark.parametrize(
    "policy",
    [
        {"keepMs": 0},
        {"keepMs": -5},
        {"keepGenerations": 0},
        {"keepGenerations": 1.5},
        {"keepGenerations": "7"},
        {"keepMs": True},
        {"keepMs": 1 << 53},
        [],
        "7d",
    ],
)
def test_bad_policies_are_invalid_requests_that_change_nothing(live: Live, policy: object) -> None:
    live.ok(
        "POST",
        "/collections/",
        {"collectionName": "c", "isManual": True, "retention": {"keepGenerations": 2}},
    )
    before = raw_state(live.store)
    live.fail("PUT", "/collections/c/retention", policy, status=400, code="invalidRequest")
    live.fail(
        "POST",
        "/collections/",
        {"collectionName": "d", "isManual": True, "retention": policy},
        status=400,
        code="invalidRequest",
    )
    assert raw_state(live.store) == before
    assert live.ok("GET", "/collections/c")["retention"] == {"keepGenerations": 2}


def test_retention_of_a_missing_collection_is_not_found(live: Live) -> None:
    live.fail(
        "PUT", "/collections/nope/retention", {"keepGenerations": 2}, status=404, code="noSuchCollection"
    )
    live.fail("GET", "/collections/nope/retention", status=404, code="noSuchCollection")


def test_kept_generations_stay_readable_and_the_history_marks_the_rest(live: Live) -> None:
    live.ok(
        "POST",
        "/collections/",
        {"collectionName": "c", "isManual": True, "retention": {"keepGenerations": 2}},
    )
    _commits(live, "c", 4)
    live.ok("POST", "/collections/c/readers/", {"readerName": "r", "generationId": es("g4")})
    run_background(live.store)
    assert live.ok("POST", "/collections/c/get", {"key": es("k"), "generationId": es("g3")})["item"][
        "value"
    ] == {"value": "v3"}
    live.fail(
        "POST",
        "/collections/c/get",
        {"key": es("k"), "generationId": es("g2")},
        status=410,
        code="generationCollected",
    )
    items = live.ok("GET", "/collections/c/generations")["items"]
    assert [(i["generationId"]["value"], i.get("collected", False)) for i in items] == [
        ("g4", False),
        ("g3", False),
        ("g2", True),
        ("g1", True),
        ("", True),
    ]


def test_the_server_default_applies_to_collections_created_without_one(tmp_path: Path) -> None:
    config = StoreConfig(commit_delay_ms=20, default_retention=RetentionPolicy(keep_ms=86_400_000))
    with live_server(tmp_path / "data", store_config=config) as live:
        live.ok("POST", "/collections/", {"collectionName": "a", "isManual": True})
        live.ok("POST", "/collections/", {"collectionName": "b", "isManual": True, "retention": {}})
        assert live.ok("GET", "/collections/a")["retention"] == {"keepMs": 86_400_000}
        assert "retention" not in live.ok("GET", "/collections/b")
