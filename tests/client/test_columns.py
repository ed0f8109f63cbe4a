"""The column fast path answers what the object path answers, on both codecs, and parses leniently."""

from __future__ import annotations

import asyncio

import pytest

from diffstore.client import AsyncClient, Client, DiffColumns, GetManyColumns, QueryColumns
from diffstore.client._columns import diff_columns_from_wire, query_columns_from_wire
from diffstore.errors import InvalidRequest
from diffstore.wire import JSON, MSGPACK
from tests.helpers import LiveServer


def _fill(client: Client) -> None:
    c = client.create_collection("K", manual=True)
    c.start_generation(b"1")
    c.put_many([(b"k%02d" % i, b"v%d" % i) for i in range(25)] + [(b"\x00\xff", b"\x01")], generation_id=b"1")
    c.commit_generation(b"1")
    c.start_generation(b"2")
    c.put_many([(b"k%02d" % i, None if i % 3 else b"w") for i in range(0, 25, 2)], generation_id=b"2")
    c.commit_generation(b"2")


def test_query_columns_match_query_pages(client: Client) -> None:
    _fill(client)
    c = client.collection("K")
    for at in (b"1", b"2"):
        expected = [(r.key, r.value) for r in c.query(generation_id=at)]
        got: list[tuple[bytes, bytes]] = []
        page = c.query_page_columns(generation_id=at, limit=7)
        while True:
            assert isinstance(page, QueryColumns) and page.generation_id == at
            got += zip(page.keys, page.values, strict=True)
            if page.cursor is None:
                break
            page = c.query_page_columns(cursor=page.cursor)
        assert got == expected
    ranged = c.query_page_columns(from_key=b"k03", to_key=b"k06")
    assert ranged.keys == [b"k03", b"k05"] and ranged.cursor is None  # k04 was deleted in 2


def test_diff_columns_match_diff_pages(client: Client) -> None:
    _fill(client)
    c = client.collection("K")
    expected = [(d.key, d.from_value, d.to_value) for d in c.diff(b"1", b"2")]
    assert any(row[2] is None for row in expected) and any(row[2] == b"w" for row in expected)
    got: list[tuple[bytes, bytes | None, bytes | None]] = []
    page = c.diff_page_columns(b"1", b"2", limit=4)
    while True:
        assert isinstance(page, DiffColumns)
        assert (page.from_generation_id, page.to_generation_id) == (b"1", b"2")
        got += zip(page.keys, page.from_values, page.to_values, strict=True)
        if page.cursor is None:
            break
        page = c.diff_page_columns(cursor=page.cursor)
    assert got == expected
    from_start = c.diff_page_columns(from_key=b"\x00", to_key=b"k01")
    assert (from_start.keys, from_start.from_values, from_start.to_values) == (
        [b"\x00\xff", b"k00"],
        [None, None],
        [b"\x01", b"w"],
    )


def test_get_many_columns_match_get_many(client: Client) -> None:
    _fill(client)
    c = client.collection("K")
    keys = [b"k02", b"k01", b"none", b"k02", b"\x00\xff"]
    for at in (b"1", b"2", None):
        expected = c.get_many(keys, generation_id=at)
        got = c.get_many_columns(keys, generation_id=at)
        assert isinstance(got, GetManyColumns) and got.generation_id == expected.generation_id
        assert got.values == [None if r is None else r.value for r in expected.records]
        assert got.generation_ids == [None if r is None else r.generation_id for r in expected.records]
    assert c.get_many_columns([], generation_id=b"1").values == []


def test_the_async_handle_has_the_same_column_calls(server: LiveServer) -> None:
    with server.client() as client:
        _fill(client)

    async def read() -> tuple[QueryColumns, DiffColumns]:
        async with AsyncClient(server.url) as client:
            c = await client.collection("K")
            many = await c.get_many_columns([b"k01", b"k00"], generation_id=b"2")
            assert many.values == [b"v1", b"w"]
            return await c.query_page_columns(limit=3), await c.diff_page_columns(b"1", b"2", limit=3)

    query, diff = asyncio.run(read())
    assert query.keys == [b"\x00\xff", b"k00", b"k01"] and query.cursor is not None
    assert diff.keys == [b"k00", b"k02", b"k04"] and diff.to_values == [b"w", None, None]


def test_lenient_answers_take_the_generic_path() -> None:
    # msgpack answers may carry EncodedStrings in their map form or as text (SPEC §2 leniency)
    body = {
        "generationId": b"g",
        "items": [{"key": {"value": "a"}, "value": "x"}, {"key": b"b", "value": b"y"}],
        "cursorId": "c1",
    }
    page = query_columns_from_wire(body, MSGPACK)
    assert (page.keys, page.values, page.cursor) == ([b"a", b"b"], [b"x", b"y"], "c1")
    # the column calls decode msgpack arrays as tuples; the generic path gets lists back
    assert query_columns_from_wire(body | {"items": tuple(body["items"])}, MSGPACK) == page
    diff = {
        "fromGenerationId": {"value": "MQ==", "encoding": "base64"},
        "toGenerationId": {"value": "2"},
        "items": [
            {"key": {"value": "k"}, "fromValue": None, "intermediateValues": [], "toValue": {"value": "v"}}
        ],
    }
    parsed = diff_columns_from_wire(diff, JSON)
    assert (parsed.from_generation_id, parsed.to_generation_id) == (b"1", b"2")
    assert (parsed.keys, parsed.from_values, parsed.to_values) == ([b"k"], [None], [b"v"])
    with pytest.raises(InvalidRequest):
        query_columns_from_wire({"generationId": b"g", "items": [{"key": None, "value": b"x"}]}, MSGPACK)
    with pytest.raises(InvalidRequest):
        diff_columns_from_wire({"items": []}, MSGPACK)
