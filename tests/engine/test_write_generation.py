"""``Collection.write_generation``: a whole manual generation in one call and one storage transaction.

It must leave exactly the rows that start_generation + put_many + commit_generation leave, and when any
of the three would fail it must change nothing at all (no generation left open, an open one kept).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from diffstore import Store
from diffstore.engine.types import LeaseToken, ReaderUpdate
from diffstore.errors import (
    BadVersion,
    DiffstoreError,
    InvalidRequest,
    LeaseLost,
    NoSuchReader,
    NotManual,
    OutdatedGeneration,
)
from tests.engine.conftest import StoreFactory
from tests.helpers import ManualClock

from .util import as_dict, raw_state

ROUNDS: list[tuple[bytes, list[Any], list[ReaderUpdate], dict[str, str] | None]] = [
    (b"1", [(b"a", b"1"), (b"b", b"2"), (b"c", b"3")], [ReaderUpdate("r", b"1")], {"window": "1"}),
    (b"2", [(b"b", None), (b"d", b"4"), (b"a", b"1"), (b"a", b"one")], [], None),
    (b"3", [], [ReaderUpdate("r", b"3", expected=b"1")], None),  # a checkpoint: readers only
    (b"4", [(b"zz", b"", False), (b"a", b"kept?", True)], [ReaderUpdate("r", None)], {"k": "v"}),
]


def _store_with_reader(open_store: StoreFactory, path: Path, clock: ManualClock) -> Store:
    store = open_store(path, clock_ms=clock)
    c = store.create_collection("m", manual=True)
    c.create_reader("r", collection="m")
    return store


def test_one_call_leaves_the_rows_of_three(open_store: StoreFactory, tmp_path: Path) -> None:
    clock = ManualClock()
    three = _store_with_reader(open_store, tmp_path / "three", clock)
    one = _store_with_reader(open_store, tmp_path / "one", clock)
    for generation_id, items, updates, metadata in ROUNDS:
        c = three.collection("m")
        c.start_generation(generation_id)
        expected = c.put_many(items, generation_id=generation_id)
        c.commit_generation(generation_id, update_readers=updates, metadata=metadata)
        result = one.collection("m").write_generation(generation_id, items, updates, metadata=metadata)
        assert result == expected
        clock.now_ms += 7
    assert raw_state(one) == raw_state(three)
    c = one.collection("m")
    assert as_dict(c) == {b"a": b"one", b"c": b"3", b"d": b"4", b"zz": b""}
    assert c.history()[0][0].metadata == {"k": "v"}


@pytest.fixture
def open_coll(store: Store) -> Any:
    """A manual collection at generation 1, with generation 2 open holding one write, and a reader."""
    c = store.create_collection("m", manual=True)
    c.create_reader("r", collection="m")
    c.write_generation(b"1", [(b"a", b"1")], [ReaderUpdate("r", b"1")])
    c.start_generation(b"2")
    c.put(b"open", b"x", generation_id=b"2")
    return c


@pytest.mark.parametrize(
    ("call", "error"),
    [
        ({"generation_id": b"0"}, OutdatedGeneration),  # not above the current generation
        ({"abort_outdated": False}, OutdatedGeneration),  # another one is open
        ({"update_readers": [ReaderUpdate("nobody", b"3")]}, NoSuchReader),
        ({"update_readers": [ReaderUpdate("r", b"3", expected=b"0")]}, BadVersion),
        ({"items": [(b"ok", b"1"), (b"x" * (1 << 24), b"key too long")]}, InvalidRequest),
        ({"items": [(b"k", "not bytes")]}, InvalidRequest),
        ({"metadata": {"k": 1}}, InvalidRequest),
        ({"lease": LeaseToken("w", 1)}, LeaseLost),  # nobody holds that lease
    ],
)
def test_a_failure_anywhere_changes_nothing(
    store: Store, open_coll: Any, call: dict[str, Any], error: type[DiffstoreError]
) -> None:
    args: dict[str, Any] = {"generation_id": b"3", "items": [(b"a", b"2")], "abort_outdated": True}
    args.update(call)
    before = raw_state(store)
    with pytest.raises(error):
        open_coll.write_generation(**args)
    assert raw_state(store) == before
    assert open_coll.generation_state() == (b"1", b"2")  # the open generation and its write are kept
    assert open_coll.get(b"open", generation_id=b"2").value == b"x"


def test_abort_outdated_replaces_the_open_generation(open_coll: Any) -> None:
    open_coll.write_generation(b"3", [(b"b", b"2")], [ReaderUpdate("r", b"3")], abort_outdated=True)
    assert open_coll.generation_state() == (b"3", None)
    assert as_dict(open_coll) == {b"a": b"1", b"b": b"2"}  # the dropped generation's write is gone
    assert [r.generation_id for r in open_coll.readers()] == [b"3"]


def test_naming_the_open_generation_commits_its_earlier_writes_too(open_coll: Any) -> None:
    open_coll.write_generation(b"2", [(b"b", b"2")])
    assert as_dict(open_coll) == {b"a": b"1", b"b": b"2", b"open": b"x"}


def test_a_non_manual_collection_refuses_it_and_keeps_its_writes(store: Store) -> None:
    c = store.create_collection("auto", manual=False)
    c.put(b"k", b"v")
    before = raw_state(store)
    with pytest.raises(NotManual):
        c.write_generation(b"9", [(b"a", b"1")])
    assert raw_state(store) == before


def test_listeners_hear_one_commit(store: Store) -> None:
    c = store.create_collection("m", manual=True)
    heard: list[tuple[str, bytes | None]] = []
    store.add_commit_listener(lambda name, generation_id: heard.append((name, generation_id)))
    c.write_generation(b"1", [(b"a", b"1")])
    assert heard == [("m", b"1")]


def test_under_a_lease_and_fenced_out_once_it_moved(store: Store) -> None:
    c = store.create_collection("m", manual=True)
    first = c.acquire_lease("w", "one", ttl_ms=60_000)
    token = LeaseToken("w", first.version)
    c.write_generation(b"1", [(b"a", b"1")], lease=token)
    c.release_lease("w", "one", first.version)
    second = c.acquire_lease("w", "two", ttl_ms=60_000)
    before = raw_state(store)
    with pytest.raises(LeaseLost):
        c.write_generation(b"2", [(b"a", b"stale")], lease=token)
    assert raw_state(store) == before
    c.write_generation(b"2", [(b"a", b"2")], lease=LeaseToken("w", second.version))
    assert as_dict(c) == {b"a": b"2"}
