"""The engine's replication API: a primary's generation applied with its own id, records and reader moves in
one transaction together with the replica's position; what a primary serves its replicas."""

from __future__ import annotations

import pytest

from diffstore import Store
from diffstore.engine.meta import non_manual_generation
from diffstore.engine.types import Lease, Reader, ReplicaGeneration
from diffstore.errors import (
    BadVersion,
    GenerationCollected,
    InvalidRequest,
    NoSuchGeneration,
    NoSuchReader,
    NotReplica,
)
from tests.engine.conftest import StoreFactory


def _replica(open_store: StoreFactory, tmp_path_factory: pytest.TempPathFactory) -> Store:
    store = open_store(tmp_path_factory.mktemp("replica") / "store")
    store.become_replica("http://primary", "r1")
    return store


def test_manual_generations_apply_once_with_their_ids_records_and_lineage(
    open_store: StoreFactory, tmp_path_factory: pytest.TempPathFactory
) -> None:
    replica = _replica(open_store, tmp_path_factory)
    assert replica.apply_replica_generation(ReplicaGeneration("A", True, None, b"", []))
    assert not replica.apply_replica_generation(ReplicaGeneration("A", True, None, b"", []))  # done before
    step = ReplicaGeneration(
        "A",
        True,
        b"",
        b"0001",
        [(b"k", b"v"), (b"gone", None)],
        readers=(Reader("from_b", "B", b"7"),),
        lag_generations=2,
        unapplied_since_ms=123,
    )
    assert replica.apply_replica_generation(step)
    assert not replica.apply_replica_generation(step)  # exactly once: the position moved with it
    a = replica.collection("A")
    assert a.generation_state() == (b"0001", None)
    record = a.get(b"k")
    assert record is not None and record.value == b"v" and record.generation_id == b"0001"
    assert a.readers() == [Reader("from_b", "B", b"7")]
    (source,) = a.lineage(b"0001").sources
    assert (source.reader_name, source.from_generation_id, source.to_generation_id) == ("from_b", None, b"7")
    state = replica.replica_state()
    assert state.following and state.applied == 2 and state.primary == "http://primary"
    assert [(lag.collection, lag.generations, lag.unapplied_since_ms) for lag in state.lags] == [
        ("A", 2, 123)
    ]
    with pytest.raises(BadVersion):  # not on top of what the replica holds: nothing changes
        replica.apply_replica_generation(ReplicaGeneration("A", True, b"0000", b"0003", [(b"k", b"x")]))
    assert a.get(b"k").value == b"v"  # type: ignore[union-attr]


def test_automatic_collection_keeps_ids_and_carries_on_after_promotion(
    open_store: StoreFactory, tmp_path_factory: pytest.TempPathFactory
) -> None:
    replica = _replica(open_store, tmp_path_factory)
    g = non_manual_generation
    assert replica.apply_replica_generation(ReplicaGeneration("X", False, None, g(0), []))
    assert replica.collection("X").generation_state() == (g(0), g(1))
    replica.apply_replica_generation(ReplicaGeneration("X", False, g(0), g(1), [(b"a", b"1")]))
    replica.apply_replica_generation(ReplicaGeneration("X", False, g(1), g(2), [(b"a", b"2")]))
    x = replica.collection("X")
    assert x.generation_state() == (g(2), g(3))
    replica.promote_replica()
    with pytest.raises(NotReplica):
        replica.apply_replica_generation(ReplicaGeneration("X", False, g(2), g(3), [(b"a", b"3")]))
    assert x.put(b"b", b"1").generation_id == g(3)
    replica.run_background_once(now=1e12)
    assert x.generation_state() == (g(3), g(4))
    assert [item.key for item in x.diff(from_generation_id=g(1))] == [b"a", b"b"]
    with pytest.raises(NotReplica):
        replica.promote_replica()


def test_first_copy_mid_history_marks_the_floor(
    open_store: StoreFactory, tmp_path_factory: pytest.TempPathFactory
) -> None:
    replica = _replica(open_store, tmp_path_factory)
    step = ReplicaGeneration("A", True, None, b"5", [(b"k", b"v")], floor=True)
    assert replica.apply_replica_generation(step)
    a = replica.collection("A")
    assert a.get(b"k").value == b"v"  # type: ignore[union-attr]
    with pytest.raises(GenerationCollected):
        a.get(b"k", generation_id=b"4")


