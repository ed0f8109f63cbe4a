"""SPEC §8 in the engine: commit rows of manual, automatic and replicated commits; stores without them;
metadata refused whole; the rows go with their collection."""

from __future__ import annotations

import pytest

from diffstore import Store
from diffstore.engine.types import GenerationInfo, ReplicaGeneration
from diffstore.errors import InvalidRequest, NoSuchGeneration
from tests.engine.conftest import StoreFactory


def test_a_replica_keeps_the_primarys_time_and_metadata(
    open_store: StoreFactory, tmp_path_factory: pytest.TempPathFactory
) -> None:
    replica = open_store(tmp_path_factory.mktemp("replica"))
    replica.become_replica("http://primary", "r1")
    replica.apply_replica_generation(ReplicaGeneration("A", True, None, b"", []))
    step = ReplicaGeneration(
        "A", True, b"", b"1", [(b"a", b"1"), (b"b", None)], committed_at_ms=1234, metadata={"job": "x"}
    )
    assert replica.apply_replica_generation(step)
    infos, more = replica.collection("A").history()
    assert infos[0] == GenerationInfo(b"1", 1234, 2, {"job": "x"}) and not more


def test_a_store_without_commit_rows_shows_null(store: Store) -> None:
    c = store.create_collection("A", manual=True)
    c.start_generation(b"1")
    c.put(b"k", b"v", generation_id=b"1")
    c.commit_generation(b"1", metadata={"a": "b"})
    with store.write() as scope:  # as a store written before the rows existed
        scope.txn.drop(store.tables.commits, delete=False)
    assert c.history()[0] == [GenerationInfo(b"1"), GenerationInfo(b"")]


def test_bad_metadata_changes_nothing(store: Store) -> None:
    c = store.create_collection("A", manual=True)
    c.start_generation(b"1")
    for bad in ({"k": "x" * 4096}, {"k": 1}, {1: "v"}, ["k"]):
        with pytest.raises(InvalidRequest):
            c.commit_generation(b"1", metadata=bad)  # type: ignore[arg-type]
    assert (c.generation_id, c.next_generation_id) == (b"", b"1")


def test_rows_go_with_their_collection(store: Store) -> None:
    c = store.create_collection("A", manual=True)
    c.start_generation(b"1")
    c.commit_generation(b"1")
    store.delete_collection("A")
    while store.run_background_once(10**12):
        pass
    with store.read() as txn:
        assert txn.stat(store.tables.commits)["entries"] == 0


def test_generation_at_an_instant(open_store: StoreFactory) -> None:
    now = [1000]
    store = open_store(clock_ms=lambda: now[0])
    c = store.create_collection("A", manual=True)
    for g, at in ((b"1", 1000), (b"2", 2000), (b"3", 3000)):
        now[0] = at
        c.start_generation(g)
        c.put(b"k", g, generation_id=g)
        c.commit_generation(g)
    assert [c.generation_at(ms) for ms in (1000, 1999, 2000, 2500, 10**12)] == [b"1", b"1", b"2", b"2", b"3"]
    with pytest.raises(NoSuchGeneration):
        c.generation_at(999)
    assert [i.committed_at_ms for i in c.history()[0]] == [3000, 2000, 1000, None]
