"""SPEC §1 Visibility: the one rule for get/query/keys_around, the open generation, and phantoms."""

from __future__ import annotations

import time

import pytest

from diffstore import Store
from diffstore.engine import background as background_module
from diffstore.engine import collection as collection_module
from diffstore.engine import visibility as visibility_module
from diffstore.errors import InvalidRequest, NoSuchGeneration
from tests.helpers import wait_until

from .util import as_dict, commit, raw_state, run_background


@pytest.fixture
def coll(store: Store):
    c = store.create_collection("m", manual=True)
    commit(c, b"1", [(b"a", b"a1"), (b"b", b"b1"), (b"c", b"c1")])
    commit(c, b"3", [(b"a", b"a3"), (b"b", None)])
    commit(c, b"5", [(b"b", b"b5"), (b"d", b"d5")])
    return c


@pytest.mark.parametrize(
    ("gen", "expected"),
    [
        (b"", {}),
        (b"0", {}),
        (b"1", {b"a": b"a1", b"b": b"b1", b"c": b"c1"}),
        (b"2", {b"a": b"a1", b"b": b"b1", b"c": b"c1"}),
        (b"3", {b"a": b"a3", b"c": b"c1"}),
        (b"30", {b"a": b"a3", b"c": b"c1"}),
        (b"4", {b"a": b"a3", b"c": b"c1"}),
        (b"5", {b"a": b"a3", b"b": b"b5", b"c": b"c1", b"d": b"d5"}),
    ],
)
def test_read_sees_greatest_generation_at_or_below(coll, gen: bytes, expected: dict) -> None:
    assert as_dict(coll, generation_id=gen) == expected
    for key in (b"a", b"b", b"c", b"d", b"zz"):
        record = coll.get(key, generation_id=gen)
        assert (record.value if record else None) == expected.get(key)
    around = coll.keys_around(b"c", 10, require_key_existence=False, generation_id=gen)
    assert around.left == sorted((k for k in expected if k < b"c"), reverse=True)
    assert around.right == sorted(k for k in expected if k > b"c")
    assert around.found_key == (b"c" in expected)


def test_a_read_above_the_current_generation_is_no_such_generation(coll) -> None:
    """SPEC §8 (it used to read the current generation's data)."""
    for read in (
        lambda: as_dict(coll, generation_id=b"9"),
        lambda: coll.get(b"a", generation_id=b"9"),
        lambda: coll.keys_around(b"c", 10, require_key_existence=False, generation_id=b"9"),
    ):
        with pytest.raises(NoSuchGeneration):
            read()


def test_default_read_is_current_generation(coll) -> None:
    assert as_dict(coll) == as_dict(coll, generation_id=b"5")
    assert coll.query_page().generation_id == b"5"


def test_get_reports_record_generation_or_read_generation(coll) -> None:
    result = coll.get_result(b"a", generation_id=b"4")
    assert result.generation_id == b"3"
    assert result.record.generation_id == b"3"  # type: ignore[union-attr]
    assert coll.get_result(b"b", generation_id=b"4").generation_id == b"4"  # tombstone: read's G
    assert coll.get_result(b"zz").generation_id == b"5"
    assert coll.get_result(b"c").record.generation_id == b"1"  # type: ignore[union-attr]
    assert [r.generation_id for r in coll.query()] == [b"3", b"5", b"1", b"5"]


def test_open_generation_visible_only_at_its_exact_id(coll) -> None:
    coll.start_generation(b"7")
    coll.put_many([(b"a", None), (b"e", b"e7")], generation_id=b"7")
    committed = {b"a": b"a3", b"b": b"b5", b"c": b"c1", b"d": b"d5"}
    own = {b"b": b"b5", b"c": b"c1", b"d": b"d5", b"e": b"e7"}
    for gen in (b"6", b"70", b"8", b"\xff"):  # above the current, not the open one (SPEC §8)
        with pytest.raises(NoSuchGeneration):
            coll.get(b"e", generation_id=gen)
    for gen in (None, b"5"):
        assert as_dict(coll, generation_id=gen) == committed, gen
        assert coll.get(b"e", generation_id=gen) is None
        assert coll.keys_around(b"e", 3, require_key_existence=False, generation_id=gen).left == [
            b"d",
            b"c",
            b"b",
        ]
    assert as_dict(coll, generation_id=b"7") == own
    assert coll.get(b"e", generation_id=b"7").generation_id == b"7"  # type: ignore[union-attr]
    assert coll.get(b"a", generation_id=b"7") is None
    around = coll.keys_around(b"e", 10, generation_id=b"7")
    assert (around.found_key, around.left, around.right) == (True, [b"d", b"c", b"b"], [])


