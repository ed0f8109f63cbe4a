"""Engine benchmarks (issue 2): each figure is printed with its ratio to a baseline measured in the same run.

    .venv/bin/python benchmarks/engine.py [--records 1000000] [--dir /tmp/diffstore-bench]

Figures:
  bulk load       put_many of N records (16-byte keys, 100-byte values, 10k batches, one generation)
                  vs raw py-lmdb putmulti of the same records           goal ratio >= 0.5
  small commit    start + put_many(1,000) + commit on an N-key collection  goal <= 5 ms
                  (twice: durable by default, then StoreConfig(sync=False); each vs raw putmulti alike)
  diff scaling    diff of 1,000 changed keys on N keys vs on 10k keys       goal ratio <= 1.5
  diff throughput diff over 100k changed keys vs a raw cursor scan of 100k records  goal ratio >= 0.4
                  (and the "read floor": only reading the change and both versions of each key)
  diff memory     anonymous RSS growth while iterating a diff of N changes  goal <= 100 MB
"""

from __future__ import annotations

import argparse
import itertools
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import lmdb

from diffstore import Store, StoreConfig
from diffstore.engine import layout
from diffstore.engine.tables import load_meta, resolve_seq

BATCH = 10_000


def key(i: int) -> bytes:
    return b"key-%012d" % i  # 16 bytes


def value(i: int, salt: int = 0) -> bytes:
    return (b"%08d:%08d:" % (i, salt)).ljust(100, b"v")


def best_of(runs: int, fn: Callable[[], float]) -> float:
    return min(fn() for _ in range(runs))


