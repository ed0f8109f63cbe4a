"""SPEC §1: the manual generation lifecycle table (every row) and non-manual auto-commit."""

from __future__ import annotations

import time
import types

import pytest

from diffstore import Store, StoreConfig
from diffstore.engine import store as store_module
from diffstore.errors import (
    GenerationMismatch,
    InvalidRequest,
    NoSuchGeneration,
    NotManual,
    OutdatedGeneration,
)
from tests.helpers import wait_until

from .util import as_dict, commit, raw_state, run_background

ZERO = bytes(8)


def u64(n: int) -> bytes:
    return n.to_bytes(8, "big")


# --- manual collections ------------------------------------------------------------------------


def test_manual_starts_at_empty_generation_without_next(store: Store) -> None:
    c = store.create_collection("m", manual=True)
    assert c.manual is True
    assert c.generation_id == b""
    assert c.next_generation_id is None
    assert list(c.query()) == []


def test_manual_initial_generation_id(store: Store) -> None:
    c = store.create_collection("m", manual=True, initial_generation_id=b"g5")
    assert c.generation_id == b"g5"
    assert c.next_generation_id is None
    with pytest.raises(OutdatedGeneration):
        c.start_generation(b"g4")
    c.start_generation(b"g6")
    assert c.next_generation_id == b"g6"


@pytest.mark.parametrize("gen", [b"b", b"a", b"", b"0"])
def test_start_at_or_below_current_is_outdated(store: Store, gen: bytes) -> None:
    c = store.create_collection("m", manual=True)
    commit(c, b"b", [(b"k", b"v")])
    before = raw_state(store)
    with pytest.raises(OutdatedGeneration) as info:
        c.start_generation(gen)
    assert info.value.code == "outdatedGeneration"
    assert raw_state(store) == before
    assert c.next_generation_id is None


def test_start_without_next_opens_it(store: Store) -> None:
    c = store.create_collection("m", manual=True)
    c.start_generation(b"1")
    assert c.next_generation_id == b"1"
    assert c.generation_id == b""


def test_start_of_open_generation_is_idempotent(store: Store) -> None:
    c = store.create_collection("m", manual=True)
    c.start_generation(b"1")
    c.put(b"k", b"v", generation_id=b"1")
    before = raw_state(store)
    c.start_generation(b"1")
    c.start_generation(b"1", abort_outdated=True)
    assert raw_state(store) == before
    assert c.get(b"k", generation_id=b"1") is not None  # its writes are kept


def test_start_above_next_with_abort_outdated_drops_old_next(store: Store) -> None:
    c = store.create_collection("m", manual=True)
    commit(c, b"1", [(b"base", b"b")])
    c.start_generation(b"2")
    c.put_many([(b"k", b"old"), (b"base", None)], generation_id=b"2")
    c.start_generation(b"3", abort_outdated=True)
    assert c.next_generation_id == b"3"
    assert c.generation_id == b"1"
    # the old next's records are gone: not at 3 (which reads its own, empty, writes), not anywhere
    assert as_dict(c, generation_id=b"3") == {b"base": b"b"}
    with pytest.raises(NoSuchGeneration):  # above the current one and no longer open (SPEC §8)
        as_dict(c, generation_id=b"2")
    with pytest.raises(GenerationMismatch):
        c.put(b"x", b"y", generation_id=b"2")
    c.put(b"k", b"new", generation_id=b"3")
    c.commit_generation(b"3")
    assert as_dict(c) == {b"base": b"b", b"k": b"new"}
    assert [(i.key, i.from_value, i.to_value) for i in c.diff(b"1", include_intermediate=True)] == [
        (b"k", None, b"new")
    ]
    assert [i.intermediate for i in c.diff(b"", include_intermediate=True)] == [(), ()]


@pytest.mark.parametrize(
    ("gen", "abort_outdated"),
    [
        (b"3", False),  # above next, no abortOutdated
        (b"15", False),  # between current and next
        (b"15", True),  # below next even with abortOutdated
    ],
)
def test_start_other_cases_are_outdated(store: Store, gen: bytes, abort_outdated: bool) -> None:
    c = store.create_collection("m", manual=True)
    commit(c, b"1", [(b"a", b"1")])
    c.start_generation(b"2")
    c.put(b"k", b"v", generation_id=b"2")
    before = raw_state(store)
    with pytest.raises(OutdatedGeneration):
        c.start_generation(gen, abort_outdated=abort_outdated)
    assert raw_state(store) == before
    assert c.next_generation_id == b"2"