def test_key_and_generation_validation(coll) -> None:
    with pytest.raises(InvalidRequest):
        coll.get(b"k", generation_id=b"x" * 256)
    with pytest.raises(InvalidRequest):
        coll.get(b"x" * (1 << 24))
    with pytest.raises(InvalidRequest):
        coll.query_page(limit=0)


# --- phantoms -------------------------------------------------------------------------------------


def test_phantom_records_visible_only_with_same_phantom(store: Store, coll) -> None:
    p1, p2 = coll.start_phantom(), coll.start_phantom()
    assert p1 != p2 and 1 <= len(p1) <= 255
    before = raw_state(store)
    coll.put_many([(b"p", b"mine"), (b"a", b"pa")], generation_id=b"5", phantom_id=p1)
    assert raw_state(store)["records"] == before["records"]  # no base record was written
    assert coll.next_generation_id is None and coll.generation_id == b"5"
    base = {b"a": b"a3", b"b": b"b5", b"c": b"c1", b"d": b"d5"}
    assert as_dict(coll) == base
    assert as_dict(coll, phantom_id=p2) == base
    assert as_dict(coll, phantom_id=p1) == {**base, b"p": b"mine", b"a": b"pa"}
    assert coll.get(b"p", phantom_id=p1).generation_id == b"5"  # type: ignore[union-attr]
    assert coll.get(b"p", phantom_id=p2) is None
    assert coll.keys_around(b"c", 5, phantom_id=p1).right == [b"d", b"p"]
    assert coll.keys_around(b"c", 5, phantom_id=p2).right == [b"d"]


def test_phantom_write_at_generation_is_seen_at_or_above_it(coll) -> None:
    p = coll.start_phantom()
    coll.put(b"x", b"x2", generation_id=b"2", phantom_id=p)  # a past generation
    coll.put(b"y", b"y9", generation_id=b"9", phantom_id=p)  # a future one
    assert coll.get(b"x", generation_id=b"1", phantom_id=p) is None
    assert coll.get(b"x", generation_id=b"2", phantom_id=p).value == b"x2"  # type: ignore[union-attr]
    assert coll.get(b"x", phantom_id=p).value == b"x2"  # type: ignore[union-attr]
    assert coll.get(b"y", phantom_id=p) is None  # current 5 < 9
    assert coll.get(b"y", generation_id=b"9", phantom_id=p).value == b"y9"  # type: ignore[union-attr]
    assert as_dict(coll, generation_id=b"95", phantom_id=p)[b"y"] == b"y9"


def test_phantom_wins_over_base_of_same_generation_but_not_newer_base(coll) -> None:
    p = coll.start_phantom()
    coll.put(b"a", b"phantom3", generation_id=b"3", phantom_id=p)  # base a3 is also at generation 3
    assert coll.get(b"a", generation_id=b"3", phantom_id=p).value == b"phantom3"  # type: ignore[union-attr]
    assert as_dict(coll, generation_id=b"4", phantom_id=p)[b"a"] == b"phantom3"
    coll.put(b"c", b"phantom2", generation_id=b"2", phantom_id=p)  # base c1 is older: phantom wins
    assert coll.get(b"c", phantom_id=p).value == b"phantom2"  # type: ignore[union-attr]
    coll.put(b"d", b"phantom4", generation_id=b"4", phantom_id=p)  # base d5 is newer: base wins at 5
    assert coll.get(b"d", phantom_id=p).value == b"d5"  # type: ignore[union-attr]
    assert coll.get(b"d", generation_id=b"4", phantom_id=p).value == b"phantom4"  # type: ignore[union-attr]
    assert as_dict(coll, phantom_id=p) == {b"a": b"phantom3", b"b": b"b5", b"c": b"phantom2", b"d": b"d5"}


