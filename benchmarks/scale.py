"""How each operation's cost grows with the store (issue 52, part 2): every operation at 1M, 10M and 100M
keys, each beside its raw py-lmdb baseline measured in the same run where one exists.

    .venv/bin/python benchmarks/scale.py [--sizes 1M,10M,100M] [--work DIR] [--keep] [--only op,op]
                                         [--repeat R] [--serve]

For each size it builds one collection of N keys (16-byte keys, 100-byte values, loaded in generations of
at most 10M keys) and measures:

- ``bulk``: the load, records/s, against a raw ``putmulti`` of the same rows in an environment of its own;
- ``generation``: a durable 1,000-key generation spread over the keys, against a raw durable ``putmulti``;
- ``diff``: a diff of those 1,000 changes, against the raw cursor seeks to the same keys' two versions;
- ``query``: a page of 1,000 records from a random key, against a raw ``set_range`` and 1,000 ``next``;
- ``getmany``: ``get_many`` of 10,000 keys spread over the collection, against raw point gets;
- ``gc``: collecting a generation that rewrote 10% of the keys (a reader moved past it), against a raw
  delete of the same number of rows;
- ``compact``, ``backup`` (``backup --data``): against LMDB's compacting copy of the same file;
- ``check``: against a raw scan of every table;
- with ``--serve``: ``serve``'s RSS outside the map (``RssAnon``) after a round of reads, and a replica's
  initial copy against ``backup --url`` of the same server.

The last table prints, per operation, its cost at each size and the growth against the smallest size:
per operation for the operations whose work is the change (goal ≤ 1.3× from 1M to 100M), per key for the
whole-store operations (goal ≤ 1.2× per key from 10M to 100M). ``--work`` on a disk with room (a 100M-key
store and its raw twin take ~40 GB; compact and backup need as much again for a moment) and ``--keep``
reuse the stores of an earlier run.
"""

from __future__ import annotations

import argparse
import random
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import lmdb  # noqa: E402
from _harness import diffstore_command, diffstore_serve, machine, median  # noqa: E402

from diffstore import Store, StoreConfig  # noqa: E402
from diffstore.engine import check as check_engine  # noqa: E402
from diffstore.engine.backup import backup_directory  # noqa: E402
from diffstore.engine.compact import compact  # noqa: E402

BATCH = 100_000
GENERATION_KEYS = 10_000_000
MAP_SIZE = 1 << 40
CHANGE_OPS = ("generation", "diff", "query", "getmany")
WHOLE_STORE_OPS = ("bulk", "gc", "compact", "backup", "check", "replica copy")


def key(i: int) -> bytes:
    return b"k%015d" % i


def value(i: int, salt: int = 0) -> bytes:
    return (b"%016d%04d" % (i, salt)) * 5


def parse_size(text: str) -> int:
    text = text.strip().upper()
    scale = {"K": 1_000, "M": 1_000_000, "G": 1_000_000_000}.get(text[-1:], 1)
    return int(float(text.rstrip("KMG")) * scale)


def batches(low: int, high: int, salt: int = 0, step: int = 1) -> Iterator[list[tuple[bytes, bytes]]]:
    """Keys ``low``, ``low + step``, … below ``high`` with their values, ``BATCH`` rows at a time."""
    for start in range(low, high, BATCH * step):
        yield [(key(i), value(i, salt)) for i in range(start, min(high, start + BATCH * step), step)]


class Figures:
    """Per size: operation → (ours, baseline or None, unit, amount of work it stands for)."""

    def __init__(self) -> None:
        self.rows: dict[int, dict[str, tuple[float, float | None, str]]] = {}

    def add(self, n: int, op: str, ours: float, baseline: float | None, unit: str) -> None:
        self.rows.setdefault(n, {})[op] = (ours, baseline, unit)
        ratio = f"   ratio {ours / baseline:.2f}" if baseline else ""
        base = f"   baseline {baseline:>12,.3f} {unit}" if baseline else ""
        print(f"  {n:>12,} keys  {op:<14} {ours:>12,.3f} {unit}{base}{ratio}", flush=True)


def timed(fn: Callable[[], object]) -> float:
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


