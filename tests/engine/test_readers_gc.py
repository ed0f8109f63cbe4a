"""SPEC §1 Readers, CAS, commit-with-reader-updates, minimumGenerationId and background GC."""

from __future__ import annotations

from collections import Counter

import pytest

from diffstore import FromReader, Reader, ReaderUpdate, Store
from diffstore.engine import check, layout
from diffstore.errors import (
    BadVersion,
    CursorExpired,
    GenerationCollected,
    InvalidRequest,
    NoSuchReader,
    ReaderExists,
)
from tests.helpers import wait_until

from .util import as_dict, commit, raw_state, run_background

# --- readers ---------------------------------------------------------------------------------------


def test_create_list_update_delete_reader(store: Store) -> None:
    c = store.create_collection("c", manual=True)
    commit(store.create_collection("other", manual=True), b"5", [])
    c.create_reader("self")
    c.create_reader("b", collection="other", generation_id=b"5")
    c.create_reader("s", collection="hstream://stream", generation_id=b"\x00" * 12)
    assert c.readers() == [
        Reader("b", "other", b"5"),
        Reader("s", "hstream://stream", b"\x00" * 12),
        Reader("self", "c", None),
    ]
    c.update_reader("self", b"7")
    c.update_reader("b", None)
    assert c.readers()[0] == Reader("b", "other", None)
    assert c.readers()[2] == Reader("self", "c", b"7")
    c.delete_reader("self")
    assert [r.name for r in c.readers()] == ["b", "s"]
    assert store.collection("other").readers() == []


def test_create_same_reader_again_is_ok_different_is_reader_exists(store: Store) -> None:
    c = store.create_collection("c", manual=True)
    c.create_reader("r", collection="hstream://x", generation_id=b"1")
    before = raw_state(store)
    c.create_reader("r", collection="hstream://x", generation_id=b"1")
    assert raw_state(store) == before
    for target, gen in (("hstream://x", b"2"), ("hstream://y", b"1"), ("hstream://x", None), (None, b"")):
        with pytest.raises(ReaderExists) as info:
            c.create_reader("r", collection=target, generation_id=gen)
        assert info.value.code == "readerExists"
    assert raw_state(store) == before


@pytest.mark.parametrize("name", ["", "x" * 256])
def test_bad_reader_name_is_invalid(store: Store, name: str) -> None:
    c = store.create_collection("c", manual=True)
    before = raw_state(store)
    with pytest.raises(InvalidRequest):
        c.create_reader(name)
    assert raw_state(store) == before


def test_update_of_unknown_reader_is_no_such_reader(store: Store) -> None:
    c = store.create_collection("c", manual=True)
    c.create_reader("r")
    before = raw_state(store)
    with pytest.raises(NoSuchReader) as info:
        c.update_reader("nope", b"2")
    assert info.value.code == "noSuchReader"
    assert raw_state(store) == before


def test_delete_missing_reader_is_ok(store: Store) -> None:
    c = store.create_collection("c", manual=True)
    before = raw_state(store)
    c.delete_reader("nope")
    assert raw_state(store) == before


@pytest.mark.parametrize(
    ("stored", "expected", "ok"),
    [
        (b"1", b"1", True),
        (b"1", b"2", False),
        (b"1", None, False),
        (None, None, True),
        (None, b"", True),  # a reader's "" and null are one value (SPEC §7)
        (b"", None, True),
        (b"", b"", True),
    ],
)
def test_update_reader_cas(store: Store, stored, expected, ok: bool) -> None:
    c = store.create_collection("c", manual=True)
    c.create_reader("r", collection="hstream://t", generation_id=stored)
    before = raw_state(store)
    if ok:
        c.update_reader("r", b"9", expected=expected)
        assert c.readers() == [Reader("r", "hstream://t", b"9")]
    else:
        with pytest.raises(BadVersion) as info:
            c.update_reader("r", b"9", expected=expected)
        assert info.value.code == "badVersion"
        assert raw_state(store) == before


