"""Query and diff pages in the columns form, over a live server: same rows as the items form, cursors,
and every other answer (errors, other routes) in plain msgpack."""

from __future__ import annotations

from typing import Any

import msgpack

from diffstore.wire import decode_es
from diffstore.wire_columns import COLUMNS_CONTENT_TYPE, BinaryColumn

from .conftest import Live, es

ASK = {"accept": f"{COLUMNS_CONTENT_TYPE}, application/msgpack;q=0.9", "content-type": "application/msgpack"}


def es_bytes(encoded: dict[str, str]) -> bytes:
    return decode_es(encoded, "es")


def _fill(live: Live) -> None:
    live.ok("POST", "/collections/", {"collectionName": "c", "isManual": True})
    for generation, items in (
        (b"1", [(b"k%d" % i, b"v%d" % i) for i in range(7)] + [(b"\x00\xff", b"")]),
        (b"2", [(b"k1", None), (b"k3", b"w"), (b"new", b"n")]),
    ):
        live.ok("POST", "/collections/c/generation/start", {"generationId": es(generation)})
        puts = [{"key": es(k), "value": None if v is None else es(v)} for k, v in items]
        live.ok("POST", "/collections/c/putMany", {"items": puts, "generationId": es(generation)})
        live.ok("POST", "/collections/c/generation/commit", {"generationId": es(generation)})


def _columns_pages(live: Live, route: str, body: dict[str, Any]) -> list[dict[str, Any]]:
    pages = []
    answer = live.call("POST", f"/collections/c/{route}/", content=msgpack.packb(body), headers=ASK)
    while True:
        assert answer.status_code == 200 and answer.headers["content-type"] == COLUMNS_CONTENT_TYPE
        page = msgpack.unpackb(answer.content)
        pages.append(page)
        if "cursorId" not in page:
            return pages
        answer = live.call("GET", f"/collections/c/{route}/{page['cursorId']}", headers=ASK)


def _rows(page: dict[str, Any], *names: str) -> list[tuple[bytes | None, ...]]:
    columns = [BinaryColumn.from_wire(page[name], page["count"], name).to_list() for name in names]
    return list(zip(*columns, strict=True))


def test_pages_in_columns_hold_the_rows_of_the_items_form(live: Live) -> None:
    _fill(live)
    pages = _columns_pages(live, "query", {"generationId": b"1", "limit": 3})
    assert [page["count"] for page in pages] == [3, 3, 2] and all(p["generationId"] == b"1" for p in pages)
    rows = [row for page in pages for row in _rows(page, "keys", "values")]
    items = live.ok("POST", "/collections/c/query/", {"generationId": es(b"1")})["items"]
    assert rows == [(es_bytes(i["key"]), es_bytes(i["value"])) for i in items]
    assert rows[0] == (b"\x00\xff", b"")

    pages = _columns_pages(live, "diff", {"fromGenerationId": b"1", "toGenerationId": b"2", "limit": 2})
    rows = [row for page in pages for row in _rows(page, "keys", "fromValues", "toValues")]
    assert rows == [(b"k1", b"v1", None), (b"k3", b"v3", b"w"), (b"new", None, b"n")]
    assert all("intermediateValues" not in page and "items" not in page for page in pages)


def test_get_many_in_columns_answers_every_key_asked_in_order(live: Live) -> None:
    _fill(live)
    body = {"keys": [b"k3", b"nothing", b"k1", b"k3", b"\x00\xff"], "generationId": b"2"}
    answer = live.call("POST", "/collections/c/getMany", content=msgpack.packb(body), headers=ASK)
    assert answer.status_code == 200 and answer.headers["content-type"] == COLUMNS_CONTENT_TYPE
    page = msgpack.unpackb(answer.content)
    assert page["generationId"] == b"2" and page["count"] == 5
    assert _rows(page, "values", "generationIds") == [
        (b"w", b"2"),
        (None, None),
        (None, None),  # deleted in 2
        (b"w", b"2"),
        (b"", b"1"),
    ]
    too_many = {"keys": [b"k"] * 10_001}
    refused = live.call("POST", "/collections/c/getMany", content=msgpack.packb(too_many), headers=ASK)
    assert refused.status_code == 400 and refused.headers["content-type"] == "application/msgpack"
    assert msgpack.unpackb(refused.content)["error"] == "invalidRequest"


def test_other_answers_to_a_columns_client_are_plain_msgpack(live: Live) -> None:
    _fill(live)
    got = live.call("POST", "/collections/c/get", content=msgpack.packb({"key": b"k3"}), headers=ASK)
    assert got.headers["content-type"] == "application/msgpack"
    assert msgpack.unpackb(got.content)["item"] == {"key": b"k3", "value": b"w"}
    missing = live.call("POST", "/collections/none/query/", content=msgpack.packb({}), headers=ASK)
    assert missing.status_code == 404 and missing.headers["content-type"] == "application/msgpack"
    assert msgpack.unpackb(missing.content)["error"] == "noSuchCollection"
    bad = live.call("GET", "/collections/c/diff/not-a-cursor", headers=ASK)
    assert bad.status_code == 404 and bad.headers["content-type"] == "application/msgpack"
    assert msgpack.unpackb(bad.content)["error"] == "noSuchCursor"
    # and nothing was stored by asking
    assert live.ok("POST", "/collections/c/query/", {})["generationId"] == es(b"2")


def test_the_openapi_document_names_the_columns_form_of_the_pages(live: Live) -> None:
    document = live.call("GET", "/openapi.json").json()
    for path, model in (
        ("/collections/{c}/query/", "QueryColumnsResponse"),
        ("/collections/{c}/query/{cursor_id}", "QueryColumnsResponse"),
        ("/collections/{c}/diff/", "DiffColumnsResponse"),
        ("/collections/{c}/diff/{cursor_id}", "DiffColumnsResponse"),
    ):
        for operation in document["paths"][path].values():
            if operation.get("summary", "").startswith("Forget"):
                continue
            content = operation["responses"]["200"]["content"]
            assert content[COLUMNS_CONTENT_TYPE]["schema"] == {"$ref": f"#/components/schemas/{model}"}
    assert set(document["components"]["schemas"]["Column"]["properties"]) == {"offsets", "data", "present"}
    get_many = document["paths"]["/collections/{c}/getMany"]["post"]["responses"]["200"]["content"]
    assert get_many[COLUMNS_CONTENT_TYPE]["schema"] == {"$ref": "#/components/schemas/GetManyColumnsResponse"}
    get = document["paths"]["/collections/{c}/get"]["post"]["responses"]["200"]["content"]
    assert COLUMNS_CONTENT_TYPE not in get
