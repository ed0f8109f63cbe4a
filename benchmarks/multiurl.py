"""What following a leader costs a client of several servers: point gets and 1-key rounds against a
primary, by a client given its URL alone (the baseline) and by one given a replica's URL too.

    .venv/bin/python benchmarks/multiurl.py [--gets 2000] [--rounds 300] [--repeats 5]

A ``diffstore serve`` primary and a ``--replica-of`` replica; one :class:`diffstore.client.Client` each
way, both over keep-alive. The client of both lists the replica first, so it must find the leader
(one probe round, paid once). Each repeat times N point gets and M rounds (start, putMany, commit with a
reader update: three writes) with each client in turn; printed: the p50 of each and its ratio to the
single-URL client measured in the same run (goal: <= 1.05x: the fail-over plan is a few Python calls per
request). The machine is shared with other jobs: figures move between runs.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _harness import diffstore_serve, machine, median, ratio_line  # noqa: E402

from diffstore.client import Client  # noqa: E402
from diffstore.engine.types import ReaderUpdate  # noqa: E402


def timed(action: object, n: int) -> list[float]:
    """Microseconds of each of ``n`` calls of ``action``."""
    assert callable(action)
    times = []
    for _ in range(n):
        started = time.perf_counter()
        action()
        times.append((time.perf_counter() - started) * 1e6)
    return times


def plan_overhead(n: int = 100_000) -> tuple[float, float]:
    """Microseconds per call of the fail-over plan around a no-op ``execute``, and of the no-op itself:
    what a client of several servers adds to each request, without the noise of the HTTP round trip."""
    import threading

    from diffstore.client import _calls
    from diffstore.client._failover import perform, run_sync
    from diffstore.client._leader import LeaderFinder
    from diffstore.client._transport import never_sent, unreachable

    finder = LeaderFinder(("http://a", "http://b"), leader="http://a")
    call = _calls.get("g", b"k", _calls.ReadAt())
    lock = threading.Lock()

    def execute(url: str, call: object) -> int:
        return 1

    started = time.perf_counter()
    for _ in range(n):
        run_sync(perform(call, finder, time.monotonic, unreachable, never_sent), execute, time.sleep, lock)
    planned = (time.perf_counter() - started) / n * 1e6
    started = time.perf_counter()
    for _ in range(n):
        execute("http://a", call)
    return planned, (time.perf_counter() - started) / n * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--gets", type=int, default=2_000, help="point gets per repeat and client")
    parser.add_argument("--rounds", type=int, default=300, help="rounds per repeat and client")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    print(machine())
    with tempfile.TemporaryDirectory() as directory:
        root = Path(directory)
        with (
            diffstore_serve(root / "primary", "--workers", "1") as primary,
            diffstore_serve(root / "replica", "--workers", "1", "--replica-of", primary.url) as replica,
        ):
            single = Client(primary.url)
            both = Client([replica.url, primary.url])
            for name in ("one", "both"):
                single.create_collection(name, manual=True).create_reader("r")
            single.create_collection("g", manual=False).put(b"k", b"v")
            clients = {"one": single, "both": both}
            gets: dict[str, list[float]] = {"one": [], "both": []}
            rounds: dict[str, list[float]] = {"one": [], "both": []}
            counters = {"one": 0, "both": 0}
            for repeat in range(args.repeats):
                order = ("one", "both") if repeat % 2 == 0 else ("both", "one")
                for name in order:
                    g = clients[name].collection("g")
                    gets[name] += timed(lambda g=g: g.get(b"k"), args.gets)
                    m = clients[name].collection(name)

                    def round_(m: object = m, name: str = name) -> None:
                        counters[name] += 1
                        gid = b"%08d" % counters[name]
                        previous = b"%08d" % (counters[name] - 1) if counters[name] > 1 else None
                        update = ReaderUpdate("r", gid, expected=previous)
                        m.write_generation(gid, [(b"k", gid)], [update])  # type: ignore[attr-defined]

                    rounds[name] += timed(round_, args.rounds)
            finder = both._transport.finder
            assert finder is not None and finder.leader == primary.url, "the client of both found no leader"
            print(ratio_line("point get p50", median(gets["both"]), median(gets["one"]), "us", "<= 1.05x"))
            print(ratio_line("round p50", median(rounds["both"]), median(rounds["one"]), "us", "<= 1.05x"))
            single.close()
            both.close()
    planned, bare = plan_overhead()
    print(f"plan per call            {planned:>14,.2f} us   (a no-op call alone: {bare:.2f} us)")


if __name__ == "__main__":
    main()
