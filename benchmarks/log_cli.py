"""``diffstore log`` over many generations: its lineage requests in flight together, against one at a time.

    .venv/bin/python benchmarks/log_cli.py [--generations 1000] [--rounds 3]

A server (``diffstore serve`` in a child process) holds a manual collection C of ``--generations``
committed generations, each commit moving a reader of a source A (as a transform's rounds do). ``diffstore
log C --limit N`` lists them with the readers each commit moved: one history page per 1,000 generations and
one lineage request per generation. Timed, alternately, ``--rounds`` times each: the command itself (its
``main``, in this process: an interpreter's start is not what is compared; its lineage requests go out
several at once), and the same listing through the same client one request at a time (what the command
did before: the baseline), plus the history pages alone (the floor: no lineage at all). Prints the
medians and the ratios; the machine is shared, so compare the ratios, not the seconds.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import statistics
import tempfile
import time
from pathlib import Path

from _harness import diffstore_serve, machine

from diffstore import cli
from diffstore.client import Client
from diffstore.client.log_cli import _moves


def listing(url: str, limit: int, lineage: bool) -> int:
    """The listing one request at a time: history pages, and with ``lineage`` each generation's lineage
    after its page (what the command did before); without, the pages alone (the floor)."""
    listed = 0
    with Client(url) as client:
        collection = client.collection("C")
        before = None
        while listed < limit:
            page, more = collection.history(before, limit=min(1000, limit - listed))
            for info in page if lineage else ():
                _moves(collection, info)
            listed += len(page)
            if not more or not page:
                break
            before = page[-1].generation_id
    return listed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--generations", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    print(machine())
    n = args.generations
    with (
        tempfile.TemporaryDirectory(prefix="diffstore-log-bench-") as tmp,
        diffstore_serve(Path(tmp) / "data", "--no-sync") as served,
    ):
        with Client(served.url) as client:
            a = client.create_collection("A")
            c = client.create_collection("C")
            c.create_reader("from_a", "A")
            for i in range(1, n + 1):
                g = b"g%07d" % i
                a.start_generation(g)
                a.put(b"k%d" % (i % 100), b"v%d" % i, generation_id=g)
                a.commit_generation(g)
                c.start_generation(g)
                c.put(b"k%d" % (i % 100), b"t%d" % i, generation_id=g)
                c.commit_generation(g, [("from_a", g)])
        command = ["log", "C", "--limit", str(n), "--url", served.url]
        times: dict[str, list[float]] = {"command": [], "sequential": [], "pages": []}
        for _ in range(args.rounds):
            out_buffer = io.StringIO()
            started = time.perf_counter()
            with contextlib.redirect_stdout(out_buffer):
                assert cli.main(command) == 0
            times["command"].append(time.perf_counter() - started)
            out = out_buffer.getvalue()
            assert len(out.splitlines()) == n and "from_a A" in out, out[:500]
            started = time.perf_counter()
            assert listing(served.url, n, lineage=True) == n
            times["sequential"].append(time.perf_counter() - started)
            started = time.perf_counter()
            assert listing(served.url, n, lineage=False) == n
            times["pages"].append(time.perf_counter() - started)
        command_s, sequential_s, pages_s = (
            statistics.median(times[k]) for k in ("command", "sequential", "pages")
        )
        print(
            f"diffstore log C --limit {n:,}: {command_s:.2f} s (in-process); "
            f"one request at a time, in-process: {sequential_s:.2f} s; ratio {sequential_s / command_s:.2f}x "
            f"faster; history pages alone {pages_s:.2f} s (median of {args.rounds})"
        )
    print(f"load average: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
