"""Promotion with fencing (issue 47): how long a planned switchover keeps writers waiting, and what the
write gate (the replication term and fencing checked on every write) costs.

- **Switchover**: a primary and a caught-up replica (``diffstore serve``, one process each); a writer puts
  one key at a time into an automatic collection of the primary without pause. ``POST /replica/promote``
  is sent to the replica; the old primary steps down, the writer gets 409 ``fenced`` with the new
  primary's URL and carries on there. Figures: the promotion's own time (request to answer) and the
  writer's gap (its last acknowledged put on the old primary to its first on the new one). Baseline: the
  writer's median put round trip in the same run. Each trial starts fresh servers.
- **Gate**: the check every write pays (``Store.check_writable``: the replica and fencing rows read in a
  read transaction, as the HTTP gate does per write request; the engine reads the fencing row inside each
  write transaction too), per call. Baseline: a point ``get`` of one key on the same store.

The machine is shared: read the ratios, and the load average printed with them.

    python benchmarks/promote.py [--trials 3] [--calls 100000]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import threading
import time
from pathlib import Path

from _harness import diffstore_serve, load_average, machine, ratio_line

from diffstore import Store, StoreConfig
from diffstore.client import Client
from diffstore.client import _calls as calls
from diffstore.errors import DiffstoreError, Fenced, ReadOnlyReplica

SERVE = ("--workers", "1", "--log-level", "warning", "--commit-delay-ms", "20")


class Writer(threading.Thread):
    """Puts into W on ``url`` until stopped; on ``fenced`` it moves to the primary the error names (which
    answers ``readOnlyReplica`` until its promotion is done: the writer retries)."""

    def __init__(self, url: str) -> None:
        super().__init__(daemon=True)
        self.url = url
        self.acks: list[tuple[float, str]] = []  # (monotonic time of the ack, server)
        self.round_trips: list[float] = []
        self.stopping = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        n = 0
        try:
            while not self.stopping.is_set():
                with Client(self.url, timeout_s=60) as client:
                    w = client.collection("W")
                    while not self.stopping.is_set():
                        n += 1
                        started = time.monotonic()
                        try:
                            w.put(b"k%08d" % n, b"v")
                        except Fenced as exc:
                            assert exc.primary is not None
                            self.url = exc.primary
                            break
                        except ReadOnlyReplica:  # the new primary is still catching up: not promoted yet
                            time.sleep(0.002)
                            continue
                        done = time.monotonic()
                        self.acks.append((done, self.url))
                        self.round_trips.append(done - started)
        except DiffstoreError as exc:
            self.error = exc


def switchover(tmp: Path, trial: int) -> tuple[float, float, float]:
    """One trial: (promotion seconds, writer gap seconds, median put round trip seconds)."""
    with (
        diffstore_serve(tmp / f"primary{trial}", *SERVE) as primary,
        diffstore_serve(tmp / f"replica{trial}", *SERVE, "--replica-of", primary.url) as replica,
    ):
        with Client(primary.url) as p:
            p.create_collection("W", manual=False)
        writer = Writer(primary.url)
        writer.start()
        end = time.monotonic() + 60
        while len(writer.acks) < 200 or not _caught_up(replica.url):
            if time.monotonic() > end or writer.error is not None:
                raise SystemExit(f"the replica never caught up ({writer.error})")
            time.sleep(0.01)
        started = time.monotonic()
        with Client(replica.url, timeout_s=120) as r:
            answer = r.execute(calls.promotion())
        promoted = time.monotonic() - started
        end = time.monotonic() + 60
        while not writer.acks or writer.acks[-1][1] != replica.url:
            if time.monotonic() > end or writer.error is not None:
                raise SystemExit(f"the writer never reached the new primary ({writer.error})")
            time.sleep(0.01)
        time.sleep(0.2)
        writer.stopping.set()
        writer.join(60)
        assert answer["steppedDown"], answer
        last_old = max(t for t, url in writer.acks if url == primary.url)
        first_new = min(t for t, url in writer.acks if url == replica.url)
        return promoted, first_new - last_old, statistics.median(writer.round_trips)


def _caught_up(replica_url: str) -> bool:
    with Client(replica_url) as r:
        try:
            lags = r.replica_status()["collections"]
        except DiffstoreError:
            return False
    return bool(lags) and all(lag["lagGenerations"] == 0 for lag in lags)


def gate(tmp: Path, count: int) -> tuple[float, float]:
    """(seconds per write check, seconds per point get) on one store."""
    with Store.open(tmp / "gate", StoreConfig(background=False)) as store:
        c = store.create_collection("A", manual=True)
        c.write_generation(b"1", [(b"k%05d" % i, b"v") for i in range(1000)])
        checks, gets = [], []
        for _ in range(5):
            started = time.perf_counter()
            for _ in range(count):
                store.check_writable()
            checks.append((time.perf_counter() - started) / count)
            started = time.perf_counter()
            for _ in range(count):
                c.get(b"k00500")
            gets.append((time.perf_counter() - started) / count)
        return statistics.median(checks), statistics.median(gets)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--calls", type=int, default=100_000)
    args = parser.parse_args()
    print(machine())
    with tempfile.TemporaryDirectory() as name:
        tmp = Path(name)
        check_s, get_s = gate(tmp, args.calls)
        print(ratio_line("write gate check", check_s * 1e6, get_s * 1e6, "µs", "baseline: a point get"))
        results = [switchover(tmp, trial) for trial in range(args.trials)]
        for promoted, gap, put in results:
            print(
                f"switchover: promotion {promoted * 1000:,.0f} ms, writer gap {gap * 1000:,.0f} ms"
                f" (put round trip p50 {put * 1000:.2f} ms)"
            )
        promoted = statistics.median(r[0] for r in results)
        gap = statistics.median(r[1] for r in results)
        put = statistics.median(r[2] for r in results)
        print(ratio_line("promotion (median)", promoted * 1000, put * 1000, "ms", "baseline: a put"))
        print(ratio_line("writer gap (median)", gap * 1000, put * 1000, "ms", "baseline: a put"))
    print(f"load average after: {load_average()}")


if __name__ == "__main__":
    main()
