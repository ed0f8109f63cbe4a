"""Several processes over one store: every SPEC rule holds across processes (real subprocesses, real LMDB)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from diffstore import Store, StoreConfig
from diffstore.engine import writes
from diffstore.errors import StorageError
from tests.helpers import close_pipes, wait_until

WORKER = Path(__file__).with_name("proc_worker.py")
ROOT = Path(__file__).resolve().parents[2]
DEADLINE_S = 60.0


def spawn(*args: object) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen(
        [sys.executable, str(WORKER), *map(str, args)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


def result(proc: subprocess.Popen[str]) -> object:
    out, err = proc.communicate(timeout=DEADLINE_S)
    assert proc.returncode == 0, err
    return json.loads(out.strip().splitlines()[-1])


def gen(n: int) -> bytes:
    return n.to_bytes(8, "big")


def test_two_processes_racing_the_lifecycle_of_one_manual_collection(tmp_path: Path) -> None:
    path = tmp_path / "store"
    with Store.open(path, StoreConfig(background=False)) as store:
        store.create_collection("m", manual=True, initial_generation_id=gen(0))
    rounds = 150
    procs = [spawn("race", path, me, rounds) for me in (0, 1)]
    for proc in procs:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    for proc in procs:
        assert proc.stdin is not None
        proc.stdin.write("go\n")
        proc.stdin.flush()
    outcomes = [result(proc) for proc in procs]
    committed: dict[int, int] = {}
    refused = 0
    for me, done in enumerate(outcomes):
        assert isinstance(done, list) and len(done) == rounds
        for g, step, code in done:
            if code is None:
                if step == "commit":
                    committed[g] = me
                continue
            # only starting can be refused (the other's generation is open, or ours is outdated): once a
            # process has opened its generation, nobody else can write, commit or abort it
            assert step == "start", (g, step, code)
            assert code == "outdatedGeneration", (g, step, code)
            refused += 1
    assert committed and refused, "the two processes never raced"
    with Store.open(path, StoreConfig(background=False)) as store:
        c = store.collection("m")
        assert c.next_generation_id is None
        assert c.generation_id == gen(max(committed))
        written = {r.key: r.value for r in c.query()}
        # every committed generation is there, whole, with its owner's writes only; aborted ones are not
        expected = {b"g-%d" % g: b"%d" % me for g, me in committed.items()}
        assert {k: v for k, v in written.items() if k.startswith(b"g-")} == expected
        for g, me in committed.items():
            assert c.get(b"owner", generation_id=gen(g)).value == b"%d" % me  # type: ignore[union-attr]


def test_a_non_manual_collection_written_by_several_processes(tmp_path: Path) -> None:
    path = tmp_path / "store"
    with Store.open(path, StoreConfig(background=False)) as store:
        store.create_collection("n", manual=False)
    count = 150
    procs = [spawn("write_auto", path, me, count) for me in range(3)]
    admitted = [result(proc) for proc in procs]
    # seqNo dedup holds across processes: each seqNo of producer p was admitted exactly once
    assert sorted(n for got in admitted for n in got) == list(range(1, count + 1))  # type: ignore[union-attr]
    with Store.open(path, StoreConfig(background=True, commit_delay_ms=2, gc_interval_ms=20)) as store:
        c = store.collection("n")
        keys = {b"p%d-%05d" % (me, i) for me in range(3) for i in range(count)} | {b"seq"}
        # the last writes of each process were left due when it exited: this store's worker commits them
        wait_until(lambda: {r.key for r in c.query()} == keys, DEADLINE_S, what="every write committed")
        current = int.from_bytes(c.generation_id, "big")
        # every generation was committed once: none is empty, and every write is in exactly one of them
        seen: list[bytes] = []
        for g in range(1, current + 1):
            changed = [item.key for item in c.diff(gen(g - 1), gen(g))]
            assert changed, f"generation {g} was committed empty"
            seen += [k for k in changed if k != b"seq"]
        assert sorted(seen) == sorted(keys - {b"seq"})


def test_writes_left_due_by_a_process_that_exited_are_committed_by_another(tmp_path: Path) -> None:
    path = tmp_path / "store"
    with Store.open(path, StoreConfig(background=True, commit_delay_ms=1, gc_interval_ms=20)) as store:
        c = store.create_collection("n", manual=False)
        assert result(spawn("write_pending", path)) == "done"
        wait_until(lambda: c.get(b"left") is not None, DEADLINE_S, what="the left-behind write committed")
        assert c.generation_id == gen(1)


def test_a_commit_in_another_process_reaches_this_process_listeners(tmp_path: Path) -> None:
    path = tmp_path / "store"
    with Store.open(path, StoreConfig(background=False)) as store:
        store.create_collection("m", manual=True, initial_generation_id=gen(0))
        heard: list[tuple[str, bytes]] = []
        got = threading.Event()

        def listener(name: str, generation_id: bytes) -> None:
            heard.append((name, generation_id))
            got.set()

        store.add_commit_listener(listener)
        result(spawn("commit_once", path, 1))
        assert got.wait(DEADLINE_S)
        assert heard == [("m", gen(1))]
        assert store.collection("m").generation_id == gen(1)


def test_a_dead_process_reader_slot_is_cleared(tmp_path: Path) -> None:
    path = tmp_path / "store"
    with Store.open(path, StoreConfig(background=True, gc_interval_ms=20)) as store:
        store.create_collection("m")
        holder = spawn("hold_reader", path)
        assert holder.stdout is not None and holder.stdout.readline().strip() == "ready"
        assert str(holder.pid) in store.env.readers()
        holder.send_signal(signal.SIGKILL)
        holder.wait(DEADLINE_S)
        close_pipes(holder)
        # its snapshot would keep every page freed since from being reused, so the file would only grow
        wait_until(
            lambda: str(holder.pid) not in store.env.readers(),
            DEADLINE_S,
            what="the dead reader's slot cleared",
        )
        assert store.stale_readers_cleared >= 1


def test_a_failing_automatic_commit_is_retried_and_reported(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    failures = [2]
    commit_automatic = writes.commit_automatic

    def flaky(txn, tables, meta, now_ms=None):  # type: ignore[no-untyped-def]
        if meta.name == "bad" and failures[0] > 0:
            failures[0] -= 1
            raise StorageError("MDB_MAP_FULL: Environment mapsize limit reached")
        return commit_automatic(txn, tables, meta, now_ms)

    monkeypatch.setattr(writes, "commit_automatic", flaky)
    with Store.open(tmp_path / "store", StoreConfig(background=False, commit_delay_ms=0)) as store:
        bad = store.create_collection("bad", manual=False)
        good = store.create_collection("good", manual=False)
        bad.put(b"k", b"v")
        good.put(b"k", b"v")
        assert store.health().ok
        start = time.monotonic()  # the failure's backoff (50 ms) is counted from after this
        store.run_background_once()
        # the other collection due in the same pass was committed; the failed one is kept, and reported
        assert good.generation_id == gen(1)
        assert bad.generation_id == gen(0)
        health = store.health()
        assert not health.ok and health.auto_commit_failures == 1
        assert "bad" in (health.reason or "") and "MDB_MAP_FULL" in (health.reason or "")
        # within the backoff, however long the checks above took on a loaded machine: not tried again
        store.run_background_once(start)
        assert store.health().auto_commit_failures == 1
        store.run_background_once(time.monotonic() + 60)  # after the backoff: fails again
        assert store.health().auto_commit_failures == 2 and bad.generation_id == gen(0)
        store.run_background_once(time.monotonic() + 60)  # and succeeds
        assert bad.generation_id == gen(1)
        assert bad.get(b"k").value == b"v"  # type: ignore[union-attr]
        health = store.health()
        assert health.ok and health.auto_commit_failures == 2


def test_a_registration_left_by_a_dead_process_is_removed_by_the_next_commit(tmp_path: Path) -> None:
    path = tmp_path / "store"
    with Store.open(path, StoreConfig(background=False)) as store:
        coll = store.create_collection("m", manual=True)
        (path / "wake").mkdir()
        stale = path / "wake" / "0123456789abcdef0123456789abcdef"  # no socket of that name exists
        stale.touch()
        coll.start_generation(b"1")
        coll.commit_generation(b"1")
        assert not stale.exists()
