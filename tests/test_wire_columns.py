"""The columns form of query and diff pages: the column codec, its validation and its negotiation."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from diffstore.client._columns import (
    diff_columns_from_wire,
    get_many_columns_from_wire,
    query_columns_from_wire,
)
from diffstore.client._transport import codec_of
from diffstore.engine.types import DiffItem, DiffPage, GetManyResult, QueryPage, Record
from diffstore.errors import InvalidRequest
from diffstore.server.negotiation import response_codec
from diffstore.wire import (
    COLUMNS,
    JSON,
    MSGPACK,
    diff_page_to_wire,
    get_many_result_to_wire,
    query_page_to_wire,
)
from diffstore.wire_columns import COLUMNS_CONTENT_TYPE, BinaryColumn

values = st.lists(st.none() | st.binary(max_size=12), max_size=40)


@given(values)
def test_a_column_gives_back_its_rows(rows: list[bytes | None]) -> None:
    column = BinaryColumn.of(rows)
    assert column.to_list() == rows and list(column) == rows and len(column) == len(rows)
    assert (column.present is None) == (None not in rows)
    again = BinaryColumn.from_wire(column.to_wire(), len(rows), "c")
    assert again == rows and again == column
    if rows:
        assert column[-1] == rows[-1] and column[1:] == rows[1:]


def _offsets(*ints: int) -> bytes:
    return struct.pack(f"<{len(ints)}q", *ints)


@pytest.mark.parametrize(
    "wire",
    [
        None,
        {"data": b""},
        {"offsets": _offsets(0), "data": b""},  # two rows need three offsets
        {"offsets": "not bin" * 4, "data": b""},
        {"offsets": _offsets(0, 1, 2), "data": "ab"},
        {"offsets": _offsets(0, 1, 2), "data": b"ab", "present": b"\x01"},
    ],
)
def test_a_column_of_the_wrong_shape_is_refused(wire: object) -> None:
    with pytest.raises(InvalidRequest):
        BinaryColumn.from_wire(wire, 2, "response.keys")


@pytest.mark.parametrize(
    "offsets", [_offsets(1, 1, 2), _offsets(0, 2, 1), _offsets(0, 1, 3), _offsets(0, 1, 1)]
)
def test_offsets_that_do_not_describe_the_data_are_refused(offsets: bytes) -> None:
    column = BinaryColumn.from_wire({"offsets": offsets, "data": b"ab"}, 2, "response.keys")
    with pytest.raises(InvalidRequest, match="offsets"):
        column.to_list()


def test_pages_in_the_columns_form_parse_to_the_same_columns_as_items() -> None:
    records = [Record(b"a", b"1", b"g"), Record(b"\x00\xff", b"", b"g")]
    query = QueryPage(b"g", records, "next")
    for codec in (COLUMNS, MSGPACK, JSON):
        page = query_columns_from_wire(query_page_to_wire(query, codec), codec)
        assert (page.generation_id, page.keys, page.values, page.cursor) == (
            b"g",
            [b"a", b"\x00\xff"],
            [b"1", b""],
            "next",
        )
    items = [
        DiffItem(b"a", None, b"1", ()),
        DiffItem(b"b", b"2", None, (b"x",)),
        DiffItem(b"c", b"", b"3", ()),
    ]
    diff = DiffPage(b"1", b"2", items, None)
    body = diff_page_to_wire(diff, COLUMNS)
    assert set(body) == {"fromGenerationId", "toGenerationId", "count", "keys", "fromValues", "toValues"}
    assert "present" not in body["keys"] and body["fromValues"]["present"] == b"\x00\x01\x01"
    for codec in (COLUMNS, MSGPACK, JSON):
        page = diff_columns_from_wire(diff_page_to_wire(diff, codec), codec)
        assert (page.keys, page.from_values, page.to_values, page.cursor) == (
            [b"a", b"b", b"c"],
            [None, b"2", b""],
            [b"1", None, b"3"],
            None,
        )


def test_get_many_answers_in_the_columns_form_parse_to_the_same_columns_as_items() -> None:
    records = [Record(b"a", b"1", b"g1"), None, Record(b"a", b"", b"g2")]
    result = GetManyResult(b"g2", records)
    body = get_many_result_to_wire(result, COLUMNS)
    assert set(body) == {"generationId", "count", "values", "generationIds"}
    for codec in (COLUMNS, MSGPACK, JSON):
        answer = get_many_columns_from_wire(get_many_result_to_wire(result, codec), codec)
        assert answer.generation_id == b"g2"
        assert (answer.values, answer.generation_ids) == ([b"1", None, b""], [b"g1", None, b"g2"])
    mismatched = body | {"generationIds": BinaryColumn.of([b"g1", b"g1", b"g2"]).to_wire()}
    with pytest.raises(InvalidRequest, match="absent"):
        get_many_columns_from_wire(mismatched, COLUMNS)


def test_an_answer_with_an_absent_key_or_a_bad_count_is_refused() -> None:
    good = query_page_to_wire(QueryPage(b"g", [Record(b"a", b"1", b"g")], None), COLUMNS)
    absent_key = good | {"keys": BinaryColumn.of([None]).to_wire()}
    with pytest.raises(InvalidRequest, match="absent"):
        query_columns_from_wire(absent_key, COLUMNS)
    for count in (2, -1, "1", True, None):
        with pytest.raises(InvalidRequest):
            query_columns_from_wire(good | {"count": count}, COLUMNS)
    with pytest.raises(InvalidRequest, match="cursorId"):
        query_columns_from_wire(good | {"cursorId": 7}, COLUMNS)


@pytest.mark.parametrize(
    ("accept", "on_pages", "elsewhere"),
    [
        (COLUMNS_CONTENT_TYPE, COLUMNS, MSGPACK),
        (f"{COLUMNS_CONTENT_TYPE}, application/msgpack;q=0.9", COLUMNS, MSGPACK),
        (f"application/msgpack, {COLUMNS_CONTENT_TYPE}", COLUMNS, MSGPACK),
        (f"{COLUMNS_CONTENT_TYPE};q=0, application/msgpack", MSGPACK, MSGPACK),
        (f"{COLUMNS_CONTENT_TYPE};q=0", JSON, JSON),
        ("application/msgpack", MSGPACK, MSGPACK),
        ("application/json", JSON, JSON),
        (None, JSON, JSON),
    ],
)
def test_only_the_routes_with_a_columns_form_answer_it(
    accept: str | None, on_pages: object, elsewhere: object
) -> None:
    assert response_codec(accept, columns=True) is on_pages
    assert response_codec(accept) is elsewhere


def test_the_client_reads_the_columns_media_type() -> None:
    assert codec_of(COLUMNS_CONTENT_TYPE) is COLUMNS and codec_of("application/msgpack") is MSGPACK
