"""``POST /collections/{c}/lineage`` over a real server: shapes (JSON and msgpack), the walk, bad requests."""

from __future__ import annotations

import base64
from typing import Any

import msgpack
import pytest

from tests.engine.util import raw_state, run_background

from .conftest import Live, es

STREAM = "hstream://events"
SHARD = "hstream/sub/0"
RECORD_1 = (1).to_bytes(8, "big") + bytes(4)
RECORD_2 = (2).to_bytes(8, "big") + bytes(4)


def b64(data: bytes) -> dict[str, str]:
    """How an answer encodes bytes that are not printable ASCII."""
    return {"value": base64.b64encode(data).decode(), "encoding": "base64"}


def _commit(live: Live, name: str, generation: str, updates: list[tuple[str, bytes]]) -> None:
    live.ok("POST", f"/collections/{name}/generation/start", {"generationId": es(generation)})
    live.ok(
        "POST",
        f"/collections/{name}/putMany",
        {"items": [{"key": es("k"), "value": es(generation)}], "generationId": es(generation)},
    )
    body = {
        "generationId": es(generation),
        "updateReaders": [{"readerName": r, "generationId": es(g)} for r, g in updates],
    }
    live.ok("POST", f"/collections/{name}/generation/commit", body)


def _pipeline(live: Live) -> None:
    """A ingested from a stream in two windows; C read A once (through the HTTP API only)."""
    for name in ("A", "C"):
        live.ok("POST", "/collections/", {"collectionName": name, "isManual": True})
    live.ok("POST", "/collections/A/readers/", {"readerName": SHARD, "collectionName": STREAM})
    live.ok("POST", "/collections/C/readers/", {"readerName": "from_a", "collectionName": "A"})
    live.ok("POST", "/collections/C/readers/", {"readerName": "keep_a", "collectionName": "A"})
    _commit(live, "A", "a1", [(SHARD, RECORD_1)])
    _commit(live, "A", "a2", [(SHARD, RECORD_2)])
    _commit(live, "C", "c1", [("from_a", b"a2")])


def test_lineage_json_shape_and_walk(live: Live) -> None:
    _pipeline(live)
    assert live.ok("POST", "/collections/C/lineage", {"generationId": es("c1")}) == {
        "generationId": {"value": "c1"},
        "sources": [
            {
                "readerName": "from_a",
                "collectionName": "A",
                "fromGenerationId": None,
                "toGenerationId": {"value": "a2"},
            }
        ],
    }
    walked = live.ok("POST", "/collections/C/lineage/", {"generationId": es("c1"), "depth": 2})
    assert walked["sources"][0]["sources"] == [
        {
            "readerName": SHARD,
            "collectionName": None,
            "target": STREAM,
            "fromGenerationId": None,
            "toGenerationId": b64(RECORD_2),
        }
    ]
    assert live.ok("POST", "/collections/A/lineage", {"generationId": es("a2")})["sources"] == [
        {
            "readerName": SHARD,
            "collectionName": None,
            "target": STREAM,
            "fromGenerationId": b64(RECORD_1),
            "toGenerationId": b64(RECORD_2),
        }
    ]


def test_lineage_msgpack(live: Live) -> None:
    _pipeline(live)
    response = live.call(
        "POST",
        "/collections/C/lineage",
        content=msgpack.packb({"generationId": b"c1", "depth": 3}),
        headers={"content-type": "application/msgpack", "accept": "application/msgpack"},
    )
    assert response.status_code == 200, response.text
    answer = msgpack.unpackb(response.content)
    assert answer["generationId"] == b"c1"
    assert answer["sources"][0]["toGenerationId"] == b"a2"
    assert answer["sources"][0]["sources"][0]["toGenerationId"] == RECORD_2


def test_a_collected_generation_answers_410(live: Live) -> None:
    _pipeline(live)
    live.ok("POST", "/collections/C/readers/", {"readerName": "self", "generationId": es("c1")})
    _commit(live, "C", "c2", [("from_a", b"a2"), ("self", b"c2")])
    run_background(live.store)
    live.fail(
        "POST", "/collections/C/lineage", {"generationId": es("c1")}, status=410, code="generationCollected"
    )
    assert live.ok("POST", "/collections/C/lineage", {"generationId": es("c2")})["sources"][0][
        "readerName"
    ] == ("from_a")


@pytest.mark.parametrize(
    ("body", "status", "code"),
    [
        ({}, 400, "invalidRequest"),
        ({"generationId": es("c1"), "depth": 0}, 400, "invalidRequest"),
        ({"generationId": es("c1"), "depth": 11}, 400, "invalidRequest"),
        ({"generationId": es("c1"), "depth": "2"}, 400, "invalidRequest"),
        ({"generationId": es("c1"), "depth": True}, 400, "invalidRequest"),
        ({"generationId": es("c1"), "depth": 1.5}, 400, "invalidRequest"),
        ({"generationId": {"value": "!", "encoding": "base64"}}, 400, "invalidEncoding"),
        ({"generationId": "c1"}, 400, "invalidRequest"),
        ({"generationId": es("c9")}, 400, "invalidRequest"),  # not a generation of C
        ({"generationId": es("a1")}, 400, "invalidRequest"),
        (None, 400, "invalidRequest"),
        ([], 400, "invalidRequest"),
    ],
)
def test_bad_requests_change_nothing(live: Live, body: Any, status: int, code: str) -> None:
    _pipeline(live)
    before = raw_state(live.store)
    if body is None:
        response = live.call("POST", "/collections/C/lineage", content=b"null")
        assert response.status_code == status and response.json()["error"] == code
    else:
        live.fail("POST", "/collections/C/lineage", body, status=status, code=code)
    assert raw_state(live.store) == before


def test_unknown_collection_and_bad_json(live: Live) -> None:
    live.fail(
        "POST", "/collections/nope/lineage", {"generationId": es("")}, status=404, code="noSuchCollection"
    )
    response = live.call("POST", "/collections/nope/lineage", content=b"{")
    assert response.status_code == 400 and response.json()["error"] == "invalidJson"


def test_the_route_is_in_the_openapi_schema(live: Live) -> None:
    schema = live.call("GET", "/openapi.json").json()
    operation = schema["paths"]["/collections/{c}/lineage"]["post"]
    assert operation["requestBody"]["content"]["application/json"]["schema"]["$ref"].endswith("/LineageQuery")
    source = schema["components"]["schemas"]["LineageEntry"]
    assert {"readerName", "collectionName", "fromGenerationId", "toGenerationId", "sources"} <= set(
        source["properties"]
    )
