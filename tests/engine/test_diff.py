"""SPEC §3: diffs, intermediate values, key ranges, cursor tokens, range capping, keys_around, splits,
and long keys (beyond LMDB's key size) in true bytewise order everywhere."""

from __future__ import annotations

from unittest import mock

import hypothesis.strategies as st
import pytest
from hypothesis import HealthCheck, given, settings

from diffstore import DiffItem, Store, StoreConfig
from diffstore.engine import layout
from diffstore.engine.reads import even_cuts, even_form_cuts
from diffstore.errors import GenerationCollected, InvalidRequest, NoSuchCursor, NoSuchGeneration

from .util import as_dict, commit, raw_state, run_background


def triples(items):
    return [(i.key, i.from_value, i.to_value) for i in items]


@pytest.fixture
def coll(store: Store):
    c = store.create_collection("m", manual=True)
    commit(c, b"1", [(b"a", b"a1"), (b"b", b"b1"), (b"c", b"c1"), (b"same", b"s")])
    commit(c, b"2", [(b"a", b"a2"), (b"b", None), (b"d", b"d2"), (b"same", b"s")])
    commit(c, b"3", [(b"a", b"a3"), (b"b", b"b3"), (b"d", None), (b"e", b"e3")])
    commit(c, b"4", [(b"a", b"a1"), (b"c", b"c4")])
    return c


def test_diff_values_at_both_ends(coll) -> None:
    assert triples(coll.diff(b"1", b"3")) == [
        (b"a", b"a1", b"a3"),
        (b"b", b"b1", b"b3"),
        (b"e", None, b"e3"),
    ]  # d: absent -> d2 -> absent, left out; same: written with an equal value, left out


@pytest.mark.parametrize("compiled", [True, False], ids=["compiled", "python"])
def test_a_scan_that_goes_sparse_at_the_collections_end_names_each_change_once(
    store: Store, compiled: bool
) -> None:
    """The scan hands over to the keyed way after 8 unchanged keys in a row; when the ninth is its
    collection's last, the row that counts it is the next collection's first: the scan ends there (it
    handed that row's form over, and the keyed way named the changed keys from there again)."""
    if compiled and layout.ACCEL is None:
        pytest.skip("the compiled accelerator was not built")
    keys = [b"a", *(b"k%d" % i for i in range(9))]  # a, then exactly nine unchanged keys
    coll = store.create_collection("m", manual=True)
    commit(coll, b"1", [(k, b"1") for k in keys])
    commit(coll, b"2", [(b"a", b"2")])
    after = store.create_collection("n", manual=True)  # its records follow m's: first key a, as m's
    commit(after, b"1", [(b"a", b"x"), (b"b", b"x")])
    with mock.patch.object(layout, "ACCEL", layout.ACCEL if compiled else None):
        assert triples(coll.diff(b"1", b"2")) == [(b"a", b"1", b"2")]
        assert triples(coll.diff(b"", b"2")) == [(k, None, b"2" if k == b"a" else b"1") for k in keys]


def test_diff_omits_keys_back_to_their_start_value(coll) -> None:
    assert [i.key for i in coll.diff(b"1", b"4")] == [b"b", b"c", b"e"]  # a went a1 -> ... -> a1


def test_diff_from_beginning(coll) -> None:
    full = triples(coll.diff())
    assert full == triples(coll.diff(b""))
    assert full == [
        (b"a", None, b"a1"),
        (b"b", None, b"b3"),
        (b"c", None, b"c4"),
        (b"e", None, b"e3"),
        (b"same", None, b"s"),
    ]
    at_1 = as_dict(coll, generation_id=b"1")
    assert triples(coll.diff(b"", b"1")) == [(k, None, v) for k, v in at_1.items()]


def test_diff_intermediate_values(coll) -> None:
    items = {i.key: i for i in coll.diff(b"", include_intermediate=True)}
    assert items[b"a"].intermediate == (b"a1", b"a2", b"a3")
    assert items[b"b"].intermediate == (b"b1", None)
    assert items[b"c"].intermediate == (b"c1",)
    assert items[b"e"].intermediate == ()
    assert all(i.intermediate == () for i in coll.diff(b""))  # omitted unless asked for
    assert coll.diff_page(b"1", include_intermediate=True).items[0] == DiffItem(b"b", b"b1", b"b3", (None,))


