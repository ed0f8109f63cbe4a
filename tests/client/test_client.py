"""The sync client against a real server: every method, typed results, errors as the engine's classes."""

from __future__ import annotations

import asyncio
import queue
import threading
from pathlib import Path

import httpx
import pytest

from diffstore.client import Client
from diffstore.engine.types import (
    CollectionInfo,
    DiffItem,
    FromReader,
    GetResult,
    PutResult,
    Reader,
    ReaderUpdate,
    Record,
    StoreConfig,
)
from diffstore.errors import (
    BadVersion,
    CollectionExists,
    GenerationMismatch,
    InvalidRequest,
    NoSuchCollection,
    NoSuchGeneration,
    NoSuchReader,
    NotManual,
    OutdatedGeneration,
    PayloadTooLarge,
    ReaderExists,
    StorageError,
    Unauthorized,
)
from diffstore.server import ServerConfig
from diffstore.server.config import Limit
from tests.helpers import LiveServer, running_server, wait_until

from .conftest import DEADLINE_S


def committed(
    client: Client, name: str, generation_id: bytes, items: list[tuple[bytes, bytes | None]]
) -> None:
    collection = client.collection(name)
    collection.start_generation(generation_id)
    collection.put_many(items, generation_id=generation_id)
    collection.commit_generation(generation_id)


def test_collections_lifecycle(client: Client) -> None:
    assert client.healthz() is True
    manual = client.create_collection("b manual", manual=True, initial_generation_id=b"g0")
    auto = client.create_collection("a/auto".replace("/", "é"), manual=False)
    assert client.collections() == [CollectionInfo("aéauto", False), CollectionInfo("b manual", True)]
    assert manual.generation_id == b"g0" and manual.next_generation_id is None and manual.manual
    assert auto.generation_id == bytes(8) and auto.next_generation_id == bytes(7) + b"\x01"
    assert client.collection("aéauto").manual is False
    with pytest.raises(CollectionExists):
        client.create_collection("b manual")
    client.delete_collection("b manual")
    with pytest.raises(NoSuchCollection):
        client.collection("b manual")
    with pytest.raises(NoSuchCollection):
        client.delete_collection("b manual")
    with pytest.raises(InvalidRequest):
        client.create_collection("x", manual=False, initial_generation_id=b"1")


def test_generation_lifecycle_and_its_errors(client: Client) -> None:
    c = client.create_collection("M")
    c.start_generation(b"1")
    c.start_generation(b"1")  # idempotent
    assert c.next_generation_id == b"1"
    with pytest.raises(OutdatedGeneration):
        c.start_generation(b"2")
    c.start_generation(b"2", abort_outdated=True)
    with pytest.raises(GenerationMismatch):
        c.put(b"k", b"v")
    with pytest.raises(GenerationMismatch):
        c.commit_generation(b"1")
    c.put(b"k", b"v", generation_id=b"2")
    c.abort_generation(b"2")
    with pytest.raises(NoSuchGeneration):  # aborted: above the current generation, not open (SPEC §8)
        c.get(b"k", generation_id=b"2")
    assert c.next_generation_id is None
    c.start_generation(b"3")
    c.put(b"k", b"v3", generation_id=b"3")
    c.commit_generation(b"3")
    assert c.generation_id == b"3" and c.get(b"k") == Record(b"k", b"v3", b"3")
    with pytest.raises(OutdatedGeneration):
        c.start_generation(b"3")
    auto = client.create_collection("auto", manual=False)
    with pytest.raises(NotManual):
        auto.start_generation(b"x")


def test_writes_reads_phantoms_and_producers(client: Client) -> None:
    c = client.create_collection("W")
    c.start_generation(b"1")
    binary_key = bytes(range(256))
    assert c.put(binary_key, b"\x00\xff", generation_id=b"1") == PutResult(b"1", True, False)
    first = c.put(b"k", b"old", generation_id=b"1", if_not_present=True)
    assert first.was_put
    assert c.put(b"k", b"new", generation_id=b"1", if_not_present=True).was_put is False
    c.put_many([(b"a", b"1"), (b"gone", None), (b"b", b"2", True)], generation_id=b"1")
    c.commit_generation(b"1")
    assert c.get(binary_key) == Record(binary_key, b"\x00\xff", b"1")
    assert c.get(b"k") == Record(b"k", b"old", b"1")
    assert c.get_result(b"gone") == GetResult(b"1", None)
    assert c.get(b"a", generation_id=b"") is None

    phantom = c.start_phantom(ttl_seconds=60)
    c.put(b"a", b"phantom", generation_id=b"1", phantom_id=phantom)
    assert c.get(b"a", phantom_id=phantom) == Record(b"a", b"phantom", b"1")
    assert c.get(b"a") == Record(b"a", b"1", b"1")

    c.start_generation(b"2")
    assert c.put_many([(b"p", b"1")], generation_id=b"2", producer_id="prod", seq_no=5).skipped is False
    assert c.put(b"p", b"2", generation_id=b"2", producer_id="prod", seq_no=5).skipped is True
    assert c.producer_last_seq_no("prod") == 5 and c.producer_last_seq_no("other") == 0
    assert c.put(b"a", b"1", generation_id=b"2", skip_unchanged=True).generation_id == b"2"
    c.commit_generation(b"2")
    assert [item.key for item in c.diff(from_generation_id=b"1")] == [b"p"]


