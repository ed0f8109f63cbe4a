"""``phantom/changes`` (beyond SPEC, for transform previews): what a phantom changes at a generation.

Through a real uvicorn server over a real store: JSON and msgpack, the Python client, paging by
``nextKey``, and every bad request answered with its status and code while the data stays as it was.
"""

from __future__ import annotations

import time
from typing import Any

import msgpack
import pytest

from diffstore.client import Client
from diffstore.engine import phantoms
from diffstore.engine.types import DiffItem
from tests.helpers import wait_until

from .conftest import Live, es, unes

LONG = b"L" * 300  # a long key (its own storage form)


@pytest.fixture
def phantomed(live: Live) -> tuple[Live, dict[str, Any]]:
    """Manual ``m`` at generation g2 and phantom ``p`` over it; ``other`` has a phantom of its own."""
    for name in ("m", "other"):
        live.ok("POST", "/collections/", {"collectionName": name, "isManual": True})
    for generation, items in (
        ("g1", [("a", "a1"), ("b", "b1"), ("c", "c1"), ("hidden", "h1")]),
        ("g2", [("b", "b2"), ("hidden", "h2"), (LONG, "long")]),
    ):
        live.ok("POST", "/collections/m/generation/start", {"generationId": es(generation)})
        body = [{"key": es(k), "value": es(v)} for k, v in items]
        live.ok("POST", "/collections/m/putMany", {"items": body, "generationId": es(generation)})
        live.ok("POST", "/collections/m/generation/commit", {"generationId": es(generation)})
    phantom = live.ok("POST", "/collections/m/phantom/start", {})["phantomId"]
    writes: list[tuple[str, bytes | str, bytes | str | None]] = [
        ("g2", "a", "a-new"),  # a change
        ("g2", "b", "b2"),  # the value the base already has: no change
        ("g2", "c", None),  # a delete
        ("g2", "new", "n"),  # an insert
        ("g1", "hidden", "old"),  # below the base's newer record at g2: hidden, no change
        ("g2", LONG, None),  # a long key's delete
        ("g9", "future", "f"),  # above the current generation: not visible there
    ]
    for generation, key, value in writes:
        item = {"key": es(key), "value": None if value is None else es(value)}
        live.ok(
            "POST",
            "/collections/m/put",
            {"item": item, "generationId": es(generation), "phantomId": phantom},
        )
    other = live.ok("POST", "/collections/other/phantom/start", {})["phantomId"]
    return live, {"phantom": phantom, "other": other}


EXPECTED = [
    DiffItem(LONG, b"long", None),
    DiffItem(b"a", b"a1", b"a-new"),
    DiffItem(b"c", b"c1", None),
    DiffItem(b"new", None, b"n"),
]


def _items(answer: dict[str, Any]) -> list[DiffItem]:
    return [
        DiffItem(unes(i["key"]) or b"", unes(i["fromValue"]), unes(i["toValue"])) for i in answer["items"]
    ]


def test_changes_at_the_current_generation_in_json_and_msgpack(
    phantomed: tuple[Live, dict[str, Any]],
) -> None:
    live, ids = phantomed
    answer = live.ok("POST", "/collections/m/phantom/changes", {"phantomId": ids["phantom"]})
    assert answer["generationId"] == {"value": "g2"}
    assert _items(answer) == EXPECTED
    assert "nextKey" not in answer
    packed = live.call(
        "POST",
        "/collections/m/phantom/changes",
        content=msgpack.packb({"phantomId": unes(ids["phantom"])}),
        headers={"content-type": "application/msgpack", "accept": "application/msgpack"},
    )
    assert packed.status_code == 200
    body = msgpack.unpackb(packed.content)
    assert body["generationId"] == b"g2"
    assert [(i["key"], i["fromValue"], i["toValue"]) for i in body["items"]] == [
        tuple(d[:3]) for d in EXPECTED
    ]


