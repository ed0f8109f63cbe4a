"""Lineage: the reader moves each commit records, the walk back through sources, and their collection."""

from __future__ import annotations

import pytest

from diffstore import Store
from diffstore.engine import lineage as lineage_module
from diffstore.engine.tables import load_meta
from diffstore.engine.types import Lineage, LineageSource, ReaderUpdate
from diffstore.errors import GenerationCollected, InvalidRequest, NoSuchCollection, NoSuchReader

from .util import commit, raw_state, run_background

STREAM = "hstream://events"
SHARD = "hstream/sub/0"


def _record_id(n: int) -> bytes:
    return n.to_bytes(8, "big") + b"\x00\x00\x00\x00"


def _pipeline(store: Store) -> None:
    """A and B ingested from a stream (reader per shard), C reading A and B (as the transform does)."""
    for name in ("A", "B"):
        source = store.create_collection(name, manual=True)
        source.create_reader(SHARD, collection=STREAM)
    c = store.create_collection("C", manual=True)
    c.create_reader("from_a", collection="A")
    c.create_reader("from_b", collection="B")


def _ingest(store: Store, name: str, generation_id: bytes, record: int) -> None:
    commit(
        store.collection(name), generation_id, [(b"k" + generation_id, b"v")], [(SHARD, _record_id(record))]
    )


def test_commit_records_the_readers_it_moved(store: Store) -> None:
    _pipeline(store)
    _ingest(store, "A", b"a1", 3)
    _ingest(store, "B", b"b1", 7)
    c = store.collection("C")
    commit(c, b"c1", [(b"x", b"1")], [("from_a", b"a1"), ("from_b", b"b1")])
    assert c.lineage(b"c1") == Lineage(
        b"c1",
        (
            LineageSource("from_a", "A", "A", None, b"a1"),
            LineageSource("from_b", "B", "B", None, b"b1"),
        ),
    )
    assert store.collection("A").lineage(b"a1") == Lineage(
        b"a1", (LineageSource(SHARD, STREAM, None, None, _record_id(3)),)
    )
    _ingest(store, "A", b"a2", 5)
    commit(c, b"c2", [], [("from_a", b"a2"), ("from_b", b"b1")])
    # B did not move: its entry says so (from == to), C's generation c2 is consistent with B at b1
    assert c.lineage(b"c2").sources == (
        LineageSource("from_a", "A", "A", b"a1", b"a2"),
        LineageSource("from_b", "B", "B", b"b1", b"b1"),
    )
    assert c.lineage(b"c1").sources[0].to_generation_id == b"a1"  # earlier generations keep theirs


def test_generations_that_moved_no_reader_have_empty_lineage(store: Store) -> None:
    _pipeline(store)
    c = store.collection("C")
    commit(c, b"c1", [(b"x", b"1")])
    assert c.lineage(b"c1") == Lineage(b"c1", ())
    assert c.lineage(b"") == Lineage(b"", ())  # the initial generation
    auto = store.create_collection("auto", manual=False)
    auto.put(b"k", b"v")
    store.run_background_once(now=10**9)
    assert auto.lineage(auto.generation_id).sources == ()


def test_a_reader_updated_twice_in_one_commit_is_one_move(store: Store) -> None:
    _pipeline(store)
    _ingest(store, "A", b"a1", 1)
    _ingest(store, "A", b"a2", 2)
    c = store.collection("C")
    commit(c, b"c1", [], [ReaderUpdate("from_a", b"a1", expected=None), ("from_a", b"a2")])
    assert c.lineage(b"c1").sources == (LineageSource("from_a", "A", "A", None, b"a2"),)


def test_a_refused_commit_records_nothing(store: Store) -> None:
    _pipeline(store)
    _ingest(store, "A", b"a1", 1)
    c = store.collection("C")
    c.start_generation(b"c1")
    before = raw_state(store)
    with pytest.raises(NoSuchReader):
        c.commit_generation(b"c1", [("from_a", b"a1"), ("nope", b"a1")])
    assert raw_state(store) == before