def test_commit_applies_reader_updates_atomically(store: Store) -> None:
    c = store.create_collection("c", manual=True)
    c.create_reader("from_a", collection="hstream://a")
    c.create_reader("from_b", collection="hstream://b", generation_id=b"x")
    c.start_generation(b"1")
    c.put(b"k", b"v", generation_id=b"1")
    c.commit_generation(
        b"1", update_readers=[("from_a", b"ga"), ReaderUpdate("from_b", b"gb", expected=b"x")]
    )
    assert c.generation_id == b"1"
    assert c.readers() == [Reader("from_a", "hstream://a", b"ga"), Reader("from_b", "hstream://b", b"gb")]


@pytest.mark.parametrize(
    ("updates", "error"),
    [
        ([("from_a", b"ga"), ("nope", b"g")], NoSuchReader),
        ([ReaderUpdate("from_a", b"ga", None), ReaderUpdate("from_b", b"gb", b"y")], BadVersion),
        ([ReaderUpdate("from_b", b"gb", b"x"), ReaderUpdate("from_a", b"ga", b"q")], BadVersion),
        ([ReaderUpdate("from_a", b"ga", expected=b"ga")], BadVersion),
    ],
)
def test_commit_with_bad_reader_update_changes_nothing(store: Store, updates, error) -> None:
    c = store.create_collection("c", manual=True)
    c.create_reader("from_a", collection="hstream://a")
    c.create_reader("from_b", collection="hstream://b", generation_id=b"x")
    c.start_generation(b"1")
    c.put(b"k", b"v", generation_id=b"1")
    before = raw_state(store)
    with pytest.raises(error):
        c.commit_generation(b"1", update_readers=updates)
    assert raw_state(store) == before
    assert c.generation_id == b""
    assert c.next_generation_id == b"1"
    assert c.get(b"k") is None
    assert c.readers() == [Reader("from_a", "hstream://a", None), Reader("from_b", "hstream://b", b"x")]
    c.commit_generation(b"1")  # the generation is still open and commits fine afterwards
    assert c.get(b"k") is not None


def test_readers_survive_reopen(open_store) -> None:
    store = open_store()
    c = store.create_collection("c", manual=True)
    c.create_reader("r", collection="hstream://t", generation_id=b"1")
    commit(c, b"1", [], update_readers=[("r", b"2")])
    store.close()
    assert open_store().collection("c").readers() == [Reader("r", "hstream://t", b"2")]


# --- minimumGenerationId and GC ------------------------------------------------------------------------


def _history(store: Store, name: str = "c"):
    c = store.create_collection(name, manual=True)
    commit(c, b"1", [(b"a", b"a1"), (b"b", b"b1"), (b"t", b"t1")])
    commit(c, b"2", [(b"a", b"a2"), (b"t", None)])
    commit(c, b"3", [(b"a", b"a3"), (b"b", b"b3")])
    commit(c, b"4", [(b"a", b"a4"), (b"n", b"n4")])
    commit(c, b"5", [(b"b", b"b5")])
    return c


def _versions_per_key(store: Store) -> Counter:
    return Counter(layout.record_form(k) for k, _ in raw_state(store)["records"])


GENS = [b"", b"1", b"2", b"3", b"4", b"5"]


def _snapshot(c):
    return {g: as_dict(c, generation_id=g) for g in GENS}


def test_no_gc_without_readers(store: Store) -> None:
    c = _history(store)
    snap, before = _snapshot(c), raw_state(store)
    run_background(store)
    assert raw_state(store) == before
    assert _snapshot(c) == snap


def test_no_gc_while_a_reader_is_null_or_empty(store: Store) -> None:
    c = _history(store)
    c.create_reader("high", generation_id=b"5")
    c.create_reader("null")
    other = store.create_collection("o", manual=True)
    other.create_reader("empty", collection="c", generation_id=b"")
    before = raw_state(store)
    run_background(store)
    assert raw_state(store)["records"] == before["records"]
    assert as_dict(c, generation_id=b"1") == {b"a": b"a1", b"b": b"b1", b"t": b"t1"}