def test_changes_at_an_older_generation_a_key_range_and_pages(phantomed: tuple[Live, dict[str, Any]]) -> None:
    live, ids = phantomed
    phantom = ids["phantom"]
    at_g1 = live.ok(
        "POST", "/collections/m/phantom/changes", {"phantomId": phantom, "generationId": es("g1")}
    )
    # at g1 the phantom's g1 record of "hidden" wins; its g2 records are not visible yet
    assert _items(at_g1) == [DiffItem(b"hidden", b"h1", b"old")]
    ranged = live.ok(
        "POST",
        "/collections/m/phantom/changes",
        {"phantomId": phantom, "fromKey": es("b"), "toKey": es("new")},
    )
    assert _items(ranged) == [DiffItem(b"c", b"c1", None)]
    seen: list[DiffItem] = []
    body: dict[str, Any] = {"phantomId": phantom, "limit": 1}
    while True:
        page = live.ok("POST", "/collections/m/phantom/changes", body)
        assert len(page["items"]) <= 1
        seen += _items(page)
        if "nextKey" not in page:
            break
        body = {
            "phantomId": phantom,
            "limit": 1,
            "fromKey": page["nextKey"],
            "generationId": page["generationId"],
        }
    assert seen == EXPECTED


def test_the_python_client_pages_through_every_change(phantomed: tuple[Live, dict[str, Any]]) -> None:
    live, ids = phantomed
    phantom = unes(ids["phantom"])
    assert phantom is not None
    for wire in ("json", "msgpack"):  # the client then speaks that format
        with Client(live.url, format=wire) as client:
            handle = client.collection("m")
            page = handle.phantom_changes(phantom, limit=2)
            assert page.items == EXPECTED[:2] and page.next_key == b"c"
            rest = handle.phantom_changes(phantom, page.generation_id, page.next_key)
            assert page.items + rest.items == EXPECTED and rest.next_key is None
    engine = live.store.collection("m")
    assert engine.phantom_changes(phantom).items == EXPECTED


def _state(live: Live, phantom: dict[str, str]) -> Any:
    """Everything the bad requests must leave alone: the records, with and without the phantom."""
    return (
        live.ok("POST", "/collections/m/query/", {}),
        live.ok("POST", "/collections/m/query/", {"phantomId": phantom}),
        live.ok("GET", "/collections/m"),
    )


def test_bad_requests_are_refused_and_change_nothing(phantomed: tuple[Live, dict[str, Any]]) -> None:
    live, ids = phantomed
    before = _state(live, ids["phantom"])
    path = "/collections/m/phantom/changes"
    live.fail("POST", path, {}, status=400, code="invalidRequest")  # no phantomId
    live.fail("POST", path, None, status=400, code="invalidRequest")  # no body at all
    live.fail(
        "POST", path, {"phantomId": {"value": "*", "encoding": "base64"}}, status=400, code="invalidEncoding"
    )
    live.fail("POST", path, {"phantomId": es("nope")}, status=400, code="invalidRequest")  # not an id of ours
    never = es(b"\x00\x00\x00\x01\x00\x00\x00\x63")  # the right form, never started
    answer = live.fail("POST", path, {"phantomId": never}, status=400, code="invalidRequest")
    assert "not a live phantom" in answer["reason"]
    answer = live.fail("POST", path, {"phantomId": ids["other"]}, status=400, code="invalidRequest")
    assert "another collection" in answer["reason"]
    live.fail("POST", path, {"phantomId": ids["phantom"], "limit": 0}, status=400, code="invalidRequest")
    live.fail(
        "POST",
        path,
        {"phantomId": ids["phantom"], "generationId": 5},
        status=400,
        code="invalidRequest",
    )
    live.fail(
        "POST",
        "/collections/missing/phantom/changes",
        {"phantomId": ids["phantom"]},
        status=404,
        code="noSuchCollection",
    )
    live.fail(
        "POST",
        path,
        content=b"{",
        status=400,
        code="invalidJson",
        headers={"content-type": "application/json"},
    )
    assert _state(live, ids["phantom"]) == before