@pytest.mark.parametrize("generation_id", [b"c9", b"c", b"zz", b"\xff"])
def test_a_generation_that_is_not_committed_is_invalid(store: Store, generation_id: bytes) -> None:
    _pipeline(store)
    c = store.collection("C")
    commit(c, b"c1", [])
    c.start_generation(b"c2")  # open, not committed
    before = raw_state(store)
    for asked in (generation_id, b"c2"):
        with pytest.raises(InvalidRequest) as info:
            c.lineage(asked)
        assert info.value.code == "invalidRequest"
    assert raw_state(store) == before


@pytest.mark.parametrize("depth", [0, -1, 11, True, 1.5, "2", None])
def test_bad_depth_is_invalid(store: Store, depth: object) -> None:
    _pipeline(store)
    c = store.collection("C")
    commit(c, b"c1", [])
    before = raw_state(store)
    with pytest.raises(InvalidRequest):
        c.lineage(b"c1", depth=depth)  # type: ignore[arg-type]
    assert raw_state(store) == before


def test_the_walk_goes_back_through_sources_to_the_streams(store: Store) -> None:
    _pipeline(store)
    for keep in ("A", "B"):  # a reader at null keeps every generation of A and B (no GC)
        store.collection("C").create_reader(f"keep_{keep}", collection=keep)
    _ingest(store, "A", b"a1", 10)
    _ingest(store, "A", b"a2", 20)
    _ingest(store, "B", b"b1", 5)
    c = store.collection("C")
    commit(c, b"c1", [], [("from_a", b"a2"), ("from_b", b"b1")])
    _ingest(store, "A", b"a3", 30)
    _ingest(store, "A", b"a4", 40)
    commit(c, b"c2", [], [("from_a", b"a4"), ("from_b", b"b1")])

    assert c.lineage(b"c2", depth=1).sources[0].sources is None  # depth 1: not walked
    walked = c.lineage(b"c2", depth=2)
    # A's generations (a2, a4] merged per reader: stream records (20, 40] of the shard made c2
    assert walked.sources == (
        LineageSource(
            "from_a",
            "A",
            "A",
            b"a2",
            b"a4",
            (LineageSource(SHARD, STREAM, None, _record_id(20), _record_id(40)),),
        ),
        LineageSource("from_b", "B", "B", b"b1", b"b1", ()),
    )
    assert c.lineage(b"c2", depth=10) == walked  # stream readers are leaves
    first = c.lineage(b"c1", depth=3).sources
    assert first[0].sources == (LineageSource(SHARD, STREAM, None, None, _record_id(20)),)
    assert first[1].sources == (LineageSource(SHARD, STREAM, None, None, _record_id(5)),)

    # one level further: D reads C, so D's generation walks D -> C -> A, B -> the stream
    d = store.create_collection("D", manual=True)
    d.create_reader("from_c", collection="C")
    d.create_reader("keep_C", collection="C")  # else C's c1 is collected once from_c passes it
    commit(d, b"d1", [], [("from_c", b"c2")])
    deep = d.lineage(b"d1", depth=3).sources[0]
    assert deep.sources is not None
    assert [(s.reader_name, s.from_generation_id, s.to_generation_id) for s in deep.sources] == [
        ("from_a", None, b"a4"),
        ("from_b", None, b"b1"),
    ]
    assert deep.sources[0].sources == (LineageSource(SHARD, STREAM, None, None, _record_id(40)),)
    assert d.lineage(b"d1", depth=2).sources[0].sources[0].sources is None  # type: ignore[index]