def test_diff_default_to_is_current_not_open_generation(coll) -> None:
    coll.start_generation(b"5")
    coll.put(b"z", b"z5", generation_id=b"5")
    page = coll.diff_page(b"3")
    assert page.to_generation_id == b"4"
    assert [i.key for i in page.items] == [b"a", b"c"]
    assert list(coll.diff(b"4")) == []


def test_diff_to_above_current_is_refused(store: Store, coll) -> None:
    coll.start_generation(b"5")
    before = raw_state(store)
    # any generation above the current one but the open one: no such (SPEC §8); the open one is allowed
    # (its pending changes: tests/engine/test_diff_open.py)
    assert list(coll.diff(b"4", b"5")) == [] and triples(coll.diff(b"1", b"5")) == triples(
        coll.diff(b"1", b"4")
    )
    for to, error in ((b"41", NoSuchGeneration), (b"9", NoSuchGeneration)):
        with pytest.raises(error):
            coll.diff_page(b"1", to)
        with pytest.raises(error):
            list(coll.diff(b"1", to))
    assert raw_state(store) == before


def test_diff_between_non_generation_ids(coll) -> None:
    # "15" reads as 1, "35" as 3
    assert triples(coll.diff(b"15", b"35")) == triples(coll.diff(b"1", b"3"))
    assert coll.diff_page(b"15", b"35").to_generation_id == b"35"


def test_diff_of_empty_range(coll) -> None:
    assert list(coll.diff(b"4", b"4")) == []
    page = coll.diff_page(b"3", b"3")
    assert (page.from_generation_id, page.to_generation_id, page.items, page.cursor) == (b"3", b"3", [], None)


def test_diff_and_query_key_ranges(coll) -> None:
    assert [i.key for i in coll.diff(b"", from_key=b"b", to_key=b"e")] == [b"b", b"c"]
    assert [i.key for i in coll.diff(b"", from_key=b"bb")] == [b"c", b"e", b"same"]
    assert [i.key for i in coll.diff(b"", to_key=b"b")] == [b"a"]
    assert [i.key for i in coll.diff_page(b"", from_key=b"b", to_key=b"e", limit=1).items] == [b"b"]
    assert [r.key for r in coll.query(from_key=b"b", to_key=b"e")] == [b"b", b"c"]
    assert [r.key for r in coll.query(from_key=b"c\x00")] == [b"e", b"same"]
    assert [r.key for r in coll.query(to_key=b"a")] == []
    assert [r.key for r in coll.query_page(from_key=b"a", to_key=b"c", limit=10).items] == [b"a", b"b"]


def _all_diff_pages(coll, **kwargs):
    page = coll.diff_page(**kwargs)
    pages = [page]
    while page.cursor is not None:
        page = coll.diff_page(cursor=page.cursor)
        pages.append(page)
    return pages


def test_diff_paging_and_cursor_tokens(coll) -> None:
    pages = _all_diff_pages(coll, from_generation_id=b"", limit=2, include_intermediate=True)
    assert [len(p.items) for p in pages] == [2, 2, 1]
    assert [p.cursor is None for p in pages] == [False, False, True]
    assert [i for p in pages for i in p.items] == list(coll.diff(b"", include_intermediate=True))
    assert all((p.from_generation_id, p.to_generation_id) == (b"", b"4") for p in pages)
    token = pages[0].cursor
    assert isinstance(token, str) and token.replace("-", "").replace("_", "").isalnum()
    assert coll.diff_page(cursor=token) == coll.diff_page(cursor=token) == pages[1]
    # an exactly full last page has no cursor
    assert coll.diff_page(b"", limit=5).cursor is None


