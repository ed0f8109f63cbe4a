"""Every HTTP operation of SPEC §3 as a pure :class:`Call`: the request to send and how to read its answer.

A ``Call`` knows nothing of sockets. The request body is built lazily for a :class:`~diffstore.wire.Codec`
(JSON or msgpack) and the answer is parsed with the codec the response actually used, so a client that
asks for msgpack still understands a diffbelt server that only speaks JSON. The shapes themselves come
from :mod:`diffstore.wire` and :mod:`diffstore.wire_requests`, shared with the server.

Optional request fields are sent only when given, so that a diffbelt server, which knows none of the
"beyond diffbelt" options, sees exactly the bodies it expects.
"""

from __future__ import annotations

import base64
import enum
import functools
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from operator import itemgetter
from typing import Any, Generic, TypeVar
from urllib.parse import quote

from diffstore.engine.types import (
    UNSET,
    CollectionInfo,
    DiffPage,
    DiffSpec,
    Expected,
    GenerationDigest,
    GenerationInfo,
    GenerationRecords,
    GetManyResult,
    GetResult,
    KeysAround,
    Lease,
    LeaseToken,
    Lineage,
    PhantomChanges,
    PutItem,
    PutResult,
    QueryPage,
    Reader,
    ReaderUpdate,
    ReaderUpdateLike,
    ResolvedRef,
    RetentionPolicy,
    RevertResult,
)
from diffstore.errors import InvalidRequest
from diffstore.wire import (
    Body,
    Codec,
    CollectionState,
    Fields,
    diff_page_from_wire,
    generation_from_wire,
    get_many_result_from_wire,
    get_result_from_wire,
    keys_around_from_wire,
    lineage_from_wire,
    phantom_changes_from_wire,
    put_result_from_wire,
    query_page_from_wire,
    readers_from_wire,
    retention_from_wire,
    retention_to_wire,
)
from diffstore.wire_leases import (
    AcquireLeaseRequest,
    ReleaseLeaseRequest,
    RenewLeaseRequest,
    lease_from_wire,
    leases_from_wire,
)
from diffstore.wire_requests import (
    CreateCollectionRequest,
    CreateReaderRequest,
    GenerationRequest,
    GetManyRequest,
    GetRequest,
    KeysAroundRequest,
    LineageRequest,
    PhantomChangesRequest,
    PutManyRequest,
    PutRequest,
    QueryRequest,
    ReadAt,
    StartPhantomRequest,
    UpdateReaderRequest,
    WriteOptions,
    diff_to_wire,
)
from diffstore.wire_revert import RevertRequest, revert_result_from_wire

T = TypeVar("T")


# Long polls get this much more time on the socket than the server's own timeout.
LONG_POLL_GRACE_S = 10.0
DEFAULT_LONG_POLL_MS = 60_000


class Replay(enum.Enum):
    """What a client given several servers may do with a call whose server went away or stepped down
    (:mod:`diffstore.client._failover`). A refusal (409 ``readOnlyReplica``/``fenced``) or a connection
    that never opened changed nothing: every call is then sent again to the leader. Only a call whose
    answer was lost after it was sent needs this."""

    READ = "read"
    """Changes nothing: sent again (to the leader, or any member answering reads)."""
    SAFE = "safe"
    """A write whose second application changes nothing more (a named generation, a producer's seqNo, a
    lease's own version): sent again to the new leader."""
    CHECKED = "checked"
    """A write whose second application is refused once the first one made it (a commit, a CAS): sent
    again; a refusal is then checked with ``confirm`` (applied: success; not: ``LeaderChanged``)."""
    ONCE = "once"
    """A write that could apply twice (an automatic collection's put, a create): not sent again; its
    failure is raised (the caller decides)."""


