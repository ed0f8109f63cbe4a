"""Engine benchmarks (issues 2 and 11): each figure with its ratio to a baseline measured in the same run.

    .venv/bin/python benchmarks/engine.py [--records 1000000] [--rounds 3] [--only bulk,diff] [--dir DIR]
                                          [--pure-python]

Figures:
  bulk load       put_many of N sorted records (``key-%012d``, 100-byte values, 10k batches, one generation)
                  vs raw py-lmdb putmulti of the same records, each round on empty stores   goal ratio >= 0.5
                  (and the "layout floor": LMDB alone storing the rows our layout needs, built beforehand)
  small commit    start + put_many(1,000) + commit on an N-key collection  goal <= 5 ms
                  (twice: durable by default, then StoreConfig(sync=False); each vs raw putmulti alike)
  diff scaling    diff of 1,000 changed keys on N keys vs on 10k keys       goal ratio <= 1.5
                  twice: keys spread evenly over the collection, then 1,000 side by side
  diff throughput diff over 100k changed keys vs a raw cursor scan of 100k records  goal ratio >= 0.2
                  (and the "read floor": only reading the change and both versions of each key; and the
                  "item floor": stepping over both versions and building each item, with no check at all)
  diff memory     anonymous RSS growth while iterating a diff of N changes  goal <= 100 MB

The engine's per-record hot loops run compiled when its optional accelerator was built (``make install``
builds it; the first line says which ran); ``--pure-python`` measures its pure-Python twins instead.

Bulk load and diff throughput are measured ``--rounds`` times, ours and the baseline side by side in each
round; the medians are printed. The machine these figures come from is shared and noisy.
"""

from __future__ import annotations

import argparse
import itertools
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import lmdb

from diffstore import Store, StoreConfig
from diffstore.engine import layout
from diffstore.engine.tables import load_meta, resolve_seq
from diffstore.engine.types import DiffItem

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


def batches(n: int) -> Iterator[list[tuple[bytes, bytes]]]:
    """The records in batches, each built when asked (timings leave the building out)."""
    for lo in range(0, n, BATCH):
        yield [(key(i), value(i)) for i in range(lo, min(n, lo + BATCH))]


def bench_raw_putmulti(root: Path, n: int, rounds: int, sync: bool = True) -> tuple[float, list[float]]:
    """Raw py-lmdb: bulk putmulti of n records, then ``rounds`` transactions of 1,000 spread keys."""
    path = root / "raw"
    env = lmdb.open(str(path), map_size=1 << 36, max_dbs=2, sync=sync, metasync=sync)
    db = env.open_db(b"t")
    elapsed = 0.0
    for batch in batches(n):
        start = time.perf_counter()
        with env.begin(write=True) as txn:
            txn.cursor(db=db).putmulti(batch)
        elapsed += time.perf_counter() - start
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
    elapsed = 0.0
    for batch in batches(n):
        start = time.perf_counter()
        coll.put_many(batch, generation_id=b"g0001")
        elapsed += time.perf_counter() - start
    start = time.perf_counter()
    coll.commit_generation(b"g0001")
    return elapsed + time.perf_counter() - start


Rows = list[tuple[bytes, bytes]]


def layout_rows(batch: Rows) -> tuple[Rows, Rows]:
    """The rows our layout writes for a batch of short keys in a collection's first generation:
    ``records`` (cid | K | seq -> 01 value) and ``changes`` (cid | seq | K -> b"")."""
    cid, seq = layout.cid_bytes(1), 1
    records = [(layout.record_key(cid, layout.key_form(k), seq), layout.encode_value(k, v)) for k, v in batch]
    changes = [(layout.change_key(cid, seq, layout.key_form(k)), b"") for k, _ in batch]
    return records, changes