@pytest.mark.parametrize("gen", [b"1", b"3", b""])
def test_commit_of_other_generation_is_mismatch(store: Store, gen: bytes) -> None:
    c = store.create_collection("m", manual=True)
    c.start_generation(b"2")
    c.put(b"k", b"v", generation_id=b"2")
    before = raw_state(store)
    with pytest.raises(GenerationMismatch) as info:
        c.commit_generation(gen)
    assert info.value.code == "generationMismatch"
    assert raw_state(store) == before


def test_commit_without_next_is_mismatch(store: Store) -> None:
    c = store.create_collection("m", manual=True)
    before = raw_state(store)
    with pytest.raises(GenerationMismatch):
        c.commit_generation(b"1")
    with pytest.raises(GenerationMismatch):
        c.abort_generation(b"1")
    assert raw_state(store) == before


def test_commit_makes_next_current(store: Store) -> None:
    c = store.create_collection("m", manual=True)
    c.start_generation(b"1")
    c.put(b"k", b"v", generation_id=b"1")
    assert c.get(b"k") is None  # not visible at current before the commit
    c.commit_generation(b"1")
    assert c.generation_id == b"1"
    assert c.next_generation_id is None
    assert c.get(b"k") == c.get(b"k", generation_id=b"1")
    assert c.get(b"k").value == b"v"  # type: ignore[union-attr]


def test_commit_of_empty_generation_is_allowed(store: Store) -> None:
    c = store.create_collection("m", manual=True)
    commit(c, b"1", [])
    assert c.generation_id == b"1"


@pytest.mark.parametrize("gen", [b"1", b"3", b""])
def test_abort_of_other_generation_is_mismatch(store: Store, gen: bytes) -> None:
    c = store.create_collection("m", manual=True)
    c.start_generation(b"2")
    c.put(b"k", b"v", generation_id=b"2")
    before = raw_state(store)
    with pytest.raises(GenerationMismatch):
        c.abort_generation(gen)
    assert raw_state(store) == before


def test_abort_drops_records_and_next(store: Store) -> None:
    c = store.create_collection("m", manual=True)
    commit(c, b"1", [(b"a", b"1")])
    before = raw_state(store)
    c.start_generation(b"2")
    c.put_many([(b"a", None), (b"b", b"2")], generation_id=b"2")
    c.abort_generation(b"2")
    assert c.next_generation_id is None
    assert c.generation_id == b"1"
    assert as_dict(c) == {b"a": b"1"}
    with pytest.raises(NoSuchGeneration):  # above the current one and no longer open (SPEC §8)
        as_dict(c, generation_id=b"2")
    after = raw_state(store)
    assert after["records"] == before["records"]
    assert after["changes"] == before["changes"]
    assert after["change_chunks"] == before["change_chunks"]
    # the same id can be opened again and starts empty
    c.start_generation(b"2")
    assert as_dict(c, generation_id=b"2") == {b"a": b"1"}


@pytest.mark.parametrize("gen", [None, b"1", b"3"])
def test_manual_put_must_name_open_generation(store: Store, gen: bytes | None) -> None:
    c = store.create_collection("m", manual=True)
    commit(c, b"1", [(b"a", b"1")])
    c.start_generation(b"2")
    before = raw_state(store)
    with pytest.raises(GenerationMismatch):
        c.put(b"k", b"v", generation_id=gen)
    with pytest.raises(GenerationMismatch):
        c.put_many([(b"k", b"v"), (b"j", None)], generation_id=gen)
    assert raw_state(store) == before


def test_manual_put_without_next_is_mismatch(store: Store) -> None:
    c = store.create_collection("m", manual=True)
    before = raw_state(store)
    for gen in (None, b"", b"1"):
        with pytest.raises(GenerationMismatch):
            c.put(b"k", b"v", generation_id=gen)
    assert raw_state(store) == before


def test_phantom_write_needs_no_open_generation(store: Store) -> None:
    c = store.create_collection("m", manual=True)
    phantom = c.start_phantom()
    c.put(b"k", b"v", generation_id=b"7", phantom_id=phantom)
    assert c.next_generation_id is None
    assert c.get(b"k", generation_id=b"7", phantom_id=phantom) is not None
    with pytest.raises(InvalidRequest):
        c.put(b"k", b"v", phantom_id=phantom)  # a phantom write needs a generationId


def test_generation_ids_compare_bytewise_prefix_first(store: Store) -> None:
    c = store.create_collection("m", manual=True)
    commit(c, b"0", [(b"k", b"0")])
    commit(c, b"0001", [(b"k", b"0001")])
    with pytest.raises(OutdatedGeneration):
        c.start_generation(b"0")
    commit(c, b"1", [(b"k", b"1")])
    assert c.get(b"k", generation_id=b"00").value == b"0"  # type: ignore[union-attr]
    assert c.get(b"k", generation_id=b"0002").value == b"0001"  # type: ignore[union-attr]