def test_cursor_pins_its_range_across_commits(coll) -> None:
    page = coll.diff_page(b"", limit=2)
    qpage = coll.query_page(limit=2)
    commit(coll, b"5", [(b"a", b"a5"), (b"zz", b"new")])
    rest = coll.diff_page(cursor=page.cursor)
    assert rest.to_generation_id == b"4"
    assert [i.key for i in rest.items] == [b"c", b"e"]
    qrest = coll.query_page(cursor=qpage.cursor)
    assert qrest.generation_id == b"4"
    assert b"zz" not in [r.key for r in qrest.items]


def test_cursor_tokens_survive_reopen(open_store) -> None:
    store = open_store()
    c = store.create_collection("m", manual=True)
    commit(c, b"1", [(b"k%d" % i, b"v") for i in range(5)])
    dpage = c.diff_page(b"", limit=2)
    qpage = c.query_page(limit=3)
    expected_d = c.diff_page(cursor=dpage.cursor)
    expected_q = c.query_page(cursor=qpage.cursor)
    store.close()
    c = open_store().collection("m")
    assert c.diff_page(cursor=dpage.cursor) == expected_d
    assert c.query_page(cursor=qpage.cursor) == expected_q


def test_bad_cursor_tokens_are_no_such_cursor(store: Store, coll) -> None:
    dtoken = coll.diff_page(b"", limit=1).cursor
    qtoken = coll.query_page(limit=1).cursor
    assert dtoken and qtoken
    other = store.create_collection("o", manual=True)
    commit(other, b"1", [(b"x", b"1"), (b"y", b"1")])
    bad = ["", "garbage", "!!!", dtoken[:-2], dtoken[:-1] + ("A" if dtoken[-1] != "A" else "B"), qtoken + "x"]
    for token in bad:
        with pytest.raises(NoSuchCursor) as info:
            coll.diff_page(cursor=token)
        assert info.value.code == "noSuchCursor"
        with pytest.raises(NoSuchCursor):
            coll.query_page(cursor=token)
    with pytest.raises(NoSuchCursor):
        coll.diff_page(cursor=qtoken)  # a query token is not a diff token
    with pytest.raises(NoSuchCursor):
        coll.query_page(cursor=dtoken)
    with pytest.raises(NoSuchCursor):
        other.diff_page(cursor=dtoken)  # another collection's token
    with pytest.raises(NoSuchCursor):
        other.query_page(cursor=qtoken)


def test_cursor_of_deleted_and_recreated_collection_is_no_such_cursor(store: Store, coll) -> None:
    dtoken = coll.diff_page(b"", limit=1).cursor
    qtoken = coll.query_page(limit=1).cursor
    store.delete_collection("m")
    again = store.create_collection("m", manual=True)
    commit(again, b"4", [(b"a", b"x"), (b"b", b"y"), (b"c", b"z")])
    with pytest.raises(NoSuchCursor):
        again.diff_page(cursor=dtoken)
    with pytest.raises(NoSuchCursor):
        again.query_page(cursor=qtoken)


@pytest.mark.parametrize("limit", [0, -1, 10_001, True])
def test_bad_page_limit_is_invalid(coll, limit) -> None:
    with pytest.raises(InvalidRequest):
        coll.diff_page(b"", limit=limit)
    with pytest.raises(InvalidRequest):
        coll.query_page(limit=limit)


def test_default_page_limit(open_store) -> None:
    store = open_store(default_page_limit=3, max_page_limit=4)
    c = store.create_collection("m", manual=True)
    commit(c, b"1", [(b"k%d" % i, b"v") for i in range(7)])
    assert len(c.query_page().items) == 3
    assert len(c.diff_page(b"").items) == 3
    with pytest.raises(InvalidRequest):
        c.query_page(limit=5)


def test_query_iterator_with_small_max_page_limit(open_store) -> None:
    store = open_store(default_page_limit=3, max_page_limit=4)
    c = store.create_collection("m", manual=True)
    commit(c, b"1", [(b"k%d" % i, b"v") for i in range(7)])
    assert len(list(c.query())) == 7


