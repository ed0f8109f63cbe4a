"""Query and diff pages as columns of raw bytes: the client's fast path for bulk readers (Spark tasks).

A page of 10,000 items parsed into ``Record``/``DiffItem`` objects costs several times what the
msgpack decoding itself costs; a bulk reader that only wants Arrow arrays needs none of those objects.
These calls answer the same routes as :func:`~diffstore.client._calls.query_page` and
:func:`~diffstore.client._calls.diff_page`, parsed column-wise: one list per field, built by a list
comprehension over the decoded items (the bytes objects msgpack made are used as they are).

Invariants:
    * Every column holds ``bytes`` (``None`` for an absent value; keys are never ``None``).
    * msgpack answers are decoded with arrays as tuples (``Call.tuples``): no list is built per item.
    * A body the fast path does not recognise (a JSON answer, a msgpack answer using the map form of
      EncodedString) is parsed by the generic ``xxx_from_wire`` of :mod:`diffstore.wire` instead, with
      its full validation (after turning tuples back into lists), so both paths accept the same answers.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from diffstore.client._calls import Call, page_call
from diffstore.engine.types import DiffSpec
from diffstore.wire import Codec, Fields, diff_page_from_wire, query_page_from_wire
from diffstore.wire_requests import QueryRequest

_RAW_TYPES = frozenset((bytes, type(None)))


@dataclass(frozen=True, slots=True)
class QueryColumns:
    """One query page: ``keys[i]`` holds ``values[i]``; ``cursor`` is present when more remain."""

    generation_id: bytes
    keys: list[bytes]
    values: list[bytes]
    cursor: str | None


@dataclass(frozen=True, slots=True)
class DiffColumns:
    """One diff page: ``keys[i]`` went from ``from_values[i]`` to ``to_values[i]`` (``None``: absent)."""

    from_generation_id: bytes
    to_generation_id: bytes
    keys: list[bytes]
    from_values: list[bytes | None]
    to_values: list[bytes | None]
    cursor: str | None


def _all_raw(*columns: list[Any]) -> bool:
    return all(set(map(type, column)) <= _RAW_TYPES for column in columns)


def _lists(obj: Any) -> Any:
    """``obj`` with every tuple (a msgpack array decoded without lists) turned into a list."""
    if isinstance(obj, tuple | list):
        return [_lists(item) for item in obj]
    if isinstance(obj, dict):
        return {key: _lists(value) for key, value in obj.items()}
    return obj


def _cursor(obj: Any, codec: Codec) -> str | None:
    cursor = obj.get("cursorId")
    if cursor is not None and not isinstance(cursor, str):
        Fields(obj, codec, "response").text("cursorId")  # raises the usual error
    return cursor  # type: ignore[no-any-return]


def query_columns_from_wire(obj: Any, codec: Codec) -> QueryColumns:
    """Parses a query answer column-wise (see the module's invariants)."""
    if codec.binary and isinstance(obj, dict):
        try:
            items = obj["items"]
            keys = [item["key"] for item in items]
            values = [item["value"] for item in items]
        except (KeyError, TypeError):
            pass
        else:
            if _all_raw(keys, values) and None not in keys and None not in values:
                generation = Fields(obj, codec, "response").es("generationId")
                return QueryColumns(generation, keys, values, _cursor(obj, codec))
    page = query_page_from_wire(_lists(obj), codec)
    return QueryColumns(
        page.generation_id,
        [record.key for record in page.items],
        [record.value for record in page.items],
        page.cursor,
    )


def diff_columns_from_wire(obj: Any, codec: Codec) -> DiffColumns:
    """Parses a diff answer column-wise (intermediate values are dropped)."""
    if codec.binary and isinstance(obj, dict):
        try:
            items = obj["items"]
            keys = [item["key"] for item in items]
            from_values = [item.get("fromValue") for item in items]
            to_values = [item.get("toValue") for item in items]
        except (KeyError, TypeError, AttributeError):
            pass
        else:
            if _all_raw(keys, from_values, to_values) and None not in keys:
                f = Fields(obj, codec, "response")
                return DiffColumns(
                    f.es("fromGenerationId"),
                    f.es("toGenerationId"),
                    keys,
                    from_values,
                    to_values,
                    _cursor(obj, codec),
                )
    page = diff_page_from_wire(_lists(obj), codec)
    return DiffColumns(
        page.from_generation_id,
        page.to_generation_id,
        [item.key for item in page.items],
        [item.from_value for item in page.items],
        [item.to_value for item in page.items],
        page.cursor,
    )


def query_columns(name: str, request: QueryRequest, cursor: str | None) -> Call[QueryColumns]:
    """``query/`` (or the cursor's next page) parsed into columns."""
    return page_call(name, "query", request, cursor, query_columns_from_wire, tuples=True)


def diff_columns(name: str, request: DiffSpec, cursor: str | None) -> Call[DiffColumns]:
    """``diff/`` (or the cursor's next page) parsed into columns."""
    return page_call(name, "diff", request, cursor, diff_columns_from_wire, tuples=True)