def raw_env(path: Path) -> lmdb.Environment:
    path.mkdir(parents=True, exist_ok=True)
    return lmdb.open(str(path), map_size=MAP_SIZE, max_dbs=4, writemap=True, metasync=False)


def build(root: Path, n: int, figures: Figures) -> None:
    """The engine's store and its raw twin; the load is timed only when both are built here."""
    data, raw = root / "store", root / "raw"
    if (root / "built").exists():
        print(f"  {n:,} keys: reusing {root}")
        return
    shutil.rmtree(root, ignore_errors=True)
    ours = 0.0
    with Store.open(data, StoreConfig(background=False)) as store:
        coll = store.create_collection("A")
        for g, low in enumerate(range(0, n, GENERATION_KEYS)):
            high = min(n, low + GENERATION_KEYS)
            gid = b"b%04d" % g
            started = time.perf_counter()
            coll.start_generation(gid)
            for rows in batches(low, high):
                coll.put_many(rows, generation_id=gid)
            coll.commit_generation(gid)
            ours += time.perf_counter() - started
    env = raw_env(raw)
    db = env.open_db(b"records")
    theirs = 0.0
    for low in range(0, n, GENERATION_KEYS):
        high = min(n, low + GENERATION_KEYS)
        started = time.perf_counter()
        with env.begin(write=True, db=db) as txn:
            cursor = txn.cursor()
            for rows in batches(low, high):
                cursor.putmulti(rows, append=True)
        env.sync(True)
        theirs += time.perf_counter() - started
    env.close()
    (root / "built").touch()
    figures.add(n, "bulk", n / ours, n / theirs, "rec/s")


def later_id() -> bytes:
    """A generation id above every earlier one of this store, also one kept from an earlier run (the
    load's ids start with ``b``)."""
    return b"z%016d" % time.time_ns()


