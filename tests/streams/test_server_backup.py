"""The stream server's data directory backed up and compacted with the same commands as a diffstore
store (``diffstore backup --data`` tells the kinds apart), through real subprocesses and real LMDB files."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from diffstore.engine import storage
from diffstore.streams.server.store import EARLIEST, StreamStore, SubscriptionInfo

DEADLINE_S = 120.0


def cli(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "diffstore", *argv], capture_output=True, text=True, timeout=DEADLINE_S
    )


def state(path: Path) -> tuple[object, ...]:
    store = StreamStore(path)
    try:
        shards = store.shards("s")
        batches = []
        for shard in shards:
            batch = store.next_batch(shard.shard_id, 0)
            while batch is not None:
                batches.append(batch)
                batch = store.next_batch(shard.shard_id, batch.batch_id + 1)
        return (
            store.list_streams(),
            shards,
            batches,
            store.list_subscriptions(),
            store.positions("sub"),
        )
    finally:
        store.close()


def make(path: Path) -> None:
    store = StreamStore(path)
    try:
        store.create_stream("s", 1, 0, 2, 1)
        for shard in store.shards("s"):
            for n in range(50):
                store.append("s", shard.shard_id, 1, b"record %d of shard %d" % (n, shard.shard_id) * 20)
        store.create_subscription(SubscriptionInfo("sub", "s", 30, 100, EARLIEST, 2))
    finally:
        store.close()


def test_a_stream_server_directory_is_backed_up_and_compacted_like_a_store(tmp_path: Path) -> None:
    source = tmp_path / "hstream-data"
    make(source)
    before = state(source)
    done = cli("backup", "--data", str(source), str(tmp_path / "out"))
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("backed up a stream server store into")
    assert sorted(os.listdir(tmp_path / "out")) == ["MANIFEST.json", storage.DATA_FILE]
    assert state(tmp_path / "out") == before
    done = cli("compact", "--data", str(tmp_path / "out"))
    assert done.returncode == 0, done.stderr
    assert state(tmp_path / "out") == before
    done = cli("check", "--data", str(source))  # check covers diffstore stores only: one line
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 1 and lines == [
        f"diffstore check: {source} holds a stream server store: check verifies diffstore stores only"
        " (invalidRequest)"
    ]
    assert state(source) == before


def test_compaction_refuses_while_the_stream_server_has_its_directory_open(tmp_path: Path) -> None:
    source = tmp_path / "hstream-data"
    make(source)
    before = state(source)
    store = StreamStore(source)  # as `diffstore streams serve` holds it
    try:
        done = cli("compact", "--data", str(source))
        lines = done.stderr.strip().splitlines()
        assert done.returncode == 1 and len(lines) == 1 and "is open in another process" in lines[0], (
            done.stderr
        )
    finally:
        store.close()
    assert state(source) == before