@dataclass(frozen=True, slots=True)
class Call(Generic[T]):
    """One request/response exchange.

    Attributes:
        method: the HTTP method.
        path: the URL path, already percent-encoded.
        parse: turns the decoded 2xx body into the typed result.
        body: builds the request body for a codec; ``None`` sends no body.
        params: query-string parameters.
        timeout_s: overrides the client's timeout (long polls need longer).
        tuples: ``parse`` accepts arrays as tuples, so a msgpack answer may be decoded without
            building lists (much cheaper for pages whose items each hold an array).
        columns: ``parse`` reads the columns form too (:mod:`diffstore.wire_columns`); a msgpack
            client asks for it.
        replay: whether a call whose answer was lost may be sent again (:class:`Replay`); None: a read or
            ``ONCE``, by :func:`diffstore.wire_routes.is_write`.
        confirm: for ``CHECKED`` calls (whose answer is None): a call answering whether the call was
            applied, asked when its resend is refused.
        generation_of: the collection whose open generation the call writes into (start, put into a named
            generation, commit, abort): such a generation does not survive a fail-over.
        lease: the collection and the fencing token the call carries: a token taken from another leader
            may collide with one issued by the new leader (its lease row may lag), so it is not sent there.
        holds_lease: the collection of an acquire or renew: its answer shows the token holds on the
            leader that gave it.
    """

    method: str
    path: str
    parse: Callable[[Any, Codec], T]
    body: Callable[[Codec], Body] | None = None
    params: dict[str, str] | None = None
    timeout_s: float | None = None
    tuples: bool = False
    columns: bool = False
    replay: Replay | None = None
    confirm: Callable[[], Call[bool]] | None = None
    generation_of: str | None = None
    lease: tuple[str, LeaseToken] | None = None
    holds_lease: str | None = None


def _path(*segments: str) -> str:
    return "/" + "/".join(quote(s, safe="") for s in segments)


def collection_path(name: str, *rest: str) -> str:
    return _path("collections", name, *rest)


def _empty(obj: Any, codec: Codec) -> None:
    return None


# --------------------------------------------------------------------------------------- collections


def _collection_infos(obj: Any, codec: Codec) -> list[CollectionInfo]:
    infos = []
    for entry in Fields(obj, codec, "response").array("items"):
        f = Fields(entry, codec, "response.items[]")
        infos.append(CollectionInfo(f.text("name"), f.flag("isManual")))
    return infos


def list_collections() -> Call[list[CollectionInfo]]:
    return Call("GET", "/collections/", _collection_infos)


def create_collection(
    name: str, manual: bool, initial_generation_id: bytes | None, retention: RetentionPolicy | None = None
) -> Call[bytes]:
    request = CreateCollectionRequest(name, manual, initial_generation_id, retention)
    return Call("POST", "/collections/", generation_from_wire, request.to_wire)


def _retention_answer(obj: Any, codec: Codec) -> RetentionPolicy | None:
    policy = retention_from_wire(Fields(obj, codec, "response").raw("retention"), codec, "response.retention")
    return None if policy.empty else policy


def retention(name: str) -> Call[RetentionPolicy | None]:
    return Call("GET", collection_path(name, "retention"), _retention_answer)


def set_retention(name: str, policy: RetentionPolicy | None) -> Call[RetentionPolicy | None]:
    return Call(
        "PUT",
        collection_path(name, "retention"),
        _retention_answer,
        lambda codec: retention_to_wire(policy),
        replay=Replay.SAFE,  # it replaces the policy
    )


def collection_state(name: str) -> Call[CollectionState]:
    return Call("GET", collection_path(name), CollectionState.from_wire)


def delete_collection(name: str) -> Call[None]:
    return Call("DELETE", collection_path(name), _empty)


def _generation_param(generation_id: bytes) -> dict[str, str]:
    if generation_id.isascii() and generation_id.decode("ascii").isprintable():
        return {"generationId": generation_id.decode("ascii"), "generationIdEncoding": "utf8"}
    encoded = base64.b64encode(generation_id).decode("ascii")
    return {"generationId": encoded, "generationIdEncoding": "base64"}


