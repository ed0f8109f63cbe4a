"""One frozen request object per operation of the HTTP API (SPEC §3), shared by the server and the client.

``XxxRequest.from_wire(obj, codec)`` validates a decoded body (the server's side) and raises only
:class:`~diffstore.errors.BadRequest` subclasses; ``to_wire(codec)`` builds the body (the client's side).
Both directions live together so that a round-trip test pins them to each other. ``run(collection)``
performs the request on any :class:`~diffstore.collection.Collection` -- a route runs it on the engine's
handle (parse → run → render), and the client's handle builds the same object from its arguments.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from diffstore.engine.types import (
    MAX_GET_MANY_KEYS,
    MAX_LINEAGE_DEPTH,
    UNSET,
    DiffPage,
    DiffSpec,
    Expected,
    FromReader,
    GetManyResult,
    GetResult,
    KeysAround,
    LeaseToken,
    Lineage,
    PhantomChanges,
    PutItem,
    PutResult,
    QueryPage,
    ReaderUpdate,
    RetentionPolicy,
)
from diffstore.errors import InvalidRequest
from diffstore.wire import (
    MAX_KEYS_AROUND_LIMIT,
    MAX_PAGE_LIMIT,
    Body,
    Codec,
    Fields,
    retention_from_wire,
    retention_to_wire,
    set_if_given,
)
from diffstore.wire_items import FlaggedItem, item_to_wire, parse_item, parse_items
from diffstore.wire_leases import token_from_fields, token_to_wire

if TYPE_CHECKING:
    from diffstore.collection import Collection


@dataclass(frozen=True, slots=True)
class CreateCollectionRequest:
    """``retention`` None: not given (the server's default policy); an empty policy: none."""

    collection_name: str
    manual: bool
    initial_generation_id: bytes | None = None
    retention: RetentionPolicy | None = None

    @classmethod
    def from_wire(cls, obj: Any, codec: Codec) -> CreateCollectionRequest:
        f = Fields(obj, codec)
        manual = f.flag("isManual")
        initial = f.es_opt("initialGenerationId")
        if initial is not None and not manual:
            raise InvalidRequest("initialGenerationId is only allowed for manual collections")
        raw = f.raw("retention")
        policy = None if raw is None else retention_from_wire(raw, codec, "retention")
        return cls(f.text("collectionName"), manual, initial, policy)

    def to_wire(self, codec: Codec) -> Body:
        body: Body = {"collectionName": self.collection_name, "isManual": self.manual}
        set_if_given(body, "initialGenerationId", codec.es_opt(self.initial_generation_id))
        if self.retention is not None:
            body["retention"] = retention_to_wire(self.retention)
        return body


@dataclass(frozen=True, slots=True)
class ReadAt:
    """Where a read looks: a generation (default current) or the one current at ``as_of_ms`` (SPEC §8),
    and an optional phantom."""

    generation_id: bytes | None = None
    phantom_id: bytes | None = None
    as_of_ms: int | None = None

    @classmethod
    def from_fields(cls, f: Fields) -> ReadAt:
        at = cls(f.es_opt("generationId"), f.es_opt("phantomId"), f.integer_opt("asOfMs", 0))
        if at.generation_id is not None and at.as_of_ms is not None:
            raise InvalidRequest("generationId and asOfMs: give one of them")
        return at

    def fill(self, body: Body, codec: Codec) -> Body:
        set_if_given(body, "generationId", codec.es_opt(self.generation_id))
        set_if_given(body, "phantomId", codec.es_opt(self.phantom_id))
        set_if_given(body, "asOfMs", self.as_of_ms)
        return body

    def generation(self, collection: Collection) -> bytes | None:
        """The generation to read: the one named, else the newest committed at or before ``as_of_ms``."""
        if self.as_of_ms is None:
            return self.generation_id
        return collection.generation_at(self.as_of_ms)


@dataclass(frozen=True, slots=True)
class GetRequest:
    key: bytes
    at: ReadAt = ReadAt()

    @classmethod
    def from_wire(cls, obj: Any, codec: Codec) -> GetRequest:
        f = Fields(obj, codec)
        return cls(f.es("key"), ReadAt.from_fields(f))

    def to_wire(self, codec: Codec) -> Body:
        return self.at.fill({"key": codec.es(self.key)}, codec)

    def run(self, collection: Collection) -> GetResult:
        return collection.get_result(self.key, self.at.generation(collection), self.at.phantom_id)


@dataclass(frozen=True, slots=True)
class GetManyRequest:
    """(beyond SPEC) ``getMany``: ``{keys: [ES], generationId?, phantomId?}``."""

    keys: list[bytes]
    at: ReadAt = ReadAt()

    @classmethod
    def from_wire(cls, obj: Any, codec: Codec) -> GetManyRequest:
        f = Fields(obj, codec)
        raw = f.array("keys")
        if len(raw) > MAX_GET_MANY_KEYS:
            raise InvalidRequest(f"keys: at most {MAX_GET_MANY_KEYS} keys")
        parse = codec.parse_es
        return cls([parse(key, "keys[]") for key in raw], ReadAt.from_fields(f))

    def to_wire(self, codec: Codec) -> Body:
        return self.at.fill({"keys": [codec.es(key) for key in self.keys]}, codec)

    def run(self, collection: Collection) -> GetManyResult:
        return collection.get_many(self.keys, self.at.generation(collection), self.at.phantom_id)


@dataclass(frozen=True, slots=True)
class KeysAroundRequest:
    key: bytes
    require_key_existence: bool
    limit: int
    at: ReadAt = ReadAt()

    @classmethod
    def from_wire(cls, obj: Any, codec: Codec) -> KeysAroundRequest:
        f = Fields(obj, codec)
        return cls(
            f.es("key"),
            f.flag("requireKeyExistance"),
            f.integer("limit", 1, MAX_KEYS_AROUND_LIMIT),
            ReadAt.from_fields(f),
        )

    def to_wire(self, codec: Codec) -> Body:
        body = {
            "key": codec.es(self.key),
            "requireKeyExistance": self.require_key_existence,
            "limit": self.limit,
        }
        return self.at.fill(body, codec)

    def run(self, collection: Collection) -> KeysAround:
        at = self.at
        return collection.keys_around(
            self.key, self.limit, self.require_key_existence, at.generation(collection), at.phantom_id
        )


@dataclass(frozen=True, slots=True)
class WriteOptions:
    """The options shared by put and putMany."""

    generation_id: bytes | None = None
    phantom_id: bytes | None = None
    skip_unchanged: bool = False
    producer_id: str | None = None
    seq_no: int | None = None
    lease: LeaseToken | None = None

    @classmethod
    def from_fields(cls, f: Fields) -> WriteOptions:
        producer_id, seq_no = f.text_opt("producerId"), f.integer_opt("seqNo", 1)
        if (producer_id is None) != (seq_no is None):
            raise InvalidRequest("producerId and seqNo must be given together")
        phantom_id = f.es_opt("phantomId")
        generation_id = f.es_opt("generationId")
        if phantom_id is not None and generation_id is None:
            raise InvalidRequest("a phantom write needs a generationId")
        skip_unchanged, lease = f.flag("skipUnchanged", False), token_from_fields(f)
        return cls(generation_id, phantom_id, skip_unchanged, producer_id, seq_no, lease)

    def fill(self, body: Body, codec: Codec) -> Body:
        set_if_given(body, "generationId", codec.es_opt(self.generation_id))
        set_if_given(body, "phantomId", codec.es_opt(self.phantom_id))
        if self.skip_unchanged:
            body["skipUnchanged"] = True
        set_if_given(body, "producerId", self.producer_id)
        set_if_given(body, "seqNo", self.seq_no)
        if self.lease is not None:
            body["lease"] = token_to_wire(self.lease)
        return body

    def kwargs(self) -> dict[str, Any]:
        """Keyword arguments of the engine's ``put``/``put_many``."""
        return {
            "generation_id": self.generation_id,
            "phantom_id": self.phantom_id,
            "skip_unchanged": self.skip_unchanged,
            "producer_id": self.producer_id,
            "seq_no": self.seq_no,
            "lease": self.lease,
        }


@dataclass(frozen=True, slots=True)
class PutRequest:
    item: FlaggedItem
    options: WriteOptions = WriteOptions()

    @classmethod
    def from_wire(cls, obj: Any, codec: Codec) -> PutRequest:
        f = Fields(obj, codec)
        return cls(parse_item(f.raw("item"), codec, "item"), WriteOptions.from_fields(f))

    def to_wire(self, codec: Codec) -> Body:
        return self.options.fill({"item": item_to_wire(self.item, codec)}, codec)

    def run(self, collection: Collection) -> PutResult:
        key, value, if_not_present = self.item
        return collection.put(key, value, if_not_present=if_not_present, **self.options.kwargs())


@dataclass(frozen=True, slots=True)
class PutManyRequest:
    items: list[PutItem]
    options: WriteOptions = WriteOptions()

    @classmethod
    def from_wire(cls, obj: Any, codec: Codec) -> PutManyRequest:
        f = Fields(obj, codec)
        return cls(parse_items(f.array("items"), codec), WriteOptions.from_fields(f))

    def to_wire(self, codec: Codec) -> Body:
        return self.options.fill({"items": [item_to_wire(item, codec) for item in self.items]}, codec)

    def run(self, collection: Collection) -> PutResult:
        return collection.put_many(self.items, **self.options.kwargs())


@dataclass(frozen=True, slots=True)
class CreateReaderRequest:
    reader_name: str
    collection_name: str | None = None
    generation_id: bytes | None = None

    @classmethod
    def from_wire(cls, obj: Any, codec: Codec) -> CreateReaderRequest:
        f = Fields(obj, codec)
        return cls(f.text("readerName"), f.text_opt("collectionName"), f.es_opt("generationId"))

    def to_wire(self, codec: Codec) -> Body:
        body: Body = {"readerName": self.reader_name, "generationId": codec.es_opt(self.generation_id)}
        set_if_given(body, "collectionName", self.collection_name)
        return body


@dataclass(frozen=True, slots=True)
class UpdateReaderRequest:
    generation_id: bytes | None
    expected: Expected = UNSET

    @classmethod
    def from_wire(cls, obj: Any, codec: Codec) -> UpdateReaderRequest:
        f = Fields(obj, codec)
        return cls(f.es_opt("generationId"), f.expected("expectedGenerationId"))

    def to_wire(self, codec: Codec) -> Body:
        body: Body = {"generationId": codec.es_opt(self.generation_id)}
        if self.expected is not UNSET:
            body["expectedGenerationId"] = codec.es_opt(self.expected)
        return body


@dataclass(frozen=True, slots=True)
class GenerationRequest:
    """generation/start (with ``abort_outdated``), /commit (with ``update_readers``) and /abort.

    ``lease`` (start, commit and abort) is a fencing token: refused with ``leaseLost`` unless it still holds
    and matches the lease the open generation was started under (see :mod:`diffstore.engine.leases`).
    """

    generation_id: bytes
    abort_outdated: bool = False
    update_readers: tuple[ReaderUpdate, ...] = ()
    lease: LeaseToken | None = None
    metadata: dict[str, str] | None = None  # commit only; checked by the engine (history.validate_metadata)

    @classmethod
    def from_wire(cls, obj: Any, codec: Codec) -> GenerationRequest:
        f = Fields(obj, codec)
        updates: list[ReaderUpdate] = []
        if f.raw("updateReaders") is not None:
            for i, entry in enumerate(f.array("updateReaders")):
                u = Fields(entry, codec, f"updateReaders[{i}]")
                updates.append(
                    ReaderUpdate(
                        u.text("readerName"),
                        u.es_nullable("generationId"),
                        u.expected("expectedGenerationId"),
                    )
                )
        return cls(
            f.es("generationId"),
            f.flag("abortOutdated", False),
            tuple(updates),
            token_from_fields(f),
            f.raw("metadata"),
        )

    def to_wire(self, codec: Codec) -> Body:
        body: Body = {"generationId": codec.es(self.generation_id)}
        if self.abort_outdated:
            body["abortOutdated"] = True
        if self.update_readers:
            body["updateReaders"] = [
                UpdateReaderRequest(u.generation_id, u.expected).to_wire(codec) | {"readerName": u.name}
                for u in self.update_readers
            ]
        if self.lease is not None:
            body["lease"] = token_to_wire(self.lease)
        if self.metadata is not None:
            body["metadata"] = dict(self.metadata)
        return body


@dataclass(frozen=True, slots=True)
class StartPhantomRequest:
    ttl_seconds: int = 3600

    @classmethod
    def from_wire(cls, obj: Any, codec: Codec) -> StartPhantomRequest:
        ttl = Fields(obj if obj is not None else {}, codec).integer_opt("ttlSeconds", 1, 10 * 365 * 86400)
        return cls(3600 if ttl is None else ttl)

    def to_wire(self, codec: Codec) -> Body:
        return {"ttlSeconds": self.ttl_seconds}


@dataclass(frozen=True, slots=True)
class PhantomChangesRequest:
    """**(beyond diffbelt)** ``phantom/changes``: what a phantom changes at a generation, paged by key."""

    phantom_id: bytes
    generation_id: bytes | None = None
    from_key: bytes | None = None
    to_key: bytes | None = None
    limit: int | None = None

    @classmethod
    def from_wire(cls, obj: Any, codec: Codec) -> PhantomChangesRequest:
        f = Fields(obj, codec)
        return cls(
            f.es("phantomId"),
            f.es_opt("generationId"),
            f.es_opt("fromKey"),
            f.es_opt("toKey"),
            f.integer_opt("limit", 1, MAX_PAGE_LIMIT),
        )

    def to_wire(self, codec: Codec) -> Body:
        body: Body = {"phantomId": codec.es(self.phantom_id)}
        set_if_given(body, "generationId", codec.es_opt(self.generation_id))
        set_if_given(body, "fromKey", codec.es_opt(self.from_key))
        set_if_given(body, "toKey", codec.es_opt(self.to_key))
        set_if_given(body, "limit", self.limit)
        return body

    def run(self, collection: Collection) -> PhantomChanges:
        return collection.phantom_changes(
            self.phantom_id, self.generation_id, self.from_key, self.to_key, self.limit
        )


@dataclass(frozen=True, slots=True)
class QueryRequest:
    at: ReadAt = ReadAt()
    from_key: bytes | None = None
    to_key: bytes | None = None
    limit: int | None = None

    @classmethod
    def from_wire(cls, obj: Any, codec: Codec) -> QueryRequest:
        f = Fields(obj if obj is not None else {}, codec)
        return cls(
            ReadAt.from_fields(f),
            f.es_opt("fromKey"),
            f.es_opt("toKey"),
            f.integer_opt("limit", 1, MAX_PAGE_LIMIT),
        )

    def to_wire(self, codec: Codec) -> Body:
        body: Body = {}
        set_if_given(body, "fromKey", codec.es_opt(self.from_key))
        set_if_given(body, "toKey", codec.es_opt(self.to_key))
        set_if_given(body, "limit", self.limit)
        return self.at.fill(body, codec)

    def run(self, collection: Collection) -> QueryPage:
        """The first page (the next ones follow the answer's cursor)."""
        at = self.at
        return collection.query_page(
            at.generation(collection), at.phantom_id, self.from_key, self.to_key, self.limit
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class DiffRequest(DiffSpec):
    """The engine's :class:`~diffstore.engine.types.DiffSpec` with its body; the wire's null
    ``fromGenerationId`` (from the beginning) is ``b""``."""

    @classmethod
    def from_wire(cls, obj: Any, codec: Codec) -> DiffRequest:
        f = Fields(obj, codec)
        from_as_of, to_as_of = f.integer_opt("fromAsOfMs", 0), f.integer_opt("toAsOfMs", 0)
        if from_as_of is not None and f.has("fromGenerationId"):
            raise InvalidRequest("fromGenerationId and fromAsOfMs: give one of them")
        if to_as_of is not None and f.raw("toGenerationId") is not None:
            raise InvalidRequest("toGenerationId and toAsOfMs: give one of them")
        from_generation: bytes | None = None
        if f.has("fromGenerationId"):
            from_generation = f.es_opt("fromGenerationId")
            from_generation = b"" if from_generation is None else from_generation
        from_reader = None
        if f.raw("fromReader") is not None:
            r = Fields(f.raw("fromReader"), codec, "fromReader")
            from_reader = FromReader(r.text("readerName"), r.text_opt("collectionName"))
        if from_as_of is not None:
            from_reader = None
        elif from_generation is None and from_reader is None:
            raise InvalidRequest("a diff needs fromGenerationId, fromAsOfMs or fromReader")
        if from_generation is not None:
            from_reader = None  # both named: fromGenerationId wins (SPEC §3, as in diffbelt)
        return cls(
            from_generation_id=from_generation,
            from_reader=from_reader,
            to_generation_id=f.es_opt("toGenerationId"),
            include_intermediate=not f.flag("omitIntermediateValues", True),
            from_key=f.es_opt("fromKey"),
            to_key=f.es_opt("toKey"),
            limit=f.integer_opt("limit", 1, MAX_PAGE_LIMIT),
            from_as_of_ms=from_as_of,
            to_as_of_ms=to_as_of,
        )

    def to_wire(self, codec: Codec) -> Body:
        return diff_to_wire(self, codec)

    def run(self, collection: Collection) -> DiffPage:
        """The first page (the next ones follow the answer's cursor)."""
        return collection.diff_page_of(self)


def diff_to_wire(spec: DiffSpec, codec: Codec) -> Body:
    """The body of ``POST diff/`` asking for ``spec``."""
    body: Body = {}
    if spec.from_as_of_ms is not None:
        body["fromAsOfMs"] = spec.from_as_of_ms
    elif spec.from_reader is not None:
        reader: Body = {"readerName": spec.from_reader.name}
        set_if_given(reader, "collectionName", spec.from_reader.collection)
        body["fromReader"] = reader
    else:
        body["fromGenerationId"] = codec.es(spec.from_generation_id or b"")
    set_if_given(body, "toGenerationId", codec.es_opt(spec.to_generation_id))
    if spec.include_intermediate:
        body["omitIntermediateValues"] = False
    set_if_given(body, "fromKey", codec.es_opt(spec.from_key))
    set_if_given(body, "toKey", codec.es_opt(spec.to_key))
    set_if_given(body, "limit", spec.limit)
    set_if_given(body, "toAsOfMs", spec.to_as_of_ms)
    return body


@dataclass(frozen=True, slots=True)
class LineageRequest:
    """``POST /collections/{c}/lineage``: the readers a generation's commit moved, ``depth`` levels back."""

    generation_id: bytes
    depth: int = 1

    @classmethod
    def from_wire(cls, obj: Any, codec: Codec) -> LineageRequest:
        f = Fields(obj, codec)
        depth = f.integer_opt("depth", 1, MAX_LINEAGE_DEPTH)
        return cls(f.es("generationId"), 1 if depth is None else depth)

    def to_wire(self, codec: Codec) -> Body:
        body: Body = {"generationId": codec.es(self.generation_id)}
        if self.depth != 1:
            body["depth"] = self.depth
        return body

    def run(self, collection: Collection) -> Lineage:
        return collection.lineage(self.generation_id, self.depth)
