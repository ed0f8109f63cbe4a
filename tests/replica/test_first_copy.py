"""A large first copy is staged in batches: invisible until its last batch, and a copy cut by kill -9
goes on after the restart (issue 47, initial copy speed)."""

from __future__ import annotations

from pathlib import Path

import httpx
import msgpack
import pytest

from diffstore.engine.crashpoints import CRASH_AT_ENV
from diffstore.engine.store import Store
from diffstore.engine.types import ReplicaGeneration, StoreConfig
from diffstore.errors import NoSuchCollection

from .compare import converged
from .conftest import Server

KEYS = 125_000  # three batches of a first copy (50,000 records each)


def _big_collection_with_collected_history(server: Server) -> None:
    with server.client() as p:
        m = p.create_collection("big", manual=True)
        m.start_generation(b"g1")
        for start in range(0, KEYS, 5_000):
            m.put_many([(b"k%06d" % i, b"v%d" % i) for i in range(start, start + 5_000)], generation_id=b"g1")
        m.commit_generation(b"g1")
        m.create_reader("pipeline", generation_id=b"g1")
        m.start_generation(b"g2")
        m.put_many([(b"k%06d" % i, None) for i in range(0, KEYS, 7)], generation_id=b"g2")
        m.put_many([(b"new%04d" % i, b"n") for i in range(100)], generation_id=b"g2")
        m.commit_generation(b"g2")
        m.update_reader("pipeline", b"g2")  # "" and g1 are collected: the copy starts at g2
        small = p.create_collection("small", manual=False)
        small.put(b"a", b"1")


def test_a_first_copy_cut_by_kill9_goes_on_after_the_restart(
    tmp_path: Path, primary: Server, servers: list[Server], monkeypatch: pytest.MonkeyPatch
) -> None:
    _big_collection_with_collected_history(primary)
    replica = Server(tmp_path / "replica", "--replica-of", primary.url)
    servers.append(replica)
    monkeypatch.setenv(CRASH_AT_ENV, "first-copy-batch")
    replica.start(wait=False)
    assert replica.process is not None
    replica.process.wait(120)  # it killed itself after the first batch of the big collection
    monkeypatch.delenv(CRASH_AT_ENV)
    replica._close()

    # what the crash left: a staged copy that reads do not see, with where it goes on
    store = Store(tmp_path / "replica", StoreConfig())
    try:
        staged = store.staged_first_copy("big")
        assert staged is not None and staged.generation_id == b"g2"
        assert staged.next_key is not None
        assert "big" not in {info.name for info in store.collections()}
    finally:
        store.close()

    replica.start()
    with primary.client() as p, replica.client() as r:
        held = converged(p, r, 120)
        assert held["big"] == [b"g2"]
        assert (
            len(list(r.collection("big").query(generation_id=b"g2", limit=10_000)))
            == KEYS - (KEYS + 6) // 7 + 100
        )


def test_a_staged_copy_is_invisible_until_its_last_batch(tmp_path: Path) -> None:
    store = Store(tmp_path / "data", StoreConfig())
    try:
        store.become_replica("http://primary", "r1")
        staged = store.stage_first_copy("c", True, b"g2")
        assert staged is not None and staged.next_key is None
        assert store.stage_first_copy_batch("c", b"g2", [(b"a", b"1"), (b"b", b"2")], b"c")
        assert store.collections() == []
        with pytest.raises(NoSuchCollection):
            store.collection("c")
        # the same copy is found again (a restart resumes it); another generation starts over
        again = store.stage_first_copy("c", True, b"g2")
        assert again is not None and again.next_key == b"c"
        assert store.finish_first_copy(ReplicaGeneration("c", True, None, b"g2", [(b"c", b"3")], floor=True))
        assert store.staged_first_copy("c") is None
        c = store.collection("c")
        assert c.generation_id == b"g2"
        assert [(r.key, r.value) for r in c.query_page(limit=10).items] == [
            (b"a", b"1"),
            (b"b", b"2"),
            (b"c", b"3"),
        ]
        assert store.stage_first_copy("c", True, b"g2") is None  # copied already
    finally:
        store.close()


def test_generation_records_in_pairs_are_the_objects_form(primary: Server) -> None:
    with primary.client() as p:
        c = p.create_collection("c", manual=True)
        c.start_generation(b"g1")
        c.put_many([(b"a", b"1"), (b"b\xff", b"\x00"), (b"c", b"3")], generation_id=b"g1")
        c.commit_generation(b"g1")
        c.start_generation(b"g2")
        c.put_many([(b"c", None)], generation_id=b"g2")
        c.commit_generation(b"g2")
    url = f"{primary.url}/collections/c/generations/records"
    ask = {"generationId": {"value": "g1"}, "limit": 2}
    objects = httpx.post(url, json=ask).json()
    pairs = httpx.post(url, json=ask | {"pairs": True}).json()
    assert pairs["items"] == [[o["key"], o["value"]] for o in objects["items"]]
    assert pairs["nextKey"] == objects["nextKey"] == {"value": "c"}
    assert pairs["previousGenerationId"] == objects["previousGenerationId"]
    packed = httpx.post(
        url,
        content=msgpack.packb({"generationId": b"g2", "pairs": True}),
        headers={"Content-Type": "application/msgpack", "Accept": "application/msgpack"},
    )
    assert msgpack.unpackb(packed.content)["items"] == [[b"c", None]]  # a tombstone: nil
    with primary.client() as p:  # the client reads both forms alike
        records = p.collection("c").generation_records(b"g1", visible=True)
        assert records.records == [(b"a", b"1"), (b"b\xff", b"\x00"), (b"c", b"3")]
        before = httpx.post(url, json={"generationId": {"value": "g2"}}).json()
        refused = httpx.post(url, json={"generationId": {"value": "g2"}, "pairs": "yes"})
        assert refused.status_code == 400 and refused.json()["error"] == "invalidRequest"
        assert httpx.post(url, json={"generationId": {"value": "g2"}}).json() == before
        assert [(r.key, r.value) for r in p.collection("c").query(generation_id=b"g2")] == [
            (b"a", b"1"),
            (b"b\xff", b"\x00"),
        ]


def test_a_staged_copy_is_dropped_by_the_follower_and_by_a_promotion(tmp_path: Path) -> None:
    store = Store(tmp_path / "data", StoreConfig())
    try:
        store.become_replica("http://primary", "r1")
        for name in ("a", "b"):
            store.stage_first_copy(name, False, b"\x00" * 7 + b"\x05")
            assert store.stage_first_copy_batch(name, b"\x00" * 7 + b"\x05", [(b"k", b"v")], b"l")
        store.delete_collection("a", replica_copy=True)  # the follower drops it: copied again later
        assert store.staged_first_copy("a") is None
        assert not store.stage_first_copy_batch("a", b"\x00" * 7 + b"\x05", [(b"l", b"v")], None)
        # another generation of the same collection starts the copy over
        again = store.stage_first_copy("b", False, b"\x00" * 7 + b"\x09")
        assert again is not None and again.next_key is None
        store.promote_replica()  # never to be finished: a promoted store holds no copy under way
        assert store.staged_first_copy("b") is None
        assert store.collections() == []
        store.create_collection("b", manual=True)  # the name is free for the new primary's own
    finally:
        store.close()