def generation_stream(name: str, since: bytes | None, timeout_ms: int = DEFAULT_LONG_POLL_MS) -> Call[bytes]:
    """The long poll: answers at once without ``since``, else when the generation differs or at timeout."""
    params: dict[str, str] = {}
    if since is not None:
        params = _generation_param(since) | {"timeoutMs": str(timeout_ms)}
    return Call(
        "GET",
        collection_path(name, "generationId", "stream"),
        generation_from_wire,
        params=params,
        timeout_s=timeout_ms / 1000 + LONG_POLL_GRACE_S,
    )


def producer_last_seq_no(name: str, producer_id: str) -> Call[int]:
    def parse(obj: Any, codec: Codec) -> int:
        return Fields(obj, codec, "response").integer("lastSeqNo", 0)

    return Call("GET", collection_path(name, "producers", producer_id), parse)


def splits(
    name: str, count: int, generation_id: bytes | None, from_generation_id: bytes | None = None
) -> Call[list[bytes]]:
    """``from_generation_id``: cut the keys changed in (from, generation] instead of those visible."""
    params = {"count": str(count)}
    ids = {"generationId": generation_id, "fromGenerationId": from_generation_id}
    given = {name: value for name, value in ids.items() if value is not None}
    utf8 = all(v.isascii() and v.decode("ascii").isprintable() for v in given.values())
    for param, value in given.items():
        params[param] = value.decode("ascii") if utf8 else base64.b64encode(value).decode("ascii")
    if given:
        params["generationIdEncoding"] = "utf8" if utf8 else "base64"

    def parse(obj: Any, codec: Codec) -> list[bytes]:
        return [codec.parse_es(k, "keys[]") for k in Fields(obj, codec, "response").array("keys")]

    return Call("GET", collection_path(name, "splits"), parse, params=params)


# ----------------------------------------------------------------------------------------- generations


def start_generation(
    name: str, generation_id: bytes, abort_outdated: bool, lease: LeaseToken | None = None
) -> Call[None]:
    request = GenerationRequest(generation_id, abort_outdated, lease=lease)
    path = collection_path(name, "generation", "start")
    # starting the open generation again is a no-op (SPEC §1)
    return Call(
        "POST",
        path,
        _empty,
        request.to_wire,
        replay=Replay.SAFE,
        generation_of=name,
        lease=_leased(name, lease),
    )


def _reader_update(update: ReaderUpdateLike) -> ReaderUpdate:
    if isinstance(update, ReaderUpdate):
        return update
    reader_name, generation_id = update
    return ReaderUpdate(reader_name, generation_id)


def commit_generation(
    name: str,
    generation_id: bytes,
    update_readers: Iterable[ReaderUpdateLike],
    lease: LeaseToken | None = None,
    metadata: dict[str, str] | None = None,
) -> Call[None]:
    updates = tuple(map(_reader_update, update_readers))
    request = GenerationRequest(generation_id, update_readers=updates, lease=lease, metadata=metadata)
    path = collection_path(name, "generation", "commit")
    # a second commit answers generationMismatch: the generation then tells whether the first one made it
    # (records and readers move in one transaction)
    confirm = functools.partial(generation_committed, name, generation_id)
    return Call(
        "POST",
        path,
        _empty,
        request.to_wire,
        replay=Replay.CHECKED,
        confirm=confirm,
        generation_of=name,
        lease=_leased(name, lease),
    )


def generation_committed(name: str, generation_id: bytes) -> Call[bool]:
    """Whether ``generation_id`` is a committed generation of ``name`` (the newest below its successor)."""

    listed = generations(name, generation_id + b"\0", 1)  # the newest at or below it

    def parse(obj: Any, codec: Codec) -> bool:
        ids, _ = listed.parse(obj, codec)
        return bool(ids) and ids[0] == generation_id

    return Call(listed.method, listed.path, parse, params=listed.params)


