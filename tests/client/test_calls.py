"""The client's pure halves: request bodies (diffbelt-compatible by default) and answer parsing."""

from __future__ import annotations

import orjson
import pytest

from diffstore.client import _calls
from diffstore.client._transport import Settings, build_request, codec_of, error_from_response, read_response
from diffstore.engine.types import ReaderUpdate
from diffstore.errors import (
    ERROR_CLASSES_BY_CODE,
    Conflict,
    DiffstoreError,
    NotFound,
    PayloadTooLarge,
    StorageError,
)
from diffstore.wire import JSON, MSGPACK
from diffstore.wire_requests import DiffRequest, QueryRequest, ReadAt, WriteOptions


def json_body(call: _calls.Call) -> object:
    request = build_request(call, Settings(format="json"))
    assert request.headers["Content-Type"] == JSON.content_type
    assert request.content is not None
    return orjson.loads(request.content)


def test_default_bodies_carry_only_what_diffbelt_knows() -> None:
    request = DiffRequest.of()
    assert json_body(_calls.diff_page("c", request, None)) == {"fromGenerationId": {"value": ""}}
    assert json_body(_calls.query_page("c", QueryRequest(), None)) == {}
    put = _calls.put("c", b"k", b"\x00", False, WriteOptions(generation_id=b"g"))
    assert json_body(put) == {
        "item": {"key": {"value": "k"}, "value": {"value": "AA==", "encoding": "base64"}},
        "generationId": {"value": "g"},
    }
    assert json_body(_calls.get("c", b"k", ReadAt())) == {"key": {"value": "k"}}
    commit = _calls.commit_generation("c", b"2", [("r", b"2"), ReaderUpdate("s", None, expected=b"1")])
    assert json_body(commit) == {
        "generationId": {"value": "2"},
        "updateReaders": [
            {"readerName": "r", "generationId": {"value": "2"}},
            {"readerName": "s", "generationId": None, "expectedGenerationId": {"value": "1"}},
        ],
    }


def test_paths_and_query_strings_are_encoded() -> None:
    assert _calls.readers("a b/é").path == "/collections/a%20b%2F%C3%A9/readers/"
    assert _calls.update_reader("c", "r/1", None).path == "/collections/c/readers/r%2F1"
    poll = _calls.generation_stream("c", b"\x00\x01", 1_000)
    assert poll.params == {"generationId": "AAE=", "generationIdEncoding": "base64", "timeoutMs": "1000"}
    assert poll.timeout_s is not None and poll.timeout_s > 1
    assert _calls.generation_stream("c", None).params == {}


def test_answers_are_read_in_the_codec_the_server_chose() -> None:
    call = _calls.collection_state("c")
    json_answer = orjson.dumps({"isManual": True, "generationId": {"value": "AAE=", "encoding": "base64"}})
    assert codec_of("application/json") is JSON and codec_of("Application/MsgPack") is MSGPACK
    state = read_response(call, 200, "application/json", json_answer)  # diffbelt ignores Accept
    assert (state.manual, state.generation_id, state.next_generation_id) == (True, b"\x00\x01", None)
    msgpack_answer = MSGPACK.dumps({"isManual": False, "generationId": b"\x00", "nextGenerationId": b"\x01"})
    assert read_response(call, 200, "application/msgpack", msgpack_answer).next_generation_id == b"\x01"
    with pytest.raises(StorageError):
        read_response(call, 200, "application/json", b'{"isManual": "yes"}')


@pytest.mark.parametrize("code", sorted(ERROR_CLASSES_BY_CODE))
def test_every_error_code_is_raised_as_its_class(code: str) -> None:
    for codec in (JSON, MSGPACK):
        error = error_from_response(400, codec, codec.dumps({"error": code, "reason": "why"}))
        assert type(error) is ERROR_CLASSES_BY_CODE[code] and error.reason == "why"


def test_answers_without_an_error_body_are_raised_by_status() -> None:
    assert type(error_from_response(404, JSON, b"Not Found")) is NotFound
    assert type(error_from_response(409, JSON, b"")) is Conflict
    assert type(error_from_response(500, JSON, b"internal error")) is StorageError
    assert type(error_from_response(418, JSON, b"teapot")) is DiffstoreError
    too_large = error_from_response(413, JSON, orjson.dumps({"error": "payloadTooLarge", "bytesMax": 10}))
    assert isinstance(too_large, PayloadTooLarge) and too_large.bytes_max == 10


def test_the_public_names_are_sorted_and_importable() -> None:
    import diffstore.client
    import diffstore.consumer

    for module in (diffstore.client, diffstore.consumer):
        assert module.__all__ == sorted(module.__all__)
        assert all(hasattr(module, name) for name in module.__all__)