def test_gc_removes_versions_below_minimum_and_keeps_reads_at_or_above(store: Store) -> None:
    c = _history(store)
    snap = _snapshot(c)
    diff_from_3 = list(c.diff(b"3", include_intermediate=True))
    diff_from_empty = [(i.key, i.from_value, i.to_value) for i in c.diff(b"")]
    c.create_reader("r", generation_id=b"3")
    steps = run_background(store)
    assert steps >= 1
    for gen in (b"3", b"4", b"5"):
        assert as_dict(c, generation_id=gen) == snap[gen]
    assert list(c.diff(b"3", include_intermediate=True)) == diff_from_3
    # a diff from the very beginning still works after GC (values at its ends are the same)
    assert [(i.key, i.from_value, i.to_value) for i in c.diff(b"")] == diff_from_empty
    assert [(i.key, i.from_value, i.to_value) for i in c.diff_page(b"").items] == diff_from_empty
    versions = _versions_per_key(store)
    # per key: versions older than the newest one at or below 3 are gone (a: a3,a4; b: b3,b5; t: tombstone)
    assert versions[layout.key_form(b"a")] == 2
    assert versions[layout.key_form(b"b")] == 2
    assert versions[layout.key_form(b"t")] == 1
    assert versions[layout.key_form(b"n")] == 1


@pytest.mark.parametrize("gen", [b"", b"1", b"2", b"29"])
def test_reads_below_horizon_are_generation_collected(store: Store, gen: bytes) -> None:
    c = _history(store)
    page = c.query_page(generation_id=b"2", limit=1)
    diff_page = c.diff_page(b"1", limit=1)
    c.create_reader("r", generation_id=b"3")
    run_background(store)
    before = raw_state(store)
    calls = [
        lambda: c.get(b"a", generation_id=gen),
        lambda: list(c.query(generation_id=gen)),
        lambda: c.query_page(generation_id=gen),
        lambda: c.keys_around(b"a", 3, generation_id=gen),
        lambda: c.splits(2, generation_id=gen),
    ]
    if gen:  # "" is the very beginning: diffs from it and readers at it (same as null) stay allowed
        calls.append(lambda: list(c.diff(gen)))
        calls.append(lambda: c.diff_page(gen, b"3"))
        calls.append(lambda: c.update_reader("r", gen))
        calls.append(lambda: c.create_reader("r2", generation_id=gen))
    for call in calls:
        with pytest.raises(GenerationCollected) as info:
            call()
        assert info.value.code == "generationCollected"
    with pytest.raises(GenerationCollected):
        list(c.diff(b"", b"2"))
    assert raw_state(store) == before
    with pytest.raises(CursorExpired) as expired:
        c.query_page(cursor=page.cursor)
    assert expired.value.code == "cursorExpired"
    with pytest.raises(CursorExpired):
        c.diff_page(cursor=diff_page.cursor)
    c.update_reader("r", b"3")  # at the horizon is fine
    c.create_reader("null")  # a null reader is fine


def test_horizon_does_not_move_back_when_reader_moves_back_or_goes(store: Store) -> None:
    c = _history(store)
    c.create_reader("r", generation_id=b"4")
    run_background(store)
    c.delete_reader("r")
    c.create_reader("r", generation_id=b"")
    run_background(store)
    with pytest.raises(GenerationCollected):
        c.get(b"a", generation_id=b"3")
    assert c.get(b"a", generation_id=b"4").value == b"a4"  # type: ignore[union-attr]


def test_minimum_is_over_readers_in_every_collection(store: Store) -> None:
    c = _history(store)
    other = store.create_collection("o", manual=True)
    other.create_reader("from_c", collection="c", generation_id=b"2")
    other.create_reader("unrelated", collection="hstream://s", generation_id=b"")
    c.create_reader("self", generation_id=b"5")
    run_background(store)
    assert as_dict(c, generation_id=b"2") == {b"a": b"a2", b"b": b"b1"}
    with pytest.raises(GenerationCollected):
        c.get(b"a", generation_id=b"1")
    other.update_reader("from_c", b"4")
    run_background(store)
    with pytest.raises(GenerationCollected):
        c.get(b"a", generation_id=b"3")
    assert as_dict(c, generation_id=b"4") == {b"a": b"a4", b"b": b"b3", b"n": b"n4"}
    assert list(c.diff(b"4")) == [c.diff_page(b"4").items[0]]