def abort_generation(name: str, generation_id: bytes, lease: LeaseToken | None = None) -> Call[None]:
    request = GenerationRequest(generation_id, lease=lease)
    path = collection_path(name, "generation", "abort")
    confirm = functools.partial(generation_not_open, name, generation_id)
    return Call(
        "POST",
        path,
        _empty,
        request.to_wire,
        replay=Replay.CHECKED,
        confirm=confirm,
        generation_of=name,
        lease=_leased(name, lease),
    )


def generation_not_open(name: str, generation_id: bytes) -> Call[bool]:
    """Whether ``generation_id`` is not the open generation of ``name`` (what an abort leaves)."""

    def parse(obj: Any, codec: Codec) -> bool:
        return CollectionState.from_wire(obj, codec).next_generation_id != generation_id

    return Call("GET", collection_path(name), parse)


def revert(
    name: str, to_generation_id: bytes, generation_id: bytes | None, lease: LeaseToken | None
) -> Call[RevertResult]:
    request = RevertRequest(to_generation_id, generation_id, lease)
    # a second revert to the same state finds nothing left to change
    return Call(
        "POST",
        collection_path(name, "revert"),
        revert_result_from_wire,
        request.to_wire,
        replay=Replay.SAFE,
        generation_of=name if generation_id is not None else None,
        lease=_leased(name, lease),
    )


def start_phantom(name: str, ttl_seconds: int) -> Call[bytes]:
    def parse(obj: Any, codec: Codec) -> bytes:
        return Fields(obj, codec, "response").es("phantomId")

    request = StartPhantomRequest(ttl_seconds)
    return Call("POST", collection_path(name, "phantom", "start"), parse, request.to_wire)


def phantom_changes(name: str, request: PhantomChangesRequest) -> Call[PhantomChanges]:
    return Call(
        "POST", collection_path(name, "phantom", "changes"), phantom_changes_from_wire, request.to_wire
    )


# ------------------------------------------------------------------------------------ records: writes


def _put_item(item: PutItem, if_not_present: bool) -> PutItem:
    if len(item) == 2:
        return (item[0], item[1], True) if if_not_present else item
    return item[0], item[1], bool(item[2])


def put(
    name: str, key: bytes, value: bytes | None, if_not_present: bool, options: WriteOptions
) -> Call[PutResult]:
    request = PutRequest((key, value, if_not_present), options)
    return Call(
        "POST",
        collection_path(name, "put"),
        put_result_from_wire,
        request.to_wire,
        replay=_write_replay(options, if_not_present),
        generation_of=_generation_of(name, options),
        lease=_leased(name, options.lease),
    )


def put_many(
    name: str, items: Iterable[PutItem], options: WriteOptions, if_not_present: bool = False
) -> Call[PutResult]:
    """``if_not_present`` applies to ``(key, value)`` items; a triple's own flag wins (as in the engine)."""
    listed = [_put_item(item, if_not_present) for item in items]
    request = PutManyRequest(listed, options)
    conditional = any(len(item) == 3 and item[2] for item in listed)
    return Call(
        "POST",
        collection_path(name, "putMany"),
        put_result_from_wire,
        request.to_wire,
        replay=_write_replay(options, conditional),
        generation_of=_generation_of(name, options),
        lease=_leased(name, options.lease),
    )


def _write_replay(options: WriteOptions, conditional: bool) -> Replay:
    """A put's: a producer's seqNo is deduplicated, and the same values written into the same named
    generation (or phantom) again change nothing -- but a second ``ifNotPresent`` would answer
    ``wasPut: false`` for what the first one wrote, and an automatic collection's next generation may be a
    new one."""
    if options.producer_id is not None and options.seq_no is not None:
        return Replay.SAFE
    if options.generation_id is not None and not conditional:
        return Replay.SAFE
    return Replay.ONCE


def _leased(name: str, lease: LeaseToken | None) -> tuple[str, LeaseToken] | None:
    return None if lease is None else (name, lease)


