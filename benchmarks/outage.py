"""Riding out a restart of ``diffstore serve`` (issue 54): how soon ``diffstore ingest --url`` commits again
once its server is back, against a supervisor's restart of an ingestor that exited.

An embedded streams server (``diffstore streams serve``) gets a steady trickle of records; one ingestor
(``--url``, ``--lease-ttl-ms 0``: a single ingestor, so that no lease expiry is part of either figure)
consumes it into a ``diffstore serve`` process. Each trial SIGKILLs the server, keeps it down for
``--outage-s`` and starts it again on the same port and data directory; ``back`` is when ``/healthz`` answers
again. Measured:

- **ours**: ``back`` → the first window the running ingestor commits (it rode the outage out with the
  back-off of ``diffstore.backoff``: 0.2 s doubling to 5 s, with jitter);
- **baseline**: the same, for a fresh ingestor started at ``back`` -- what the old behaviour (exit 1 at the
  first refused call) gave at best, with a supervisor that restarts it at once.

The machine is shared and noisy: read the ratio, not the absolute figures.

    python benchmarks/outage.py [--trials 3] [--outage-s 3]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import queue
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from _harness import (
    diffstore_command,
    free_port,
    healthy,
    machine,
    median,
    ratio_line,
    stop,
    streams_serve,
    wait_for,
)

from diffstore.streams.client import StreamClient
from diffstore.streams.producer import BufferedProducer, ProducerConfig


class Server:
    """``diffstore serve`` on a fixed port, started again after a kill."""

    def __init__(self, data: Path) -> None:
        self.data, self.port = data, free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> float:
        """Starts it; returns when ``/healthz`` answered (monotonic)."""
        command = [*diffstore_command(), "serve", "--data", str(self.data), "--port", str(self.port)]
        command += ["--workers", "1"]
        self.process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_for(lambda: healthy(self.url), "diffstore serve to start", process=self.process, interval_s=0.01)
        return time.monotonic()

    def kill(self) -> None:
        assert self.process is not None
        self.process.kill()
        self.process.wait()


class Ingestor:
    """One ``diffstore ingest --log-commits`` process; the arrival time of each commit with records."""

    def __init__(self, hstream: str, url: str) -> None:
        command = [
            *diffstore_command(), "ingest", "--hstream", hstream, "--subscription", "sub",
            "--collection", "C", "--url", url, "--create-collection", "--window-ms", "50", "--log-commits",
            "--lease-ttl-ms", "0",
        ]  # fmt: skip
        self.process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        self.commits: queue.Queue[float] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            with contextlib.suppress(ValueError, KeyError):
                if json.loads(line)["records"] > 0:
                    self.commits.put(time.monotonic())

    def commit_after(self, moment: float, deadline_s: float = 120.0) -> float:
        """Seconds from ``moment`` to the first commit that arrived after it."""
        end = time.monotonic() + deadline_s
        while True:
            at = self.commits.get(timeout=max(0.0, end - time.monotonic()))
            if at > moment:
                return at - moment

    def alive(self) -> bool:
        return self.process.poll() is None


def trickle(hstream: str, stop_event: threading.Event) -> None:
    """50 records every 20 ms until stopped."""
    with (
        StreamClient(hstream) as client,
        BufferedProducer(client, "s", ProducerConfig(linger_ms=5)) as producer,
    ):
        seq = 0
        while not stop_event.wait(0.02):
            for _ in range(50):
                producer.append(b"%d" % seq, key=f"k{seq % 100}")
                seq += 1


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--outage-s", type=float, default=3.0)
    args = parser.parse_args()
    print(machine())
    with tempfile.TemporaryDirectory() as tmp, streams_serve(Path(tmp) / "hstream", quiet=True) as hstream:
        with StreamClient(hstream) as client:
            client.create_stream("s", shard_count=2)
            client.create_subscription("sub", "s")
        server = Server(Path(tmp) / "db")
        server.start()
        stop_event = threading.Event()
        producer = threading.Thread(target=trickle, args=(hstream, stop_event), daemon=True)
        producer.start()
        ingestor = Ingestor(hstream, server.url)
        ours: list[float] = []
        baseline: list[float] = []
        try:
            ingestor.commit_after(time.monotonic())
            for trial in range(args.trials):
                # ours: the ingestor keeps running through the outage
                server.kill()
                time.sleep(args.outage_s)  # the outage's length
                back = server.start()
                ours.append(ingestor.commit_after(back))
                assert ingestor.alive(), "the ingestor exited during the outage"
                # baseline: the ingestor dies with the server and is started again once it is back
                stop(ingestor.process)
                server.kill()
                time.sleep(args.outage_s)
                back = server.start()
                ingestor = Ingestor(hstream, server.url)
                baseline.append(ingestor.commit_after(back))
                print(f"trial {trial + 1}: ours {ours[-1]:.2f} s, restarted ingestor {baseline[-1]:.2f} s")
        finally:
            stop_event.set()
            stop(ingestor.process)
            if server.process is not None:
                stop(server.process)
    print(
        ratio_line(
            "commit after restart",
            median(ours),
            median(baseline),
            "s",
            f"median of {args.trials}; baseline: a fresh ingestor started when the server is back",
        )
    )


if __name__ == "__main__":
    sys.exit(main())
