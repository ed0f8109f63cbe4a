"""The HTTP wire codec (SPEC §2): EncodedStrings, JSON/msgpack bodies, request and response shapes.

Pure functions, no I/O. The server renders engine results with ``xxx_to_wire``, the client reads them
back with ``xxx_from_wire``, so both sides share one definition of every response shape. Request shapes
live in :mod:`diffstore.wire_requests`, built on :class:`Codec` and :class:`Fields` from here.

Invariants:
    * An EncodedString (ES) in a JSON body is ``{"value": str, "encoding"?: "utf8"|"base64"}``; in a
      msgpack body it is a raw ``bin`` (a ``str`` or the JSON-style map is accepted too, for leniency).
    * Encoding picks the plain form only when every byte is printable ASCII (0x20..0x7E), else base64
      with ``"encoding": "base64"``; the same rule is used for requests (it is valid input everywhere).
    * Every malformed input raises a :class:`~diffstore.errors.BadRequest` subclass, never anything else.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

import msgpack
import orjson

from diffstore.engine.types import (
    MAX_KEEP_GENERATIONS,
    MAX_KEEP_MS,
    UNSET,
    DiffItem,
    DiffPage,
    Expected,
    GetManyResult,
    GetResult,
    KeysAround,
    Lineage,
    LineageSource,
    PhantomChanges,
    PutResult,
    QueryPage,
    Reader,
    Record,
    RetentionPolicy,
)
from diffstore.errors import InvalidEncoding, InvalidJson, InvalidRequest
from diffstore.wire_columns import (
    COLUMNS_CONTENT_TYPE,
    diff_page_to_columns,
    get_many_to_columns,
    query_page_to_columns,
)

JSON_CONTENT_TYPE: Final = "application/json; charset=utf-8"
MSGPACK_CONTENT_TYPE: Final = "application/msgpack"
MSGPACK_MEDIA_TYPES: Final = frozenset(
    {MSGPACK_CONTENT_TYPE, "application/x-msgpack", "application/vnd.msgpack"}
)
"""Every media type read as msgpack, by the server (Content-Type, Accept) and the client (answers)."""
MAX_PAGE_LIMIT: Final = 10_000
MAX_KEYS_AROUND_LIMIT: Final = 1_000
MAX_NAME_BYTES: Final = 255

Body = dict[str, Any]


class Codec:
    """One body format: how EncodedStrings look in it and how whole bodies are (de)serialised."""

    __slots__ = ("name", "content_type", "binary", "columns")

    def __init__(self, name: str, content_type: str, binary: bool, columns: bool = False) -> None:
        """``columns``: query and diff pages are answered in the columns form (:mod:`diffstore.wire_columns`);
        every other body is plain msgpack."""
        self.name = name
        self.content_type = content_type
        self.binary = binary
        self.columns = columns

    def __repr__(self) -> str:
        return f"Codec({self.name!r})"

    def es(self, data: bytes) -> Any:
        """Encodes bytes as an EncodedString of this format."""
        if self.binary:
            return bytes(data)
        return encode_es(data)

    def es_opt(self, data: bytes | None) -> Any:
        return None if data is None else self.es(data)

    def parse_es(self, obj: Any, name: str) -> bytes:
        """Decodes an EncodedString; ``name`` only serves the error message."""
        if self.binary and isinstance(obj, bytes | bytearray):
            return bytes(obj)
        if self.binary and isinstance(obj, str):
            return obj.encode("utf-8")
        return decode_es(obj, name)

    def parse_es_opt(self, obj: Any, name: str) -> bytes | None:
        return None if obj is None else self.parse_es(obj, name)

    def dumps(self, obj: Any) -> bytes:
        if self.binary:
            return msgpack.packb(obj, use_bin_type=True)  # type: ignore[no-any-return]
        return orjson.dumps(obj)

    def loads(self, body: bytes) -> Any:
        """Parses a whole body; any syntax error is :class:`InvalidJson`."""
        try:
            if self.binary:
                return msgpack.unpackb(body, raw=False, strict_map_key=False)
            return orjson.loads(body)
        except Exception as exc:  # msgpack raises a zoo of exception types for bad input
            raise InvalidJson(f"malformed {self.name} body: {exc}") from exc


JSON: Final = Codec("json", JSON_CONTENT_TYPE, binary=False)
MSGPACK: Final = Codec("msgpack", MSGPACK_CONTENT_TYPE, binary=True)
COLUMNS: Final = Codec("msgpack-columns", COLUMNS_CONTENT_TYPE, binary=True, columns=True)
"""msgpack, with query and diff pages and getMany answers in the columns form (only those routes)."""


def encode_es(data: bytes) -> dict[str, str]:
    """JSON EncodedString: plain when every byte is printable ASCII, else base64."""
    if data.isascii():
        text = data.decode("ascii")
        if text.isprintable():  # for ASCII exactly 0x20..0x7E
            return {"value": text}
    return {"value": base64.b64encode(data).decode("ascii"), "encoding": "base64"}


def decode_es(obj: Any, name: str = "value") -> bytes:
    """Decodes a JSON EncodedString (``encoding`` defaults to utf8)."""
    if not isinstance(obj, Mapping):
        raise InvalidRequest(f"{name}: expected an EncodedString object")
    value = obj.get("value")
    encoding = obj.get("encoding", "utf8")
    if isinstance(value, bytes | bytearray) and encoding in (None, "utf8", "base64"):
        return bytes(value)  # a msgpack body using the map form with a bin value
    if not isinstance(value, str):
        raise InvalidRequest(f"{name}.value: expected a string")
    if encoding is None or encoding == "utf8":
        try:
            return value.encode("utf-8")
        except UnicodeEncodeError as exc:  # lone surrogates
            raise InvalidEncoding(f"{name}: not valid UTF-8") from exc
    if encoding == "base64":
        try:
            return base64.b64decode(value.encode("ascii"), validate=True)
        except (binascii.Error, UnicodeEncodeError) as exc:
            raise InvalidEncoding(f"{name}: invalid base64") from exc
    raise InvalidEncoding(f"{name}: unknown encoding {encoding!r}")


class Fields:
    """Typed, validating access to the fields of one request object (unknown fields are ignored)."""

    __slots__ = ("obj", "codec", "where")

    def __init__(self, obj: Any, codec: Codec, where: str = "") -> None:
        """``where``: the path of ``obj`` in its message, named in errors as a user wrote it (``items[3]``);
        empty for the request body itself, whose fields are then named alone (``depth``, not ``body.depth``).
        """
        if not isinstance(obj, Mapping):
            raise InvalidRequest(f"{where or 'the request body'}: expected an object")
        self.obj = obj
        self.codec = codec
        self.where = where

    def path(self, name: str) -> str:
        """How errors name field ``name`` of this object."""
        return f"{self.where}.{name}" if self.where else name

    def has(self, name: str) -> bool:
        return name in self.obj

    def raw(self, name: str) -> Any:
        return self.obj.get(name)

    def _require(self, name: str) -> Any:
        if name not in self.obj:
            raise InvalidRequest(f"{self.path(name)}: missing")
        return self.obj[name]

    def es(self, name: str) -> bytes:
        return self.codec.parse_es(self._require(name), self.path(name))

    def es_opt(self, name: str) -> bytes | None:
        """Absent or null: ``None``."""
        return self.codec.parse_es_opt(self.obj.get(name), self.path(name))

    def es_nullable(self, name: str) -> bytes | None:
        """Must be present; null gives ``None``."""
        return self.codec.parse_es_opt(self._require(name), self.path(name))

    def expected(self, name: str) -> Expected:
        """A CAS expectation: absent is UNSET, null is ``None``."""
        if name not in self.obj:
            return UNSET
        return self.codec.parse_es_opt(self.obj[name], self.path(name))

    def flag(self, name: str, default: bool | None = None) -> bool:
        value = self.obj.get(name)
        if value is None and default is not None:
            return default
        if not isinstance(value, bool):
            raise InvalidRequest(f"{self.path(name)}: expected a boolean")
        return value

    def integer_opt(self, name: str, low: int, high: int | None = None) -> int | None:
        value = self.obj.get(name)
        if value is None:
            return None
        if type(value) is not int or value < low or (high is not None and value > high):
            bound = f"{low}..{high}" if high is not None else f">= {low}"
            raise InvalidRequest(f"{self.path(name)}: expected an integer {bound}")
        return value

    def integer(self, name: str, low: int, high: int | None = None) -> int:
        self._require(name)
        value = self.integer_opt(name, low, high)
        if value is None:
            raise InvalidRequest(f"{self.path(name)}: expected an integer")
        return value

    def text_opt(self, name: str) -> str | None:
        value = self.obj.get(name)
        if value is None:
            return None
        if (
            not isinstance(value, str)
            or not 1 <= len(value.encode("utf-8", "surrogatepass")) <= MAX_NAME_BYTES
        ):
            raise InvalidRequest(f"{self.path(name)}: expected a string of 1..{MAX_NAME_BYTES} bytes")
        return value

    def text(self, name: str) -> str:
        self._require(name)
        value = self.text_opt(name)
        if value is None:
            raise InvalidRequest(f"{self.path(name)}: expected a string")
        return value

    def array(self, name: str) -> list[Any]:
        value = self._require(name)
        if not isinstance(value, list):
            raise InvalidRequest(f"{self.path(name)}: expected an array")
        return value


def set_if_given(body: Body, name: str, value: Any) -> None:
    if value is not None:
        body[name] = value


# -------------------------------------------------------------------------------------------- responses


def generation_to_wire(generation_id: bytes, codec: Codec) -> Body:
    return {"generationId": codec.es(generation_id)}


def generation_from_wire(obj: Any, codec: Codec) -> bytes:
    return Fields(obj, codec, "response").es("generationId")


def get_result_to_wire(result: GetResult, codec: Codec) -> Body:
    record = result.record
    item = None if record is None else {"key": codec.es(record.key), "value": codec.es(record.value)}
    return {"generationId": codec.es(result.generation_id), "item": item}


def get_result_from_wire(obj: Any, codec: Codec) -> GetResult:
    f = Fields(obj, codec, "response")
    generation_id = f.es("generationId")
    if f.raw("item") is None:
        return GetResult(generation_id, None)
    item = Fields(f.raw("item"), codec, "response.item")
    return GetResult(generation_id, Record(item.es("key"), item.es("value"), generation_id))


def get_many_result_to_wire(result: GetManyResult, codec: Codec) -> Body:
    if codec.columns:
        return get_many_to_columns(result)
    es = codec.es
    items = [
        None if r is None else {"key": es(r.key), "value": es(r.value), "generationId": es(r.generation_id)}
        for r in result.records
    ]
    return {"generationId": es(result.generation_id), "items": items}


def get_many_result_from_wire(obj: Any, codec: Codec) -> GetManyResult:
    f = Fields(obj, codec, "response")
    generation_id = f.es("generationId")
    records: list[Record | None] = []
    for i, raw in enumerate(f.array("items")):
        if raw is None:
            records.append(None)
            continue
        item = Fields(raw, codec, f"response.items[{i}]")
        records.append(Record(item.es("key"), item.es("value"), item.es("generationId")))
    return GetManyResult(generation_id, records)


def put_result_to_wire(result: PutResult, codec: Codec) -> Body:
    body: Body = {"generationId": codec.es(result.generation_id), "wasPut": result.was_put}
    if result.skipped:
        body["skipped"] = True
    return body


def put_result_from_wire(obj: Any, codec: Codec) -> PutResult:
    f = Fields(obj, codec, "response")
    return PutResult(f.es("generationId"), f.flag("wasPut", True), f.flag("skipped", False))


def _encode_es_opt(data: bytes | None) -> dict[str, str] | None:
    return None if data is None else encode_es(data)


def query_page_to_wire(page: QueryPage, codec: Codec) -> Body:
    if codec.columns:
        return query_page_to_columns(page)
    es = codec.es
    items: list[dict[str, Any]]
    if codec.binary:  # keys and values are bytes already: msgpack writes them as bin
        items = [{"key": r[0], "value": r[1]} for r in page.items]
    else:
        items = [{"key": encode_es(r[0]), "value": encode_es(r[1])} for r in page.items]
    body: Body = {"generationId": es(page.generation_id), "items": items}
    set_if_given(body, "cursorId", page.cursor)
    return body


def query_page_from_wire(obj: Any, codec: Codec) -> QueryPage:
    f = Fields(obj, codec, "response")
    generation_id = f.es("generationId")
    items = []
    for entry in f.array("items"):
        item = Fields(entry, codec, "response.items[]")
        items.append(Record(item.es("key"), item.es("value"), generation_id))
    return QueryPage(generation_id, items, f.raw("cursorId"))


def diff_page_to_wire(page: DiffPage, codec: Codec) -> Body:
    if codec.columns:
        return diff_page_to_columns(page)
    es = codec.es
    items: list[dict[str, Any]]
    if codec.binary:  # keys and values are bytes (or None) already: msgpack writes bin / nil
        # d[3] is a tuple, which msgpack writes as an array: no list per item (a third of the cost)
        items = [
            {"key": d[0], "fromValue": d[1], "intermediateValues": d[3], "toValue": d[2]} for d in page.items
        ]
    else:
        es_opt = _encode_es_opt
        items = [
            {
                "key": encode_es(d[0]),
                "fromValue": es_opt(d[1]),
                "intermediateValues": [es_opt(v) for v in d[3]],
                "toValue": es_opt(d[2]),
            }
            for d in page.items
        ]
    body: Body = {
        "fromGenerationId": es(page.from_generation_id),
        "toGenerationId": es(page.to_generation_id),
        "items": items,
    }
    set_if_given(body, "cursorId", page.cursor)
    return body


def diff_page_from_wire(obj: Any, codec: Codec) -> DiffPage:
    f = Fields(obj, codec, "response")
    items = []
    for entry in f.array("items"):
        d = Fields(entry, codec, "response.items[]")
        intermediate = tuple(
            codec.parse_es_opt(v, "intermediateValues[]") for v in d.raw("intermediateValues") or ()
        )
        items.append(DiffItem(d.es("key"), d.es_opt("fromValue"), d.es_opt("toValue"), intermediate))
    return DiffPage(f.es("fromGenerationId"), f.es("toGenerationId"), items, f.raw("cursorId"))


def phantom_changes_to_wire(page: PhantomChanges, codec: Codec) -> Body:
    es, es_opt = codec.es, codec.es_opt
    body: Body = {
        "generationId": es(page.generation_id),
        "items": [
            {"key": es(d.key), "fromValue": es_opt(d.from_value), "toValue": es_opt(d.to_value)}
            for d in page.items
        ],
    }
    set_if_given(body, "nextKey", es_opt(page.next_key))
    return body


def phantom_changes_from_wire(obj: Any, codec: Codec) -> PhantomChanges:
    f = Fields(obj, codec, "response")
    items = []
    for entry in f.array("items"):
        d = Fields(entry, codec, "response.items[]")
        items.append(DiffItem(d.es("key"), d.es_opt("fromValue"), d.es_opt("toValue")))
    return PhantomChanges(f.es("generationId"), items, f.es_opt("nextKey"))


def keys_around_to_wire(result: KeysAround, codec: Codec) -> Body:
    return {
        "generationId": codec.es(result.generation_id),
        "left": [codec.es(k) for k in result.left],
        "right": [codec.es(k) for k in result.right],
        "hasMoreOnTheLeft": result.has_more_on_the_left,
        "hasMoreOnTheRight": result.has_more_on_the_right,
        "foundKey": result.found_key,
    }


def keys_around_from_wire(obj: Any, codec: Codec) -> KeysAround:
    f = Fields(obj, codec, "response")
    return KeysAround(
        f.es("generationId"),
        [codec.parse_es(k, "left[]") for k in f.array("left")],
        [codec.parse_es(k, "right[]") for k in f.array("right")],
        f.flag("hasMoreOnTheLeft"),
        f.flag("hasMoreOnTheRight"),
        f.flag("foundKey"),
    )


def readers_to_wire(readers: list[Reader], codec: Codec) -> Body:
    return {
        "items": [
            {
                "readerName": r.name,
                "collectionName": r.collection,
                "generationId": codec.es_opt(r.generation_id),
            }
            for r in readers
        ]
    }


def readers_from_wire(obj: Any, codec: Codec, owner: str) -> list[Reader]:
    """Parses a readers list; ``owner`` is the collection they are stored in (the default target)."""
    readers = []
    for entry in Fields(obj, codec, "response").array("items"):
        r = Fields(entry, codec, "response.items[]")
        readers.append(
            Reader(r.text("readerName"), r.text_opt("collectionName") or owner, r.es_opt("generationId"))
        )
    return readers


def retention_to_wire(policy: RetentionPolicy | None) -> Body:
    """``{keepMs?, keepGenerations?}``: the fields set (``{}``: no policy)."""
    body: Body = {}
    if policy is not None:
        set_if_given(body, "keepMs", policy.keep_ms)
        set_if_given(body, "keepGenerations", policy.keep_generations)
    return body


def retention_from_wire(obj: Any, codec: Codec, where: str) -> RetentionPolicy:
    """Parses ``{keepMs?, keepGenerations?}`` (each a positive integer or null; ``{}``: no policy)."""
    f = Fields(obj, codec, where)
    return RetentionPolicy(
        f.integer_opt("keepMs", 1, MAX_KEEP_MS), f.integer_opt("keepGenerations", 1, MAX_KEEP_GENERATIONS)
    )


@dataclass(frozen=True, slots=True)
class CollectionState:
    """The answer of ``GET /collections/{c}``; absent fields are ``None`` (``retention`` None: none)."""

    manual: bool
    generation_id: bytes | None = None
    next_generation_id: bytes | None = None
    fields: tuple[str, ...] = field(default=("generationId", "nextGenerationId", "retention"))
    retention: RetentionPolicy | None = None

    def to_wire(self, codec: Codec) -> Body:
        body: Body = {"isManual": self.manual}
        if "generationId" in self.fields:
            set_if_given(body, "generationId", codec.es_opt(self.generation_id))
        if "nextGenerationId" in self.fields:
            set_if_given(body, "nextGenerationId", codec.es_opt(self.next_generation_id))
        if "retention" in self.fields and self.retention is not None:  # absent: none (diffbelt's shape)
            body["retention"] = retention_to_wire(self.retention)
        return body

    @classmethod
    def from_wire(cls, obj: Any, codec: Codec) -> CollectionState:
        f = Fields(obj, codec, "response")
        policy = (
            None
            if f.raw("retention") is None
            else retention_from_wire(f.raw("retention"), codec, "response.retention")
        )
        return cls(
            f.flag("isManual"),
            f.es_opt("generationId"),
            f.es_opt("nextGenerationId"),
            retention=None if policy is None or policy.empty else policy,
        )


def error_to_wire(code: str, reason: str, bytes_max: int | None = None) -> Body:
    body: Body = {"error": code, "reason": reason}
    set_if_given(body, "bytesMax", bytes_max)
    return body


def lineage_to_wire(lineage: Lineage, codec: Codec) -> Body:
    """``{generationId, sources: [...]}``; a source names ``collectionName`` or else its ``target``."""
    return {
        "generationId": codec.es(lineage.generation_id),
        "sources": _sources_to_wire(lineage.sources, codec),
    }


def _sources_to_wire(sources: tuple[LineageSource, ...], codec: Codec) -> list[Body]:
    out = []
    for source in sources:
        entry: Body = {"readerName": source.reader_name, "collectionName": source.collection_name}
        if source.collection_name is None:
            entry["target"] = source.target
        entry["fromGenerationId"] = codec.es_opt(source.from_generation_id)
        entry["toGenerationId"] = codec.es_opt(source.to_generation_id)
        if source.sources is not None:
            entry["sources"] = _sources_to_wire(source.sources, codec)
        if source.incomplete:
            entry["incomplete"] = True
        out.append(entry)
    return out


def lineage_from_wire(obj: Any, codec: Codec) -> Lineage:
    f = Fields(obj, codec, "response")
    return Lineage(f.es("generationId"), _sources_from_wire(f.array("sources"), codec))


def _sources_from_wire(items: list[Any], codec: Codec) -> tuple[LineageSource, ...]:
    sources = []
    for item in items:
        f = Fields(item, codec, "response.sources[]")
        collection_name = f.text_opt("collectionName")
        target = collection_name if collection_name is not None else f.raw("target")
        if not isinstance(target, str):
            raise InvalidRequest("response.sources[].target: expected a string")
        nested = _sources_from_wire(f.array("sources"), codec) if f.raw("sources") is not None else None
        sources.append(
            LineageSource(
                f.text("readerName"),
                target,
                collection_name,
                f.es_opt("fromGenerationId"),
                f.es_opt("toGenerationId"),
                nested,
                f.flag("incomplete", False),
            )
        )
    return tuple(sources)
