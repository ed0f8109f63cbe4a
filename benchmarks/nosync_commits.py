"""What not writing through LMDB's memory map costs unsynced stores (issue 13).

    .venv/bin/python benchmarks/nosync_commits.py [--records 300000] [--rounds 60] [--dir DIR]

``StoreConfig(sync=False)`` used to open LMDB with ``writemap`` (dirty pages changed in a shared writable
map); a full disk then killed the process by SIGBUS. It now writes dirty pages with ``pwrite`` at commit
(see ``diffstore/engine/storage.py``). This script measures, on one N-key manual collection, the median
latency of small commits (start + put_many of K spread keys + commit) three ways in the same run:

  nosync/writemap   the old flags (``writemap=True, map_async=True``, forced here by wrapping ``lmdb.open``)
  nosync/pwrite     what ``sync=False`` does now
  sync              the durable default, for scale

and prints each median with the ratio pwrite / writemap. The machine is shared and noisy: repeat a run
before trusting a difference of a few percent.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import shutil
import statistics
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from unittest import mock

import lmdb
from _harness import machine

from diffstore import Store, StoreConfig

BATCH = 10_000


def key(i: int) -> bytes:
    return b"key-%012d" % i


def value(i: int, salt: int = 0) -> bytes:
    return (b"%08d:%08d:" % (i, salt)).ljust(100, b"v")


@contextlib.contextmanager
def old_writemap_flags() -> Iterator[None]:
    """Opens stores as ``sync=False`` did before: writing through the writable map."""
    real_open = lmdb.open

    def open_with_writemap(path: str, **options: Any) -> lmdb.Environment:
        if not options.get("sync", True):
            options.update(writemap=True, map_async=True)
        return real_open(path, **options)

    with mock.patch.object(lmdb, "open", open_with_writemap):
        yield


def load(path: Path, n: int) -> None:
    with Store.open(path, StoreConfig(background=False)) as store:
        coll = store.create_collection("big", manual=True)
        coll.start_generation(b"g0")
        for lo in range(0, n, BATCH):
            coll.put_many([(key(i), value(i)) for i in range(lo, min(n, lo + BATCH))], generation_id=b"g0")
        coll.commit_generation(b"g0")


def small_commits(
    path: Path, config: StoreConfig, n: int, size: int, rounds: int, gens: Iterator[int]
) -> float:
    """Median seconds of ``rounds`` commits of ``size`` spread keys each."""
    times = []
    with Store.open(path, config) as store:
        coll = store.collection("big")
        for r in range(rounds):
            gen = b"g1-%09d" % next(gens)  # generations must keep increasing across the variants
            items = [(key((r * 7919 + j * 997) % n), value(j, r)) for j in range(size)]
            start = time.perf_counter()
            coll.start_generation(gen)
            coll.put_many(items, generation_id=gen)
            coll.commit_generation(gen)
            times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--records", type=int, default=300_000)
    parser.add_argument("--rounds", type=int, default=60)
    parser.add_argument("--dir", default=None, help="where to put the store (default: a temp dir)")
    args = parser.parse_args()
    print(machine())
    root = Path(args.dir or tempfile.mkdtemp(prefix="diffstore-nosync-"))
    path = root / "store"
    try:
        load(path, args.records)
        nosync = StoreConfig(background=False, sync=False)
        gens = itertools.count()
        print(f"small commits on {args.records:,} keys, median of {args.rounds} (noisy shared machine)")
        for size in (1, 100, 1000):
            # interleave the variants so that a burst of noise from other processes hits both alike
            old: list[float] = []
            new: list[float] = []
            for _ in range(3):
                with old_writemap_flags():
                    old.append(small_commits(path, nosync, args.records, size, args.rounds, gens))
                new.append(small_commits(path, nosync, args.records, size, args.rounds, gens))
            durable = small_commits(
                path, StoreConfig(background=False), args.records, size, args.rounds // 3, gens
            )
            old_ms, new_ms = min(old) * 1000, min(new) * 1000
            print(
                f"  {size:5d} keys: nosync/writemap {old_ms:7.3f} ms   nosync/pwrite {new_ms:7.3f} ms   "
                f"ratio {new_ms / old_ms:5.2f}   (sync {durable * 1000:7.3f} ms)"
            )
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
