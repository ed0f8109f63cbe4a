"""The wire codec: EncodedString rules of SPEC §2, body codecs, and request/response round trips."""

from __future__ import annotations

from typing import Any

import msgpack
import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from diffstore.client._transport import codec_of
from diffstore.engine.types import (
    UNSET,
    DiffItem,
    DiffPage,
    FromReader,
    GetResult,
    KeysAround,
    LeaseToken,
    PutItem,
    PutResult,
    QueryPage,
    Reader,
    ReaderUpdate,
    Record,
    RevertResult,
)
from diffstore.errors import BadRequest, InvalidEncoding, InvalidJson, InvalidRequest
from diffstore.server.negotiation import request_codec, response_codec
from diffstore.wire import (
    JSON,
    MSGPACK,
    MSGPACK_MEDIA_TYPES,
    Codec,
    CollectionState,
    decode_es,
    diff_page_from_wire,
    diff_page_to_wire,
    encode_es,
    get_result_from_wire,
    get_result_to_wire,
    keys_around_from_wire,
    keys_around_to_wire,
    put_result_from_wire,
    put_result_to_wire,
    query_page_from_wire,
    query_page_to_wire,
    readers_from_wire,
    readers_to_wire,
)
from diffstore.wire_requests import (
    CreateCollectionRequest,
    CreateReaderRequest,
    DiffRequest,
    GenerationRequest,
    GetRequest,
    KeysAroundRequest,
    PutManyRequest,
    PutRequest,
    QueryRequest,
    ReadAt,
    StartPhantomRequest,
    UpdateReaderRequest,
    WriteOptions,
)
from diffstore.wire_revert import RevertRequest, revert_result_from_wire, revert_result_to_wire

CODECS = [JSON, MSGPACK]


def through(codec: Codec, body: Any) -> Any:
    """Serialises and parses a body, as it travels."""
    return codec.loads(codec.dumps(body))


def test_spec_example_eight_zero_bytes() -> None:
    assert encode_es(b"\0" * 8) == {"value": "AAAAAAAAAAA=", "encoding": "base64"}


@pytest.mark.parametrize(
    ("data", "plain"),
    [(b"", True), (b" ~", True), (b"abc", True), (b"\x1f", False), (b"\x7f", False), ("é".encode(), False)],
)
def test_plain_only_for_printable_ascii(data: bytes, plain: bool) -> None:
    encoded = encode_es(data)
    assert ("encoding" not in encoded) is plain
    assert decode_es(encoded) == data


def test_request_encodings() -> None:
    assert decode_es({"value": "é"}) == "é".encode()
    assert decode_es({"value": "é", "encoding": "utf8"}) == "é".encode()
    assert decode_es({"value": "AAE=", "encoding": "base64"}) == b"\0\1"


@pytest.mark.parametrize(
    "bad",
    [
        {"value": "AAE", "encoding": "base64"},
        {"value": "A!E=", "encoding": "base64"},
        {"value": "é", "encoding": "base64"},
        {"value": "x", "encoding": "hex"},
        {"value": "\ud800"},
    ],
)
def test_invalid_encoding(bad: dict[str, str]) -> None:
    with pytest.raises(InvalidEncoding):
        decode_es(bad)


@pytest.mark.parametrize("bad", [None, "x", 1, [], {"value": 3}, {"encoding": "utf8"}])
def test_malformed_es_is_invalid_request(bad: Any) -> None:
    with pytest.raises(InvalidRequest):
        decode_es(bad)


@given(st.binary(max_size=64))
def test_es_round_trip(data: bytes) -> None:
    for codec in CODECS:
        assert codec.parse_es(through(codec, codec.es(data)), "x") == data


def test_msgpack_es_is_raw_bin() -> None:
    raw = MSGPACK.dumps({"generationId": MSGPACK.es(b"\0\1")})
    assert msgpack.unpackb(raw, raw=True) == {b"generationId": b"\0\1"}
    # lenient forms: a str is its UTF-8 bytes, the JSON-style map works too
    assert MSGPACK.parse_es("é", "k") == "é".encode()
    assert MSGPACK.parse_es({"value": "AAE=", "encoding": "base64"}, "k") == b"\0\1"


@pytest.mark.parametrize(
    ("codec", "body"), [(JSON, b"{"), (JSON, b"\xff"), (MSGPACK, b"\xc1"), (MSGPACK, b"\x92")]
)
def test_malformed_bodies_are_invalid_json(codec: Codec, body: bytes) -> None:
    with pytest.raises(InvalidJson):
        codec.loads(body)


def test_json_dumps_is_compact_orjson() -> None:
    assert JSON.dumps({"a": [1, None]}) == orjson.dumps({"a": [1, None]}) == b'{"a":[1,null]}'