def test_generation_id_too_long_is_invalid(store: Store) -> None:
    c = store.create_collection("m", manual=True)
    before = raw_state(store)
    with pytest.raises(InvalidRequest) as info:
        c.start_generation(b"x" * 256)
    assert info.value.code == "invalidRequest"
    assert raw_state(store) == before
    c.start_generation(b"x" * 255)
    c.commit_generation(b"x" * 255)
    assert c.generation_id == b"x" * 255


def test_manual_lifecycle_survives_reopen(open_store, tmp_path) -> None:
    store = open_store()
    c = store.create_collection("m", manual=True)
    commit(c, b"1", [(b"a", b"1")])
    c.start_generation(b"2")
    c.put(b"b", b"2", generation_id=b"2")
    store.close()
    c = open_store().collection("m")
    assert c.generation_id == b"1"
    assert c.next_generation_id == b"2"
    assert as_dict(c) == {b"a": b"1"}
    assert as_dict(c, generation_id=b"2") == {b"a": b"1", b"b": b"2"}
    c.commit_generation(b"2")
    assert as_dict(c) == {b"a": b"1", b"b": b"2"}


# --- non-manual collections ----------------------------------------------------------------------


def test_non_manual_starts_at_zero_with_next_open(store: Store) -> None:
    n = store.create_collection("n", manual=False)
    assert n.manual is False
    assert n.generation_id == ZERO
    assert n.next_generation_id == u64(1)


def test_non_manual_rejects_initial_generation_id(store: Store) -> None:
    before = raw_state(store)
    with pytest.raises(InvalidRequest):
        store.create_collection("n", manual=False, initial_generation_id=b"x")
    assert raw_state(store) == before


@pytest.mark.parametrize("call", ["start", "commit", "abort"])
def test_lifecycle_calls_on_non_manual_are_not_manual(store: Store, call: str) -> None:
    n = store.create_collection("n", manual=False)
    n.put(b"k", b"v")
    before = raw_state(store)
    for gen in (u64(1), u64(2), ZERO):
        with pytest.raises(NotManual) as info:
            if call == "start":
                n.start_generation(gen, abort_outdated=True)
            elif call == "commit":
                n.commit_generation(gen)
            else:
                n.abort_generation(gen)
        assert info.value.code == "notManual"
    assert raw_state(store) == before


def test_non_manual_writes_go_to_next(store: Store) -> None:
    n = store.create_collection("n", manual=False)
    result = n.put(b"k", b"v")
    assert result.generation_id == u64(1)
    assert n.get(b"k") is None
    assert n.get(b"k", generation_id=u64(1)).value == b"v"  # type: ignore[union-attr]
    assert n.put(b"j", b"w", generation_id=u64(1)).generation_id == u64(1)
    before = raw_state(store)
    for gen in (ZERO, u64(2), b""):
        with pytest.raises(GenerationMismatch):
            n.put(b"x", b"y", generation_id=gen)
    assert raw_state(store) == before


def test_auto_commit_after_delay(open_store) -> None:
    store = open_store(commit_delay_ms=60_000)
    n = store.create_collection("n", manual=False)
    heard: list[tuple[str, bytes]] = []
    store.add_commit_listener(lambda name, gen: heard.append((name, gen)))
    start = time.monotonic()
    n.put(b"k", b"v")
    run_background(store, now=start + 1)  # before the delay: nothing is committed
    assert n.generation_id == ZERO
    run_background(store, now=time.monotonic() + 61)
    assert n.generation_id == u64(1)
    assert n.next_generation_id == u64(2)
    assert n.get(b"k").value == b"v"  # type: ignore[union-attr]
    assert heard == [("n", u64(1))]


def test_auto_commit_delay_counts_from_first_write(open_store, monkeypatch) -> None:
    clock = [1000.0]
    fake_time = types.SimpleNamespace(monotonic=lambda: clock[0], time=lambda: clock[0])
    monkeypatch.setattr(store_module, "time", fake_time)
    store = open_store(commit_delay_ms=10_000)
    n = store.create_collection("n", manual=False)
    n.put(b"a", b"1")
    clock[0] += 5
    n.put(b"b", b"2")  # not a first write: the deadline stays 1010
    run_background(store, now=1009.0)
    assert n.generation_id == ZERO
    run_background(store, now=1010.0)
    assert n.generation_id == u64(1)
    assert as_dict(n) == {b"a": b"1", b"b": b"2"}


