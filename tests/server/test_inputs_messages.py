"""Inputs refused as reads there are, and messages in the one text form (issue 48 §3), over a real server.

Each refusal is checked for its status, its code, and that the stored data did not change.
"""

from __future__ import annotations

from typing import Any

import pytest

from diffstore.engine.store import Store

from .conftest import Live, es


def _state(store: Store) -> Any:
    """What a refused request must leave as it was: every collection's readers and generations."""
    return {
        info.name: (store.collection(info.name).readers(), store.collection(info.name).generation_state())
        for info in store.collections()
    }


def _commit(live: Live, collection: str, generation: str) -> None:
    live.ok("POST", f"/collections/{collection}/generation/start", {"generationId": es(generation)})
    live.ok(
        "POST",
        f"/collections/{collection}/put",
        {"item": {"key": es("k"), "value": es(generation)}, "generationId": es(generation)},
    )
    live.ok("POST", f"/collections/{collection}/generation/commit", {"generationId": es(generation)})


@pytest.fixture
def history(live: Live) -> Live:
    """Manual collections ``m`` (at g3) and ``c`` (no commit yet)."""
    live.ok("POST", "/collections/", {"collectionName": "m", "isManual": True})
    live.ok("POST", "/collections/", {"collectionName": "c", "isManual": True})
    for generation in ("g1", "g2", "g3"):
        _commit(live, "m", generation)
    return live


def test_a_reader_of_an_unknown_collection_is_refused(history: Live) -> None:
    before = _state(history.store)
    answer = history.fail(
        "POST",
        "/collections/c/readers/",
        {"readerName": "r", "collectionName": "TYPO"},
        status=404,
        code="noSuchCollection",
    )
    assert "TYPO" in answer["reason"] and "hstream://" in answer["reason"]
    assert _state(history.store) == before
    # a stream target is no collection and stays fine; so does a reader of an existing collection
    history.ok("POST", "/collections/c/readers/", {"readerName": "s", "collectionName": "hstream://events"})
    history.ok("POST", "/collections/c/readers/", {"readerName": "r", "collectionName": "m"})
    assert [(r.name, r.collection) for r in history.store.collection("c").readers()] == [
        ("r", "m"),
        ("s", "hstream://events"),
    ]


@pytest.mark.parametrize(("target", "generation"), [("m", "zz"), ("m", "g4"), ("c", "9"), ("c", "zz")])
def test_a_reader_above_the_current_generation_is_refused_as_a_read_there(
    history: Live, target: str, generation: str
) -> None:
    read = history.fail(
        "POST",
        f"/collections/{target}/query/",
        {"generationId": es(generation)},
        status=404,
        code="noSuchGeneration",
    )
    before = _state(history.store)
    created = history.fail(
        "POST",
        "/collections/c/readers/",
        {"readerName": "r", "collectionName": target, "generationId": es(generation)},
        status=404,
        code="noSuchGeneration",
    )
    assert created["reason"] == read["reason"]
    history.fail(
        "POST",
        f"/collections/{target}/readers/",
        {"readerName": "self", "generationId": es(generation)},
        status=404,
        code="noSuchGeneration",
    )
    assert _state(history.store) == before


def test_a_reader_at_a_readable_generation_is_created(history: Live) -> None:
    """At the current generation, below it, and at the open one (readable, as a read there)."""
    for name, generation in (("b", ""), ("q", "g1"), ("r", "g3")):  # b first: nothing is collected
        body = {"readerName": name, "collectionName": "m", "generationId": es(generation)}
        history.ok("POST", "/collections/c/readers/", body)
    history.ok("POST", "/collections/m/generation/start", {"generationId": es("g4")})
    history.ok(
        "POST",
        "/collections/c/readers/",
        {"readerName": "o", "collectionName": "m", "generationId": es("g4")},
    )
    positions = {r.name: r.generation_id for r in history.store.collection("c").readers()}
    assert positions == {"b": None, "o": b"g4", "q": b"g1", "r": b"g3"}


def test_bad_version_names_generations_in_their_text_form(history: Live) -> None:
    history.ok(
        "POST",
        "/collections/c/readers/",
        {"readerName": "r", "collectionName": "m", "generationId": es("g3")},
    )
    before = _state(history.store)
    answer = history.fail(
        "PUT",
        "/collections/c/readers/r",
        {"generationId": es("g2"), "expectedGenerationId": es(b"\x00\xff")},
        status=409,
        code="badVersion",
    )
    assert answer["reason"] == "reader 'r' is at g3, expected base64:AP8="
    answer = history.fail(
        "PUT",
        "/collections/c/readers/r",
        {"generationId": es("g2"), "expectedGenerationId": None},
        status=409,
        code="badVersion",
    )
    assert answer["reason"] == "reader 'r' is at g3, expected the beginning (null)"
    assert "b'" not in answer["reason"]
    assert _state(history.store) == before


def test_an_id_that_sorts_below_as_bytes_hints_at_zero_padding(history: Live) -> None:
    before = _state(history.store)
    answer = history.fail(
        "POST",
        "/collections/m/generation/start",
        {"generationId": es("g10")},
        status=409,
        code="outdatedGeneration",
    )
    assert answer["reason"].startswith("generation g10 is not above the current generation g3: ")
    assert "bytewise" in answer["reason"] and "zero-pad" in answer["reason"] and "g010" in answer["reason"]
    # a plain outdated id gets no such hint: it is below as a number too
    plain = history.fail(
        "POST",
        "/collections/m/generation/start",
        {"generationId": es("g2")},
        status=409,
        code="outdatedGeneration",
    )
    assert plain["reason"] == "generation g2 is not above the current generation g3"
    assert _state(history.store) == before


@pytest.mark.parametrize("at_ms", [10**15, 2**63 - 1])
def test_a_future_instant_reads_the_current_generation_as_ref_and_as_as_of_ms(
    history: Live, at_ms: int
) -> None:
    by_instant = history.ok("POST", "/collections/m/get", {"key": es("k"), "asOfMs": at_ms})
    by_ref = history.ok("GET", "/collections/m/refs", params={"ref": "@9999-12-31T23:59:59Z"})
    assert by_instant["generationId"] == by_ref["generationId"] == {"value": "g3"}
    assert by_instant["item"]["value"] == {"value": "g3"}
