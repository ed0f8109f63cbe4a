"""The API's invalidRequest reasons name a field as the user sent it (``depth``, ``items[0].value``), never
where the server found it (``body.depth``, ``query.limit``) — issue 29 — and change nothing."""

from __future__ import annotations

from typing import Any

import pytest

from .conftest import Live, es

BAD: list[tuple[str, str, dict[str, Any], str]] = [
    ("POST", "/collections/C/lineage", {"json": {"generationId": es("1"), "depth": "deep"}}, "depth: "),
    ("POST", "/collections/C/lineage", {"json": {"depth": 1}}, "generationId: missing"),
    ("POST", "/collections/C/get", {"json": {"key": 5}}, "key: "),
    ("POST", "/collections/C/getMany", {"json": {"keys": [{"value": 1}]}}, "keys[].value: "),
    ("POST", "/collections/C/query", {"json": {"limit": -1}}, "limit: "),
    ("GET", "/collections/C/generations", {"params": {"limit": "x"}}, "limit: "),
    ("POST", "/collections/C/putMany", {"json": {"items": [{"key": es("k")}]}}, "items[0].value: missing"),
    ("POST", "/collections/C/put", {"json": {"item": {"key": 1, "value": None}}}, "item.key: "),
    ("POST", "/collections/C/generation/commit", {"json": {"generationId": es("1"), "updateReaders": [{}]}},
     "updateReaders[0].readerName: missing"),
    ("POST", "/collections/", {"json": [1, 2]}, "the request body: expected an object"),
]  # fmt: skip


@pytest.mark.parametrize(("method", "path", "request_args", "starts"), BAD, ids=[b[3] for b in BAD])
def test_a_bad_field_is_named_as_sent(
    live: Live, method: str, path: str, request_args: dict[str, Any], starts: str
) -> None:
    c = live.store.create_collection("C", manual=True)
    c.start_generation(b"1")
    c.put(b"k", b"v", generation_id=b"1")
    answer = live.fail(method, path, status=400, code="invalidRequest", **request_args)
    assert answer["reason"].startswith(starts), answer
    assert "body" not in answer["reason"].replace("request body", "") and "query." not in answer["reason"]
    assert c.generation_state() == (b"", b"1") and [r.key for r in c.query(generation_id=b"1")] == [b"k"]