def test_phantom_tombstone_hides_base(coll) -> None:
    p = coll.start_phantom()
    coll.put_many([(b"c", None), (b"a", None)], generation_id=b"5", phantom_id=p)
    assert coll.get(b"c", phantom_id=p) is None
    assert coll.get(b"c").value == b"c1"  # type: ignore[union-attr]
    assert as_dict(coll, phantom_id=p) == {b"b": b"b5", b"d": b"d5"}
    around = coll.keys_around(b"b", 5, phantom_id=p)
    assert (around.left, around.right) == ([], [b"d"])
    assert coll.keys_around(b"c", 5, phantom_id=p).found_key is False


def test_phantom_rewrite_of_same_generation_replaces(coll) -> None:
    p = coll.start_phantom()
    coll.put(b"k", b"one", generation_id=b"6", phantom_id=p)
    coll.put(b"k", b"two", generation_id=b"6", phantom_id=p)
    coll.put(b"k", b"four", generation_id=b"8", phantom_id=p)
    assert coll.get(b"k", generation_id=b"7", phantom_id=p).value == b"two"  # type: ignore[union-attr]
    assert coll.get(b"k", generation_id=b"8", phantom_id=p).value == b"four"  # type: ignore[union-attr]


def test_phantoms_never_appear_in_diffs_nor_get_committed(coll) -> None:
    p = coll.start_phantom()
    coll.put(b"a", b"pa", generation_id=b"6", phantom_id=p)
    coll.put(b"new", b"pn", generation_id=b"6", phantom_id=p)
    commit(coll, b"6", [(b"z", b"z6")])
    assert [(i.key, i.to_value) for i in coll.diff(b"5")] == [(b"z", b"z6")]
    assert {i.key for i in coll.diff(b"")} == {b"a", b"b", b"c", b"d", b"z"}
    assert coll.get(b"new") is None
    assert coll.get(b"a").value == b"a3"  # type: ignore[union-attr]


def test_phantom_if_not_present_and_skip_unchanged(coll) -> None:
    p = coll.start_phantom()
    result = coll.put(b"c", b"x", generation_id=b"6", phantom_id=p, if_not_present=True)
    assert result.was_put is False
    assert coll.get(b"c", generation_id=b"6", phantom_id=p).value == b"c1"  # type: ignore[union-attr]
    coll.put(b"a", b"a3", generation_id=b"6", phantom_id=p, skip_unchanged=True)
    assert coll.get(b"a", generation_id=b"6", phantom_id=p).generation_id == b"3"  # type: ignore[union-attr]


def test_phantom_if_not_present_answers_existing_generation(coll) -> None:
    p = coll.start_phantom()
    result = coll.put(b"c", b"x", generation_id=b"6", phantom_id=p, if_not_present=True)
    assert (result.was_put, result.generation_id) == (False, b"1")


def test_phantom_on_non_manual_collection(store: Store) -> None:
    n = store.create_collection("n", manual=False)
    p = n.start_phantom()
    n.put(b"k", b"v", generation_id=bytes(8), phantom_id=p)
    assert n.next_generation_id == (1).to_bytes(8, "big")
    run_background(store, now=time.monotonic() + 3600)
    assert n.generation_id == bytes(8)  # a phantom write opens/fills no generation
    assert n.get(b"k", phantom_id=p).value == b"v"  # type: ignore[union-attr]
    assert n.get(b"k") is None


def test_unknown_phantom_is_rejected_for_writes(store: Store, coll) -> None:
    other = store.create_collection("o", manual=True)
    foreign = other.start_phantom()
    coll.start_phantom()
    before = raw_state(store)
    for bad in (b"nope", b"\x00" * 8 + b"x", (99).to_bytes(8, "big")):
        with pytest.raises(InvalidRequest):
            coll.put(b"k", b"v", generation_id=b"5", phantom_id=bad)
    other.put(b"k", b"v", generation_id=b"1", phantom_id=foreign)
    assert coll.get(b"k", generation_id=b"1", phantom_id=foreign) is None
    assert raw_state(store)["records"] == before["records"]


@pytest.mark.parametrize("ttl", [0, -1, True, "5"])
def test_bad_phantom_ttl_is_invalid(store: Store, coll, ttl) -> None:
    before = raw_state(store)
    with pytest.raises(InvalidRequest):
        coll.start_phantom(ttl_seconds=ttl)
    assert raw_state(store) == before


