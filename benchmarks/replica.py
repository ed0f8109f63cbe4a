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
  the primary's records per second. Goal (issue 47): >= 0.9x, lag p99 <= 50 ms (the wake-up's p99).
- **Initial copy** (issue 47): a collection of ``--keys`` keys whose history was collected (a reader moved
  from g1 to g2); the time a new replica takes to copy it, against ``diffstore backup --url`` of the same
  primary in the same run. Goal: >= 0.5x the backup's speed (``--keys 10000000`` for the full figure).
- **Recovery after a link stall** (issue 47): the replica's link to the primary (a TCP proxy) stalls for
  ``--stall-s`` seconds while the writer commits; the time the replica then needs to catch up, against the
  writer's time for the same generations. Goal: caught up within 2x.
- **Memory** (issue 54): a replica following ``--collections`` collections: its resident memory and threads,
  against a replica following one collection, in the same run (it ran one thread per collection).

The machine is shared: read the ratios, and the load average printed with them.

    python benchmarks/replica.py [--trials 50] [--seconds 15] [--records 10] [--keys 1000000]
        [--stall-s 30] [--collections 2000] [--only wake,throughput,copy,stall,memory]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
from _harness import Served, diffstore_serve, machine

from diffstore.client import Client
from diffstore.errors import NoSuchCollection

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the repository: tests.faults' proxy
from tests.faults import TcpProxy  # noqa: E402

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
    print(f"throughput replica / primary: {replica_rate / primary_rate:.2f}x (goal: >= 0.9x)")


def _replica_items(url: str) -> list[dict[str, object]]:
    with httpx.Client(base_url=url, timeout=60) as http:
        items: list[dict[str, object]] = http.get("/replica").json()["collections"]
        return items


def _wait(predicate: object, deadline_s: float, what: str) -> None:
    end = time.monotonic() + deadline_s
    while not predicate():  # type: ignore[operator]
        if time.monotonic() > end:
            raise SystemExit(f"timed out waiting for {what}")
        time.sleep(0.01)


