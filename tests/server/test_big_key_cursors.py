"""Paging past keys of a megabyte: cursor ids stay short (SPEC §1: a key that can be written can always be
read), through raw HTTP and through the Python client, for queries and diffs, across a restart of the
server, and with the oldest long positions evicted when too many are kept.

A real uvicorn over a real store; the keys are 1 MiB each."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from diffstore.client import Client
from diffstore.engine import cursor_spill
from diffstore.engine.store import Store
from diffstore.errors import CursorExpired

from .conftest import Live, es, live_server

KEY_BYTES = 1 << 20
SHORT_ID_MAX = 100  # a cursor id of a long position is a reference of ~60 characters


def big_keys() -> list[bytes]:
    return [bytes([ord("a") + i]) * KEY_BYTES for i in range(4)]


@pytest.fixture
def live(tmp_path: Path) -> Iterator[Live]:
    with live_server(tmp_path / "data") as running:
        running.ok("POST", "/collections/", {"collectionName": "big", "isManual": True})
        running.ok("POST", "/collections/big/generation/start", {"generationId": es("1")})
        items = [{"key": es(key), "value": es(b"v%d" % i)} for i, key in enumerate(big_keys())]
        running.ok("POST", "/collections/big/putMany", {"generationId": es("1"), "items": items})
        running.ok("POST", "/collections/big/generation/commit", {"generationId": es("1")})
        yield running


def page_keys(page: dict[str, object], field: str = "items") -> list[bytes]:
    items = page[field]
    assert isinstance(items, list)
    return [item["key"]["value"].encode() for item in items]


def test_query_pages_past_megabyte_keys_over_raw_http(live: Live) -> None:
    page = live.ok("POST", "/collections/big/query/", {"limit": 1})
    seen = page_keys(page)
    while "cursorId" in page:
        cursor = page["cursorId"]
        assert len(cursor) <= SHORT_ID_MAX
        page = live.ok("GET", f"/collections/big/query/{cursor}")
        assert live.ok("GET", f"/collections/big/query/{cursor}") == page  # the same page again
        seen += page_keys(page)
    assert seen == big_keys()


def test_diff_pages_past_megabyte_keys_over_raw_http_with_a_megabyte_to_key(live: Live) -> None:
    to_key = b"z" * KEY_BYTES  # the cursor carries it too
    page = live.ok(
        "POST", "/collections/big/diff/", {"fromGenerationId": None, "limit": 1, "toKey": es(to_key)}
    )
    seen = page_keys(page)
    while "cursorId" in page:
        assert len(page["cursorId"]) <= SHORT_ID_MAX
        page = live.ok("GET", f"/collections/big/diff/{page['cursorId']}")
        seen += page_keys(page)
    assert seen == big_keys()


@pytest.mark.parametrize("wire", ["json", "msgpack"])
def test_the_python_client_pages_past_megabyte_keys(live: Live, wire: str) -> None:
    with Client(live.url, format=wire) as client:  # type: ignore[arg-type]
        collection = client.collection("big")
        assert [record.key for record in collection.query(limit=1)] == big_keys()
        assert [item.key for item in collection.diff(from_generation_id=b"", limit=1)] == big_keys()
        assert [record.key for record in collection.query(limit=1, to_key=b"c")] == big_keys()[:2]


def test_a_long_cursor_survives_a_restart_and_an_evicted_one_expires(tmp_path: Path) -> None:
    data = tmp_path / "data"
    with Store.open(data) as store:
        c = store.create_collection("big", manual=True)
        c.start_generation(b"1")
        c.put_many([(key, b"v") for key in big_keys()], generation_id=b"1")
        c.commit_generation(b"1")
        first = c.query_page(limit=1)
        assert first.cursor is not None and len(first.cursor) <= SHORT_ID_MAX
    with live_server(data) as live:  # another process's view of the same rows: after a restart
        page = live.ok("GET", f"/collections/big/query/{first.cursor}")
        assert page_keys(page) == big_keys()[1:2]
    with Store.open(data) as store:
        c = store.collection("big")
        cursors = [c.query_page(limit=1, from_key=key).cursor for key in big_keys()[:3]]
        assert all(cursor is not None for cursor in cursors)
        kept = cursor_spill.MAX_ENTRIES
        cursor_spill.MAX_ENTRIES = 2  # the oldest of three is evicted
        try:
            fresh = c.query_page(limit=1, from_key=big_keys()[2]).cursor  # stored already: no eviction
            assert fresh == cursors[2]
            c.query_page(limit=1, to_key=b"z")  # one more position: the two oldest go
        finally:
            cursor_spill.MAX_ENTRIES = kept
        with pytest.raises(CursorExpired):
            c.query_page(cursor=first.cursor)
        assert [r.key for r in c.query_page(cursor=cursors[2]).items] == big_keys()[3:]
