"""Collections: create/list/delete (durable, removing readers that target them), names, listeners."""

from __future__ import annotations

import contextlib

import pytest

from diffstore import CollectionInfo, Reader, Store
from diffstore.errors import (
    CollectionExists,
    GenerationCollected,
    GenerationMismatch,
    InvalidRequest,
    NoSuchCollection,
    NoSuchGeneration,
    StorageError,
)
from tests.helpers import wait_until

from .util import as_dict, commit, raw_state, run_background


def test_create_list_and_open(store: Store) -> None:
    store.create_collection("b", manual=False)
    store.create_collection("a", manual=True)
    store.create_collection("é", manual=True)
    store.create_collection("B", manual=True)
    assert store.collections() == [
        CollectionInfo("B", True),
        CollectionInfo("a", True),
        CollectionInfo("b", False),
        CollectionInfo("é", True),
    ]
    assert store.collection("b").manual is False


def test_create_existing_is_collection_exists(store: Store) -> None:
    c = store.create_collection("a", manual=True)
    commit(c, b"1", [(b"k", b"v")])
    before = raw_state(store)
    for manual in (True, False):
        with pytest.raises(CollectionExists) as info:
            store.create_collection("a", manual=manual)
        assert info.value.code == "collectionExists"
    assert raw_state(store) == before


@pytest.mark.parametrize(
    "name",
    ["", "a/b", "nul\x00", "tab\t", "del\x7f", "x" * 256, "é" * 128, ".", "..", "c1\x85", "\x80", "\x9f"],
)
def test_bad_collection_names_are_invalid(store: Store, name: str) -> None:
    before = raw_state(store)
    with pytest.raises(InvalidRequest) as info:
        store.create_collection(name)
    assert info.value.code == "invalidRequest"
    assert raw_state(store) == before


def test_names_are_not_paths(store: Store, tmp_path) -> None:
    for name in ("...", ".a", "x" * 255, "é" * 127, "data.mdb", "lock.mdb"):
        c = store.create_collection(name)
        commit(c, b"1", [(b"k", name.encode())])
    for name in ("...", "data.mdb"):
        assert store.collection(name).get(b"k").value == name.encode()  # type: ignore[union-attr]
    # the store's own files only (store.lock: held shared while open, so that compaction can refuse)
    assert sorted(p.name for p in (tmp_path / "store").iterdir()) == ["data.mdb", "lock.mdb", "store.lock"]


def test_missing_collection_is_no_such_collection(store: Store) -> None:
    with pytest.raises(NoSuchCollection) as info:
        store.collection("nope")
    assert info.value.code == "noSuchCollection"
    with pytest.raises(NoSuchCollection):
        store.delete_collection("nope")


def test_handle_of_deleted_collection_is_no_such_collection(store: Store) -> None:
    c = store.create_collection("a", manual=True)
    store.delete_collection("a")
    for call in (
        lambda: c.generation_id,
        lambda: c.get(b"k"),
        lambda: list(c.query()),
        lambda: c.start_generation(b"1"),
        lambda: c.put(b"k", b"v", generation_id=b"1"),
        lambda: c.create_reader("r"),
        lambda: list(c.diff(b"")),
    ):
        with pytest.raises(NoSuchCollection):
            call()


def test_delete_is_durable_and_removes_targeting_readers(open_store) -> None:
    store = open_store()
    a = store.create_collection("a", manual=True)
    b = store.create_collection("b", manual=True)
    c = store.create_collection("c", manual=False)
    commit(a, b"1", [(b"k", b"v")])
    a.create_reader("self")
    a.create_reader("to_b", collection="b", generation_id=b"")
    b.create_reader("from_a", collection="a", generation_id=b"1")
    b.create_reader("keep", collection="c")
    c.create_reader("from_a", collection="a")
    c.create_reader("stream", collection="hstream://a")
    store.delete_collection("a")
    assert [i.name for i in store.collections()] == ["b", "c"]
    assert b.readers() == [Reader("keep", "c", None)]
    assert c.readers() == [Reader("stream", "hstream://a", None)]
    store.close()
    store = open_store()  # durable: nothing comes back after a restart
    assert [i.name for i in store.collections()] == ["b", "c"]
    assert store.collection("b").readers() == [Reader("keep", "c", None)]
    assert store.collection("c").readers() == [Reader("stream", "hstream://a", None)]
    with pytest.raises(NoSuchCollection):
        store.collection("a")
    again = store.create_collection("a", manual=True)  # a new, empty collection of the same name
    assert again.generation_id == b""
    assert list(again.query()) == []
    with pytest.raises(NoSuchGeneration):  # the old collection's generation is not the new one's (SPEC §8)
        list(again.query(generation_id=b"1"))
    assert again.readers() == []


