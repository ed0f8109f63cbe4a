"""Takeover of highly available ingestors (issue 17): how long after a ``kill -9`` of the active
``diffstore ingest`` the standby is active again, and what a waiting standby costs.

Two ingestor processes (``--data``, one embedded store) consume one subscription of an embedded
HStream-compatible server (``diffstore streams serve`` in its own process) while a producer appends a steady
trickle of records. For each lease ttl T and each trial, the active one is SIGKILLed and we measure:

- **acquired**: kill → the standby prints ``ingest: active`` (it holds the lease);
- **first commit**: kill → its first committed window (it consumes and commits again).

Both are printed with their ratio to T (the baseline: the takeover cannot come before the dead one's lease
expires, at most T after its last renewal) and their excess over T (the goal: first commit within T + 1 s).
Then the **standby's CPU** over a quiet interval (``/proc/<pid>/stat``), as a share of one core, next to the
active one's in the same interval (goal: the standby ≤ 1% of a core).

The machine is shared and noisy (other jobs run): figures vary from run to run; read the ratios.

    python benchmarks/takeover.py [--ttl-ms 1000,3000,10000] [--trials 3] [--cpu-seconds 10]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import queue
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from _harness import machine, streams_serve

from diffstore import Store, StoreConfig
from diffstore.streams.client import StreamClient
from diffstore.streams.producer import BufferedProducer, ProducerConfig

TICKS = os.sysconf("SC_CLK_TCK")


class Ingestor:
    """One ``diffstore ingest`` process; its state lines (stderr) and commits (stdout) with arrival times."""

    def __init__(self, url: str, data: Path, ttl_ms: int) -> None:
        command = [
            sys.executable, "-m", "diffstore.cli", "ingest", "--hstream", url, "--subscription", "sub",
            "--collection", "C", "--data", str(data), "--create-collection", "--window-records", "1000",
            "--window-ms", "50", "--log-commits", "--lease-ttl-ms", str(ttl_ms),
        ]  # fmt: skip
        pipe = subprocess.PIPE
        self.process = subprocess.Popen(command, stdout=pipe, stderr=pipe, text=True)
        self.events: queue.Queue[tuple[float, str]] = queue.Queue()
        self.ready = threading.Event()  # set at its first state line: up, signal handlers set
        threading.Thread(target=self._read, args=(self.process.stdout, "commit"), daemon=True).start()
        threading.Thread(target=self._read, args=(self.process.stderr, "state"), daemon=True).start()

    @property
    def pid(self) -> int:
        return self.process.pid

    def _read(self, stream: object, kind: str) -> None:
        for line in stream:  # type: ignore[attr-defined]
            now = time.monotonic()
            if kind == "commit":
                with contextlib.suppress(ValueError):
                    if json.loads(line)["records"] > 0:
                        self.events.put((now, "commit"))
            elif line.startswith("ingest: active"):
                self.ready.set()
                self.events.put((now, "active"))
            elif line.startswith("ingest: standby"):
                self.ready.set()

    def wait_for(self, what: str, after: float, deadline_s: float = 120.0) -> float:
        end = time.monotonic() + deadline_s
        while True:
            left = end - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"ingestor {self.pid}: no {what!r}")
            with contextlib.suppress(queue.Empty):
                at, event = self.events.get(timeout=min(left, 1.0))
                if event == what and at >= after:
                    return at

    def cpu_s(self) -> float:
        fields = Path(f"/proc/{self.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / TICKS  # utime + stime

    def kill(self) -> None:
        self.process.send_signal(signal.SIGKILL)
        self.process.wait()

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.kill()


def holder(data: Path) -> int | None:
    with Store.open(data, StoreConfig(background=False)) as store:
        for lease in store.collection("C").leases():
            if lease.owner is not None:
                return int(lease.owner.split(":")[1])
    return None


def trickle(url: str, stop: threading.Event) -> None:
    """Appends ~200 records/s until ``stop``."""
    with StreamClient(url) as client, BufferedProducer(client, "s", ProducerConfig(linger_ms=5)) as producer:
        n = 0
        while not stop.is_set():
            producer.append(b"%d" % n, key=f"k{n % 50}")
            n += 1
            time.sleep(0.005)


def measure(url: str, data: Path, ttl_ms: int, trials: int, cpu_seconds: float) -> None:
    pair = [Ingestor(url, data, ttl_ms), Ingestor(url, data, ttl_ms)]
    acquired: list[float] = []
    committed: list[float] = []
    try:
        for _ in range(trials):
            start = time.monotonic()
            for ingestor in pair:
                if not ingestor.ready.wait(120):
                    raise TimeoutError(f"ingestor {ingestor.pid} did not start")
            pid = None
            while pid is None or pid not in {i.pid for i in pair}:
                pid = holder(data)
                time.sleep(0.05)
            active = next(i for i in pair if i.pid == pid)
            standby = next(i for i in pair if i.pid != pid)
            active.wait_for("commit", after=start)
            killed_at = time.monotonic()
            active.kill()
            acquired.append(standby.wait_for("active", after=killed_at) - killed_at)
            committed.append(standby.wait_for("commit", after=killed_at) - killed_at)
            pair = [standby, Ingestor(url, data, ttl_ms)]
        # the standby's cost while the active one works
        pair[1].ready.wait(120)
        time.sleep(ttl_ms / 1000 + 1)  # past the replacement's start-up (imports), into its steady wait
        before = [i.cpu_s() for i in pair]
        time.sleep(cpu_seconds)
        spent = [i.cpu_s() - b for i, b in zip(pair, before, strict=True)]
    finally:
        for ingestor in pair:
            ingestor.stop()
    ttl_s = ttl_ms / 1000
    for name, values in (("acquired", acquired), ("first commit", committed)):
        median = statistics.median(values)
        print(
            f"T={ttl_ms:>6} ms  {name:<12}: median {median:6.2f} s  max {max(values):6.2f} s"
            f"  = {median / ttl_s:.2f}x T   (max - T = {max(values) - ttl_s:+.2f} s; goal <= +1 s)"
        )
    active_share, standby_share = (s / cpu_seconds * 100 for s in spent)
    print(
        f"T={ttl_ms:>6} ms  CPU over {cpu_seconds:.0f} s: standby {standby_share:.2f}% of a core"
        f" (goal <= 1%), active {active_share:.2f}%"
        f" (standby/active = {standby_share / max(active_share, 1e-9):.3f})"
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--ttl-ms", default="1000,3000,10000")
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--cpu-seconds", type=float, default=10.0)
    args = parser.parse_args()
    print(machine())
    print("(a shared, noisy machine: read the ratios; figures vary between runs)")
    with tempfile.TemporaryDirectory() as tmp:
        with streams_serve(Path(tmp) / "hstream", quiet=True) as url:
            with StreamClient(url) as client:
                client.create_stream("s", shard_count=2)
                client.create_subscription("sub", "s")
            stop = threading.Event()
            producer = threading.Thread(target=trickle, args=(url, stop), daemon=True)
            producer.start()
            try:
                for n, ttl in enumerate(int(t) for t in args.ttl_ms.split(",")):
                    measure(url, Path(tmp) / f"db{n}", ttl, args.trials, args.cpu_seconds)
            finally:
                stop.set()
                producer.join(30)


if __name__ == "__main__":
    main()