def test_copy_readers_and_leases_only_at_the_generation_read(
    open_store: StoreFactory, tmp_path_factory: pytest.TempPathFactory
) -> None:
    replica = _replica(open_store, tmp_path_factory)
    replica.apply_replica_generation(ReplicaGeneration("A", True, None, b"", []))
    replica.apply_replica_generation(ReplicaGeneration("A", True, b"", b"1", [], (Reader("old", "A", None),)))
    lease = Lease("ingest", "me", 3, 10**13)
    assert not replica.copy_replica_readers("A", b"", [Reader("new", "A", b"1")], [lease])
    assert replica.copy_replica_readers("A", b"1", [Reader("new", "A", b"1")], [lease])
    a = replica.collection("A")
    assert a.readers() == [Reader("new", "A", b"1")]
    assert a.leases() == [lease]
    assert replica.copy_replica_readers(
        "A", b"1", [], [Lease("ingest", "me", 2, 5)]
    )  # versions never go back
    assert a.leases() == [lease] and a.readers() == []


def test_a_store_with_collections_or_promoted_cannot_become_a_replica(
    open_store: StoreFactory, tmp_path_factory: pytest.TempPathFactory
) -> None:
    primary = open_store()
    primary.create_collection("A")
    with pytest.raises(InvalidRequest):
        primary.become_replica("http://p", "r")
    with pytest.raises(NotReplica):
        primary.promote_replica()
    with pytest.raises(NotReplica):
        primary.apply_replica_generation(ReplicaGeneration("B", True, None, b"", []))
    assert [c.name for c in primary.collections()] == ["A"]
    replica = _replica(open_store, tmp_path_factory)
    with pytest.raises(InvalidRequest):
        replica.become_replica("http://other", "r2")
    replica.promote_replica()
    with pytest.raises(InvalidRequest):
        replica.become_replica("http://primary", "r1")


def test_primary_lists_generations_and_their_records(store: Store) -> None:
    a = store.create_collection("A", manual=True)
    for n, items in enumerate([[(b"k", b"1"), (b"j", b"x")], [(b"k", b"1")], [(b"j", None)]], start=1):
        g = b"%d" % n
        a.start_generation(g)
        a.put_many(items, generation_id=g)
        a.commit_generation(g)
    a.start_generation(b"4")  # open: not listed
    assert a.generations() == ([b"3", b"2", b"1", b""], False)
    assert a.generations(before=b"3", limit=2) == ([b"2", b"1"], True)
    two = a.generation_records(b"2")
    assert (two.records, two.next_key, two.previous) == ([(b"k", b"1")], None, b"1")  # same value: a record
    first = a.generation_records(b"1", limit=1)
    assert (first.records, first.next_key, first.previous) == ([(b"j", b"x")], b"k", b"")
    assert a.generation_records(b"1", from_key=b"k").records == [(b"k", b"1")]
    assert a.generation_records(b"3").records == [(b"j", None)]
    with pytest.raises(NoSuchReader):  # a replica's hold must be there
        a.generation_records(b"3", hold="diffstore-replica:r1")
    for missing in (b"4", b"2.5", b"9"):
        with pytest.raises(NoSuchGeneration):
            a.generation_records(missing)
    a.create_reader("r", generation_id=b"2")
    assert a.generations() == ([b"3", b"2", b"1", b""], False)  # collected ones too
    with pytest.raises(GenerationCollected):
        a.generation_records(b"1")


def test_a_replica_hold_keeps_gc_back_without_changing_reads(store: Store) -> None:
    a = store.create_collection("A", manual=True)
    for n in range(1, 5):
        g = b"%d" % n
        a.start_generation(g)
        a.put(b"k", g, generation_id=g)
        a.commit_generation(g)
    a.create_reader("diffstore-replica:r1", generation_id=b"2")  # a replica's hold alone: no floor, no GC
    store.run_background_once(now=1e12)
    assert a.get(b"k", generation_id=b"1").value == b"1"  # type: ignore[union-attr]
    assert a.generations() == ([b"4", b"3", b"2", b"1", b""], False)
    a.create_reader("user", generation_id=b"4")  # a reader turns GC on; the hold keeps 2 and above whole
    while store.run_background_once(now=1e12):
        pass
    with pytest.raises(GenerationCollected):
        a.get(b"k", generation_id=b"3")  # the readable floor is the readers' (4)
    assert a.generation_records(b"3").records == [(b"k", b"3")]
    held = a.generation_records(b"2", hold="diffstore-replica:r1")
    assert held.records == [(b"k", b"2")]
    assert held.readers == (Reader("diffstore-replica:r1", "A", b"2"), Reader("user", "A", b"4"))
    with pytest.raises(GenerationCollected):
        a.generation_records(b"1")