def test_huge_range_is_capped_and_repeating_covers_everything(open_store) -> None:
    store = open_store(max_diff_generations=3)
    c = store.create_collection("m", manual=True)
    c.start_generation(b"00")
    c.abort_generation(b"00")  # an aborted generation takes no part in counting
    for g in range(1, 11):
        commit(c, b"%02d" % g, [(b"k%d" % (g % 4), b"%d" % g), (b"g%02d" % g, b"x")])
    full = triples(c.diff(b""))  # the iterator is never capped
    assert len(full) == 14
    current, seen_to = b"", []
    final: dict[bytes, bytes | None] = {}
    while True:
        pages = _all_diff_pages(c, from_generation_id=current, limit=2)
        to = pages[0].to_generation_id
        assert all(p.to_generation_id == to for p in pages)
        if to == current:
            break
        seen_to.append(to)
        for page in pages:
            for item in page.items:
                final[item.key] = item.to_value
        current = to
    assert seen_to == [b"03", b"06", b"09", b"10"]
    assert final == {k: v for k, _, v in full}
    assert triples(c.diff_page(b"05", limit=100).items) == triples(c.diff(b"05", b"08"))


# --- keys_around and splits ------------------------------------------------------------------------


@pytest.fixture
def keys_coll(store: Store):
    c = store.create_collection("k", manual=True)
    commit(c, b"1", [(b"k%02d" % i, b"v") for i in range(0, 20, 2)] + [(b"k04", None)])
    return c


def test_keys_around_existing_key(keys_coll) -> None:
    around = keys_coll.keys_around(b"k10", 3)
    assert around.found_key is True
    assert around.left == [b"k08", b"k06", b"k02"]  # descending; k04 is gone
    assert around.right == [b"k12", b"k14", b"k16"]
    assert (around.has_more_on_the_left, around.has_more_on_the_right) == (True, True)
    edge = keys_coll.keys_around(b"k02", 10)
    assert (edge.left, edge.has_more_on_the_left) == ([b"k00"], False)
    assert (edge.right[-1], edge.has_more_on_the_right) == (b"k18", False)
    exact = keys_coll.keys_around(b"k06", 2)
    assert (exact.left, exact.has_more_on_the_left) == ([b"k02", b"k00"], False)


def test_keys_around_missing_key(keys_coll) -> None:
    required = keys_coll.keys_around(b"k05", 2)
    assert (required.found_key, required.left, required.right) == (False, [], [])
    free = keys_coll.keys_around(b"k05", 2, require_key_existence=False)
    assert (free.found_key, free.left, free.right) == (False, [b"k02", b"k00"], [b"k06", b"k08"])
    assert (free.has_more_on_the_left, free.has_more_on_the_right) == (False, True)
    beyond = keys_coll.keys_around(b"z", 1, require_key_existence=False)
    assert (beyond.left, beyond.right, beyond.has_more_on_the_left) == ([b"k18"], [], True)
    deleted = keys_coll.keys_around(b"k04", 1)
    assert deleted.found_key is False


@pytest.mark.parametrize("limit", [0, 1001, -3])
def test_keys_around_bad_limit(keys_coll, limit) -> None:
    with pytest.raises(InvalidRequest):
        keys_coll.keys_around(b"k02", limit)


SPLIT_KEYS = [b"key%05d" % i for i in range(1000)]


@pytest.fixture
def split_coll(store: Store):
    c = store.create_collection("s", manual=True)
    commit(c, b"1", [(k, b"v") for k in SPLIT_KEYS])
    return c


def test_splits_are_ascending_existing_keys(split_coll) -> None:
    assert split_coll.splits(3, generation_id=b"1") == split_coll.splits(3)
    for count in (3, 5, 16, 100, 1024):
        cuts = split_coll.splits(count)
        assert cuts == sorted(set(cuts))
        assert 1 <= len(cuts) <= count - 1
        assert set(cuts) <= set(SPLIT_KEYS)


@pytest.mark.parametrize("count", [2, 4, 7, 16])
def test_splits_cut_into_near_equal_ranges(split_coll, count: int) -> None:
    cuts = split_coll.splits(count)
    assert len(cuts) == count - 1
    bounds = [0, *(SPLIT_KEYS.index(k) for k in cuts), len(SPLIT_KEYS)]
    sizes = [b - a for a, b in zip(bounds, bounds[1:], strict=False)]
    assert max(sizes) <= 2 * min(sizes), sizes