def initial_copy(tmp: Path, primary: Served, keys: int) -> None:
    with Client(primary.url, timeout_s=600) as p:
        m = p.create_collection("big", manual=True)
        m.start_generation(b"g1")
        batch = 10_000
        for start in range(0, keys, batch):
            m.put_many(
                [(b"key%010d" % i, b"value-%010d" % i) for i in range(start, min(keys, start + batch))],
                generation_id=b"g1",
            )
        m.commit_generation(b"g1")
        m.create_reader("pipeline", generation_id=b"g1")
        m.start_generation(b"g2")
        m.put_many([(b"key%010d" % i, b"changed") for i in range(0, keys, 1000)], generation_id=b"g2")
        m.commit_generation(b"g2")
        m.update_reader("pipeline", b"g2")  # "" and g1 are collected: the copy starts at g2
    started = time.perf_counter()
    subprocess.run(
        [sys.executable, "-m", "diffstore", "backup", "--url", primary.url, str(tmp / "backup")],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    backup_s = time.perf_counter() - started
    started = time.perf_counter()
    with diffstore_serve(tmp / "copy", *SERVE, "--replica-of", primary.url) as replica:
        answered = time.perf_counter()
        wait_generation(replica.url, "big", b"g2", deadline_s=3600)
        copy_s = time.perf_counter() - started
    after_start_s = copy_s - (answered - started)
    print(
        f"initial copy: {keys:,} keys with collected history in {copy_s:.1f} s ({keys / copy_s:,.0f} keys/s)"
        f" from the replica's start; {after_start_s:.1f} s after it answered /healthz"
    )
    print(f"initial copy baseline: backup --url of the same primary in {backup_s:.1f} s (its process too)")
    print(f"initial copy speed / backup's: {backup_s / copy_s:.2f}x (goal: >= 0.5x)")
    print(f"initial copy speed after the replica's start / backup's: {backup_s / after_start_s:.2f}x")


def stall_recovery(tmp: Path, primary: Served, stall_s: float, records: int) -> None:
    with (
        TcpProxy(primary.url.removeprefix("http://")) as proxy,
        diffstore_serve(tmp / "stalled", *SERVE, "--replica-of", f"http://{proxy.address}") as replica,
        Client(primary.url) as p,
    ):
        a = p.create_collection("stall", manual=True)
        wait_generation(replica.url, "stall", b"")
        proxy.stall()
        start = time.perf_counter()
        n = 0
        while time.perf_counter() - start < stall_s:
            n += 1
            g = b"%08d" % n
            a.start_generation(g)
            a.put_many([(b"k%d-%d" % (n, i), b"v") for i in range(records)], generation_id=g)
            a.commit_generation(g)
        written = time.perf_counter() - start
        proxy.passing()
        released = time.perf_counter()
        wait_generation(replica.url, "stall", b"%08d" % n, deadline_s=3600)
        caught_up = time.perf_counter() - released
    print(
        f"stall recovery: {n} generations written in {written:.1f} s behind a stalled link;"
        f" caught up {caught_up:.1f} s after it passed again"
    )
    print(f"stall recovery time / writer's time: {caught_up / written:.2f}x (goal: <= 2x)")


def _rss_and_threads(pid: int) -> tuple[float, int]:
    fields = dict(
        line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line
    )
    return int(fields["VmRSS"].split()[0]) / 1024, int(fields["Threads"])


def memory(tmp: Path, primary: Served, collections: int) -> None:
    with Client(primary.url) as p:
        for i in range(collections):
            c = p.create_collection(f"m{i:06d}", manual=i % 2 == 0)
            if i % 2:
                c.put(b"k", b"v")
    many = _follow_all(tmp / "many", primary, collections)
    # the baseline: a replica of a primary of its own that holds one collection
    with diffstore_serve(tmp / "one-primary", *SERVE) as single:
        with Client(single.url) as s:
            s.create_collection("m000000", manual=True)
        one = _follow_all(tmp / "one", single, 1)
    print(
        f"memory: a replica following {collections:,} collections: {many[0]:.0f} MiB resident,"
        f" {many[1]} threads (copied in {many[2]:.1f} s); following 1: {one[0]:.0f} MiB, {one[1]} threads"
    )
    print(
        f"memory {collections:,} collections / 1: {many[0] / one[0]:.2f}x resident,"
        f" {many[1] / one[1]:.2f}x threads ({(many[0] - one[0]) * 1024 / collections:.1f} KiB a collection)"
    )


def _follow_all(data: Path, primary: Served, count: int) -> tuple[float, int, float]:
    started = time.perf_counter()
    with diffstore_serve(data, *SERVE, "--replica-of", primary.url, quiet=False) as replica:
        _wait(
            lambda: sum(i["state"] == "following" for i in _replica_items(replica.url)) >= count,
            3600,
            f"{count} collections following",
        )
        copied = time.perf_counter() - started
        time.sleep(2)  # an idle beat: the figures of a replica that follows, not one that copies
        rss, threads = _rss_and_threads(replica.pid)
    return rss, threads, copied


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--trials", type=int, default=50, help="commits per side for the wake-up (default 50)"
    )
    parser.add_argument("--seconds", type=float, default=15, help="how long the writer writes (default 15)")
    parser.add_argument("--records", type=int, default=10, help="records per small generation (default 10)")
    parser.add_argument("--keys", type=int, default=1_000_000, help="keys of the initial copy (default 1M)")
    parser.add_argument("--stall-s", type=float, default=30, help="the link stall's length (default 30 s)")
    parser.add_argument("--collections", type=int, default=2000, help="collections followed (default 2000)")
    parser.add_argument("--only", default="wake,throughput,copy,stall,memory", help="figures to measure")
    args = parser.parse_args()
    only = set(args.only.split(","))
    print(machine())
    print(f"load average before: {os.getloadavg()[0]:.2f}")
    with tempfile.TemporaryDirectory() as tmp:
        if only & {"wake", "throughput"}:
            with (
                diffstore_serve(Path(tmp) / "primary", *SERVE) as primary,
                diffstore_serve(Path(tmp) / "replica", *SERVE, "--replica-of", primary.url) as replica,
            ):
                if "wake" in only:
                    wake_up(primary, replica, args.trials)
                if "throughput" in only:
                    throughput(primary, replica, args.seconds, args.records)
        for figure, run in (
            ("copy", lambda d, p: initial_copy(d, p, args.keys)),
            ("stall", lambda d, p: stall_recovery(d, p, args.stall_s, args.records)),
            ("memory", lambda d, p: memory(d, p, args.collections)),
        ):
            if figure in only:
                with diffstore_serve(Path(tmp) / f"{figure}-primary", *SERVE) as primary:
                    run(Path(tmp), primary)
    print(f"load average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
