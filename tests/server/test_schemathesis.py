"""schemathesis against ``/openapi.json`` of a live server: no 500s, answers match the documented schema.

Every operation gets ``max_examples`` generated requests (bodies in JSON and in msgpack, as schemathesis
draws the media type) for each ``Accept`` (JSON, msgpack): bounded by count, derandomized, so it runs in
``make test`` in the same time on every run. ``TRIED`` counts the inputs per (body media type, Accept).

schemathesis' lazy fixture loader does not work with this pytest (it reads a private attribute), so the
document is built at import from an app over no store (the schema never touches the store), and a test
checks that it is exactly what the live server publishes at ``/openapi.json``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from typing import Any, cast

import msgpack
import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.checks import (
    content_type_conformance,
    not_a_server_error,
    response_schema_conformance,
    status_code_conformance,
)

from diffstore.engine.store import Store
from diffstore.server import create_app

from .conftest import Live, live_server

CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance]
DOCUMENT = create_app(cast(Store, None)).openapi()


@schemathesis.serializer("application/msgpack")
def _msgpack(ctx: Any, value: Any) -> bytes:
    """msgpack bodies in the JSON shape (EncodedStrings as maps): the server accepts that form too."""
    return msgpack.packb(_fit(value), use_bin_type=True)  # type: ignore[no-any-return]


def _fit(value: Any) -> Any:
    """Integers msgpack cannot hold become strings (the server then answers 400, as for any wrong type)."""
    if isinstance(value, dict):
        return {k: _fit(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_fit(v) for v in value]
    if isinstance(value, int) and not isinstance(value, bool) and not -(2**63) <= value < 2**64:
        return str(value)
    return value


# the long polls would wait for their timeout on every example; they have their own tests
schema = schemathesis.openapi.from_dict(DOCUMENT).exclude(path_regex=r"generationId/stream|overview/changes")


@pytest.fixture(scope="module")
def module_live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Live]:
    with live_server(tmp_path_factory.mktemp("schemathesis") / "data") as live:
        live.ok("POST", "/collections/", {"collectionName": "m", "isManual": True})
        live.ok("POST", "/collections/", {"collectionName": "a", "isManual": False})
        yield live


def test_published_document_is_the_one_tested(module_live: Live) -> None:
    assert module_live.http.get("/openapi.json").json() == DOCUMENT
    assert module_live.http.get("/docs").status_code == 200
    put = DOCUMENT["paths"]["/collections/{c}/put"]["post"]
    assert put["requestBody"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/PutOne"
    }
    assert "item" in DOCUMENT["components"]["schemas"]["PutOne"]["required"]
    # msgpack answers are described with EncodedStrings as binary strings, not in the JSON shape
    answer = DOCUMENT["paths"]["/collections/{c}/get"]["post"]["responses"]["200"]["content"]
    assert answer["application/json"]["schema"] == {"$ref": "#/components/schemas/GetResponse"}
    assert answer["application/msgpack"]["schema"] == {"$ref": "#/components/schemas/GetResponseMsgpack"}
    twin = DOCUMENT["components"]["schemas"]["GetResponseMsgpack"]["properties"]
    assert twin["generationId"]["type"] == "string" and twin["generationId"]["format"] == "binary"
    assert DOCUMENT["components"]["schemas"]["GetResponse"]["properties"]["generationId"] == {
        "$ref": "#/components/schemas/ES"
    }


@schema.parametrize()
@settings(
    max_examples=6,
    derandomize=True,  # the same examples on every run: CI must not be flaky
    database=None,
    deadline=None,
    suppress_health_check=[
        HealthCheck.too_slow,
        HealthCheck.filter_too_much,
        HealthCheck.function_scoped_fixture,
    ],
)
@pytest.mark.parametrize("accept", ["application/json", "application/msgpack"])
def test_api_conforms(case: Any, module_live: Live, accept: str) -> None:
    TRIED[(case.media_type or "-", accept)] += 1
    case.call_and_validate(base_url=module_live.url, checks=CHECKS, headers={"accept": accept})


TRIED: Counter[tuple[str, str]] = Counter()


def test_both_body_media_types_were_tried() -> None:
    """Runs after the generated cases (file order); prints what they tried (``pytest -s`` shows it)."""
    if not TRIED:
        pytest.skip("the generated cases did not run in this session")
    print(f"\nschemathesis inputs by (body media type, Accept): {dict(TRIED)}, {sum(TRIED.values())} in all")
    assert TRIED[("application/msgpack", "application/msgpack")] > 0
    assert TRIED[("application/json", "application/json")] > 0