def test_gc_horizon_never_passes_current_generation(store: Store) -> None:
    c = _history(store)
    c.create_reader("r")
    c.update_reader("r", b"9")  # a reader moved ahead of the collection (created there: refused)
    c.start_generation(b"6")
    c.put(b"a", b"a6", generation_id=b"6")
    run_background(store)
    assert as_dict(c, generation_id=b"5") == {b"a": b"a4", b"b": b"b5", b"n": b"n4"}
    c.commit_generation(b"6")  # the open generation was left alone
    assert c.get(b"a").value == b"a6"  # type: ignore[union-attr]
    # 5 is now below the readers' minimum (9, capped at the current generation 6): SPEC §1 says 410.
    with pytest.raises(GenerationCollected):
        list(c.diff(b"5"))


def test_gc_in_small_steps_gives_the_same_result(open_store, tmp_path) -> None:
    results = []
    for batch, sub in ((2, "small"), (10_000, "big")):
        store = open_store(tmp_path / sub, gc_batch=batch)
        c = store.create_collection("c", manual=True)
        for g in range(1, 6):
            commit(c, b"%d" % g, [(b"k%02d" % i, b"%d-%d" % (g, i)) for i in range(0, 30, g)])
        c.create_reader("r", generation_id=b"4")
        steps = run_background(store)
        results.append((steps, as_dict(c, generation_id=b"4"), as_dict(c), _versions_per_key(store)))
    (small_steps, *small), (big_steps, *big) = results
    assert small == big
    assert small_steps > big_steps


def test_gc_runs_in_background_thread(open_store) -> None:
    store = open_store(background=True, gc_interval_ms=10)
    c = _history(store)
    c.create_reader("r", generation_id=b"5")
    wait_until(lambda: _versions_per_key(store)[layout.key_form(b"a")] == 1, what="background GC")
    assert as_dict(c) == {b"a": b"a4", b"b": b"b5", b"n": b"n4"}


def test_gc_of_long_keys(store: Store) -> None:
    c = store.create_collection("c", manual=True)
    prefix = b"L" * 200
    keys = [prefix + b"b", prefix + b"a", prefix + b"a\x00", b"L" * 199]
    for g in (b"1", b"2", b"3"):
        commit(c, g, [(k, g + k[-1:]) for k in keys])
    c.create_reader("r", generation_id=b"2")
    run_background(store)
    assert as_dict(c, generation_id=b"2") == {k: b"2" + k[-1:] for k in keys}
    assert [i.key for i in c.diff(b"2")] == sorted(keys)
    assert sum(_versions_per_key(store).values()) == 8


def test_diff_from_reader(store: Store) -> None:
    c = _history(store)
    other = store.create_collection("o", manual=True)
    other.create_reader("from_c", collection="c", generation_id=b"3")
    c.create_reader("null_reader")
    c.create_reader("at4", generation_id=b"4")
    page = c.diff_page(from_reader=FromReader("from_c", "o"))
    assert page.from_generation_id == b"3" and page.to_generation_id == b"5"
    assert [(i.key, i.from_value, i.to_value) for i in page.items] == [
        (b"a", b"a3", b"a4"),
        (b"b", b"b3", b"b5"),
        (b"n", None, b"n4"),
    ]
    assert c.diff_page(from_reader="null_reader").from_generation_id == b""
    assert [i.key for i in c.diff(from_reader="at4")] == [b"b"]
    with pytest.raises(NoSuchReader):
        c.diff_page(from_reader="missing")
    with pytest.raises(NoSuchReader):
        c.diff_page(from_reader=FromReader("at4", "o"))


