"""SPEC §1 Writes: ifNotPresent, skipUnchanged, tombstones, putMany last-wins, producer seqNo dedup."""

from __future__ import annotations

import pytest

from diffstore import Store
from diffstore.errors import GenerationMismatch, InvalidRequest

from .util import as_dict, commit, raw_state


@pytest.fixture
def coll(store: Store):
    c = store.create_collection("m", manual=True)
    commit(c, b"1", [(b"a", b"1"), (b"dead", b"x")])
    commit(c, b"2", [(b"dead", None)])
    c.start_generation(b"3")
    return c


def test_if_not_present_on_existing_key_is_not_put(store: Store, coll) -> None:
    before = raw_state(store)
    result = coll.put(b"a", b"new", generation_id=b"3", if_not_present=True)
    assert result.was_put is False
    assert result.generation_id == b"1"  # the existing record's generation
    assert raw_state(store) == before
    assert coll.get(b"a", generation_id=b"3").value == b"1"


def test_if_not_present_on_absent_and_tombstoned_keys_writes(coll) -> None:
    r1 = coll.put(b"new", b"n", generation_id=b"3", if_not_present=True)
    r2 = coll.put(b"dead", b"alive", generation_id=b"3", if_not_present=True)
    assert (r1.was_put, r1.generation_id) == (True, b"3")
    assert (r2.was_put, r2.generation_id) == (True, b"3")
    assert coll.get(b"dead", generation_id=b"3").value == b"alive"


def test_if_not_present_sees_uncommitted_writes_of_same_generation(coll) -> None:
    coll.put(b"k", b"first", generation_id=b"3")
    result = coll.put(b"k", b"second", generation_id=b"3", if_not_present=True)
    assert result.was_put is False
    assert result.generation_id == b"3"
    assert coll.get(b"k", generation_id=b"3").value == b"first"


def test_if_not_present_per_item_in_put_many(coll) -> None:
    coll.put_many([(b"a", b"no", True), (b"b", b"yes", True), (b"c", b"plain", False)], generation_id=b"3")
    coll.put_many([(b"c", b"no"), (b"d", b"yes")], generation_id=b"3", if_not_present=True)
    coll.commit_generation(b"3")
    assert as_dict(coll) == {b"a": b"1", b"b": b"yes", b"c": b"plain", b"d": b"yes"}


def test_put_many_last_item_wins(coll) -> None:
    coll.put_many([(b"k", b"1"), (b"k", b"2"), (b"j", b"x"), (b"k", b"3"), (b"j", None)], generation_id=b"3")
    coll.commit_generation(b"3")
    assert as_dict(coll) == {b"a": b"1", b"k": b"3"}
    assert [(i.key, i.intermediate) for i in coll.diff(b"2", include_intermediate=True)] == [(b"k", ())]


def test_put_many_last_wins_ignores_earlier_if_not_present(coll) -> None:
    # the earlier ifNotPresent item is ignored entirely: the last, unconditional one applies
    coll.put_many([(b"a", b"cond", True), (b"a", b"forced", False)], generation_id=b"3")
    # and an earlier unconditional item does not make a later ifNotPresent one see a value
    coll.put_many([(b"z", b"early", False), (b"z", b"late", True)], generation_id=b"3")
    assert coll.get(b"a", generation_id=b"3").value == b"forced"
    assert coll.get(b"z", generation_id=b"3").value == b"late"


def test_tombstone_hides_key_and_empty_value_is_a_value(coll) -> None:
    coll.put_many([(b"a", None), (b"empty", b"")], generation_id=b"3")
    coll.commit_generation(b"3")
    assert coll.get(b"a") is None
    assert coll.get(b"a", generation_id=b"2").value == b"1"
    assert coll.get(b"empty").value == b""
    assert as_dict(coll) == {b"empty": b""}
    # a tombstone of an absent key is fine and shows in no diff
    assert {i.key for i in coll.diff(b"2")} == {b"a", b"empty"}


def test_tombstone_of_absent_key_is_not_a_diff_item(coll) -> None:
    coll.put(b"never", None, generation_id=b"3")
    coll.commit_generation(b"3")
    assert list(coll.diff(b"2")) == []
    assert coll.get(b"never") is None