def test_query_and_keys_around_follow_cursors(client: Client) -> None:
    committed(
        client.create_collection("Q") and client, "Q", b"1", [(b"k%d" % i, b"v%d" % i) for i in range(7)]
    )
    c = client.collection("Q")
    records = list(c.query(limit=2))
    assert [r.key for r in records] == [b"k%d" % i for i in range(7)]
    assert records[0] == Record(b"k0", b"v0", b"1")
    page = c.query_page(limit=3)
    assert len(page.items) == 3 and page.cursor is not None
    rest = c.query_page(cursor=page.cursor)
    assert rest.items[0].key == b"k3"
    assert [r.key for r in c.query(from_key=b"k2", to_key=b"k4")] == [b"k2", b"k3"]
    around = c.keys_around(b"k3", 2)
    assert (around.left, around.right, around.found_key) == ([b"k2", b"k1"], [b"k4", b"k5"], True)
    assert around.has_more_on_the_left and around.has_more_on_the_right
    assert c.keys_around(b"k35", 1, require_key_existence=False).found_key is False
    splits = c.splits(2)
    assert len(splits) <= 1 and all(s.startswith(b"k") for s in splits)


def test_diff_follows_cursors_and_readers(client: Client) -> None:
    c = client.create_collection("D")
    committed(client, "D", b"1", [(b"k%d" % i, b"a") for i in range(5)])
    committed(client, "D", b"2", [(b"k0", b"b"), (b"k1", None), (b"k9", b"new")])
    items = list(c.diff(limit=2))
    assert [i.key for i in items] == [b"k0", b"k2", b"k3", b"k4", b"k9"]  # k1: absent at both ends
    assert items[0] == DiffItem(b"k0", None, b"b")
    c.create_reader("r", generation_id=b"1")
    by_reader = list(c.diff(from_reader="r", limit=1))
    assert by_reader == [
        DiffItem(b"k0", b"a", b"b"),
        DiffItem(b"k1", b"a", None),
        DiffItem(b"k9", None, b"new"),
    ]
    assert list(c.diff(from_reader=FromReader("r", "D"))) == by_reader
    with_history = list(c.diff(from_generation_id=b"", include_intermediate=True))
    assert with_history[0] == DiffItem(b"k0", None, b"b", (b"a",))
    page = c.diff_page(from_generation_id=b"1", limit=2)
    assert (page.from_generation_id, page.to_generation_id, len(page.items)) == (b"1", b"2", 2)
    assert c.diff_page(cursor=page.cursor).items == [DiffItem(b"k9", None, b"new")]
    with pytest.raises(NoSuchReader):
        list(c.diff(from_reader="missing"))


def test_diff_repeats_split_ranges_until_the_target(tmp_path: Path) -> None:
    config = StoreConfig(commit_delay_ms=10, max_diff_generations=2)
    with running_server(tmp_path / "data", store_config=config) as live, live.client() as client:
        c = client.create_collection("S")
        for g in range(1, 8):
            committed(client, "S", b"%d" % g, [(b"key%d" % g, b"v")])
        assert c.diff_page(from_generation_id=b"").to_generation_id < b"7"
        assert [i.key for i in c.diff()] == [b"key%d" % g for g in range(1, 8)]
        assert [i.key for i in c.diff(from_generation_id=b"2", to_generation_id=b"6")] == [
            b"key3",
            b"key4",
            b"key5",
            b"key6",
        ]


