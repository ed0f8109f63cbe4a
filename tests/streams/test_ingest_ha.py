"""Two ``diffstore ingest`` processes on one subscription and collection, SIGKILLed again and again (#17).

Both run all the time: one holds the lease ``ingest:sub`` of C and consumes, the other stands by. After each
round of produced records has started to commit, the active one (mostly) or the standby is SIGKILLed at a
random moment and a fresh process replaces it; the standby takes over once the dead one's lease expired.
At the end:

- C holds, per key, the payload of that key's last record (final values exact);
- the mapper also writes ``rec/<seq>`` with a value unique to each application (pid and a counter), so a
  record applied twice, by two owners across a takeover, would show in two generations' diffs: every
  sequence number appears in exactly one;
- the lease's version counts at least one acquire per takeover.

Runs against an embedded store shared by both processes (``--data``) and against a diffstore server
(``--url``), with the real embedded HStream-compatible server.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import queue
import random
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from test_ingest import http_server

from diffstore.client import Client
from diffstore.collection import Collection
from diffstore.engine import Store, StoreConfig
from diffstore.streams.client import StreamClient
from diffstore.streams.producer import BufferedProducer, ProducerConfig
from diffstore.streams.records import RecordId, RecordPosition
from tests.helpers import close_pipes

TOTAL = 12_000
KEYS = 40
KILLS = ("active", "active", "standby", "active", "standby", "active")  # which one each round kills
LEASE_TTL_MS = 800
WAIT_S = 90.0
HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]


class Ingestors:
    """The ingestor processes of one test and their commit lines (read by one thread per process)."""

    def __init__(self, url: str, destination: list[str], options: tuple[str, ...] = ()) -> None:
        self.url = url
        self.destination = destination
        self.options = options  # more ingest flags
        self.alive: dict[int, subprocess.Popen[str]] = {}
        self.lines: queue.Queue[tuple[int, dict[str, Any]]] = queue.Queue()
        self.all: list[subprocess.Popen[str]] = []
        self.ready: dict[int, threading.Event] = {}
        self.log: list[str] = []  # the processes' stderr lines (shown when the test fails)

    def start(self) -> subprocess.Popen[str]:
        command = [
            sys.executable, "-m", "diffstore.streams.ingest_cli", "--hstream", self.url, "--subscription",
            "sub", "--collection", "C", *self.destination, "--create-collection", "--window-records", "500",
            "--window-ms", "30", "--mapper", "ingest_helpers:tracing_mapper", "--log-commits",
            "--lease-ttl-ms", str(LEASE_TTL_MS), *self.options,
        ]  # fmt: skip
        path = [str(HERE), str(REPO), os.environ.get("PYTHONPATH", "")]
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(path))
        pipe = subprocess.PIPE
        process = subprocess.Popen(command, stdout=pipe, stderr=pipe, text=True, env=env)
        self.alive[process.pid] = process
        self.all.append(process)
        self.ready[process.pid] = threading.Event()
        threading.Thread(target=self._read, args=(process,), daemon=True).start()
        threading.Thread(target=self._read_state, args=(process,), daemon=True).start()
        return process

    def _read(self, process: subprocess.Popen[str]) -> None:
        assert process.stdout is not None
        for line in process.stdout:
            with contextlib.suppress(ValueError):
                self.lines.put((process.pid, json.loads(line)))

    def _read_state(self, process: subprocess.Popen[str]) -> None:
        """Marks the process ready at its first state line (standby/active): its signal handlers are set."""
        assert process.stderr is not None
        for line in process.stderr:
            self.log.append(f"{process.pid}: {line.rstrip()}")
            if line.startswith("ingest: "):
                self.ready[process.pid].set()

    def drain(self) -> None:
        """Forgets the commit lines read so far."""
        with contextlib.suppress(queue.Empty):
            while True:
                self.lines.get_nowait()

    def next_commit(self, deadline: float) -> tuple[int, dict[str, Any]]:
        while True:
            left = deadline - time.monotonic()
            assert left > 0, "no commit before the deadline:\n" + "\n".join(self.log[-40:])
            with contextlib.suppress(queue.Empty):
                pid, line = self.lines.get(timeout=min(left, 1.0))
                if line.get("records", 0) > 0 and pid in self.alive:
                    return pid, line

    def kill(self, pid: int) -> None:
        process = self.alive.pop(pid)
        process.send_signal(signal.SIGKILL)
        process.wait(WAIT_S)

    def stop(self) -> None:
        for pid in self.alive:
            assert self.ready[pid].wait(WAIT_S), "an ingestor did not start"
        for process in self.alive.values():
            process.terminate()
        for process in list(self.alive.values()):
            assert process.wait(WAIT_S) == 0
        self.alive.clear()

    def close(self) -> None:
        for process in self.all:
            if process.poll() is None:
                process.kill()
                process.wait()
            close_pipes(process)


def stored_positions(collection: Collection) -> dict[int, tuple[int, int]]:
    """The committed position of each shard: the readers ``hstream/sub/<shard>`` of C."""
    found = {}
    for reader in collection.readers():
        if reader.name.startswith("hstream/sub/") and reader.generation_id:
            position = RecordPosition.from_bytes(reader.generation_id)
            found[int(reader.name.rsplit("/", 1)[1])] = (position.batch_id, position.batch_index)
    return found


def reached(positions: dict[int, tuple[int, int]], target: dict[int, tuple[int, int]]) -> bool:
    return all(positions.get(shard, (0, 0)) >= pos for shard, pos in target.items())


def holder_pid(collection: Collection) -> int | None:
    for lease in collection.leases():
        if lease.name == "ingest:sub" and lease.owner is not None:
            return int(lease.owner.split(":")[1])
    return None


@contextlib.contextmanager
def target_collection(kind: str, tmp_path: Path) -> Iterator[tuple[list[str], Collection]]:
    """The ingestors' destination arguments and a handle on C to watch and check."""
    if kind == "data":
        with Store.open(tmp_path / "db", StoreConfig(background=False)) as store:
            yield ["--data", str(tmp_path / "db")], store.create_collection("C", manual=True)
    else:
        with http_server(tmp_path / "db") as url, Client(url) as client:
            yield ["--url", url], client.create_collection("C", manual=True)


