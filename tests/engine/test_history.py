"""SPEC §8 in the engine: commit rows of manual, automatic and replicated commits; stores without them;
metadata refused whole; the rows go with their collection."""

from __future__ import annotations

import contextlib
from unittest import mock

import msgpack
import pytest

from diffstore import Store
from diffstore.engine import check, layout
from diffstore.engine.tables import load_meta
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


@pytest.mark.parametrize("accel", [True, False], ids=["compiled", "pure-python"])
def test_changed_keys_count_distinct_keys_across_writes(store: Store, accel: bool) -> None:
    """The writes count the generation's distinct keys as they go (sorted and unsorted batches, repeats
    within and across them, tombstones, conditional writes); an abort forgets them."""
    c = store.create_collection("A", manual=True)
    with contextlib.nullcontext() if accel else mock.patch.object(layout, "ACCEL", None):
        c.start_generation(b"1")
        c.put_many([(b"k%d" % i, b"x") for i in range(5)], generation_id=b"1")
        c.abort_generation(b"1")
        c.start_generation(b"1")
        c.put_many([(b"k%02d" % i, b"a") for i in range(10)], generation_id=b"1")  # sorted: 10 keys
        c.put_many([(b"k%02d" % i, b"b") for i in range(15, 5, -1)], generation_id=b"1")  # 6 new
        c.put_many([(b"k03", None), (b"z", b"1"), (b"z", b"2")], generation_id=b"1")  # 1 new
        c.put(b"y", b"1", generation_id=b"1", if_not_present=True)  # 1 new
        c.put(b"y", b"2", generation_id=b"1", if_not_present=True)  # present: not written
        c.put(b"z", b"2", generation_id=b"1", skip_unchanged=True)  # unchanged: not written
        with store.read() as txn:
            report = check.check(txn, store.tables)
        assert report.ok, report.problems
        c.commit_generation(b"1")
    assert c.history()[0][0].changed_keys == 18


def test_an_open_generation_written_before_the_count_is_counted_at_commit(store: Store) -> None:
    """A collection row written before ``next_keys`` existed (12 fields) with writes in its open
    generation: the commit counts them from the index, as it did then."""
    c = store.create_collection("A", manual=True)
    c.start_generation(b"1")
    c.put_many([(b"a", b"1"), (b"b", b"1")], generation_id=b"1")
    with store.write() as scope:
        key = b"A"
        fields = msgpack.unpackb(scope.txn.get(key, db=store.tables.collections), raw=False)
        assert len(fields) == 13 and fields[12] == 2
        scope.txn.put(key, msgpack.packb(fields[:12], use_bin_type=True), db=store.tables.collections)
    with store.read() as txn:
        assert load_meta(txn, store.tables, "A").next_keys is None
    c.put(b"c", b"1", generation_id=b"1")
    c.commit_generation(b"1")
    assert c.history()[0][0].changed_keys == 3
    with store.read() as txn:
        assert load_meta(txn, store.tables, "A").next_keys == 0