def test_an_expired_phantom_is_refused(live: Live) -> None:
    live.ok("POST", "/collections/", {"collectionName": "m", "isManual": True})
    engine = live.store.collection("m")
    phantom = engine.start_phantom(ttl_seconds=0.05)  # the engine takes fractions; HTTP takes whole seconds
    engine.put(b"k", b"v", generation_id=b"", phantom_id=phantom)
    assert engine.phantom_changes(phantom).items == [DiffItem(b"k", None, b"v")]
    expires = time.time() + 0.05
    wait_until(lambda: time.time() > expires + 0.01, what="the phantom's expiry")
    answer = live.fail(
        "POST",
        "/collections/m/phantom/changes",
        {"phantomId": es(phantom)},
        status=400,
        code="invalidRequest",
    )
    assert "not a live phantom" in answer["reason"]


def test_pages_of_any_size_hold_every_change_once_in_key_order(live: Live) -> None:
    """Short keys around a group of long keys sharing their first 200 bytes (stored in hash order, not key
    order): every page size gives the same changes, in key order, through the engine and over HTTP."""
    live.ok("POST", "/collections/", {"collectionName": "m", "isManual": True})
    engine = live.store.collection("m")
    phantom = engine.start_phantom()
    prefix = b"g" * 200
    keys = [b"a", b"b", b"h", b"z"] + [prefix + bytes([i]) * 3 for i in range(12)] + [prefix, b"g" * 199]
    engine.put_many([(k, b"v" + k[-1:]) for k in keys], generation_id=b"", phantom_id=phantom)
    every = engine.phantom_changes(phantom, limit=1000).items
    assert [d.key for d in every] == sorted(keys)
    with Client(live.url) as client:
        for limit in (1, 2, 3, 5, 17):
            pages: list[DiffItem] = []
            page = engine.phantom_changes(phantom, limit=limit)
            remote = client.collection("m").phantom_changes(phantom, limit=limit)
            while True:
                assert remote == page and len(page.items) <= limit
                pages += page.items
                if page.next_key is None:
                    break
                page = engine.phantom_changes(phantom, page.generation_id, page.next_key, limit=limit)
                remote = client.collection("m").phantom_changes(phantom, b"", remote.next_key, limit=limit)
            assert pages == every, limit


def test_a_page_examines_a_bounded_number_of_unchanged_records(live: Live) -> None:
    """A phantom that rewrites 2 * SCAN_MAX values as they were changes only its first and last key: a page
    with ``limit: 1`` answers early (``nextKey`` within the first SCAN_MAX + 1 records), not after reading
    the whole phantom, and following ``nextKey`` still finds every change once."""
    live.ok("POST", "/collections/", {"collectionName": "m", "isManual": True})
    engine = live.store.collection("m")
    same = [b"k%06d" % i for i in range(2 * phantoms.SCAN_MAX)]
    engine.start_generation(b"1")
    engine.put_many([(key, b"v") for key in same], generation_id=b"1")
    engine.commit_generation(b"1")
    phantom = engine.start_phantom()
    engine.put_many([(b"a", b"new"), *((key, b"v") for key in same), (b"z", b"new")], generation_id=b"1",
                    phantom_id=phantom)  # fmt: skip
    first = live.ok("POST", "/collections/m/phantom/changes", {"phantomId": es(phantom), "limit": 1})
    assert [unes(item["key"]) for item in first["items"]] == [b"a"]
    assert b"a" < unes(first["nextKey"]) <= same[phantoms.SCAN_MAX]  # answered early
    found: list[bytes] = []
    page = engine.phantom_changes(phantom, limit=1)
    pages = 1
    while True:
        found += [item.key for item in page.items]
        if page.next_key is None:
            break
        page = engine.phantom_changes(phantom, page.generation_id, page.next_key, limit=1)
        pages += 1
    assert found == [b"a", b"z"] and pages >= 3
