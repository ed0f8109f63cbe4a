"""Read replicas (issue 26): how soon a replica's long poll wakes after a primary commit, and whether a
replica keeps up with a primary that commits small generations as fast as it can.

A primary and a replica (``diffstore serve --replica-of``), each its own process with one worker, on this
machine.

- **Wake-up**: a long poll on the replica (``generationId/stream``) waits while a 1,000-change generation is
  committed on the primary; latency = the poll's answer - the commit's answer (the goal's measure: replica
  p99 <= 50 ms). A poll on the primary itself is woken before the commit's answer reaches its client, so
  for the baseline ratio both are also measured from the moment the commit request is sent.
- **Throughput**: a writer commits small generations (``--records`` records each) on the primary as fast as
  it can for ``--seconds``; the replica's applied records per second over the same span (from the start of the
  writes until it has applied the last one), with the lag (``GET /replica``) sampled every 0.5 s. Baseline:
  the primary's records per second. Goal: >= 0.5x, lag bounded.

The machine is shared: read the ratios, and the load average printed with them.

    python benchmarks/replica.py [--trials 50] [--seconds 15] [--records 10]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import threading
import time
from pathlib import Path

import httpx
from _harness import Served, diffstore_serve, machine

from diffstore.client import Client
from diffstore.errors import NoSuchCollection

SERVE = ("--workers", "1", "--log-level", "warning")


def wait_generation(url: str, name: str, generation: bytes, deadline_s: float = 60) -> None:
    with Client(url) as client:
        end = time.monotonic() + deadline_s
        while _generation(client, name) != generation:
            if time.monotonic() > end:
                raise SystemExit(f"{url} never reached {generation!r}")
            time.sleep(0.005)


def _generation(client: Client, name: str) -> bytes | None:
    try:
        return client.collection(name).generation_id
    except NoSuchCollection:  # not copied yet
        return None


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def wake_up(primary: Served, replica: Served, trials: int) -> None:
    items = [(b"key%06d" % i, b"value-%06d" % i) for i in range(1_000)]
    with Client(primary.url) as p:
        a = p.create_collection("wake", manual=True)
        latencies: dict[str, list[float]] = {"primary": [], "replica": []}
        from_sent: dict[str, list[float]] = {"primary": [], "replica": []}
        n = 0
        for trial in range(trials * 2):
            where = "replica" if trial % 2 else "primary"
            url = replica.url if where == "replica" else primary.url
            current = a.generation_id
            wait_generation(url, "wake", current)
            answered: list[float] = []
            with Client(url) as poller:
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
                n += 1
                g = b"%08d" % n
                a.start_generation(g)
                a.put_many([(k, v + g) for k, v in items], generation_id=g)
                sent = time.perf_counter()
                a.commit_generation(g)
                committed = time.perf_counter()
                thread.join()
            latencies[where].append((answered[0] - committed) * 1000)
            from_sent[where].append((answered[0] - sent) * 1000)
    for where in ("primary", "replica"):
        values = latencies[where]
        print(
            f"wake-up {where:8s}: p50 {statistics.median(values):6.1f} ms"
            f"  p99 {percentile(values, 0.99):6.1f} ms"
            f"  max {max(values):6.1f} ms after the commit's answer"
            f"; p99 {percentile(from_sent[where], 0.99):6.1f} ms after the commit was sent"
            f"  ({len(values)} commits of 1,000 changes)"
        )
    base = percentile(from_sent["primary"], 0.99)
    rep = percentile(from_sent["replica"], 0.99)
    goal = percentile(latencies["replica"], 0.99)
    print(
        f"wake-up p99 from the commit sent, replica / primary: {rep / base:.2f}x"
        f" (goal: replica p99 <= 50 ms after the commit's answer: {goal:.1f} ms, {goal <= 50})"
    )


def throughput(primary: Served, replica: Served, seconds: float, records: int) -> None:
    with Client(primary.url) as p, Client(replica.url) as r:
        a = p.create_collection("flow", manual=True)
        wait_generation(replica.url, "flow", b"")
        lags: list[int] = []
        stop = threading.Event()

        def sample() -> None:
            with httpx.Client(base_url=replica.url) as http:
                while not stop.is_set():
                    for c in http.get("/replica").json()["collections"]:
                        if c["collectionName"] == "flow":
                            lags.append(c["lagGenerations"])
                    stop.wait(0.5)

        sampler = threading.Thread(target=sample)
        sampler.start()
        start = time.perf_counter()
        n = 0
        while time.perf_counter() - start < seconds:
            n += 1
            g = b"%08d" % n
            a.start_generation(g)
            a.put_many([(b"k%d-%d" % (n, i), b"v") for i in range(records)], generation_id=g)
            a.commit_generation(g)
        written = time.perf_counter() - start
        wait_generation(replica.url, "flow", b"%08d" % n, deadline_s=600)
        applied = time.perf_counter() - start
        stop.set()
        sampler.join()
        assert r.collection("flow").generation_id == b"%08d" % n
    primary_rate = n * records / written
    replica_rate = n * records / applied
    print(
        f"throughput primary: {n} generations of {records} records in {written:.1f} s ="
        f" {primary_rate:,.0f} records/s"
    )
    print(
        f"throughput replica: applied them all {applied - written:.2f} s after the last commit ="
        f" {replica_rate:,.0f} records/s; lag sampled every 0.5 s: max {max(lags, default=0)},"
        f" median {statistics.median(lags) if lags else 0} generations"
    )
    print(f"throughput replica / primary: {replica_rate / primary_rate:.2f}x (goal: >= 0.5x)")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--trials", type=int, default=50, help="commits per side for the wake-up (default 50)"
    )
    parser.add_argument("--seconds", type=float, default=15, help="how long the writer writes (default 15)")
    parser.add_argument("--records", type=int, default=10, help="records per small generation (default 10)")
    args = parser.parse_args()
    print(machine())
    print(f"load average before: {os.getloadavg()[0]:.2f}")
    with (
        tempfile.TemporaryDirectory() as tmp,
        diffstore_serve(Path(tmp) / "primary", *SERVE) as primary,
        diffstore_serve(Path(tmp) / "replica", *SERVE, "--replica-of", primary.url) as replica,
    ):
        wake_up(primary, replica, args.trials)
        throughput(primary, replica, args.seconds, args.records)
    print(f"load average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