def spread(n: int, count: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return sorted(rng.sample(range(n), count))


def change_ops(root: Path, n: int, figures: Figures, repeat: int, only: set[str]) -> None:
    store = Store.open(root / "store", StoreConfig(background=False))
    env = raw_env(root / "raw")
    ours: dict[str, list[float]] = {op: [] for op in CHANGE_OPS}
    theirs: dict[str, list[float]] = {op: [] for op in CHANGE_OPS}
    tag = int(time.time())
    for turn in range(repeat):
        for op, (mine, raw) in one_round(store, env, n, turn, tag).items():
            ours[op].append(mine)
            theirs[op].append(raw)
    for op in CHANGE_OPS:
        if op in only:
            figures.add(n, op, median(ours[op]) * 1e3, median(theirs[op]) * 1e3, "ms")
    env.close()
    store.close()


def one_round(
    store: Store, env: lmdb.Environment, n: int, turn: int, tag: int
) -> dict[str, tuple[float, float]]:
    """Seconds of each operation whose work is the change, the engine's and the raw baseline's."""
    coll = store.collection("A")
    db = env.open_db(b"records")
    indices = spread(n, 1000, turn + tag)
    items = [(key(i), value(i, turn + 1)) for i in indices]
    before = coll.generation_id
    gid = later_id()
    times: dict[str, tuple[float, float]] = {}

    def raw_generation() -> None:
        with env.begin(write=True, db=db) as txn:
            txn.cursor().putmulti([(k + b"\x01", v) for k, v in items], overwrite=True)
        env.sync(True)

    times["generation"] = (timed(lambda: coll.write_generation(gid, items)), timed(raw_generation))

    def raw_seeks() -> None:
        with env.begin(db=db) as txn:
            cursor = txn.cursor()
            for k, _ in items:
                cursor.set_range(k)
                cursor.item()
                cursor.next()
                cursor.item()

    times["diff"] = (timed(lambda: sum(1 for _ in coll.diff(before, gid))), timed(raw_seeks))
    start = key(random.Random(turn).randrange(n))

    def raw_page() -> None:
        with env.begin(db=db) as txn:
            cursor = txn.cursor()
            cursor.set_range(start)
            for _ in range(1000):
                cursor.item()
                if not cursor.next():
                    break

    times["query"] = (timed(lambda: coll.query_page(from_key=start, limit=1000)), timed(raw_page))
    keys = [key(i) for i in spread(n, 10_000, turn + 7 * tag)]

    def raw_gets() -> None:
        with env.begin(db=db) as txn:
            for k in keys:
                txn.get(k)

    times["getmany"] = (timed(lambda: coll.get_many(keys)), timed(raw_gets))
    return times


def gc_op(root: Path, n: int, figures: Figures) -> None:
    """A generation rewriting 10% of the keys, a reader moved past it: the versions it replaced are
    collected; the raw baseline deletes as many rows."""
    rewritten = max(1, n // 10)
    step = n // rewritten
    with Store.open(root / "store", StoreConfig(background=False)) as store:
        coll = store.collection("A")
        reader = "scale-gc"
        try:
            coll.create_reader(reader, "A", coll.generation_id)
        except Exception:  # noqa: BLE001 -- kept from an earlier run (--keep): move it to the current one
            coll.update_reader(reader, coll.generation_id)
        gid = later_id()
        coll.start_generation(gid)
        for rows in batches(0, n, salt=9, step=step):
            coll.put_many(rows, generation_id=gid)
        coll.commit_generation(gid)
        coll.update_reader(reader, gid)

        def collect() -> None:
            while store.run_background_once():
                pass

        ours = timed(collect)
    env = raw_env(root / "raw")
    db = env.open_db(b"records")

    def raw_delete() -> None:
        with env.begin(write=True, db=db) as txn:
            for i in range(0, n, step):
                txn.delete(key(i) + b"\x01")  # the raw twin's second versions, where they exist
                txn.put(key(i) + b"\x02", b"")
        env.sync(True)
        with env.begin(write=True, db=db) as txn:
            for i in range(0, n, step):
                txn.delete(key(i) + b"\x02")
        env.sync(True)

    theirs = timed(raw_delete) / 2
    env.close()
    figures.add(n, "gc", ours, theirs, "s")


def lmdb_compacting_copy(source: Path, out: Path) -> float:
    env = lmdb.open(str(source), readonly=True, lock=False, max_dbs=64)
    out.mkdir(parents=True)
    try:
        return timed(lambda: env.copy(str(out), compact=True))
    finally:
        env.close()
        shutil.rmtree(out, ignore_errors=True)


def whole_store_ops(root: Path, n: int, figures: Figures, only: set[str]) -> None:
    data = root / "store"
    if "backup" in only or "compact" in only:
        lmdb_copy = lmdb_compacting_copy(data, root / "lmdb-copy")
    if "backup" in only:
        out = root / "backup"
        shutil.rmtree(out, ignore_errors=True)
        ours = timed(lambda: backup_directory(data, out))
        shutil.rmtree(out, ignore_errors=True)
        figures.add(n, "backup", ours, lmdb_copy, "s")
    if "compact" in only:
        figures.add(n, "compact", timed(lambda: compact(data)), lmdb_copy, "s")
    if "check" in only:
        report: list[check_engine.Report] = []
        ours = timed(lambda: report.append(check_engine.check_directory(data)))
        assert report[0].ok, report[0].problems[:3]
        figures.add(n, "check", ours, raw_scan(data), "s")


def raw_scan(data: Path) -> float:
    env = lmdb.open(str(data), max_dbs=64, readonly=True, lock=False)
    started = time.perf_counter()
    with env.begin() as txn:
        for name, _ in txn.cursor():
            for _row in txn.cursor(db=env.open_db(bytes(name), txn=txn, create=False)):
                pass
    took = time.perf_counter() - started
    env.close()
    return took


def rss_anon_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("RssAnon:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def serve_ops(root: Path, n: int, figures: Figures, only: set[str]) -> None:
    import httpx

    from diffstore.client import Client

    data = root / "store"
    with diffstore_serve(data, "--workers", "1") as served:
        if "rss" in only:
            with Client(served.url) as client:
                coll = client.collection("A")
                for turn in range(20):
                    coll.get_many([key(i) for i in spread(n, 1000, turn)])
                    coll.query_page(from_key=key(random.Random(turn).randrange(n)), limit=1000)
            figures.add(n, "serve RSS", rss_anon_mb(served.pid), None, "MB")
        if "replica" in only:
            out = root / "url-backup"
            shutil.rmtree(out, ignore_errors=True)
            command = [*diffstore_command(), "backup", "--url", served.url, str(out)]
            backup_s = timed(lambda: subprocess.run(command, check=True, capture_output=True))
            shutil.rmtree(out, ignore_errors=True)
            replica_data = root / "replica"
            shutil.rmtree(replica_data, ignore_errors=True)
            started = time.perf_counter()
            with diffstore_serve(replica_data, "--workers", "1", "--replica-of", served.url) as replica:
                deadline = started + 3600
                while time.perf_counter() < deadline:
                    items = httpx.get(f"{replica.url}/replica", timeout=30).json().get("collections", [])
                    if any(i.get("collectionName") == "A" and i.get("state") == "following" for i in items):
                        break
                    time.sleep(0.2)
                else:
                    raise RuntimeError("the replica never finished its first copy")
                copy_s = time.perf_counter() - started
            shutil.rmtree(replica_data, ignore_errors=True)
            figures.add(n, "replica copy", n / copy_s, n / backup_s, "rec/s")


def summary(figures: Figures) -> None:
    sizes = sorted(figures.rows)
    if len(sizes) < 2:
        return
    print("\ngrowth (ours; 'per op' for work that is the change, 'per key' for whole-store work):")
    first, last = sizes[0], sizes[-1]
    ops = sorted({op for row in figures.rows.values() for op in row})
    for op in ops:
        cells = [figures.rows[n].get(op) for n in sizes]
        shown = "  ".join(f"{c[0]:>12,.3f}" if c else f"{'-':>12}" for c in cells)
        unit = next(c[2] for c in cells if c)
        growth = ""
        a, b = figures.rows[first].get(op), figures.rows[last].get(op)
        if a and b:
            if op in CHANGE_OPS:
                growth = f"per op {b[0] / a[0]:.2f}x from {first:,} to {last:,} (goal <= 1.3x)"
            elif unit == "rec/s":  # a rate: per key cost is its inverse
                prev = figures.rows[sizes[-2]].get(op) or a
                growth = f"per key {prev[0] / b[0]:.2f}x from {sizes[-2]:,} to {last:,} (goal <= 1.2x)"
            elif unit == "s":
                prev_n = sizes[-2]
                prev = figures.rows[prev_n].get(op) or a
                per_key = (b[0] / last) / (prev[0] / prev_n)
                growth = f"per key {per_key:.2f}x from {prev_n:,} to {last:,} (goal <= 1.2x)"
            else:
                growth = f"{b[0] / a[0]:.2f}x from {first:,} to {last:,} (goal <= 1.5x)"
        print(f"  {op:<14} {unit:<6} {shown}   {growth}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1M,10M,100M", help="comma-separated key counts (1M, 10M, 250K)")
    parser.add_argument("--work", type=Path, default=None, help="where the stores are built (a roomy disk)")
    parser.add_argument("--keep", action="store_true", help="keep the stores for the next run (with --work)")
    parser.add_argument("--only", default="", help="comma-separated operations (default: all)")
    parser.add_argument("--repeat", type=int, default=9, help="rounds of each small operation (median)")
    parser.add_argument("--serve", action="store_true", help="also serve's RSS and a replica's initial copy")
    args = parser.parse_args()
    every = {*CHANGE_OPS, "gc", "compact", "backup", "check", "rss", "replica"}
    only = set(args.only.split(",")) if args.only else every
    if not args.serve:
        only -= {"rss", "replica"}
    print(machine())
    figures = Figures()
    work = args.work or Path(tempfile.mkdtemp(prefix="diffstore-scale-"))
    try:
        for n in sorted(parse_size(s) for s in args.sizes.split(",")):
            root = work / f"n{n}"
            print(f"{n:,} keys in {root}", flush=True)
            build(root, n, figures)
            change_ops(root, n, figures, args.repeat, only)
            if "gc" in only:
                gc_op(root, n, figures)
            whole_store_ops(root, n, figures, only)
            serve_ops(root, n, figures, only)
            if not args.keep:
                shutil.rmtree(root, ignore_errors=True)
        summary(figures)
    finally:
        if not args.keep and args.work is None:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
