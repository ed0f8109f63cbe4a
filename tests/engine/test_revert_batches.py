"""A manual collection's revert is written in batches (issue 54 item 5): the same result whatever the batch
size; another collection's writer goes in between two batches; a revert killed (``kill -9``) between two
batches leaves the store consistent, its open generation holding part of the revert, which can be aborted
or finished by calling revert again. A non-manual collection's revert stays one transaction."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from diffstore import RevertResult, Store, StoreConfig
from diffstore.engine import check, crashpoints
from diffstore.errors import GenerationMismatch
from tests.engine.conftest import StoreFactory
from tests.helpers import wait_until

LONG = b"k" * 300  # a long key: its form is a hash, its key lives in the value
DEADLINE_S = 120.0


def _state(store: Store, name: str, generation_id: bytes | None = None) -> dict[bytes, bytes]:
    return {r.key: r.value for r in store.collection(name).query(generation_id=generation_id)}


def _commit(store: Store, name: str, gen: bytes, items: list[tuple[bytes, bytes | None]]) -> None:
    c = store.collection(name)
    c.start_generation(gen)
    c.put_many(items, generation_id=gen)
    c.commit_generation(gen)


@pytest.mark.parametrize("batch_keys", [1, 2, 3, 1000])
def test_a_revert_in_batches_writes_what_one_transaction_would(
    open_store: StoreFactory, batch_keys: int
) -> None:
    store = open_store()
    c = store.create_collection("A", manual=True)
    _commit(store, "A", b"1", [(b"a", b"1"), (b"b", b"1"), (LONG, b"1"), (LONG + b"y", b"1")])
    _commit(store, "A", b"2", [(b"a", b"2"), (b"b", None), (b"c", b"2"), (LONG + b"x", b"2"), (LONG, b"2")])
    c.start_generation(b"3")
    c.put_many([(b"b", b"1"), (b"e", b"3"), (LONG + b"y", None)], generation_id=b"3")
    result = c.revert(b"1", generation_id=b"3", batch_keys=batch_keys)
    assert result == RevertResult(b"3", 6)  # a, c, e, LONG, LONG+x, LONG+y: b already equal
    assert _state(store, "A", b"3") == _state(store, "A", b"1")
    assert c.revert(b"1", generation_id=b"3", batch_keys=batch_keys) == RevertResult(b"3", 0)
    c.commit_generation(b"3")
    assert _state(store, "A") == _state(store, "A", b"1")


KEYS = 20_000
BATCH = 200  # 100 batches


def _prepared(store: Store) -> None:
    """``A``: KEYS keys at generation 1, every one changed at 2, generation 3 open (a revert to 1 writes
    KEYS keys); ``B``: another manual collection, generation 1 open."""
    store.create_collection("A", manual=True)
    _commit(store, "A", b"1", [(b"k%06d" % i, b"old") for i in range(KEYS)])
    _commit(store, "A", b"2", [(b"k%06d" % i, b"new") for i in range(KEYS)])
    store.collection("A").start_generation(b"3")
    store.create_collection("B", manual=True).start_generation(b"1")


def test_another_collections_writer_goes_in_between_two_batches(store: Store) -> None:
    _prepared(store)
    a, b = store.collection("A"), store.collection("B")
    first, last = b"k%06d" % 0, b"k%06d" % (KEYS - 1)
    between: list[int] = []  # B's writes answered while the revert had begun and not finished
    done = threading.Event()
    errors: list[BaseException] = []

    def writer() -> None:
        try:
            n = 0
            while not done.is_set():
                n += 1
                b.put(b"w%06d" % n, b"x", generation_id=b"1")
                reverted_first = a.get(first, generation_id=b"3")
                reverted_last = a.get(last, generation_id=b"3")
                assert reverted_first is not None and reverted_last is not None
                if reverted_first.value == b"old" and reverted_last.value == b"new":
                    between.append(n)
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=writer, daemon=True)
    thread.start()
    wait_until(
        lambda: b.get(b"w%06d" % 1, generation_id=b"1") is not None, DEADLINE_S, what="B's first write"
    )
    try:
        assert a.revert(b"1", generation_id=b"3", batch_keys=BATCH) == RevertResult(b"3", KEYS)
    finally:
        done.set()
        thread.join(DEADLINE_S)
    assert not errors, errors
    assert between, "no write of B was answered between two batches of the revert"
    assert _state(store, "A", b"3") == _state(store, "A", b"1")


REVERT_SCRIPT = """
import sys
from diffstore import Store
with Store.open(sys.argv[1]) as store:
    store.collection("A").revert(b"1", generation_id=b"3", batch_keys=int(sys.argv[2]))