def bulk_rounds(root: Path, n: int, rounds: int) -> tuple[list[float], ...]:
    """(ours, raw, floor) seconds per round, each round on empty stores, and raw / ours and raw / floor CPU
    time per round (``time.process_time``: what the fsyncs leave out, which dominate the wall time on a
    loaded machine).

    Batch by batch, raw putmulti, then the "layout floor" (raw putmultis, in append mode, of the very rows
    our layout stores, built before the clock starts: what LMDB alone costs for them), then put_many of the
    same batch: on a shared machine all three see the same load.
    """
    ours, raw, floor, cpu_ratios, floor_cpu_ratios = [], [], [], [], []
    for index in range(rounds):
        env = lmdb.open(str(root / f"raw{index}"), map_size=1 << 36, max_dbs=2)
        db = env.open_db(b"t")
        floor_env = lmdb.open(str(root / f"floor{index}"), map_size=1 << 36, max_dbs=2)
        floor_records, floor_changes = floor_env.open_db(b"records"), floor_env.open_db(b"changes")
        path = root / f"bulk{index}"
        with Store.open(path, StoreConfig(background=False)) as store:
            coll = store.create_collection("big", manual=True)
            coll.start_generation(b"g0001")
            ours_s = raw_s = floor_s = ours_cpu = raw_cpu = floor_cpu = 0.0
            for batch in batches(n):
                record_rows, change_rows = layout_rows(batch)
                start, cpu = time.perf_counter(), time.process_time()
                with env.begin(write=True) as txn:
                    txn.cursor(db=db).putmulti(batch)
                middle, middle_cpu = time.perf_counter(), time.process_time()
                with floor_env.begin(write=True) as txn:
                    txn.cursor(db=floor_records).putmulti(record_rows, append=True)
                    txn.cursor(db=floor_changes).putmulti(change_rows, append=True)
                floored, floored_cpu = time.perf_counter(), time.process_time()
                coll.put_many(batch, generation_id=b"g0001")
                end, end_cpu = time.perf_counter(), time.process_time()
                raw_s += middle - start
                floor_s += floored - middle
                ours_s += end - floored
                raw_cpu += middle_cpu - cpu
                floor_cpu += floored_cpu - middle_cpu
                ours_cpu += end_cpu - floored_cpu
            start = time.perf_counter()
            coll.commit_generation(b"g0001")
            ours_s += time.perf_counter() - start
        env.close()
        floor_env.close()
        for name in (f"raw{index}", f"floor{index}", f"bulk{index}"):
            shutil.rmtree(root / name)
        ours.append(ours_s)
        raw.append(raw_s)
        floor.append(floor_s)
        cpu_ratios.append(raw_cpu / ours_cpu)
        floor_cpu_ratios.append(raw_cpu / floor_cpu)
    return ours, raw, floor, cpu_ratios, floor_cpu_ratios


def change_keys(coll_name: str, store: Store, generation_id: bytes, indices: list[int]) -> None:
    coll = store.collection(coll_name)
    coll.start_generation(generation_id)
    coll.put_many([(key(i), value(i, 7)) for i in indices], generation_id=generation_id)
    coll.commit_generation(generation_id)


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


def diff_once(store: Store, name: str, from_gen: bytes, to_gen: bytes) -> float:
    coll = store.collection(name)
    start = time.perf_counter()
    count = sum(1 for _ in coll.diff(from_generation_id=from_gen, to_generation_id=to_gen))
    elapsed = time.perf_counter() - start
    assert count > 0
    return elapsed


def raw_scan_once(store: Store, count: int) -> float:
    with store.env.begin() as txn:
        start = time.perf_counter()
        seen = 0
        for _k, _v in txn.cursor(db=store.tables.records):
            seen += 1
            if seen == count:
                break
        return time.perf_counter() - start


def raw_scan(store: Store, count: int) -> float:
    return best_of(5, lambda: raw_scan_once(store, count))


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