def test_splits_follow_the_generation_asked_and_the_open_one_as_it_grows(split_coll) -> None:
    before = split_coll.splits(4)
    assert split_coll.splits(4) == before  # asked again (answered from the per-store cache)
    split_coll.start_generation(b"2")
    split_coll.put_many([(b"a%05d" % i, b"v") for i in range(3000)], generation_id=b"2")
    grown = split_coll.splits(4, generation_id=b"2")  # the open generation: recomputed
    assert grown != before and grown[0].startswith(b"a")
    split_coll.put_many([(b"z%05d" % i, b"v") for i in range(6000)], generation_id=b"2")
    assert split_coll.splits(4, generation_id=b"2") != grown  # still growing: not cached
    assert split_coll.splits(4, generation_id=b"1") == before
    split_coll.commit_generation(b"2")
    committed = split_coll.splits(4)
    assert committed == split_coll.splits(4, generation_id=b"2") and committed != before
    assert split_coll.splits(4, generation_id=b"1") == before


def test_splits_of_tiny_collection_and_bad_count(store: Store) -> None:
    c = store.create_collection("s", manual=True)
    assert c.splits(4) == []
    for count in (0, 1, 1025, True):
        with pytest.raises(InvalidRequest):
            c.splits(count)


def test_splits_of_a_diff_cut_its_changed_keys_into_near_equal_ranges(split_coll) -> None:
    """With ``from_generation_id`` the cuts are of the keys changed in (from, to], not of the collection: a
    few changes spread over it are cut evenly, as parallel readers of that diff need."""
    changed = SPLIT_KEYS[::10] + [b"zz%03d" % i for i in range(100)]  # 100 spread, 100 new at the end
    commit(split_coll, b"2", [(k, b"w") for k in changed])
    commit(split_coll, b"3", [(b"other", b"v")])  # after the range: not cut
    for count in (2, 4, 7):
        cuts = split_coll.splits(count, generation_id=b"2", from_generation_id=b"1")
        assert len(cuts) == count - 1 and set(cuts) <= set(changed)
        bounds = [0, *(changed.index(k) for k in cuts), len(changed)]
        sizes = [b - a for a, b in zip(bounds, bounds[1:], strict=False)]
        assert max(sizes) <= 2 * min(sizes), sizes
    # the visible keys' cuts of the same generation fall elsewhere: 1,100 keys, the new ones a tenth
    assert split_coll.splits(2, generation_id=b"2") != split_coll.splits(2, b"2", from_generation_id=b"1")
    assert split_coll.splits(2, from_generation_id=b"2") == []  # (2, 3]: one changed key
    whole = split_coll.splits(3, from_generation_id=b"1")  # to: the current one
    assert whole == split_coll.splits(3, b"3", from_generation_id=b"1")
    assert split_coll.splits(3, b"3", from_generation_id=b"") == split_coll.splits(3, b"3")  # since the start
    assert split_coll.splits(4, b"1", from_generation_id=b"1") == []  # an empty range


LONG_PREFIX = b"p" * layout.LONG_KEY_PREFIX


@settings(max_examples=300, deadline=None)
@given(
    keys=st.sets(
        st.binary(max_size=4) | st.builds(lambda tail: LONG_PREFIX + tail, st.binary(min_size=1, max_size=3)),
        max_size=120,
    ),
    count=st.integers(2, 40),
)
def test_cutting_forms_picks_the_keys_cutting_their_keys_picks(keys: set[bytes], count: int) -> None:
    """A diff's cuts come from its key forms, only the picked ones turned into keys (long keys of one group
    share a prefix: its forms sort by hash, and all cut at that prefix)."""
    forms = sorted(layout.key_form(key) for key in keys)
    assert even_form_cuts(iter(forms), count) == even_cuts(map(layout.cut_key_of_form, forms), count)