def _generation_of(name: str, options: WriteOptions) -> str | None:
    return name if options.generation_id is not None and options.phantom_id is None else None


# ------------------------------------------------------------------------------------- records: reads


def get(name: str, key: bytes, at: ReadAt) -> Call[GetResult]:
    return Call("POST", collection_path(name, "get"), get_result_from_wire, GetRequest(key, at).to_wire)


def get_many(name: str, keys: list[bytes], at: ReadAt) -> Call[GetManyResult]:
    request = GetManyRequest(keys, at)
    return Call("POST", collection_path(name, "getMany"), get_many_result_from_wire, request.to_wire)


def keys_around(
    name: str, key: bytes, limit: int, require_key_existence: bool, at: ReadAt
) -> Call[KeysAround]:
    request = KeysAroundRequest(key, require_key_existence, limit, at)
    return Call("POST", collection_path(name, "getKeysAround"), keys_around_from_wire, request.to_wire)


def page_call(
    name: str,
    kind: str,
    request: QueryRequest | DiffSpec,
    cursor: str | None,
    parse: Callable[[Any, Codec], T],
    tuples: bool = False,
    columns: bool = False,
) -> Call[T]:
    """A ``query/`` or ``diff/`` page (``kind``): the first by POST, the next ones by their cursor."""
    if cursor is not None:
        return Call("GET", collection_path(name, kind, cursor), parse, tuples=tuples, columns=columns)
    encode = functools.partial(diff_to_wire, request) if isinstance(request, DiffSpec) else request.to_wire
    return Call("POST", collection_path(name, kind) + "/", parse, encode, tuples=tuples, columns=columns)


def query_page(name: str, request: QueryRequest, cursor: str | None) -> Call[QueryPage]:
    return page_call(name, "query", request, cursor, query_page_from_wire)


def diff_page(name: str, request: DiffSpec, cursor: str | None) -> Call[DiffPage]:
    return page_call(name, "diff", request, cursor, diff_page_from_wire)


# -------------------------------------------------------------------------------------------- readers


def readers(name: str) -> Call[list[Reader]]:
    def parse(obj: Any, codec: Codec) -> list[Reader]:
        return readers_from_wire(obj, codec, name)

    return Call("GET", collection_path(name, "readers") + "/", parse)


def create_reader(
    name: str, reader_name: str, collection: str | None, generation_id: bytes | None
) -> Call[None]:
    request = CreateReaderRequest(reader_name, collection, generation_id)
    return Call("POST", collection_path(name, "readers") + "/", _empty, request.to_wire)


def update_reader(
    name: str, reader_name: str, generation_id: bytes | None, expected: Expected = UNSET
) -> Call[None]:
    request = UpdateReaderRequest(generation_id, expected)
    path = collection_path(name, "readers", reader_name)
    if expected is UNSET:  # setting a reader to a generation twice is setting it once
        return Call("PUT", path, _empty, request.to_wire, replay=Replay.SAFE)
    # a second compare-and-set answers badVersion once the first one moved it: where it is tells
    confirm = functools.partial(reader_at, name, reader_name, generation_id)
    return Call("PUT", path, _empty, request.to_wire, replay=Replay.CHECKED, confirm=confirm)


def reader_at(name: str, reader_name: str, generation_id: bytes | None) -> Call[bool]:
    """Whether reader ``reader_name`` of ``name`` stands at ``generation_id``."""

    def parse(obj: Any, codec: Codec) -> bool:
        found = [r for r in readers_from_wire(obj, codec, name) if r.name == reader_name]
        return bool(found) and found[0].generation_id == generation_id

    return Call("GET", collection_path(name, "readers") + "/", parse)


def delete_reader(name: str, reader_name: str) -> Call[None]:
    return Call("DELETE", collection_path(name, "readers", reader_name), _empty)


def lineage(name: str, generation_id: bytes, depth: int) -> Call[Lineage]:
    request = LineageRequest(generation_id, depth)
    return Call("POST", collection_path(name, "lineage"), lineage_from_wire, request.to_wire)