def test_skip_unchanged_skips_equal_values(store: Store, coll) -> None:
    before = raw_state(store)
    result = coll.put(b"a", b"1", generation_id=b"3", skip_unchanged=True)
    assert result.was_put is False
    coll.put_many([(b"a", b"1"), (b"dead", None), (b"never", None)], generation_id=b"3", skip_unchanged=True)
    assert raw_state(store) == before  # equal values, tombstone over absent: nothing written
    coll.put_many([(b"a", b"2"), (b"dead", b"y")], generation_id=b"3", skip_unchanged=True)
    coll.commit_generation(b"3")
    assert as_dict(coll) == {b"a": b"2", b"dead": b"y"}


def test_skip_unchanged_compares_with_uncommitted_value(coll) -> None:
    coll.put(b"a", b"9", generation_id=b"3")
    coll.put(b"a", b"1", generation_id=b"3", skip_unchanged=True)  # differs from visible "9": written
    assert coll.get(b"a", generation_id=b"3").value == b"1"


def test_without_skip_unchanged_equal_value_is_written_but_not_in_diff(coll) -> None:
    coll.put(b"a", b"1", generation_id=b"3")
    coll.commit_generation(b"3")
    assert list(coll.diff(b"2")) == []
    assert coll.get(b"a").generation_id == b"3"


@pytest.mark.parametrize(
    "bad",
    [
        {"items": [("k", b"v")]},  # key not bytes
        {"items": [(b"k", "v")]},  # value not bytes
        {"items": [(b"x" * (1 << 24), b"v")]},  # key too long
    ],
)
def test_bad_items_are_invalid_and_change_nothing(store: Store, coll, bad) -> None:
    before = raw_state(store)
    with pytest.raises(InvalidRequest):
        coll.put_many([(b"ok", b"1"), *bad["items"]], generation_id=b"3")
    assert raw_state(store) == before


# --- producer dedup ------------------------------------------------------------------------------


def test_producer_seq_no_dedup_with_gaps(store: Store, coll) -> None:
    assert coll.producer_last_seq_no("p") == 0
    for seq in (1, 2, 3, 10, 20):
        result = coll.put(b"k%d" % seq, b"v", generation_id=b"3", producer_id="p", seq_no=seq)
        assert result.skipped is False
        assert coll.producer_last_seq_no("p") == seq
    before = raw_state(store)
    for seq in (19, 20, 1):
        result = coll.put(b"late%d" % seq, b"v", generation_id=b"3", producer_id="p", seq_no=seq)
        assert result.skipped is True
        assert result.was_put is False
        result = coll.put_many([(b"late", b"v")], generation_id=b"3", producer_id="p", seq_no=seq)
        assert result.skipped is True
    assert raw_state(store) == before
    assert coll.put(b"k21", b"v", generation_id=b"3", producer_id="p", seq_no=21).skipped is False
    assert coll.producer_last_seq_no("p") == 21
    coll.commit_generation(b"3")
    assert {k for k in as_dict(coll) if k.startswith(b"k")} == {b"k1", b"k2", b"k3", b"k10", b"k20", b"k21"}


def test_producers_are_independent_per_producer_and_collection(store: Store, coll) -> None:
    other = store.create_collection("o", manual=False)
    coll.put(b"a", b"v", generation_id=b"3", producer_id="p", seq_no=5)
    assert coll.put(b"b", b"v", generation_id=b"3", producer_id="q", seq_no=1).skipped is False
    assert other.put(b"b", b"v", producer_id="p", seq_no=1).skipped is False
    assert coll.producer_last_seq_no("p") == 5
    assert coll.producer_last_seq_no("q") == 1
    assert other.producer_last_seq_no("p") == 1


def test_producer_seq_no_survives_reopen(open_store) -> None:
    store = open_store()
    c = store.create_collection("n", manual=False)
    c.put(b"a", b"v", producer_id="p", seq_no=7)
    store.close()
    c = open_store().collection("n")
    assert c.producer_last_seq_no("p") == 7
    assert c.put(b"a", b"w", producer_id="p", seq_no=7).skipped is True