def test_splits_of_a_diff_refuse_what_the_diff_refuses(store: Store) -> None:
    c = store.create_collection("s", manual=True)
    for g in (b"1", b"2", b"3"):
        commit(c, g, [(b"k", g)])
    with pytest.raises(InvalidRequest):
        c.splits(4, b"1", from_generation_id=b"2")  # from above to
    with pytest.raises(NoSuchGeneration):
        c.splits(4, b"9", from_generation_id=b"1")
    for count in (0, 1, 1025):
        with pytest.raises(InvalidRequest):
            c.splits(count, from_generation_id=b"1")
    c.create_reader("self", generation_id=b"3")
    run_background(store)
    with pytest.raises(GenerationCollected):
        c.splits(4, from_generation_id=b"1")


def test_splits_of_a_diff_cut_long_keys_at_their_shared_prefix(store: Store) -> None:
    c = store.create_collection("s", manual=True)
    long_keys = [b"m" * 200 + b"%03d" % i for i in range(50)]  # one group: the same 200-byte prefix
    commit(c, b"1", [])
    shorts = [b"a%03d" % i for i in range(25)] + [b"z%03d" % i for i in range(25)]
    commit(c, b"2", [(k, b"v") for k in shorts + long_keys])
    cuts = c.splits(2, b"2", from_generation_id=b"1")
    assert cuts == [b"m" * 200]  # the middle falls in the group: cut below all of it, at its prefix
    bounds = [None, *cuts, None]
    seen = [
        item.key
        for i in range(len(bounds) - 1)
        for item in c.diff(b"1", b"2", from_key=bounds[i], to_key=bounds[i + 1])
    ]
    assert sorted(seen) == seen and len(seen) == 100  # every changed key in exactly one range


# --- long keys -------------------------------------------------------------------------------------

P = b"L" * 200
LONG_KEYS = [
    P[:199],
    P[:199] + b"\x00",
    P,
    P + b"\x00",
    P + b"\x00\x00",
    P + b"\x00\x01",
    P + b"\x00\xff",
    P + b"a",
    P + b"a" * 300,
    P + b"b",
    P + b"\xff",
    P + b"\xff" * 5,
    P[:199] + b"M",
    P[:199] + b"M" + b"x" * 50,
    P[:150] + b"\x00" + b"q" * 100,
    P[:150] + b"\x00",
    b"",
    b"\x00",
    b"K",
    b"M",
    b"L" * 201 + b"z" * 1000,
]


@pytest.fixture
def long_coll(store: Store):
    c = store.create_collection("long", manual=True)
    commit(c, b"1", [(k, b"v1:" + k[-3:]) for k in LONG_KEYS[::2]])
    commit(c, b"2", [(k, b"v2:" + k[-3:]) for k in LONG_KEYS[1::2]] + [(LONG_KEYS[2], None)])
    return c


def test_long_keys_round_trip_and_sort_bytewise(long_coll) -> None:
    visible = sorted(k for k in LONG_KEYS if k != LONG_KEYS[2])
    assert [r.key for r in long_coll.query()] == visible
    for k in LONG_KEYS:
        record = long_coll.get(k)
        assert (record is None) == (k == LONG_KEYS[2])
        if record:
            assert record.key == k
    assert [i.key for i in long_coll.diff(b"")] == visible
    assert [i.key for i in long_coll.diff(b"1")] == sorted(LONG_KEYS[1::2] + [LONG_KEYS[2]])
    for limit in (1, 2, 3):
        keys, page = [], long_coll.query_page(limit=limit)
        keys += [r.key for r in page.items]
        while page.cursor:
            page = long_coll.query_page(cursor=page.cursor)
            keys += [r.key for r in page.items]
        assert keys == visible
        pages = _all_diff_pages(long_coll, from_generation_id=b"", limit=limit)
        dkeys = [i.key for p in pages for i in p.items]
        assert dkeys == visible