def _generations_params(before: bytes | None, limit: int) -> dict[str, str]:
    params = {"limit": str(limit)}
    if before is not None:
        params |= {
            ("before" if k == "generationId" else "beforeEncoding"): v
            for k, v in _generation_param(before).items()
        }
    return params


def resolve_ref(name: str, ref: str) -> Call[ResolvedRef]:
    def parse(obj: Any, codec: Codec) -> ResolvedRef:
        f = Fields(obj, codec, "response")
        at = f.raw("committedAtMs")
        return ResolvedRef(f.es("generationId"), int(at) if at is not None else None)

    return Call("GET", collection_path(name, "refs"), parse, params={"ref": ref})


def _generation_info(obj: Any, codec: Codec, where: str) -> GenerationInfo:
    """``{generationId, committedAtMs, changedKeys, metadata, collected?}`` (SPEC §8) as the history lists
    it."""
    e = Fields(obj, codec, where)
    at, changed, metadata = e.raw("committedAtMs"), e.raw("changedKeys"), e.raw("metadata")
    return GenerationInfo(
        e.es("generationId"),
        int(at) if at is not None else None,
        int(changed) if changed is not None else None,
        {str(k): str(v) for k, v in metadata.items()} if isinstance(metadata, dict) else None,
        e.raw("collected") is True,
    )


def history(name: str, before: bytes | None, limit: int) -> Call[tuple[list[GenerationInfo], bool]]:
    def parse(obj: Any, codec: Codec) -> tuple[list[GenerationInfo], bool]:
        f = Fields(obj, codec, "response")
        infos = [_generation_info(e, codec, "items[]") for e in f.array("items")]
        return infos, f.has("nextBefore") and f.raw("nextBefore") is not None

    return Call("GET", collection_path(name, "generations"), parse, params=_generations_params(before, limit))


def _generation_digest(obj: Any, codec: Codec, where: str) -> GenerationDigest:
    """``{generationId, records, digest}`` (SPEC §9 Integrity); null records/digest: unknown."""
    e = Fields(obj, codec, where)
    records, digest = e.raw("records"), e.raw("digest")
    return GenerationDigest(
        e.es("generationId"),
        int(records) if records is not None else None,
        bytes.fromhex(str(digest)) if digest is not None else None,
    )


def digest(name: str, generation_id: bytes | None) -> Call[GenerationDigest]:
    params = {} if generation_id is None else _generation_param(generation_id)

    def parse(obj: Any, codec: Codec) -> GenerationDigest:
        return _generation_digest(obj, codec, "response")

    return Call("GET", collection_path(name, "digest"), parse, params=params)


def digests(name: str, before: bytes | None, limit: int) -> Call[tuple[list[GenerationDigest], bool]]:
    def parse(obj: Any, codec: Codec) -> tuple[list[GenerationDigest], bool]:
        f = Fields(obj, codec, "response")
        found = [_generation_digest(e, codec, "items[]") for e in f.array("items")]
        return found, f.has("nextBefore") and f.raw("nextBefore") is not None

    return Call("GET", collection_path(name, "digests"), parse, params=_generations_params(before, limit))


def generations(name: str, before: bytes | None, limit: int) -> Call[tuple[list[bytes], bool]]:
    params = _generations_params(before, limit)

    def parse(obj: Any, codec: Codec) -> tuple[list[bytes], bool]:
        f = Fields(obj, codec, "response")
        # items are ES (the console's shape) or {generationId, ...} objects (SPEC §8's)
        ids = [
            Fields(e, codec, "items[]").es("generationId")
            if isinstance(e, dict) and "generationId" in e
            else codec.parse_es(e, "items[]")
            for e in f.array("items")
        ]
        return ids, f.has("nextBefore") and f.raw("nextBefore") is not None

    return Call("GET", collection_path(name, "generations"), parse, params=params)