def test_reader_ahead_of_a_fresh_collection_does_not_break_gc(store: Store) -> None:
    c = store.create_collection("c", manual=True)  # still at its initial generation ""
    c.create_reader("r")
    c.update_reader("r", b"x")
    run_background(store)
    commit(c, b"1", [(b"k", b"1")])
    commit(c, b"2", [(b"k", b"2")])
    run_background(store)
    with pytest.raises(GenerationCollected):
        c.get(b"k", generation_id=b"1")
    assert c.get(b"k").value == b"2"  # type: ignore[union-attr]


def test_background_worker_survives_gc_of_fresh_collection(open_store) -> None:
    store = open_store(background=True, gc_interval_ms=5)
    fresh = store.create_collection("fresh", manual=True)
    fresh.create_reader("r")
    fresh.update_reader("r", b"x")
    c = _history(store)
    c.create_reader("r", generation_id=b"5")
    wait_until(lambda: _versions_per_key(store)[layout.key_form(b"a")] == 1, what="GC after the fresh one")


def test_capped_diff_from_beginning_after_gc_covers_everything(open_store) -> None:
    store = open_store(max_diff_generations=2)
    c = store.create_collection("c", manual=True)
    for g in (b"1", b"2", b"3", b"4", b"5", b"6"):
        commit(c, g, [(b"k", g), (b"k" + g, b"x")])
    c.create_reader("r", generation_id=b"5")
    run_background(store)
    full = [(i.key, i.from_value, i.to_value) for i in c.diff(b"")]
    ends: dict[bytes, tuple[bytes | None, bytes | None]] = {}
    frm = b""
    while True:
        page = c.diff_page(frm, limit=100)  # repeat from the answered toGenerationId (SPEC §3)
        for i in page.items:
            ends[i.key] = (ends.get(i.key, (i.from_value,))[0], i.to_value)
        if page.to_generation_id == frm or page.to_generation_id == c.generation_id:
            break
        assert page.to_generation_id >= b"5", "a page ended below the GC horizon"
        frm = page.to_generation_id
    assert sorted((k, a, b) for k, (a, b) in ends.items() if a != b) == full


@pytest.mark.parametrize(
    ("owner", "reader", "target"),
    [
        ("c" * 255, "r" * 255, None),
        ("c", "x", "hstream://" + "t" * 1014),
        ("c", "y", "hstream://" + "s" * 500),
    ],
)
def test_longest_reader_names_and_targets_work(store: Store, owner, reader, target) -> None:
    c = store.create_collection(owner, manual=True)
    commit(c, b"1", [])
    c.create_reader(reader, collection=target, generation_id=b"1")
    c.update_reader(reader, b"2", expected=b"1")
    assert c.readers() == [Reader(reader, target or owner, b"2")]
    c.delete_reader(reader)
    assert c.readers() == []


def test_gc_of_a_first_load_visits_none_of_its_keys(open_store, tmp_path) -> None:
    """The run of the oldest generation stored supersedes nothing: GC passes it in one step (at
    ``gc_batch=2``, GC of this store took 24 steps when it visited the run's 40 keys), and removes the
    versions that later runs supersede."""
    store = open_store(tmp_path / "s", gc_batch=2)
    c = store.create_collection("c", manual=True)
    commit(c, b"1", [(b"k%02d" % i, b"1-%d" % i) for i in range(40)])
    commit(c, b"2", [(b"k00", b"2-0"), (b"k39", None)])
    c.create_reader("r", generation_id=b"2")
    latest = as_dict(c)
    steps = run_background(store)
    assert steps <= 4  # run 1: one step; run 2 (2 keys): two; the horizon moved: one
    assert as_dict(c, generation_id=b"2") == latest
    versions = _versions_per_key(store)
    assert versions[layout.key_form(b"k00")] == 1
    assert versions[layout.key_form(b"k39")] == 1  # the tombstone
    assert versions[layout.key_form(b"k01")] == 1
    with pytest.raises(GenerationCollected):
        c.get(b"k00", generation_id=b"1")
    with store.read() as txn:
        report = check.check(txn, store.tables)
    assert report.ok, report.problems