@pytest.mark.parametrize(
    ("producer_id", "seq_no"),
    [("p", None), (None, 1), ("p", 0), ("p", -1), ("", 1), ("x" * 256, 1), ("p", True)],
)
def test_bad_producer_arguments_are_invalid(store: Store, coll, producer_id, seq_no) -> None:
    before = raw_state(store)
    with pytest.raises(InvalidRequest):
        coll.put(b"k", b"v", generation_id=b"3", producer_id=producer_id, seq_no=seq_no)
    assert raw_state(store) == before


def test_producer_seq_no_not_stored_when_put_is_rejected(coll) -> None:
    with pytest.raises(GenerationMismatch):
        coll.put(b"k", b"v", generation_id=b"9", producer_id="p", seq_no=4)
    assert coll.producer_last_seq_no("p") == 0
    assert coll.put(b"k", b"v", generation_id=b"3", producer_id="p", seq_no=4).skipped is False


def test_producer_seq_no_of_aborted_generation_can_be_retried(coll) -> None:
    coll.put(b"k", b"v", generation_id=b"3", producer_id="p", seq_no=1)
    coll.abort_generation(b"3")
    coll.start_generation(b"4")
    result = coll.put(b"k", b"v", generation_id=b"4", producer_id="p", seq_no=1)
    assert result.skipped is False, "the retried write of an aborted generation was dropped as a duplicate"
    coll.commit_generation(b"4")
    assert coll.get(b"k").value == b"v"


# --- sorted batches: LMDB's append mode where the rows go past a table's end, plain puts elsewhere -----


def _rows_of(store: Store, name: str) -> list[tuple[bytes, bytes]]:
    prefix = store.collection(name)._meta().records_prefix
    return [(k, v) for k, v in raw_state(store)["records"] if k.startswith(prefix)]


def test_sorted_batches_past_and_before_the_tables_end_keep_every_row(store: Store) -> None:
    older = store.create_collection("older", manual=True)
    newest = store.create_collection("newest", manual=True)
    older.start_generation(b"1")
    newest.start_generation(b"1")
    batches = [
        [(b"k%03d" % i, b"v%d" % i) for i in range(10, 20)],  # past the end of empty tables
        [(b"k%03d" % i, b"w%d" % i) for i in range(20, 30)],  # past the end again
        [(b"k%03d" % i, b"x%d" % i) for i in range(0, 25, 2)],  # sorted, but starts below the end
        [(b"k%03d" % i, None) for i in range(25, 40)],  # sorted tombstones, overlapping the last batch
    ]
    model: dict[bytes, bytes | None] = {}
    for batch in batches:
        newest.put_many(batch, generation_id=b"1")
        older.put_many(batch, generation_id=b"1")  # a sorted batch into a collection not at the end
        model.update(batch)
    newest.commit_generation(b"1")
    older.commit_generation(b"1")
    visible = {k: v for k, v in sorted(model.items()) if v is not None}
    for coll in (newest, older):
        assert as_dict(coll) == visible
        assert [(i.key, i.to_value) for i in coll.diff()] == list(visible.items())
        assert coll._meta().generation == b"1"
    assert len(_rows_of(store, "newest")) == len(_rows_of(store, "older")) == len(model)


def test_unsorted_batch_after_sorted_ones_is_written_whole(store: Store) -> None:
    c = store.create_collection("m", manual=True)
    commit(c, b"1", [(b"k%03d" % i, b"1") for i in range(50)])
    c.start_generation(b"2")
    c.put_many([(b"k%03d" % i, b"2") for i in range(50, 60)], generation_id=b"2")
    c.put_many([(b"k070", b"3"), (b"k065", b"3"), (b"k080", b"3"), (b"k001", b"3")], generation_id=b"2")
    c.commit_generation(b"2")
    expected = {b"k%03d" % i: b"1" for i in range(50)} | {b"k%03d" % i: b"2" for i in range(50, 60)}
    expected |= {b"k070": b"3", b"k065": b"3", b"k080": b"3", b"k001": b"3"}
    assert as_dict(c) == dict(sorted(expected.items()))
    assert [i.key for i in c.diff(b"1")] == sorted(k for k in expected if k >= b"k050" or k == b"k001")