def test_long_keys_in_ranges_and_keys_around(long_coll) -> None:
    visible = sorted(k for k in LONG_KEYS if k != LONG_KEYS[2])
    ranges = [(P + b"\x00", P + b"b"), (P[:199], P + b"a" * 301), (b"K", P + b"\x00\x00"), (P + b"a", None)]
    for lo, hi in ranges:
        expected = [k for k in visible if k >= lo and (hi is None or k < hi)]
        assert [r.key for r in long_coll.query(from_key=lo, to_key=hi)] == expected, (lo[-3:], hi and hi[-3:])
        assert [i.key for i in long_coll.diff(b"", from_key=lo, to_key=hi)] == expected
    for i, key in enumerate(visible):
        around = long_coll.keys_around(key, 3)
        assert around.found_key
        assert around.left == visible[max(0, i - 3) : i][::-1]
        assert around.right == visible[i + 1 : i + 4]
    free = long_coll.keys_around(P + b"\x00\x00\x00", 2, require_key_existence=False)
    i = visible.index(P + b"\x00\x01")
    assert (free.left, free.right) == (visible[i - 2 : i][::-1], visible[i : i + 2])


def test_long_keys_with_phantom_overlay(long_coll) -> None:
    p = long_coll.start_phantom()
    long_coll.put_many([(P + b"a", None), (P + b"ab", b"ph"), (P, b"back")], generation_id=b"2", phantom_id=p)
    visible = sorted({k for k in LONG_KEYS if k != P + b"a"} | {P + b"ab"})
    assert [r.key for r in long_coll.query(phantom_id=p)] == visible
    assert long_coll.get(P, phantom_id=p).value == b"back"  # type: ignore[union-attr]
    around = long_coll.keys_around(P + b"ab", 1, phantom_id=p)
    assert (around.left, around.right) == ([P + b"a" * 300], [P + b"b"])


def test_maximum_key_length(store: Store) -> None:
    c = store.create_collection("big", manual=True)
    huge = b"h" * ((1 << 24) - 1)
    other = b"h" * ((1 << 24) - 2) + b"g"
    commit(c, b"1", [(huge, b"v"), (other, b"w"), (b"h", b"short")])
    assert c.get(huge).value == b"v"  # type: ignore[union-attr]
    assert [len(r.key) for r in c.query()] == [1, len(other), len(huge)]
    assert [i.key for i in c.diff(b"")] == [b"h", other, huge]
    assert c.keys_around(huge, 5).left == [other, b"h"]
    c.start_generation(b"2")
    with pytest.raises(InvalidRequest):
        c.put(huge + b"x", b"v", generation_id=b"2")


def test_default_page_limits_are_200_and_10000(store: Store) -> None:
    c = store.create_collection("big", manual=True)
    commit(c, b"1", [(b"k%05d" % i, b"v") for i in range(10_001)])
    assert len(c.query_page().items) == 200
    assert len(c.diff_page(b"").items) == 200
    full = c.query_page(limit=10_000)
    assert len(full.items) == 10_000 and full.cursor is not None
    assert [r.key for r in c.query_page(cursor=full.cursor).items] == [b"k10000"]
    assert len(c.diff_page(b"", limit=10_000).items) == 10_000
    with pytest.raises(InvalidRequest):
        c.diff_page(b"", limit=10_001)


# --- bytewise order of arbitrary keys (property) -----------------------------------------------------