def generation_records(
    name: str,
    generation_id: bytes,
    from_key: bytes | None,
    limit: int,
    hold: str | None,
    visible: bool = False,
) -> Call[GenerationRecords]:
    def body(codec: Codec) -> Body:
        out: Body = {"generationId": codec.es(generation_id), "limit": limit}
        if visible:
            out["visible"] = True
            out["pairs"] = True  # a server from before pairs answers objects: both are read
        if from_key is not None:
            out["fromKey"] = codec.es(from_key)
        if hold is not None:
            out["hold"] = hold
        return out

    def readers_of(f: Fields, field: str) -> tuple[Reader, ...]:
        found = []
        for entry in f.array(field) if f.has(field) else []:
            e = Fields(entry, f.codec, f"{field}[]")
            found.append(Reader(e.text("readerName"), e.text("target"), e.es_nullable("generationId")))
        return tuple(found)

    def parse(obj: Any, codec: Codec) -> GenerationRecords:
        f = Fields(obj, codec, "response")
        entries = f.raw("items")
        if not isinstance(entries, list | tuple):
            raise InvalidRequest("response.items: expected an array")
        items: list[tuple[bytes, bytes | None]]
        if codec.binary and entries and isinstance(entries[0], tuple):
            items = list(entries)  # msgpack pairs, decoded as tuples: the items as they are, once checked
            if not _bin_pairs(items):
                raise InvalidRequest("response.items: expected [key, value] pairs of bin (value: nil)")
        else:
            items = []
            for entry in entries:
                if isinstance(entry, list | tuple) and len(entry) == 2:
                    key = codec.parse_es(entry[0], "items[][0]")
                    value = None if entry[1] is None else codec.parse_es(entry[1], "items[][1]")
                    items.append((key, value))
                else:
                    e = Fields(entry, codec, "items[]")
                    items.append((e.es("key"), e.es_nullable("value")))
        return GenerationRecords(
            items,
            f.es_opt("nextKey"),
            f.es_opt("previousGenerationId"),
            readers_of(f, "moves"),
            readers_of(f, "readers"),
            # an older server sends no commit fields: None, and a replica's clock stands in
            _generation_info(obj | {"generationId": codec.es(generation_id)}, codec, "response")
            if isinstance(obj, dict) and "committedAtMs" in obj
            else None,
        )

    # a first copy's pages (visible: no readers or moves, whose arrays would come as tuples) skip lists
    return Call("POST", collection_path(name, "generations", "records"), parse, body, tuples=visible)


def _bin_pairs(items: list[Any]) -> bool:
    """Whether ``items`` are (bin, bin or nil) pairs (checked by type sets: no Python loop per item)."""
    try:
        return (
            set(map(type, items)) <= {tuple}
            and set(map(len, items)) <= {2}
            and set(map(type, map(itemgetter(0), items))) <= {bytes}
            and set(map(type, map(itemgetter(1), items))) <= {bytes, type(None)}
        )
    except TypeError:
        return False


# --------------------------------------------------------------------------------------------- leases


def leases(name: str) -> Call[list[Lease]]:
    return Call("GET", collection_path(name, "leases") + "/", leases_from_wire)


def _lease_parser(lease_name: str) -> Callable[[Any, Codec], Lease]:
    def parse(obj: Any, codec: Codec) -> Lease:
        return lease_from_wire(obj, codec, lease_name)

    return parse


def acquire_lease(name: str, lease_name: str, owner: str, ttl_ms: int) -> Call[Lease]:
    request = AcquireLeaseRequest(owner, ttl_ms)
    path = collection_path(name, "leases", lease_name, "acquire")
    # a second acquire by the same owner answers a newer version to that owner: the version the lost answer
    # carried reached no one, so it fences nothing and the owner holds the lease once
    return Call(
        "POST", path, _lease_parser(lease_name), request.to_wire, replay=Replay.SAFE, holds_lease=name
    )