def check_exactly_once(collection: Collection, expected: dict[bytes, bytes], total: int = TOTAL) -> None:
    assert collection.generation_state()[1] is None
    final = {r.key: r.value for r in collection.query() if not r.key.startswith(b"rec/")}
    assert final == expected
    current = collection.generation_id
    # generation ids are an 8-byte counter (then the lease version): one committed generation per counter
    bounds = [b""] + [n.to_bytes(8, "big") for n in range(1, int.from_bytes(current[:8], "big") + 1)]
    bounds.append(current)
    seen: dict[bytes, bytes] = {}
    for low, high in itertools.pairwise(bounds):
        if low == high:
            continue
        for item in collection.diff(from_generation_id=low, to_generation_id=high):
            if item.key.startswith(b"rec/"):
                assert item.key not in seen, (
                    f"{item.key!r} applied in {seen[item.key]!r} and again by {high!r}"
                )
                seen[item.key] = high
    assert set(seen) == {b"rec/%08d" % seq for seq in range(total)}


@pytest.mark.parametrize("kind", ["data", "url"])
def test_two_ingestors_under_repeated_sigkill_apply_every_record_exactly_once(
    stream_server: Any, tmp_path: Path, kind: str
) -> None:
    rng = random.Random(17)
    expected: dict[bytes, bytes] = {}
    ids: list[RecordId] = []
    takeovers = 0
    with (
        target_collection(kind, tmp_path) as (destination, collection),
        StreamClient(stream_server.url) as client,
    ):
        client.create_stream("s", shard_count=2)
        client.create_subscription("sub", "s", ack_timeout_s=4, max_unacked_records=20_000)
        ingestors = Ingestors(stream_server.url, destination)
        try:
            ingestors.start()
            ingestors.start()
            with BufferedProducer(
                client, "s", ProducerConfig(batch_max_records=200, linger_ms=1000)
            ) as producer:
                seqs = iter(range(TOTAL))
                for plan in KILLS:
                    ingestors.drain()
                    futures = []
                    for seq in itertools.islice(seqs, TOTAL // len(KILLS)):
                        key = f"key-{rng.randrange(KEYS)}"
                        payload = b"%08d" % seq
                        expected[key.encode()] = payload
                        futures.append(producer.append(payload, key=key))
                    producer.flush()
                    ids.extend(f.result() for f in futures)
                    ingestors.next_commit(time.monotonic() + WAIT_S)
                    time.sleep(rng.uniform(0.0, 0.2))  # a random moment, not a wait for a condition
                    active = holder_pid(collection)
                    assert active in ingestors.alive, (active, list(ingestors.alive))
                    standby = next(pid for pid in ingestors.alive if pid != active)
                    victim = active if plan == "active" else standby
                    takeovers += victim == active
                    ingestors.kill(victim)
                    ingestors.start()
            assert len(ids) == TOTAL and takeovers == 4
            target: dict[int, tuple[int, int]] = {}
            for rid in ids:
                target[rid.shard_id] = max(target.get(rid.shard_id, (0, 0)), (rid.batch_id, rid.batch_index))
            # the positions stored in C, not commit lines: the last records may have been committed by an
            # ingestor killed before it acked them (its successor then only acks them)
            deadline = time.monotonic() + WAIT_S
            while not reached(stored_positions(collection), target):
                assert time.monotonic() < deadline, "the positions in C did not reach the last records"
                time.sleep(0.05)
            ingestors.stop()  # SIGTERM: both exit 0, the active one releases the lease
        finally:
            ingestors.close()
        lease = collection.leases()[0]
        assert lease.owner is None and lease.version >= 1 + takeovers
        check_exactly_once(collection, expected)
