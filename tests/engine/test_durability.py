"""``StoreConfig.sync``: unsynced stores keep their commits across reopen and are flushed by the worker.

Surviving ``kill -9`` with ``sync=False`` is covered by the crash test (``test_crash.py``, ``nosync``).
"""

from __future__ import annotations

import pytest

from diffstore import StoreConfig
from diffstore.errors import InvalidRequest
from tests.helpers import wait_until


def test_unsynced_commits_survive_close_and_reopen(open_store, tmp_path) -> None:
    store = open_store(sync=False)
    coll = store.create_collection("c", manual=True)
    coll.start_generation(b"1")
    coll.put_many([(b"k", b"v"), (b"gone", None)], generation_id=b"1")
    coll.commit_generation(b"1")
    store.close()
    reopened = open_store(sync=False)
    again = reopened.collection("c")
    assert again.generation_id == b"1"
    assert [(r.key, r.value) for r in again.query()] == [(b"k", b"v")]


def test_worker_flushes_an_unsynced_store_periodically(open_store) -> None:
    store = open_store(sync=False, sync_interval_ms=10, background=True)
    coll = store.create_collection("c", manual=True)
    coll.start_generation(b"1")
    coll.put(b"k", b"v", generation_id=b"1")
    coll.commit_generation(b"1")
    wait_until(lambda: store.flushes >= 2, what="two background flushes")


def test_synced_store_never_needs_a_flush(open_store) -> None:
    store = open_store(background=True, gc_interval_ms=5)
    coll = store.create_collection("n", manual=False)
    coll.put(b"k", b"v")
    wait_until(lambda: coll.generation_id != b"", what="the automatic commit")
    assert store.flushes == 0


@pytest.mark.parametrize("interval", [0, -5])
def test_sync_interval_must_be_positive(interval: int) -> None:
    with pytest.raises(InvalidRequest):
        StoreConfig(sync=False, sync_interval_ms=interval)


@pytest.mark.parametrize("first, then", [(False, True), (True, False)], ids=["unsynced", "synced"])
def test_a_store_may_switch_between_synced_and_unsynced(open_store, first: bool, then: bool) -> None:
    store = open_store(sync=first, map_size=1 << 30)
    coll = store.create_collection("c", manual=True)
    coll.start_generation(b"1")
    coll.put(b"k", b"v1", generation_id=b"1")
    coll.commit_generation(b"1")
    store.close()
    store = open_store(sync=then, map_size=1 << 30)
    coll = store.collection("c")
    coll.start_generation(b"2")
    coll.put(b"k", b"v2", generation_id=b"2")
    coll.commit_generation(b"2")
    assert [(i.key, i.from_value, i.to_value) for i in coll.diff(b"1", b"2")] == [(b"k", b"v1", b"v2")]
