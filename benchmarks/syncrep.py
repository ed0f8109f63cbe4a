"""Synchronous replication (issue 50 item 4): what ``serve --synchronous 1`` costs, and what it saves.

A primary and one replica (``diffstore serve --replica-of``), each its own process with one worker, on
this machine; every figure is measured twice in the same run, on a primary started with
``--synchronous 1`` and on one without (the baseline), over fresh data directories.

- **Commit rate**: writers commit small manual generations (``--records`` records each: start, putMany,
  commit) as fast as they can for ``--seconds``: one writer, then ``--writers`` writers on a collection
  each. Goal: with ``--synchronous 1`` >= 0.5x the rate without.
- **Long-poll wake-up**: a long poll on the primary (``generationId/stream``) waits while a generation of
  1,000 changes is committed; latency = the poll's answer - the commit request's sending (a synchronous
  commit's answer comes after the replica applied it; the long poll must not wait for that).
  Goal: p99 with ``--synchronous 1`` <= 1.1x without.
- **The window a crash loses**: a writer commits continuously on the primary; the primary is killed
  (SIGKILL) at a random moment; then the replica (which can no longer reach it) is read. Lost =
  generations the writer saw acknowledged that the replica has not applied. ``--kills`` times each way.
  Goal: 0 with ``--synchronous 1``; without, the figure is reported (docs/replicas.md).

The machine is shared: read the ratios, and the load average printed with them.

    python benchmarks/syncrep.py [--seconds 10] [--records 10] [--writers 4] [--trials 100] [--kills 10]
        [--only rate,wake,window]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import signal
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from _harness import Served, diffstore_serve, machine, ratio_line

from diffstore.client import Client
from diffstore.errors import DiffstoreError, NoSuchCollection

SERVE = ("--workers", "1", "--log-level", "warning", "--commit-delay-ms", "20")
MODES = {"without": (), "synchronous 1": ("--synchronous", "1", "--synchronous-timeout-s", "30")}


@contextlib.contextmanager
def pair(mode: tuple[str, ...]) -> Iterator[tuple[Served, Served]]:
    with tempfile.TemporaryDirectory(prefix="syncrep-") as tmp:
        with diffstore_serve(Path(tmp) / "primary", *SERVE, *mode) as primary:
            replica_args = ("--replica-of", primary.url)
            with diffstore_serve(Path(tmp) / "replica", *SERVE, *replica_args) as replica:
                yield primary, replica


def copied(replica: Served, names: list[str]) -> None:
    """Waits until the replica holds every collection of ``names`` (its first copies are done)."""
    with Client(replica.url) as r:
        deadline = time.monotonic() + 120
        while not {info.name for info in r.collections()} >= set(names):
            if time.monotonic() > deadline:
                raise SystemExit("the replica never copied the collections")
            time.sleep(0.01)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def commit_rate(url: str, names: list[str], seconds: float, records: int, run: int) -> float:
    """Commits per second of one writer per collection of ``names``, together (``run`` numbers the
    generations above those of earlier runs on the same collections)."""
    counts = [0] * len(names)
    stop = time.monotonic() + seconds

    def write(index: int) -> None:
        with Client(url) as client:
            c = client.collection(names[index])
            n = 0
            while time.monotonic() < stop:
                n += 1
                g = b"%02d%08d" % (run, n)
                c.start_generation(g)
                c.put_many([(b"k%d" % i, g) for i in range(records)], generation_id=g)
                c.commit_generation(g)
            counts[index] = n

    started = time.monotonic()
    threads = [threading.Thread(target=write, args=(i,)) for i in range(len(names))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return sum(counts) / (time.monotonic() - started)


def rates(seconds: float, records: int, writers: int) -> None:
    found: dict[str, dict[int, float]] = {}
    for label, mode in MODES.items():
        with pair(mode) as (primary, replica):
            names = [f"w{i}" for i in range(writers)]
            with Client(primary.url) as p:
                for name in names:
                    p.create_collection(name, manual=True)
            copied(replica, names)
            found[label] = {
                1: commit_rate(primary.url, names[:1], seconds, records, 1),
                writers: commit_rate(primary.url, names, seconds, records, 2),
            }
    for count in (1, writers):
        ours, base = found["synchronous 1"][count], found["without"][count]
        print(ratio_line(f"commits/s, {count} writer(s)", ours, base, "/s", "goal >= 0.5"))


def wake_ups(trials: int) -> None:
    items = [(b"key%06d" % i, b"value-%06d" % i) for i in range(1_000)]
    found: dict[str, list[float]] = {}
    for label, mode in MODES.items():
        with pair(mode) as (primary, replica), Client(primary.url) as p:
            a = p.create_collection("wake", manual=True)
            copied(replica, ["wake"])
            latencies: list[float] = []
            for n in range(1, trials + 1):
                current = a.generation_id
                answered: list[float] = []
                with Client(primary.url) as poller:
                    ready = threading.Event()

                    def poll(
                        poller: Client = poller,
                        current: bytes = current,
                        ready: threading.Event = ready,
                        answered: list[float] = answered,
                    ) -> None:
                        ready.set()
                        poller.wait_for_change({"wake": current}, timeout_ms=30_000)
                        answered.append(time.perf_counter())

                    thread = threading.Thread(target=poll)
                    thread.start()
                    ready.wait()
                    time.sleep(0.05)  # the poll is parked on the server
                    g = b"%08d" % n
                    a.start_generation(g)
                    a.put_many([(k, v + g) for k, v in items], generation_id=g)
                    sent = time.perf_counter()
                    a.commit_generation(g)
                    thread.join()
                latencies.append((answered[0] - sent) * 1000)
            found[label] = latencies
            print(
                f"wake-up, {label:13s}: p50 {statistics.median(latencies):6.1f} ms"
                f"  p99 {percentile(latencies, 0.99):6.1f} ms after the commit was sent ({trials} commits)"
            )
    ours, base = percentile(found["synchronous 1"], 0.99), percentile(found["without"], 0.99)
    print(ratio_line("long-poll wake-up p99", ours, base, "ms", "goal <= 1.1"))


def lost_window(kills: int, records: int) -> None:
    for label, mode in MODES.items():
        lost: list[int] = []
        for _ in range(kills):
            with pair(mode) as (primary, replica):
                with Client(primary.url) as p:
                    p.create_collection("flow", manual=True)
                copied(replica, ["flow"])
                acknowledged = [0]
                stop = threading.Event()

                def write(acknowledged: list[int] = acknowledged, stop: threading.Event = stop) -> None:
                    with Client(primary.url, timeout_s=60) as client:
                        c = client.collection("flow")
                        n = 0
                        with contextlib.suppress(DiffstoreError):  # the primary is gone
                            while not stop.is_set():
                                n += 1
                                g = b"%08d" % n
                                c.start_generation(g)
                                c.put_many([(b"k%d" % i, g) for i in range(records)], generation_id=g)
                                c.commit_generation(g)
                                acknowledged[0] = n

                writer = threading.Thread(target=write)
                writer.start()
                time.sleep(random.uniform(1.0, 2.0))  # a random moment in a continuous stream
                os.kill(primary.pid, signal.SIGKILL)
                stop.set()
                writer.join()
                applied = settled(replica.url)
                lost.append(max(0, acknowledged[0] - applied))
        print(
            f"lost at a kill -9 of the primary, {label:13s}: {lost} generations acknowledged and not on the"
            f" replica (max {max(lost)}, mean {statistics.mean(lost):.1f}; {kills} kills)"
        )


def settled(url: str) -> int:
    """The replica's generation of ``flow`` once it stopped moving (its primary is gone)."""
    with Client(url) as r:
        last, since = -1, time.monotonic()
        while time.monotonic() - since < 1.0:
            try:
                now = int(r.collection("flow").generation_id or b"0")
            except NoSuchCollection:
                now = 0
            if now != last:
                last, since = now, time.monotonic()
            time.sleep(0.02)
        return last


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--records", type=int, default=10)
    parser.add_argument("--writers", type=int, default=4)
    parser.add_argument("--trials", type=int, default=100)
    parser.add_argument("--kills", type=int, default=10)
    parser.add_argument("--only", default="rate,wake,window")
    args = parser.parse_args()
    only = set(args.only.split(","))
    print(machine())
    if "rate" in only:
        rates(args.seconds, args.records, args.writers)
    if "wake" in only:
        wake_ups(args.trials)
    if "window" in only:
        lost_window(args.kills, args.records)
    print(machine())


if __name__ == "__main__":
    sys.exit(main())
