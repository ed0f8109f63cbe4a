"""schemathesis against ``/openapi.json`` of a live server: no 500s, answers match the documented schema.

schemathesis' lazy fixture loader does not work with this pytest (it reads a private attribute), so the
document is built at import from an app over no store (the schema never touches the store), and a test
checks that it is exactly what the live server publishes at ``/openapi.json``.
"""

from __future__ import annotations

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
def test_api_conforms(case: Any, module_live: Live) -> None:
    case.call_and_validate(base_url=module_live.url, checks=CHECKS)