def test_deleted_collection_rows_are_purged_without_touching_a_recreated_one(store: Store) -> None:
    a = store.create_collection("a", manual=True)
    commit(a, b"1", [(b"k%d" % i, b"v") for i in range(50)])
    a.start_generation(b"2")
    a.put(b"open", b"v", generation_id=b"2")
    p = a.start_phantom()
    a.put(b"ph", b"v", generation_id=b"1", phantom_id=p)
    a.put(b"pr", b"v", generation_id=b"2", producer_id="prod", seq_no=3)
    empty = raw_state(store)
    store.delete_collection("a")
    again = store.create_collection("a", manual=True)
    commit(again, b"1", [(b"new", b"n")])
    assert as_dict(again) == {b"new": b"n"}
    assert again.producer_last_seq_no("prod") == 0
    assert again.get(b"ph", generation_id=b"1", phantom_id=p) is None
    run_background(store)
    assert as_dict(again) == {b"new": b"n"}
    state = raw_state(store)
    assert state["dropped"] == []
    assert len(state["records"]) == 1
    assert len(state["changes"]) + len(state["change_chunks"]) == 1  # the key of the new one, in one form
    assert state["phantoms"] == [] and state["phantom_ttl"] == [] and state["producers"] == []
    assert len(empty["records"]) == 52  # 50 committed, 2 in the open generation


def test_deleting_a_reader_owner_releases_gc_of_its_target(store: Store) -> None:
    b = store.create_collection("b", manual=True)
    for g in (b"1", b"2", b"3"):
        commit(b, g, [(b"k", g)])
    a = store.create_collection("a", manual=True)
    a.create_reader("from_b", collection="b", generation_id=b"1")
    b.create_reader("self", generation_id=b"3")
    run_background(store)
    assert b.get(b"k", generation_id=b"2").value == b"2"  # type: ignore[union-attr]  # held by a's reader
    store.delete_collection("a")
    run_background(store)
    with pytest.raises(GenerationCollected):
        b.get(b"k", generation_id=b"2")
    assert b.get(b"k").value == b"3"  # type: ignore[union-attr]


def test_commit_listeners(store: Store) -> None:
    heard: list[tuple[str, bytes]] = []
    remove = store.add_commit_listener(lambda name, gen: heard.append((name, gen)))
    other: list[str] = []
    store.add_commit_listener(lambda name, gen: other.append(name))
    m = store.create_collection("m", manual=True)
    m.start_generation(b"1")
    assert heard == []
    m.put(b"k", b"v", generation_id=b"1")
    m.commit_generation(b"1")
    commit(m, b"2", [])
    m.start_generation(b"3")
    m.abort_generation(b"3")
    with pytest.raises(GenerationMismatch):  # a rejected commit is not announced
        m.commit_generation(b"9")
    assert heard == [("m", b"1"), ("m", b"2")]
    remove()
    commit(m, b"4", [])
    assert heard == [("m", b"1"), ("m", b"2")]
    assert other == ["m", "m", "m"]


def test_commit_listener_sees_committed_state(store: Store) -> None:
    m = store.create_collection("m", manual=True)
    seen: list[bytes | None] = []

    def listener(name: str, gen: bytes) -> None:
        record = store.collection(name).get(b"k")
        seen.append(record.value if record else None)
        assert store.collection(name).generation_id == gen

    store.add_commit_listener(listener)
    commit(m, b"1", [(b"k", b"v1")])
    assert seen == [b"v1"]


def test_failing_commit_listener_does_not_stop_background_work(open_store) -> None:
    store = open_store(background=True, commit_delay_ms=1, gc_interval_ms=5)
    n = store.create_collection("n", manual=False)
    calls: list[bytes] = []

    def failing(name: str, gen: bytes) -> None:
        calls.append(gen)
        raise RuntimeError("a buggy listener")

    store.add_commit_listener(failing)
    n.put(b"k", b"1")
    wait_until(lambda: calls, what="the first automatic commit")
    n.put(b"k", b"2")
    wait_until(
        lambda: n.generation_id == (2).to_bytes(8, "big"), timeout=5, what="the second automatic commit"
    )


def test_failing_commit_listener_does_not_silence_the_others(store: Store) -> None:
    heard: list[bytes] = []

    def failing(name: str, gen: bytes) -> None:
        raise RuntimeError("a buggy listener")

    store.add_commit_listener(failing)
    store.add_commit_listener(lambda name, gen: heard.append(gen))
    m = store.create_collection("m", manual=True)
    m.start_generation(b"1")
    with contextlib.suppress(RuntimeError):  # whether the committer sees the listener's error is open
        m.commit_generation(b"1")
    assert m.generation_id == b"1"
    assert heard == [b"1"]


def test_store_open_on_a_file_is_a_storage_error(tmp_path) -> None:
    path = tmp_path / "a-file"
    path.write_bytes(b"not a store")
    with pytest.raises(StorageError):
        Store.open(path)