def renew_lease(name: str, lease_name: str, owner: str, version: int, ttl_ms: int | None) -> Call[Lease]:
    request = RenewLeaseRequest(owner, version, ttl_ms)
    path = collection_path(name, "leases", lease_name, "renew")
    return Call(
        "POST", path, _lease_parser(lease_name), request.to_wire, replay=Replay.SAFE, holds_lease=name
    )


def release_lease(name: str, lease_name: str, owner: str, version: int) -> Call[None]:
    request = ReleaseLeaseRequest(owner, version)
    path = collection_path(name, "leases", lease_name, "release")
    # a second release answers leaseLost once the first one made it: the owner holds it no more either way
    confirm = functools.partial(lease_not_held, name, lease_name, owner, version)
    return Call("POST", path, _empty, request.to_wire, replay=Replay.CHECKED, confirm=confirm)


def lease_not_held(name: str, lease_name: str, owner: str, version: int) -> Call[bool]:
    """Whether ``owner`` no longer holds lease ``lease_name`` of ``name`` at ``version``."""

    def parse(obj: Any, codec: Codec) -> bool:
        held = [x for x in leases_from_wire(obj, codec) if x.name == lease_name]
        return not held or held[0].owner != owner or held[0].version != version

    return Call("GET", collection_path(name, "leases") + "/", parse)


def replica_status() -> Call[Any]:
    """``GET /replica``: the answer as decoded (``{primary, collections: [...]}``)."""
    return Call("GET", "/replica", lambda obj, codec: obj)


def promote(force: bool = False, wait_ms: int | None = None) -> Call[bool]:
    def parse(obj: Any, codec: Codec) -> bool:
        return Fields(obj, codec, "response").flag("promoted")

    return Call(
        "POST",
        "/replica/promote",
        parse,
        _promotion_body(force, wait_ms),
        timeout_s=_promote_timeout(wait_ms),
    )


def promotion(force: bool = False, wait_ms: int | None = None) -> Call[Any]:
    """``POST /replica/promote``: the whole answer as decoded (``{promoted, term, collections, ...}``)."""
    body = _promotion_body(force, wait_ms)
    return Call("POST", "/replica/promote", lambda obj, codec: obj, body, timeout_s=_promote_timeout(wait_ms))


def _promotion_body(force: bool, wait_ms: int | None) -> Callable[[Codec], Body]:
    def body(codec: Codec) -> Body:
        out: Body = {"force": force}
        if wait_ms is not None:
            out["waitMs"] = wait_ms
        return out

    return body


def _promote_timeout(wait_ms: int | None) -> float:
    # a promotion waits up to twice waitMs for the replica to catch up, plus its calls to the old primary
    return 2 * (wait_ms if wait_ms is not None else 10_000) / 1000 + 60


def replication() -> Call[Any]:
    """``GET /replication``: any server's role and term, as decoded."""
    return Call("GET", "/replication", lambda obj, codec: obj)


def step_down(term: int, primary: str, replica_id: str | None) -> Call[Any]:
    """``POST /replica/stepDown``: a new primary promoted at ``term`` tells its old primary to step down."""

    def body(codec: Codec) -> Body:
        out: Body = {"term": term, "primary": primary}
        if replica_id is not None:
            out["replicaId"] = replica_id
        return out

    return Call("POST", "/replica/stepDown", lambda obj, codec: obj, body)


def step_up(term: int, replica_id: str | None) -> Call[Any]:
    """``POST /replica/stepUp``: the promotion that stepped this primary down at ``term`` was abandoned."""

    def body(codec: Codec) -> Body:
        out: Body = {"term": term}
        if replica_id is not None:
            out["replicaId"] = replica_id
        return out

    return Call("POST", "/replica/stepUp", lambda obj, codec: obj, body)


def healthz() -> Call[bool]:
    def parse(obj: Any, codec: Codec) -> bool:
        return Fields(obj, codec, "response").flag("ok")

    return Call("GET", "/healthz", parse)