def item_floor(store: Store, name: str, count: int) -> float:
    """The least a diff written in Python costs per changed key here: step over its two versions (adjacent
    in this benchmark's layout) and build the item from slices of them, with no comparison at all -- what
    is left when every check of the real loop is taken away."""

    def items(txn: lmdb.Transaction, prefix: bytes) -> Iterator[DiffItem]:
        new = tuple.__new__
        old = b""
        records = txn.cursor(db=store.tables.records)
        records.set_range(prefix)
        for index, (record_key, raw) in enumerate(itertools.islice(records.iternext(), 2 * count)):
            if index & 1:
                yield new(DiffItem, (record_key[4:-10], old[1:], raw[1:], ()))
            else:
                old = raw

    def once() -> float:
        with store.read() as txn:
            prefix = load_meta(txn, store.tables, name).cid_prefix
            start = time.perf_counter()
            made = sum(1 for _ in items(txn, prefix))
            elapsed = time.perf_counter() - start
            assert made == count
            return elapsed

    return once()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--rounds", type=int, default=3, help="side-by-side rounds of bulk load and diff")
    parser.add_argument(
        "--only", default="bulk,small,diff,memory", help="figures to measure (bulk,small,diff,memory)"
    )
    parser.add_argument("--dir", default=None, help="where to put the stores (default: a temp dir)")
    parser.add_argument(
        "--pure-python", action="store_true", help="measure without the compiled accelerator (its twins)"
    )
    args = parser.parse_args()
    if args.pure_python:
        layout.ACCEL = None  # what the engine reads at each call: its pure-Python twins run
    accel = "pure Python" if layout.ACCEL is None else f"compiled accelerator ({layout.ACCEL.__name__})"
    n, rounds = args.records, args.rounds
    only = set(args.only.split(","))
    root = Path(args.dir or tempfile.mkdtemp(prefix="diffstore-bench-"))
    root.mkdir(parents=True, exist_ok=True)
    median = statistics.median
    print(f"engine benchmarks: {n:,} records, {rounds} rounds (a shared machine: medians, ratios per round)")
    print(f"hot loops: {accel}; load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    try:
        if "bulk" in only:
            ours, raw, floor, cpu_ratios, floor_cpu_ratios = bulk_rounds(root, n, rounds)
            ratios = [r / o for o, r in zip(ours, raw, strict=True)]
            print(
                f"bulk load       {n / median(ours):12,.0f} rec/s   "
                f"raw putmulti {n / median(raw):12,.0f} rec/s   ratio {median(ratios):.2f} "
                f"(goal >= 0.5; rounds {' '.join(f'{r:.2f}' for r in ratios)})"
            )
            floor_ratios = [r / f for f, r in zip(floor, raw, strict=True)]
            print(
                f"  layout floor  {n / median(floor):12,.0f} rec/s   LMDB alone writing our rows (records and"
                f" changes, built beforehand): ratio {median(floor_ratios):.2f} to raw putmulti"
            )
            print(
                f"  CPU time      put_many used {1 / median(cpu_ratios):.2f}x the CPU time of raw putmulti"
                f" (ratio {median(cpu_ratios):.2f}; the fsyncs, which dominate a loaded machine, left out);"
                f" the layout floor {1 / median(floor_cpu_ratios):.2f}x"
            )
        with Store.open(root / "store", StoreConfig(background=False)) as store:
            load_collection(store, "big", n)
            load_collection(store, "small", 10_000)
            if "small" in only:
                raw_small = bench_raw_putmulti(root, n, 30)[1]
                times = small_commit(store, "big", n, 30)
                ours_ms, raw_ms = median(times) * 1000, median(raw_small) * 1000
                print(
                    f"small commit    median {ours_ms:6.2f} ms on {n:,} keys (goal <= 5 ms); one raw durable"
                    f" putmulti of the same 1,000 keys {raw_ms:6.2f} ms   ratio {ours_ms / raw_ms:.2f}"
                )
        # the same with StoreConfig(sync=False): durable against kill -9, not against an OS crash
        with Store.open(root / "store", StoreConfig(background=False, sync=False)) as store:
            if "small" in only:
                raw_small_nosync = bench_raw_putmulti(root, n, 30, sync=False)[1]
                times = small_commit(store, "big", n, 30, first=100)
                ours_ms = median(times) * 1000
                raw_ms = median(raw_small_nosync) * 1000
                print(
                    f"small commit    median {ours_ms:6.2f} ms with sync=False (goal <= 5 ms); "
                    f"one raw unsynced putmulti of the same 1,000 keys {raw_ms:6.2f} ms   "
                    f"ratio {ours_ms / raw_ms:.2f}"
                )

            if "diff" in only:
                diff_figures(store, n, rounds)

            if "memory" in only:
                big = store.collection("big")
                before = anon_rss_mb()
                peak = before
                for index, _item in enumerate(big.diff(from_generation_id=b"", to_generation_id=b"g0001")):
                    if index % 50_000 == 0:
                        peak = max(peak, anon_rss_mb())
                peak = max(peak, anon_rss_mb())
                print(
                    f"diff memory     anonymous RSS growth {peak - before:6.1f} MB "
                    f"over a diff of {n:,} changes (goal <= 100 MB)"
                )
        print(f"load average at the end {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    finally:
        if args.dir is None:
            shutil.rmtree(root, ignore_errors=True)


def diff_figures(store: Store, n: int, rounds: int) -> None:
    # 1,000 changed keys, spread evenly (a seek per key) and side by side (a scan), on N and on 10k keys
    # Each diff spans exactly the generation of its 1,000 changes: from the generation before it (on "big"
    # that is the last small commit when those ran, not g0001, or the diff would span their changes too).
    before: dict[str, bytes] = {}
    for name, size in (("big", n), ("small", 10_000)):
        stride = size // 1000
        before[name] = store.collection(name).generation_id
        change_keys(name, store, b"s1", [j * stride + stride // 2 for j in range(1000)])
        change_keys(name, store, b"s2", [size // 2 + j for j in range(1000)])
    for label, from_gen, to_gen in (("spread", None, b"s1"), ("side by side", b"s1", b"s2")):
        runs = max(15, 2 * rounds + 1)
        big, small = [], []
        for _ in range(runs):
            big.append(diff_once(store, "big", from_gen or before["big"], to_gen))
            small.append(diff_once(store, "small", from_gen or before["small"], to_gen))
        ratios = [b / s for b, s in zip(big, small, strict=True)]
        print(
            f"diff 1k keys    {statistics.median(big) * 1000:6.2f} ms on {n:,} keys, "
            f"{statistics.median(small) * 1000:6.2f} ms on 10k keys, {label}   "
            f"ratio {statistics.median(ratios):.2f} (goal <= 1.5; median of {runs}, "
            f"best {min(big) * 1000:.2f} vs {min(small) * 1000:.2f} ms: {min(big) / min(small):.2f})"
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
    diffs, scans, made = [], [], []
    for _ in range(max(7, rounds)):
        diffs.append(diff_once(store, "through", b"1", b"2"))
        scans.append(raw_scan_once(store, through))
        made.append(item_floor(store, "through", through))
    ratios = [s / d for d, s in zip(diffs, scans, strict=True)]
    print(
        f"diff throughput {through / statistics.median(diffs):12,.0f} items/s   "
        f"raw scan {through / statistics.median(scans):12,.0f} rec/s   "
        f"ratio {statistics.median(ratios):.2f} (goal >= 0.2; median of {len(ratios)})"
    )
    floor = read_floor(store, "through", b"2", through)
    scan = raw_scan(store, through)
    print(
        f"  read floor    {through / floor:12,.0f} items/s   only reading the 3 entries a diff needs"
        f" per changed key (change, old and new version): ratio {scan / floor:.2f} to the raw scan"
    )
    made_ratios = [s / m for m, s in zip(made, scans, strict=True)]
    print(
        f"  item floor    {through / statistics.median(made):12,.0f} items/s   stepping over both versions"
        f" and building each item in Python, no check at all: ratio {statistics.median(made_ratios):.2f}"
        " to the raw scan (measured beside the diff, each round)"
    )


if __name__ == "__main__":
    os.environ.setdefault("PYTHONHASHSEED", "0")
    main()