def test_phantom_survives_reopen(open_store) -> None:
    store = open_store()
    c = store.create_collection("m", manual=True)
    p = c.start_phantom()
    c.put(b"k", b"v", generation_id=b"1", phantom_id=p)
    store.close()
    c = open_store().collection("m")
    assert c.get(b"k", generation_id=b"1", phantom_id=p).value == b"v"  # type: ignore[union-attr]
    assert c.start_phantom() != p


class FakeClock:
    """Wall-clock time for the engine's phantom TTLs, moved by the test (so no test waits on real time)."""

    def __init__(self) -> None:
        self.now = time.time()

    def time(self) -> float:
        return self.now

    def __getattr__(self, name: str):
        return getattr(time, name)


@pytest.fixture
def clock(monkeypatch) -> FakeClock:
    fake = FakeClock()
    for module in (collection_module, visibility_module, background_module):
        monkeypatch.setattr(module, "time", fake)
    return fake


def test_expired_phantom_is_invisible_and_purged(store: Store, coll, clock: FakeClock) -> None:
    keep = coll.start_phantom(ttl_seconds=3600)
    coll.put(b"k", b"kept", generation_id=b"5", phantom_id=keep)
    p = coll.start_phantom(ttl_seconds=10)
    coll.put_many([(b"k", b"gone"), (b"a", None)], generation_id=b"5", phantom_id=p)
    clock.now += 9
    run_background(store)
    assert coll.get(b"a", phantom_id=p) is None  # still alive
    assert len(raw_state(store)["phantoms"]) == 3
    clock.now += 2
    assert coll.get(b"a", phantom_id=p) is not None  # expired: the base shows through
    assert coll.get(b"k", phantom_id=p) is None
    assert as_dict(coll, phantom_id=p) == as_dict(coll)
    with pytest.raises(InvalidRequest):
        coll.put(b"k", b"again", generation_id=b"5", phantom_id=p)
    run_background(store)
    assert len(raw_state(store)["phantoms"]) == 1  # only the live phantom's row is left
    assert len(raw_state(store)["phantom_ttl"]) == 1
    assert coll.get(b"k", phantom_id=keep).value == b"kept"  # type: ignore[union-attr]


def test_expired_phantom_purged_by_background_thread(open_store, clock: FakeClock) -> None:
    store = open_store(background=True, gc_interval_ms=5)
    c = store.create_collection("m", manual=True)
    p = c.start_phantom(ttl_seconds=60)
    c.put(b"k", b"v", generation_id=b"1", phantom_id=p)
    clock.now += 61
    wait_until(lambda: not raw_state(store)["phantoms"], what="the background phantom purge")
    assert not raw_state(store)["phantom_ttl"]


def test_phantom_query_pages_carry_the_phantom(coll) -> None:
    p = coll.start_phantom()
    coll.put_many([(b"a", None), (b"aa", b"x"), (b"zz", b"z")], generation_id=b"5", phantom_id=p)
    page = coll.query_page(phantom_id=p, limit=1)
    keys = [r.key for r in page.items]
    while page.cursor:
        assert coll.query_page(cursor=page.cursor) == coll.query_page(cursor=page.cursor)
        page = coll.query_page(cursor=page.cursor)
        keys += [r.key for r in page.items]
    assert keys == [b"aa", b"b", b"c", b"d", b"zz"]
    assert keys == list(as_dict(coll, phantom_id=p))


def test_reads_with_an_unknown_phantom_see_the_base(coll) -> None:
    assert as_dict(coll, phantom_id=b"nope") == as_dict(coll)
    assert coll.get(b"a", phantom_id=(77).to_bytes(8, "big")).value == b"a3"  # type: ignore[union-attr]


def test_phantom_default_ttl_is_an_hour(coll, clock: FakeClock) -> None:
    p = coll.start_phantom()
    coll.put(b"a", b"mine", generation_id=b"5", phantom_id=p)
    clock.now += 3599
    assert coll.get(b"a", phantom_id=p).value == b"mine"  # type: ignore[union-attr]
    clock.now += 2
    assert coll.get(b"a", phantom_id=p).value == b"a3"  # type: ignore[union-attr]