def anon_rss_mb() -> float:
    """Anonymous resident memory (the heap), excluding LMDB's file-backed mapped pages."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) / 1024
    return 0.0


def bench_raw_putmulti(root: Path, n: int, rounds: int, sync: bool = True) -> tuple[float, list[float]]:
    """Raw py-lmdb: bulk putmulti of n records, then ``rounds`` transactions of 1,000 spread keys."""
    path = root / "raw"
    env = lmdb.open(str(path), map_size=1 << 36, max_dbs=2, sync=sync, metasync=sync)
    db = env.open_db(b"t")
    start = time.perf_counter()
    for lo in range(0, n, BATCH):
        with env.begin(write=True) as txn:
            txn.cursor(db=db).putmulti([(key(i), value(i)) for i in range(lo, min(n, lo + BATCH))])
    elapsed = time.perf_counter() - start
    small = []
    for r in range(rounds):
        items = sorted((key((r * 7919 + j * 997) % n), value(j, r)) for j in range(1000))
        begin = time.perf_counter()
        with env.begin(write=True) as txn:
            txn.cursor(db=db).putmulti(items)
        small.append(time.perf_counter() - begin)
    env.close()
    shutil.rmtree(path)
    return elapsed, small


def load_collection(store: Store, name: str, n: int) -> float:
    coll = store.create_collection(name, manual=True)
    coll.start_generation(b"g0001")
    start = time.perf_counter()
    for lo in range(0, n, BATCH):
        coll.put_many([(key(i), value(i)) for i in range(lo, min(n, lo + BATCH))], generation_id=b"g0001")
    coll.commit_generation(b"g0001")
    return time.perf_counter() - start


def small_commit(store: Store, name: str, n: int, rounds: int, first: int = 0) -> list[float]:
    coll = store.collection(name)
    times = []
    for r in range(first, first + rounds):
        gen = b"g1%04d" % r
        items = [(key((r * 7919 + j * 997) % n), value(j, r)) for j in range(1000)]
        start = time.perf_counter()
        coll.start_generation(gen)
        coll.put_many(items, generation_id=gen)
        coll.commit_generation(gen)
        times.append(time.perf_counter() - start)
    return times


def diff_time(store: Store, name: str, from_gen: bytes, to_gen: bytes, runs: int = 5) -> float:
    coll = store.collection(name)

    def once() -> float:
        start = time.perf_counter()
        count = sum(1 for _ in coll.diff(from_generation_id=from_gen, to_generation_id=to_gen))
        elapsed = time.perf_counter() - start
        assert count > 0
        return elapsed

    return best_of(runs, once)


def raw_scan(store: Store, count: int) -> float:
    def once() -> float:
        with store.env.begin() as txn:
            start = time.perf_counter()
            seen = 0
            for _k, _v in txn.cursor(db=store.tables.records):
                seen += 1
                if seen == count:
                    break
            return time.perf_counter() - start

    return best_of(5, once)


def read_floor(store: Store, name: str, generation_id: bytes, count: int) -> float:
    """The least any diff over this layout must read per changed key: its entry in the ``changes`` run
    of the generation and its two versions in ``records`` (adjacent here), iterated at C level, with
    nothing built and nothing compared."""

    def once() -> float:
        with store.read() as txn:
            meta = load_meta(txn, store.tables, name)
            run = layout.change_prefix(meta.cid_prefix, resolve_seq(txn, store.tables, meta, generation_id))
            start = time.perf_counter()
            changes = txn.cursor(db=store.tables.changes)
            changes.set_range(run)
            read = sum(1 for _ in itertools.islice(changes.iternext(values=False), count))
            records = txn.cursor(db=store.tables.records)
            records.set_range(meta.cid_prefix)
            read += sum(1 for _ in itertools.islice(records.iternext(), 2 * count))
            elapsed = time.perf_counter() - start
            assert read == 3 * count
            return elapsed

    return best_of(5, once)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--dir", default=None, help="where to put the stores (default: a temp dir)")
    args = parser.parse_args()
    n = args.records
    root = Path(args.dir or tempfile.mkdtemp(prefix="diffstore-bench-"))
    root.mkdir(parents=True, exist_ok=True)
    config = StoreConfig(background=False)
    try:
        raw, raw_small = bench_raw_putmulti(root, n, 30)
        _, raw_small_nosync = bench_raw_putmulti(root, n, 30, sync=False)
        with Store.open(root / "store", config) as store:
            ours = load_collection(store, "big", n)
            print(
                f"bulk load       {n / ours:12,.0f} rec/s   raw putmulti {n / raw:12,.0f} rec/s   "
                f"ratio {raw / ours:.2f} (goal >= 0.5)"
            )

            times = small_commit(store, "big", n, 30)
            ours_ms, raw_ms = statistics.median(times) * 1000, statistics.median(raw_small) * 1000
            print(
                f"small commit    median {ours_ms:6.2f} ms on {n:,} keys (goal <= 5 ms); one raw durable"
                f" putmulti of the same 1,000 keys {raw_ms:6.2f} ms   ratio {ours_ms / raw_ms:.2f}"
            )
        # the same with StoreConfig(sync=False): durable against kill -9, not against an OS crash
        with Store.open(root / "store", StoreConfig(background=False, sync=False)) as store:
            times = small_commit(store, "big", n, 30, first=100)
            ours_ms = statistics.median(times) * 1000
            raw_ms = statistics.median(raw_small_nosync) * 1000
            print(
                f"small commit    median {ours_ms:6.2f} ms with sync=False (goal <= 5 ms); one raw unsynced"
                f" putmulti of the same 1,000 keys {raw_ms:6.2f} ms   ratio {ours_ms / raw_ms:.2f}"
            )

            # 1,000 changed keys: the diff between two consecutive small commits.
            load_collection(store, "small", 10_000)
            small_commit(store, "small", 10_000, 2)
            big_diff = diff_time(store, "big", b"g10000", b"g10001")
            small_diff = diff_time(store, "small", b"g10000", b"g10001")
            print(
                f"diff 1k keys    {big_diff * 1000:6.2f} ms on {n:,} keys, "
                f"{small_diff * 1000:6.2f} ms on 10k keys   ratio {big_diff / small_diff:.2f} (goal <= 1.5)"
            )

            through = min(100_000, n)
            coll = store.create_collection("through", manual=True)
            coll.start_generation(b"1")
            for lo in range(0, through, BATCH):
                coll.put_many([(key(i), value(i)) for i in range(lo, lo + BATCH)], generation_id=b"1")
            coll.commit_generation(b"1")
            coll.start_generation(b"2")
            for lo in range(0, through, BATCH):
                coll.put_many([(key(i), value(i, 1)) for i in range(lo, lo + BATCH)], generation_id=b"2")
            coll.commit_generation(b"2")
            diff_100k = diff_time(store, "through", b"1", b"2", runs=3)
            scan = raw_scan(store, through)
            print(
                f"diff throughput {through / diff_100k:12,.0f} items/s   "
                f"raw scan {through / scan:12,.0f} rec/s   ratio {scan / diff_100k:.2f} (goal >= 0.4)"
            )
            floor = read_floor(store, "through", b"2", through)
            print(
                f"  read floor    {through / floor:12,.0f} items/s   only reading the 3 entries a diff needs"
                f" per changed key (change, old and new version): ratio {scan / floor:.2f} to the raw scan"
            )

            big = store.collection("big")
            before = anon_rss_mb()
            peak = before
            for index, _item in enumerate(big.diff(from_generation_id=b"", to_generation_id=b"g0001")):
                if index % 50_000 == 0:
                    peak = max(peak, anon_rss_mb())
            peak = max(peak, anon_rss_mb())
            print(
                f"diff memory     anonymous RSS growth {peak - before:6.1f} MB over a diff of {n:,} changes"
                f" (goal <= 100 MB)"
            )
    finally:
        if args.dir is None:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONHASHSEED", "0")
    main()