REQUESTS: list[Any] = [
    CreateCollectionRequest("A", True, b"\0"),
    CreateCollectionRequest("B", False),
    GetRequest(b"k"),
    GetRequest(b"\0k", ReadAt(b"g", b"p")),
    KeysAroundRequest(b"k", False, 10, ReadAt(b"\xff")),
    PutRequest((b"k", None, True)),
    PutRequest((b"k", b"v", False), WriteOptions(b"g", b"p", True, "prod", 7)),
    PutManyRequest([(b"a", b"1", False), (b"b", None, True)], WriteOptions(generation_id=b"\0\0")),
    PutManyRequest([(b"a", b"1")], WriteOptions(generation_id=b"g", lease=LeaseToken("w", 3))),
    CreateReaderRequest("r"),
    CreateReaderRequest("r", "other", b"\0"),
    UpdateReaderRequest(None),
    UpdateReaderRequest(b"g", None),
    UpdateReaderRequest(b"g", b"f"),
    GenerationRequest(b"g", abort_outdated=True),
    GenerationRequest(b"g", lease=LeaseToken("w", 2**62)),
    GenerationRequest(b"g", update_readers=(ReaderUpdate("a", b"1"), ReaderUpdate("b", None, None))),
    StartPhantomRequest(60),
    QueryRequest(),
    QueryRequest(ReadAt(b"g"), b"a", b"z", 5),
    DiffRequest(from_generation_id=b""),
    DiffRequest(from_reader=FromReader("r", "C"), to_generation_id=b"\0", include_intermediate=True, limit=3),
    DiffRequest(from_reader=FromReader("r"), from_key=b"a", to_key=b"b"),
    RevertRequest(b"\0"),
    RevertRequest(b"", b"g", LeaseToken("w", 1)),
]


@pytest.mark.parametrize("codec", CODECS, ids=lambda c: c.name)
@pytest.mark.parametrize("request_", REQUESTS, ids=lambda r: type(r).__name__)
def test_request_round_trip(codec: Codec, request_: Any) -> None:
    assert type(request_).from_wire(through(codec, request_.to_wire(codec)), codec) == request_


def test_request_defaults_and_absent_vs_null() -> None:
    assert UpdateReaderRequest.from_wire({}, JSON) == UpdateReaderRequest(None, UNSET)
    assert UpdateReaderRequest.from_wire({"expectedGenerationId": None}, JSON).expected is None
    assert DiffRequest.from_wire({"fromGenerationId": None}, JSON).from_generation_id == b""
    both = DiffRequest.from_wire({"fromGenerationId": None, "fromReader": {"readerName": "r"}}, JSON)
    assert both.from_generation_id == b"" and both.from_reader is None  # SPEC §3: fromGenerationId wins
    assert StartPhantomRequest.from_wire(None, JSON).ttl_seconds == 3600
    assert PutRequest.from_wire({"item": {"key": {"value": "k"}, "value": None}}, JSON).item == (
        b"k",
        None,
        False,
    )


@pytest.mark.parametrize(
    ("cls", "body"),
    [
        (PutRequest, {"item": {"key": {"value": "k"}}}),  # value must be present
        (
            PutRequest,
            {"item": {"key": {"value": "k"}, "value": None}, "seqNo": 1},
        ),  # seqNo without producerId
        (PutRequest, {"item": {"key": {"value": "k"}, "value": None}, "producerId": "p", "seqNo": 0}),
        (PutRequest, {"item": {"key": {"value": "k"}, "value": None}, "phantomId": {"value": "p"}}),
        (PutRequest, {"item": {"key": {"value": "k"}, "value": None}, "skipUnchanged": 1}),
        (PutManyRequest, {"items": {}}),
        (PutManyRequest, {"items": [None]}),
        (CreateCollectionRequest, {"collectionName": "", "isManual": True}),
        (CreateCollectionRequest, {"collectionName": "x" * 256, "isManual": True}),
        (
            CreateCollectionRequest,
            {"collectionName": "a", "isManual": False, "initialGenerationId": {"value": ""}},
        ),
        (CreateCollectionRequest, {"collectionName": "a"}),
        (KeysAroundRequest, {"key": {"value": "k"}, "requireKeyExistance": True, "limit": 1001}),
        (KeysAroundRequest, {"key": {"value": "k"}, "requireKeyExistance": True, "limit": True}),
        (QueryRequest, {"limit": 0}),
        (QueryRequest, {"limit": 10_001}),
        (QueryRequest, []),
        (DiffRequest, {}),
        (DiffRequest, {"fromReader": {}}),
        (GenerationRequest, {"generationId": {"value": "g"}, "updateReaders": [{"readerName": "r"}]}),
        (GenerationRequest, {"generationId": {"value": "g"}, "updateReaders": {}}),
        (StartPhantomRequest, {"ttlSeconds": -1}),
        (RevertRequest, {}),
        (RevertRequest, {"toGenerationId": 1}),
        (RevertRequest, {"toGenerationId": {"value": "g"}, "generationId": []}),
        (RevertRequest, {"toGenerationId": {"value": "g"}, "lease": {"name": "w"}}),
    ],
)
def test_bad_requests(cls: Any, body: Any) -> None:
    with pytest.raises(BadRequest):
        cls.from_wire(body, JSON)