_prefix = st.sampled_from(
    [b"", b"\x00", b"\xff", b"L" * 199, b"L" * 200, b"\x00" * 200, b"L" * 150 + b"\x00"]
)
_key = st.builds(lambda p, s: p + s, _prefix, st.binary(max_size=60))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    first=st.lists(_key, max_size=25, unique=True),
    second=st.lists(st.tuples(_key, st.sampled_from([b"v", None])), max_size=25),
    limit=st.integers(1, 7),
    probe=_key,
)
def test_any_keys_sort_bytewise_everywhere(tmp_path_factory, first, second, limit, probe) -> None:
    with Store.open(tmp_path_factory.mktemp("order"), config=StoreConfig(background=False)) as store:
        c = store.create_collection("o", manual=True)
        commit(c, b"1", [(k, b"1") for k in first])
        commit(c, b"2", second)
        model = {k: b"1" for k in first}
        for k, v in second:
            if v is None:
                model.pop(k, None)
            else:
                model[k] = v
        keys = sorted(model)
        assert [r.key for r in c.query()] == keys
        page, paged = c.query_page(limit=limit), []
        paged += [r.key for r in page.items]
        while page.cursor:
            page = c.query_page(cursor=page.cursor)
            paged += [r.key for r in page.items]
        assert paged == keys
        assert [r.key for r in c.query(from_key=probe)] == [k for k in keys if k >= probe]
        assert [r.key for r in c.query(to_key=probe)] == [k for k in keys if k < probe]
        at_1 = {k: b"1" for k in first}
        changed = sorted(k for k in {k for k, _ in second} if model.get(k) != at_1.get(k))
        assert [i.key for i in c.diff(b"1")] == changed
        assert [i.key for i in c.diff(b"")] == keys
        assert [i.key for i in c.diff(b"", from_key=probe)] == [k for k in keys if k >= probe]
        dpage = c.diff_page(b"", to_key=probe, limit=limit)
        dkeys = [i.key for i in dpage.items]
        while dpage.cursor:
            dpage = c.diff_page(cursor=dpage.cursor)
            dkeys += [i.key for i in dpage.items]
        assert dkeys == [k for k in keys if k < probe]
        around = c.keys_around(probe, limit, require_key_existence=False)
        assert around.left == [k for k in keys if k < probe][::-1][:limit]
        assert around.right == [k for k in keys if k > probe][:limit]
        assert around.found_key == (probe in model)


# --- diffs whose changes are dense in places and sparse in others (property) ------------------------
# The diff scans ``records`` where changed keys lie side by side and seeks them through the ``changes``
# index where they are far apart, switching as it goes; both ways must agree with the visible states.

_base_keys = [b"k%03d" % i for i in range(120)] + [b"k050\x00x", b"L" * 230 + b"a", b"L" * 230 + b"b"]
_write = st.tuples(
    st.sampled_from(_base_keys), st.sampled_from([b"v1", b"v2", b"", None])
)  # b"": an empty value, None: a tombstone


@st.composite
def _generation(draw: st.DrawFn) -> list[tuple[bytes, bytes | None]]:
    """A run of side-by-side keys (dense), then a few scattered ones (sparse)."""
    start = draw(st.integers(0, 119))
    length = draw(st.integers(0, 60))
    value = draw(st.sampled_from([b"r1", b"r2", b"", None]))
    run = [(b"k%03d" % i, value) for i in range(start, min(120, start + length))]
    return run + draw(st.lists(_write, max_size=12))


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    generations=st.lists(_generation(), min_size=1, max_size=4),
    ends=st.tuples(st.integers(0, 4), st.integers(0, 4)),
    bounds=st.tuples(st.sampled_from([None, *_base_keys]), st.sampled_from([None, *_base_keys])),
    limit=st.integers(1, 50),
)
def test_diff_over_dense_and_sparse_changes_matches_the_states(
    tmp_path_factory, generations, ends, bounds, limit
) -> None:
    with Store.open(tmp_path_factory.mktemp("dense"), config=StoreConfig(background=False)) as store:
        c = store.create_collection("d", manual=True)
        ids = [b""] + [b"%d" % (n + 1) for n in range(len(generations))]
        for gen, items in zip(ids[1:], generations, strict=True):
            commit(c, gen, items)
        lo, hi = sorted(min(e, len(generations)) for e in ends)
        from_gen, to_gen = ids[lo], ids[hi]
        at_from = as_dict(c, generation_id=from_gen) if from_gen else {}
        at_to = as_dict(c, generation_id=to_gen) if to_gen else {}
        from_key, to_key = bounds
        expected = [
            (k, at_from.get(k), at_to.get(k))
            for k in sorted(set(at_from) | set(at_to))
            if at_from.get(k) != at_to.get(k)
            and (from_key is None or k >= from_key)
            and (to_key is None or k < to_key)
        ]
        if not to_gen:
            return
        assert triples(c.diff(from_gen, to_gen, from_key=from_key, to_key=to_key)) == expected
        page = c.diff_page(from_gen, to_gen, from_key=from_key, to_key=to_key, limit=limit)
        paged = triples(page.items)
        while page.cursor:
            page = c.diff_page(cursor=page.cursor)
            paged += triples(page.items)
        assert paged == expected
