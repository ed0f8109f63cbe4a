"""SPEC §8 revert in the engine: the open generation's view equals the state at ``toGenerationId``, the
uncommitted writes already there included; long keys; non-manual collections; lease fencing; refusals
that change nothing. The stateful model (test_stateful.py) checks revert against the reference model too."""

from __future__ import annotations

import time

import pytest

from diffstore import RevertResult, Store
from diffstore.errors import (
    GenerationCollected,
    GenerationMismatch,
    InvalidRequest,
    LeaseLost,
    NoSuchGeneration,
)
from tests.engine.conftest import StoreFactory

LONG = b"k" * 300  # a long key: its form is a hash, its key lives in the value


def _state(store: Store, name: str, generation_id: bytes | None = None) -> dict[bytes, bytes]:
    return {r.key: r.value for r in store.collection(name).query(generation_id=generation_id)}


def _commit(store: Store, name: str, gen: bytes, items: list[tuple[bytes, bytes | None]]) -> None:
    c = store.collection(name)
    c.start_generation(gen)
    c.put_many(items, generation_id=gen)
    c.commit_generation(gen)


def test_revert_makes_the_open_generation_equal_the_old_state(store: Store) -> None:
    c = store.create_collection("A", manual=True)
    _commit(store, "A", b"1", [(b"a", b"1"), (b"b", b"1"), (LONG, b"1")])
    _commit(store, "A", b"2", [(b"a", b"2"), (b"b", None), (b"c", b"2"), (LONG + b"x", b"2")])
    _commit(store, "A", b"3", [(b"d", b"3"), (LONG, None)])
    c.start_generation(b"4")
    # uncommitted writes: one restores a key already, one changes a key the commits never touched
    c.put_many([(b"b", b"1"), (b"e", b"4"), (b"a", b"x")], generation_id=b"4")
    result = c.revert(b"1", generation_id=b"4")
    assert result == RevertResult(b"4", 6)  # a, c, d, e, LONG, LONG+x: b already equal
    assert _state(store, "A", b"4") == _state(store, "A", b"1") == {b"a": b"1", b"b": b"1", LONG: b"1"}
    assert _state(store, "A") == {b"a": b"2", b"c": b"2", b"d": b"3", LONG + b"x": b"2"}  # not committed
    c.commit_generation(b"4")
    assert _state(store, "A") == _state(store, "A", b"1")
    diff = {(i.key, i.from_value, i.to_value) for i in c.diff(b"3", b"4")}
    assert diff == {
        (b"a", b"2", b"1"),
        (b"b", None, b"1"),
        (b"c", b"2", None),
        (b"d", b"3", None),
        (LONG, None, b"1"),
        (LONG + b"x", b"2", None),
    }


def test_revert_to_the_current_generation_undoes_the_open_writes(store: Store) -> None:
    c = store.create_collection("A", manual=True)
    _commit(store, "A", b"1", [(b"a", b"1")])
    c.start_generation(b"2")
    assert c.revert(b"1", generation_id=b"2") == RevertResult(b"2", 0)
    c.put_many([(b"a", b"2"), (b"b", b"2")], generation_id=b"2")
    assert c.revert(b"1", generation_id=b"2") == RevertResult(b"2", 2)
    assert _state(store, "A", b"2") == {b"a": b"1"}
    assert c.revert(b"", generation_id=b"2") == RevertResult(b"2", 1)  # the first generation: empty
    assert _state(store, "A", b"2") == {}


def test_revert_of_a_non_manual_collection_goes_into_the_next_generation(open_store: StoreFactory) -> None:
    store = open_store(commit_delay_ms=10**9)
    c = store.create_collection("N", manual=False)
    c.put_many([(b"a", b"1"), (b"b", b"1")])
    first = _commit_auto(store)
    c.put_many([(b"a", b"2"), (b"c", b"2")])
    _commit_auto(store)
    c.put(b"d", b"open")
    result = c.revert(first)
    assert result == RevertResult(c.next_generation_id or b"", 3)
    _commit_auto(store)
    assert _state(store, "N") == {b"a": b"1", b"b": b"1"}
    with pytest.raises(GenerationMismatch):  # it may name the next generation, nothing else
        c.revert(first, generation_id=b"x")


def _commit_auto(store: Store) -> bytes:
    while store.run_background_once(time.monotonic() + 10**7):
        pass
    return store.collection("N").generation_id


def test_refusals_change_nothing(open_store: StoreFactory) -> None:
    store = open_store()
    c = store.create_collection("A", manual=True)
    _commit(store, "A", b"1", [(b"a", b"1")])
    _commit(store, "A", b"3", [(b"a", b"3")])
    with pytest.raises(GenerationMismatch, match="no generation is open"):
        c.revert(b"1", generation_id=b"4")
    c.start_generation(b"4")
    c.put(b"b", b"4", generation_id=b"4")
    before = (c.generation_state(), _state(store, "A", b"4"))
    for bad, error in [
        (lambda: c.revert(b"1"), GenerationMismatch),  # a manual revert names the open generation
        (lambda: c.revert(b"1", generation_id=b"5"), GenerationMismatch),
        (lambda: c.revert(b"2", generation_id=b"4"), NoSuchGeneration),  # between two committed ones
        (lambda: c.revert(b"4", generation_id=b"4"), NoSuchGeneration),  # the open one
        (lambda: c.revert(b"9", generation_id=b"4"), NoSuchGeneration),  # above the current one
        (lambda: c.revert("1", generation_id=b"4"), InvalidRequest),  # type: ignore[arg-type]
        (lambda: c.revert(b"x" * 256, generation_id=b"4"), InvalidRequest),
    ]:
        with pytest.raises(error):
            bad()
        assert (c.generation_state(), _state(store, "A", b"4")) == before
    c.create_reader("r", generation_id=b"3")
    with pytest.raises(GenerationCollected):
        c.revert(b"1", generation_id=b"4")
    assert (c.generation_state(), _state(store, "A", b"4")) == before
    assert c.revert(b"3", generation_id=b"4") == RevertResult(b"4", 1)


def test_a_revert_into_a_leased_generation_carries_the_lease(store: Store) -> None:
    c = store.create_collection("A", manual=True)
    _commit(store, "A", b"1", [(b"a", b"1")])
    token = c.acquire_lease("w", "A", 60_000).token
    other = c.acquire_lease("x", "A", 60_000).token
    c.start_generation(b"2", lease=token)
    c.put(b"a", b"2", generation_id=b"2", lease=token)
    for lease in (None, other):
        with pytest.raises(LeaseLost):
            c.revert(b"1", generation_id=b"2", lease=lease)
        assert _state(store, "A", b"2") == {b"a": b"2"}
    assert c.revert(b"1", generation_id=b"2", lease=token) == RevertResult(b"2", 1)
    assert _state(store, "A", b"2") == {b"a": b"1"}