"""


@pytest.mark.parametrize("then", ["abort", "revert again"])
def test_a_revert_killed_between_two_batches_leaves_a_consistent_store(tmp_path: Path, then: str) -> None:
    path = tmp_path / "s"
    with Store.open(path, StoreConfig(background=False)) as store:
        _prepared(store)
        before = (_state(store, "A"), _state(store, "A", b"3"))
    done = subprocess.run(
        [sys.executable, "-c", REVERT_SCRIPT, str(path), str(BATCH)],
        env={**os.environ, crashpoints.CRASH_AT_ENV: "revert-batch-written"},
        capture_output=True,
        timeout=DEADLINE_S,
    )
    assert done.returncode == -signal.SIGKILL, done.stderr  # killed after its first batch committed
    assert check.check_directory(path).ok
    with Store.open(path) as store:
        a = store.collection("A")
        assert (a.generation_id, a.next_generation_id) == (b"2", b"3")
        assert _state(store, "A") == before[0]  # nothing committed
        half = _state(store, "A", b"3")
        assert sum(v == b"old" for v in half.values()) == BATCH  # the first batch, and only it
        if then == "abort":
            a.abort_generation(b"3")
            assert _state(store, "A") == before[0] and a.next_generation_id is None
        else:
            assert a.revert(b"1", generation_id=b"3", batch_keys=BATCH) == RevertResult(b"3", KEYS - BATCH)
            a.commit_generation(b"3")
            assert _state(store, "A") == _state(store, "A", b"1")
    assert check.check_directory(path).ok


def test_a_revert_whose_open_generation_is_ended_between_batches_stops(store: Store) -> None:
    _prepared(store)
    a = store.collection("A")
    original = store.let_waiting_writers_in
    calls = 0

    def abort_and_restart(timeout_s: float = 1.0) -> None:  # another writer, between the first two batches
        nonlocal calls
        calls += 1
        if calls == 1:
            a.abort_generation(b"3")
            a.start_generation(b"3")
        original(timeout_s)

    store.let_waiting_writers_in = abort_and_restart  # type: ignore[method-assign]
    with pytest.raises(GenerationMismatch, match="ended and opened again"):
        a.revert(b"1", generation_id=b"3", batch_keys=BATCH)
    assert _state(store, "A", b"3") == _state(store, "A", b"2")  # the new generation 3 got nothing


def _commit_auto(store: Store) -> bytes:
    while store.run_background_once(time.monotonic() + 10**7):
        pass
    return store.collection("N").generation_id


def test_a_non_manual_collections_revert_is_one_transaction(store: Store) -> None:
    c = store.create_collection("N", manual=False)
    c.put_many([(b"k%03d" % i, b"old") for i in range(50)])
    old = _commit_auto(store)
    c.put_many([(b"k%03d" % i, b"new") for i in range(50)])
    _commit_auto(store)
    calls: list[float] = []
    store.let_waiting_writers_in = lambda timeout_s=1.0: calls.append(timeout_s)  # type: ignore[method-assign]
    assert c.revert(old, batch_keys=1).changed_keys == 50
    assert calls == []  # no batches: its open generation is committed on a timer, half a revert with it
    _commit_auto(store)
    assert _state(store, "N") == _state(store, "N", old)
