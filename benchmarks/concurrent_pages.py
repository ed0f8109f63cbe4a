"""Pages built by two threads at once vs the same pages built by one thread in turn (the engine alone).

    .venv/bin/python benchmarks/concurrent_pages.py [--records 300000] [--rounds 4]

A collection of N records over two generations (every other key changed in the second). Each round reads
it whole twice, in query pages and in diff pages of 10k: once by two threads at the same time, once by one
thread after the other (the baseline). Printed: records/s of both and their ratio, medians of rounds.

py-lmdb gives up the GIL around every LMDB call, so two threads building pages at once hand it to each
other on every cursor step; the engine builds pages one at a time (``Store.page_read``), which keeps two
concurrent readers near the rate of one: 0.95x (query) and 0.99x (diff) here, against 0.69x and
0.71x without it (measured while adding it).
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

from _harness import machine

from diffstore import Collection, Store

PAGE = 10_000


def fill(collection: Collection, n: int) -> None:
    for generation, step, value in ((b"1", 1, b"v" * 100), (b"2", 2, b"w" * 100)):
        collection.start_generation(generation)
        for lo in range(0, n, PAGE):
            items = [(b"key%08d" % i, value) for i in range(lo, min(n, lo + PAGE), step)]
            collection.put_many(items, generation_id=generation)
        collection.commit_generation(generation)


def read_query(collection: Collection) -> int:
    page = collection.query_page(limit=PAGE)
    count = len(page.items)
    while page.cursor is not None:
        page = collection.query_page(cursor=page.cursor)
        count += len(page.items)
    return count


def read_diff(collection: Collection) -> int:
    page = collection.diff_page(from_generation_id=b"1", to_generation_id=b"2", limit=PAGE)
    count = len(page.items)
    while page.cursor is not None:
        page = collection.diff_page(cursor=page.cursor)
        count += len(page.items)
    return count


def two_at_once(read: Callable[[], int]) -> float:
    counts: list[int] = []
    threads = [threading.Thread(target=lambda: counts.append(read())) for _ in range(2)]
    start = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return sum(counts) / (time.perf_counter() - start)


def one_after_the_other(read: Callable[[], int]) -> float:
    start = time.perf_counter()
    count = read() + read()
    return count / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--records", type=int, default=300_000)
    parser.add_argument("--rounds", type=int, default=4)
    args = parser.parse_args()
    print(machine())
    sys.setswitchinterval(0.0005)  # as `diffstore serve` sets it
    root = Path(tempfile.mkdtemp(prefix="diffstore-pages-bench-"))
    try:
        with Store.open(root / "store") as store:
            collection = store.create_collection("c", manual=True)
            fill(collection, args.records)
            for kind, read in (("query", read_query), ("diff", read_diff)):
                rates: dict[str, list[float]] = {"two at once": [], "in turn": []}
                for r in range(args.rounds):
                    order = ("two at once", "in turn") if r % 2 == 0 else ("in turn", "two at once")
                    for how in order:
                        run = two_at_once if how == "two at once" else one_after_the_other
                        rates[how].append(run(partial(read, collection)))
                both, alone = (statistics.median(rates[k]) for k in ("two at once", "in turn"))
                print(
                    f"{kind} pages: two threads at once {both:,.0f} records/s,"
                    f" one thread in turn {alone:,.0f} -> ratio {both / alone:.2f}"
                    f" (median of {args.rounds} rounds)"
                )
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