def test_readers_with_compare_and_set(client: Client) -> None:
    c = client.create_collection("R")
    client.create_collection("T")
    c.create_reader("self")
    c.create_reader("other", collection="T", generation_id=b"")
    c.create_reader("self")  # same data again: OK
    with pytest.raises(ReaderExists):
        c.create_reader("self", generation_id=b"x")
    # a reader's "" and null are one value (SPEC §7): stored and listed as null, equal under CAS
    assert c.readers() == [Reader("other", "T", None), Reader("self", "R", None)]
    c.update_reader("self", b"", expected=None)
    c.update_reader("self", b"", expected=b"")
    with pytest.raises(BadVersion):
        c.update_reader("self", b"", expected=b"x")
    c.start_generation(b"1")
    with pytest.raises(BadVersion):
        c.commit_generation(
            b"1", update_readers=[("other", b"1"), ReaderUpdate("self", b"1", expected=b"zz")]
        )
    assert c.generation_id == b"" and c.readers() == [Reader("other", "T", None), Reader("self", "R", None)]
    c.commit_generation(b"1", update_readers=[ReaderUpdate("self", b"1", expected=b"")])
    assert Reader("self", "R", b"1") in c.readers()
    c.delete_reader("self")
    c.delete_reader("self")  # missing reader: OK
    with pytest.raises(NoSuchReader):
        c.update_reader("self", b"1")


def test_watch_yields_each_new_generation(client: Client) -> None:
    c = client.create_collection("Wa")
    seen: queue.Queue[bytes] = queue.Queue()

    def watch() -> None:
        for generation_id in c.watch(since=b"", timeout_ms=2_000):
            seen.put(generation_id)
            if generation_id == b"2":
                return

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    committed(client, "Wa", b"1", [(b"k", b"v")])
    assert seen.get(timeout=DEADLINE_S) == b"1"
    committed(client, "Wa", b"2", [(b"k", b"w")])
    assert seen.get(timeout=DEADLINE_S) == b"2"
    thread.join(DEADLINE_S)
    assert not thread.is_alive()


def test_wait_for_change_across_collections(client: Client) -> None:
    client.create_collection("X")
    client.create_collection("Y")
    assert client.wait_for_change({"X": b"stale", "Y": b""}, timeout_ms=5_000) is True
    assert client.wait_for_change({"X": b"", "Y": b""}, timeout_ms=50) is False
    result: list[bool] = []
    thread = threading.Thread(
        target=lambda: result.append(client.wait_for_change({"X": b"", "Y": b""})), daemon=True
    )
    thread.start()
    committed(client, "Y", b"1", [(b"k", b"v")])
    thread.join(DEADLINE_S)
    assert result == [True]


def test_wait_for_change_works_inside_a_running_event_loop(client: Client) -> None:
    client.create_collection("L1")
    client.create_collection("L2")
    committed(client, "L2", b"1", [(b"k", b"v")])

    async def inside_a_loop() -> tuple[bool, bool]:
        return (
            client.wait_for_change({"L1": b"", "L2": b""}, timeout_ms=5_000),
            client.wait_for_change({"L1": b"", "L2": b"1"}, timeout_ms=50),
        )

    assert asyncio.run(inside_a_loop()) == (True, False)

    # the poll that lost the race (L1, unchanged) ends within a slice: no thread is left behind
    def polls_left() -> list[threading.Thread]:
        return [t for t in threading.enumerate() if t.name.startswith("wait:")]

    wait_until(lambda: not polls_left(), what="the losing polls to end")


def test_msgpack_is_the_default_wire_format(server: LiveServer) -> None:
    content_types: list[str] = []

    def record(response: httpx.Response) -> None:
        content_types.append(response.headers["content-type"])

    with httpx.Client(event_hooks={"response": [record]}) as http, Client(server.url, http=http) as client:
        client.create_collection("F").start_generation(b"1")
    assert content_types and all(t == "application/msgpack" for t in content_types)


def test_payload_limits_tokens_and_unreachable_servers(tmp_path: Path) -> None:
    with running_server(tmp_path / "data", token="s3cret") as live:
        with Client(live.url) as anonymous, pytest.raises(Unauthorized):
            anonymous.collections()
        with live.client("json") as client:
            c = client.create_collection("P")
            c.start_generation(b"1")
            with pytest.raises(PayloadTooLarge) as too_large:
                c.put(b"k", b"x" * (27 << 20), generation_id=b"1")
            assert too_large.value.bytes_max == ServerConfig().limit(Limit.PUT)  # 4 MiB + the largest key
            assert c.get(b"k", generation_id=b"1") is None
        url = live.url
    with Client(url, timeout_s=5) as gone, pytest.raises(StorageError) as failure:
        gone.collections()
    assert isinstance(failure.value.__cause__, httpx.TransportError)
    wait_until(lambda: True, what="nothing")
