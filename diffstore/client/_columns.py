"""Query and diff pages as columns of raw bytes: the client's fast path for bulk readers (Spark tasks).

A page of 10,000 items parsed into ``Record``/``DiffItem`` objects costs several times what the
msgpack decoding itself costs; a bulk reader that only wants Arrow arrays needs none of those objects.
These calls answer the same routes as :func:`~diffstore.client._calls.query_page`,
:func:`~diffstore.client._calls.diff_page` and :func:`~diffstore.client._calls.get_many`, asking for
the columns form (:mod:`diffstore.wire_columns`): each field of the page arrives as one
:class:`BinaryColumn`, a few buffers that a reader wraps as an Arrow array without touching the rows.

Invariants:
    * Every column holds ``bytes`` (``None`` for an absent value; keys are never ``None``).
    * An answer in the items form (a JSON client, a server without the columns form) is parsed by the
      generic ``xxx_from_wire`` of :mod:`diffstore.wire`, with its full validation, and its fields are
      put in columns, so both forms give the same pages.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from diffstore.client._calls import Call, collection_path, page_call
from diffstore.engine.types import DiffSpec
from diffstore.errors import InvalidRequest
from diffstore.wire import Codec, Fields, diff_page_from_wire, get_many_result_from_wire, query_page_from_wire
from diffstore.wire_columns import BinaryColumn
from diffstore.wire_requests import GetManyRequest, QueryRequest, ReadAt


@dataclass(frozen=True, slots=True)
class QueryColumns:
    """One query page: ``keys[i]`` holds ``values[i]``; ``cursor`` is present when more remain."""

    generation_id: bytes
    keys: BinaryColumn
    values: BinaryColumn
    cursor: str | None


@dataclass(frozen=True, slots=True)
class DiffColumns:
    """One diff page: ``keys[i]`` went from ``from_values[i]`` to ``to_values[i]`` (``None``: absent)."""

    from_generation_id: bytes
    to_generation_id: bytes
    keys: BinaryColumn
    from_values: BinaryColumn
    to_values: BinaryColumn
    cursor: str | None


@dataclass(frozen=True, slots=True)
class GetManyColumns:
    """A getMany answer: ``values[i]`` of the i-th key asked, written in ``generation_ids[i]`` (``None``:
    the key has no record at ``generation_id``)."""

    generation_id: bytes
    values: BinaryColumn
    generation_ids: BinaryColumn


def _lists(obj: Any) -> Any:
    """``obj`` with every tuple (a msgpack array decoded without lists) turned into a list."""
    if isinstance(obj, tuple | list):
        return [_lists(item) for item in obj]
    if isinstance(obj, dict):
        return {key: _lists(value) for key, value in obj.items()}
    return obj


def _columns(f: Fields, *names: str, always: tuple[str, ...]) -> list[BinaryColumn]:
    """The columns ``names`` of a columns-form answer; those in ``always`` may hold no absent row."""
    count = f.raw("count")
    if not isinstance(count, int) or isinstance(count, bool) or count < 0:
        raise InvalidRequest("response.count: expected a count of rows")
    columns = [BinaryColumn.from_wire(f.raw(name), count, f"response.{name}") for name in names]
    for name, column in zip(names, columns, strict=True):
        if name in always and column.present is not None and 0 in column.present:
            raise InvalidRequest(f"response.{name}: a row is absent")
    return columns


def _cursor(f: Fields) -> str | None:
    cursor = f.raw("cursorId")
    if cursor is not None and not isinstance(cursor, str):
        raise InvalidRequest("response.cursorId: expected a string")
    return cursor


def query_columns_from_wire(obj: Any, codec: Codec) -> QueryColumns:
    """Parses a query answer, in either form, into columns (see the module's invariants)."""
    if codec.columns:
        f = Fields(obj, codec, "response")
        keys, values = _columns(f, "keys", "values", always=("keys", "values"))
        return QueryColumns(f.es("generationId"), keys, values, _cursor(f))
    page = query_page_from_wire(_lists(obj), codec)
    return QueryColumns(
        page.generation_id,
        BinaryColumn.of([record.key for record in page.items]),
        BinaryColumn.of([record.value for record in page.items]),
        page.cursor,
    )


def diff_columns_from_wire(obj: Any, codec: Codec) -> DiffColumns:
    """Parses a diff answer, in either form, into columns (intermediate values are dropped)."""
    if codec.columns:
        f = Fields(obj, codec, "response")
        keys, from_values, to_values = _columns(f, "keys", "fromValues", "toValues", always=("keys",))
        return DiffColumns(
            f.es("fromGenerationId"), f.es("toGenerationId"), keys, from_values, to_values, _cursor(f)
        )
    page = diff_page_from_wire(_lists(obj), codec)
    return DiffColumns(
        page.from_generation_id,
        page.to_generation_id,
        BinaryColumn.of([item.key for item in page.items]),
        BinaryColumn.of([item.from_value for item in page.items]),
        BinaryColumn.of([item.to_value for item in page.items]),
        page.cursor,
    )


def get_many_columns_from_wire(obj: Any, codec: Codec) -> GetManyColumns:
    """Parses a getMany answer, in either form, into columns."""
    if codec.columns:
        f = Fields(obj, codec, "response")
        values, generation_ids = _columns(f, "values", "generationIds", always=())
        if values.present != generation_ids.present:
            raise InvalidRequest("response.generationIds: absent where values are not, or the reverse")
        return GetManyColumns(f.es("generationId"), values, generation_ids)
    result = get_many_result_from_wire(_lists(obj), codec)
    return GetManyColumns(
        result.generation_id,
        BinaryColumn.of([None if r is None else r.value for r in result.records]),
        BinaryColumn.of([None if r is None else r.generation_id for r in result.records]),
    )


def get_many_columns(name: str, keys: list[bytes], at: ReadAt) -> Call[GetManyColumns]:
    """``getMany`` in columns."""
    body = GetManyRequest(keys, at).to_wire
    path = collection_path(name, "getMany")
    return Call("POST", path, get_many_columns_from_wire, body, tuples=True, columns=True)


def query_columns(name: str, request: QueryRequest, cursor: str | None) -> Call[QueryColumns]:
    """``query/`` (or the cursor's next page) in columns."""
    return page_call(name, "query", request, cursor, query_columns_from_wire, tuples=True, columns=True)


def diff_columns(name: str, request: DiffSpec, cursor: str | None) -> Call[DiffColumns]:
    """``diff/`` (or the cursor's next page) in columns."""
    return page_call(name, "diff", request, cursor, diff_columns_from_wire, tuples=True, columns=True)