def test_unknown_fields_are_ignored() -> None:
    assert GetRequest.from_wire({"key": {"value": "k", "extra": 1}, "zzz": [1]}, JSON) == GetRequest(b"k")


@pytest.mark.parametrize("codec", CODECS, ids=lambda c: c.name)
def test_response_round_trips(codec: Codec) -> None:
    got = GetResult(b"\0g", Record(b"k", b"\xff", b"\0g"))
    assert get_result_from_wire(through(codec, get_result_to_wire(got, codec)), codec) == got
    missing = GetResult(b"g", None)
    assert get_result_from_wire(through(codec, get_result_to_wire(missing, codec)), codec) == missing
    for put in (PutResult(b"g"), PutResult(b"g", was_put=False), PutResult(b"g", skipped=True)):
        assert put_result_from_wire(through(codec, put_result_to_wire(put, codec)), codec) == put
    page = QueryPage(b"g", [Record(b"a", b"", b"g"), Record(b"b", b"\0", b"g")], "tok")
    assert query_page_from_wire(through(codec, query_page_to_wire(page, codec)), codec) == page
    diff = DiffPage(b"", b"\0", [DiffItem(b"a", None, b"x", (b"y", None)), DiffItem(b"b", b"1", None)], None)
    assert diff_page_from_wire(through(codec, diff_page_to_wire(diff, codec)), codec) == diff
    around = KeysAround(b"g", [b"b", b"a"], [b"d"], True, False, True)
    assert keys_around_from_wire(through(codec, keys_around_to_wire(around, codec)), codec) == around
    readers = [Reader("r", "A", None), Reader("s", "hstream://x", b"\0" * 12)]
    assert readers_from_wire(through(codec, readers_to_wire(readers, codec)), codec, "A") == readers
    reverted = RevertResult(b"\0g", 3)
    assert revert_result_from_wire(through(codec, revert_result_to_wire(reverted, codec)), codec) == reverted
    state = CollectionState(True, b"g", None)
    assert CollectionState.from_wire(through(codec, state.to_wire(codec)), codec) == state


def test_response_shapes_match_spec() -> None:
    assert put_result_to_wire(PutResult(b"g"), JSON) == {"generationId": {"value": "g"}, "wasPut": True}
    body = diff_page_to_wire(DiffPage(b"", b"1", [DiffItem(b"k", None, b"v")], "c"), JSON)
    assert body == {
        "fromGenerationId": {"value": ""},
        "toGenerationId": {"value": "1"},
        "items": [
            {"key": {"value": "k"}, "fromValue": None, "intermediateValues": [], "toValue": {"value": "v"}}
        ],
        "cursorId": "c",
    }
    assert CollectionState(False, b"a", None, ("nextGenerationId",)).to_wire(JSON) == {"isManual": False}


@pytest.mark.parametrize("codec", CODECS, ids=lambda c: c.name)
def test_put_many_fast_and_slow_paths_agree(codec: Codec) -> None:
    pairs: list[PutItem] = [(b"plain", b"v"), (b"gone", None), (b"", b"")]
    body = through(codec, PutManyRequest(pairs).to_wire(codec))
    assert PutManyRequest.from_wire(body, codec).items == pairs  # the fast path answers pairs
    # an item the fast path does not take (a flag, bytes that are not utf8) sends every item through the
    # validating parser, which answers triples
    odd = [(b"k", b"", True), (b"\xff\x00", b"\x80", False)]
    body = through(codec, PutManyRequest([*pairs, *odd]).to_wire(codec))
    assert PutManyRequest.from_wire(body, codec).items == [(k, v, False) for k, v in pairs] + odd


@pytest.mark.parametrize(
    ("item", "error"),
    [
        ({"key": {"value": "\ud800"}, "value": None}, InvalidEncoding),
        ({"key": {"value": "k"}, "other": None}, InvalidRequest),
        ({"key": {"value": "k"}, "value": {"value": 1}}, InvalidRequest),
        ({"key": {"value": "k", "encoding": "hex"}, "value": None}, InvalidEncoding),
        ({"key": "k", "value": None}, InvalidRequest),
        ([], InvalidRequest),
    ],
)
def test_put_many_rejects_bad_items(item: Any, error: type[Exception]) -> None:
    with pytest.raises(error):
        PutManyRequest.from_wire({"items": [{"key": {"value": "ok"}, "value": None}, item]}, JSON)


def test_put_many_msgpack_rejects_bad_items() -> None:
    for item in ({"key": b"k", "other": b""}, {"key": 1, "value": b""}, {"key": b"k", "value": 2}):
        with pytest.raises(InvalidRequest):
            PutManyRequest.from_wire({"items": [item]}, MSGPACK)


@pytest.mark.parametrize("media_type", sorted(MSGPACK_MEDIA_TYPES))
def test_server_and_client_read_the_same_media_types_as_msgpack(media_type: str) -> None:
    assert request_codec(media_type) is MSGPACK
    assert response_codec(media_type) is MSGPACK
    assert codec_of(f"{media_type}; q=1") is MSGPACK
    assert codec_of("application/json") is JSON and response_codec("application/json") is JSON
