"""The crash test of SPEC §5: an ingestor SIGKILLed at random moments still applies every record exactly once.

A producer appends 50,000 keyed records whose payloads carry their sequence number, in rounds. After each
round an ingestor subprocess (``diffstore ingest``) starts, is left to commit at least one window, and is
SIGKILLed after a random extra delay: in the middle of a window, a put_many, a commit or the acks. At the
end an in-process ingestor catches up, and the per-generation diffs are checked:

- the collection holds, per key, the payload of that key's last record;
- the mapper also writes ``rec/<seq>`` with a value unique to each application (pid and a counter), so a
  record applied twice would show in two generations' diffs: every sequence number appears in exactly one.
"""

from __future__ import annotations

import itertools
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from ingest_helpers import ingest_until, last_positions, tracing_mapper

from diffstore.engine import Store
from diffstore.streams.client import StreamClient
from diffstore.streams.ingest import IngestConfig, Ingestor
from diffstore.streams.producer import BufferedProducer, ProducerConfig
from diffstore.streams.records import RecordId, RecordPosition
from diffstore.streams.sinks import EngineSink
from tests.helpers import close_pipes

TOTAL = 50_000
KEYS = 40
ROUNDS = 12
WAIT_S = 60.0
HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]


def _start_ingestor(url: str, data_dir: Path) -> subprocess.Popen[str]:
    command = [
        sys.executable, "-m", "diffstore.streams.ingest_cli", "--hstream", url, "--subscription", "sub",
        "--collection", "C", "--data", str(data_dir), "--create-collection", "--window-records", "700",
        "--window-ms", "30", "--mapper", "ingest_helpers:tracing_mapper", "--log-commits",
        "--lease-ttl-ms", "0",  # one ingestor at a time here (tests/streams/test_ingest_ha.py runs several)
    ]  # fmt: skip
    path = [str(HERE), str(REPO), os.environ.get("PYTHONPATH", "")]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(path))
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env)


def _wait_for_a_commit(process: subprocess.Popen[str]) -> None:
    assert process.stdout is not None
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        line = process.stdout.readline()
        assert line, f"ingestor exited with {process.poll()} before committing"
        if json.loads(line)["records"] > 0:
            return
    raise AssertionError("no commit in time")


def test_sigkilled_ingestor_applies_every_record_exactly_once(stream_server: Any, tmp_path: Path) -> None:
    rng = random.Random(4)
    data_dir = tmp_path / "db"
    expected: dict[bytes, bytes] = {}
    ids: list[RecordId] = []
    kills = 0
    with StreamClient(stream_server.url) as client:
        client.create_stream("s", shard_count=2)
        client.create_subscription("sub", "s", ack_timeout_s=4, max_unacked_records=20_000)
        producer = BufferedProducer(client, "s", ProducerConfig(batch_max_records=500, linger_ms=1000))
        per_round = TOTAL // ROUNDS + 1
        seqs = iter(range(TOTAL))
        for _ in range(ROUNDS):
            futures = []
            for seq in itertools.islice(seqs, per_round):
                key = f"key-{rng.randrange(KEYS)}"
                payload = b"%08d" % seq
                expected[key.encode()] = payload
                futures.append(producer.append(payload, key=key))
            producer.flush()
            ids.extend(f.result() for f in futures)
            process = _start_ingestor(stream_server.url, data_dir)
            try:
                _wait_for_a_commit(process)
                time.sleep(rng.uniform(0.0, 0.25))  # a random moment, not a wait for a condition
                process.send_signal(signal.SIGKILL)
                kills += 1
            finally:
                if process.poll() is None:
                    process.kill()
                process.wait()
                close_pipes(process)
        producer.close()
        assert len(ids) == TOTAL and kills >= 10

        sink = EngineSink.open(data_dir, "C")
        try:
            target = last_positions(ids)
            config = IngestConfig("sub", window_records=5000, window_ms=20, mapper=tracing_mapper)
            stored = Ingestor(client, sink, config).prepare().positions  # also aborts a dead window
            if any(stored.get(s, RecordPosition(0, 0)) < p for s, p in target.items()):
                ingest_until(client, sink, config, target)
        finally:
            sink.close()

    with Store.open(data_dir) as store:
        collection = store.collection("C")
        assert collection.next_generation_id is None
        final = {r.key: r.value for r in collection.query() if not r.key.startswith(b"rec/")}
        assert final == expected
        seen: dict[bytes, int] = {}
        previous = b""
        generation = collection.generation_id
        count = int.from_bytes(generation, "big")
        for n in range(1, count + 1):
            current = n.to_bytes(8, "big")
            for item in collection.diff(from_generation_id=previous, to_generation_id=current):
                if item.key.startswith(b"rec/"):
                    assert item.key not in seen, f"{item.key!r} in generations {seen[item.key]} and {n}"
                    seen[item.key] = n
            previous = current
        assert len(seen) == TOTAL
        assert set(seen) == {b"rec/%08d" % seq for seq in range(TOTAL)}