def test_auto_commit_deadline_of_generation_after_threshold_commit(open_store, monkeypatch) -> None:
    clock = [1000.0]
    fake_time = types.SimpleNamespace(monotonic=lambda: clock[0], time=lambda: clock[0])
    monkeypatch.setattr(store_module, "time", fake_time)
    store = open_store(commit_delay_ms=10_000, max_generation_records=2)
    n = store.create_collection("n", manual=False)
    n.put(b"a", b"1")  # generation 1's first write at 1000: due 1010
    n.put(b"b", b"2")  # threshold: generation 1 commits at once
    assert n.generation_id == u64(1)
    clock[0] = 1008.0
    n.put(b"c", b"3")  # generation 2's first write at 1008: due 1018
    run_background(store, now=1011.0)
    assert n.generation_id == u64(1), "generation 2 was committed before its delay"
    run_background(store, now=1018.0)
    assert n.generation_id == u64(2)


def test_auto_commit_at_record_threshold(open_store) -> None:
    store = open_store(commit_delay_ms=60_000, max_generation_records=3)
    n = store.create_collection("n", manual=False)
    heard: list[bytes] = []
    store.add_commit_listener(lambda name, gen: heard.append(gen))
    n.put_many([(b"a", b"1"), (b"b", b"1"), (b"a", b"2")])  # 2 distinct writes: below the threshold
    assert n.generation_id == ZERO
    n.put(b"c", b"1")  # the third write: committed at once, no background work needed
    assert n.generation_id == u64(1)
    assert n.next_generation_id == u64(2)
    assert as_dict(n) == {b"a": b"2", b"b": b"1", b"c": b"1"}
    assert heard == [u64(1)]


def test_empty_generations_are_never_committed(open_store) -> None:
    store = open_store(commit_delay_ms=0)
    n = store.create_collection("n", manual=False)
    run_background(store, now=time.monotonic() + 3600)
    assert n.generation_id == ZERO
    n.put(b"k", b"v")
    run_background(store, now=time.monotonic() + 3600)
    assert n.generation_id == u64(1)
    # writes that write nothing do not make the open generation non-empty
    n.put(b"k", b"other", if_not_present=True)
    n.put(b"k", b"v", skip_unchanged=True)
    run_background(store, now=time.monotonic() + 3600)
    assert n.generation_id == u64(1)
    assert n.next_generation_id == u64(2)


def test_auto_commit_in_background_thread(open_store) -> None:
    store = open_store(background=True, commit_delay_ms=10, gc_interval_ms=10)
    n = store.create_collection("n", manual=False)
    heard: list[bytes] = []
    store.add_commit_listener(lambda name, gen: heard.append(gen))
    n.put(b"k", b"v")
    wait_until(lambda: n.generation_id == u64(1), what="the automatic commit")
    assert n.get(b"k").value == b"v"  # type: ignore[union-attr]
    wait_until(lambda: heard == [u64(1)], what="the commit listener")


def test_non_manual_generation_counter_carries(open_store) -> None:
    store = open_store(max_generation_records=1)
    n = store.create_collection("n", manual=False)
    for i in range(256):
        n.put(b"k", str(i).encode())
    assert n.generation_id == bytes(6) + b"\x01\x00"
    assert n.next_generation_id == bytes(6) + b"\x01\x01"
    assert n.get(b"k", generation_id=bytes(7) + b"\xff").value == b"254"  # type: ignore[union-attr]
    assert n.get(b"k").value == b"255"  # type: ignore[union-attr]


def test_pending_non_manual_writes_are_committed_after_reopen(open_store, tmp_path) -> None:
    store = open_store(commit_delay_ms=60_000)
    n = store.create_collection("n", manual=False)
    n.put(b"k", b"v")
    store.close()
    store = open_store(commit_delay_ms=60_000)
    n = store.collection("n")
    assert n.generation_id == ZERO
    run_background(store)  # the due time of the pending commit is kept in the store: not yet
    assert n.generation_id == ZERO
    run_background(store, now=time.monotonic() + 61)  # the reopened store commits what was pending
    assert n.generation_id == u64(1)
    assert n.get(b"k").value == b"v"  # type: ignore[union-attr]


def test_store_config_rejects_bad_values() -> None:
    for bad in ({"commit_delay_ms": -1}, {"max_generation_records": 0}, {"max_diff_generations": 0}):
        with pytest.raises(InvalidRequest):
            StoreConfig(**bad)