def test_lineage_is_collected_with_its_generation(store: Store) -> None:
    _pipeline(store)
    _ingest(store, "A", b"a1", 1)
    c = store.collection("C")
    commit(c, b"c1", [(b"x", b"1")], [("from_a", b"a1")])
    _ingest(store, "A", b"a2", 2)
    commit(c, b"c2", [(b"x", b"2")], [("from_a", b"a2")])
    _ingest(store, "A", b"a3", 3)
    commit(c, b"c3", [(b"x", b"3")], [("from_a", b"a3")])
    d = store.create_collection("D", manual=True)
    d.create_reader("from_c", collection="C", generation_id=b"c1")
    run_background(store)
    assert len(c.lineage(b"c1").sources) == 1  # live while a reader of C is at c1

    commit(d, b"d1", [], [("from_c", b"c3")])  # C's minimum moves to c3: c1 and c2 are collected
    with pytest.raises(GenerationCollected):
        c.lineage(b"c1")  # at once, whether GC has run or not
    rows_before = len(raw_state(store)["lineage"])
    run_background(store)
    assert len(raw_state(store)["lineage"]) == rows_before - 2  # C's rows of c1 and c2 are gone
    for gone in (b"c1", b"c2"):
        with pytest.raises(GenerationCollected) as info:
            c.lineage(gone)
        assert info.value.code == "generationCollected"
    assert c.lineage(b"c3").sources == (LineageSource("from_a", "A", "A", b"a2", b"a3"),)
    # D's walk over C's (None, c3] keeps the live c3 and says that c1 and c2 are gone
    walked = d.lineage(b"d1", depth=3).sources[0]
    assert walked.incomplete
    assert walked.sources == (
        LineageSource(
            "from_a",
            "A",
            "A",
            b"a2",
            b"a3",
            (LineageSource(SHARD, STREAM, None, _record_id(2), _record_id(3)),),
        ),
    )


def test_a_walk_over_partly_collected_generations_keeps_what_is_live(store: Store) -> None:
    _pipeline(store)
    c = store.collection("C")
    for n in (1, 2, 3):
        _ingest(store, "A", b"a%d" % n, n * 10)
    store.collection("A").create_reader("self", generation_id=b"a2")  # A's floor: a2
    commit(c, b"c1", [], [("from_a", b"a3")])
    run_background(store)
    walked = c.lineage(b"c1", depth=2).sources[0]
    # a1 is gone; a2 and a3 are live: the span starts where a2's move started
    assert walked.incomplete
    assert walked.sources == (LineageSource(SHARD, STREAM, None, _record_id(10), _record_id(30)),)


def test_lineage_goes_with_a_deleted_collection(store: Store) -> None:
    _pipeline(store)
    _ingest(store, "A", b"a1", 1)
    c = store.collection("C")
    commit(c, b"c1", [], [("from_a", b"a1")])
    store.delete_collection("A")
    # the walk does not follow a source that is gone (nor another collection later created with its name)
    store.create_collection("A", manual=True)
    assert c.lineage(b"c1", depth=2).sources == (LineageSource("from_a", "A", "A", None, b"a1", (), True),)
    store.delete_collection("A")
    store.delete_collection("C")
    with pytest.raises(NoSuchCollection):
        c.lineage(b"c1")
    run_background(store)
    assert raw_state(store)["lineage"] == []


def test_the_walk_is_bounded(store: Store) -> None:
    _pipeline(store)
    _ingest(store, "A", b"a1", 1)
    _ingest(store, "B", b"b1", 1)
    c = store.collection("C")
    commit(c, b"c1", [], [("from_a", b"a1"), ("from_b", b"b1")])
    with store.read() as txn:
        meta = load_meta(txn, store.tables, "C")
        assert len(lineage_module.lineage(txn, store.tables, meta, b"c1", 2, max_entries=4).sources) == 2
        with pytest.raises(InvalidRequest, match="smaller depth"):
            lineage_module.lineage(txn, store.tables, meta, b"c1", 2, max_entries=3)
    # a cycle (C's self-reader moved to the very generation being committed) ends at the depth bound
    c.create_reader("self")
    commit(c, b"c2", [], [("self", b"c2")])
    node = c.lineage(b"c2", depth=10).sources[-1]
    levels = 1
    while node.sources:
        node = [s for s in node.sources if s.reader_name == "self"][0]
        levels += 1
    assert levels == 10


def test_lineage_survives_reopen(open_store) -> None:  # type: ignore[no-untyped-def]
    store = open_store()
    _pipeline(store)
    _ingest(store, "A", b"a1", 1)
    commit(store.collection("C"), b"c1", [], [("from_a", b"a1")])
    store.close()
    again = open_store()
    assert again.collection("C").lineage(b"c1", depth=2).sources[0].sources == (
        LineageSource(SHARD, STREAM, None, None, _record_id(1)),
    )
