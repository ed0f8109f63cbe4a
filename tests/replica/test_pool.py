"""Issue 54 item 6: a replica follows many collections with a fixed pool of threads, whatever their number
(it ran one thread per collection, never given back after deletions)."""

from __future__ import annotations

import threading
from pathlib import Path

from diffstore.engine.store import Store
from diffstore.engine.types import StoreConfig
from diffstore.replica import Follower, FollowerConfig
from tests.helpers import running_server, wait_until

COLLECTIONS = 120
THREADS = 3


def _replica_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("diffstore-replica")]


def _names(store: Store) -> set[str]:
    return {info.name for info in store.collections()}


def test_many_collections_are_followed_by_a_fixed_pool(tmp_path: Path) -> None:
    with running_server(tmp_path / "primary") as primary, primary.client() as p:
        for i in range(COLLECTIONS):
            c = p.create_collection(f"c{i:04d}", manual=i % 2 == 0)
            if i % 2:
                c.put(b"k", b"%d" % i)
        with Store.open(tmp_path / "replica", StoreConfig(commit_delay_ms=10)) as store:
            state = store.become_replica(primary.url, "pool")
            assert state.replica_id is not None
            follower = Follower(store, FollowerConfig(primary.url, None, state.replica_id, threads=THREADS))
            follower.start()
            try:
                wanted = {f"c{i:04d}" for i in range(COLLECTIONS)}
                wait_until(lambda: _names(store) == wanted, 120, what="every collection copied")
                # the watcher and the workers, whatever the number of collections
                assert follower.thread_count == THREADS + 1
                assert len(_replica_threads()) == THREADS + 1
                for i in range(0, COLLECTIONS, 2):
                    p.delete_collection(f"c{i:04d}")
                wait_until(lambda: len(_names(store)) == COLLECTIONS // 2, 120, what="the deletions followed")
                assert follower.thread_count == THREADS + 1
                assert len(_replica_threads()) == THREADS + 1
                p.collection("c0001").put(b"k", b"again")
                wait_until(
                    lambda: (
                        store.collection("c0001").get(b"k") is not None
                        and store.collection("c0001").get(b"k").value == b"again"
                    ),  # type: ignore[union-attr]
                    60,
                    what="a later write followed",
                )
            finally:
                follower.stop()
            assert follower.thread_count == 0
