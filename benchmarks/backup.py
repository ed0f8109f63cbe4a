"""Backups and compaction, each against a baseline measured in the same run.

1. Backup speed: ``diffstore backup --data`` (engine/backup.py: LMDB's compacting copy, then settling and
   flushing) of a store of ``--mb`` megabytes, against LMDB's own compacting copy of the same file
   (``Environment.copy(path, compact=True)``), alternating, best of ``--rounds``. Goal: >= 0.5x.
2. A writer meanwhile: a second process commits small durable generations (10 keys each) without pause;
   its commit rate while a backup runs, against its rate just before and just after. Goal: >= 0.7x. (The
   backup then keeps the disk busy a tenth of the time: engine/copying.py.)
3. Compaction: ten collections of equal size, nine deleted and purged, then ``compact``: the file's size
   against a fresh store holding only the surviving collection (the live data's size), and against the
   raw bytes of its keys and values. Goal: <= 1.2x.

Run: ``python benchmarks/backup.py`` (1 GB; several minutes) or ``--mb 100`` for a quick run. Figures on a
loaded machine are indicative: the script prints the load average with them.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import lmdb
from _harness import machine

from diffstore import Store, StoreConfig
from diffstore.engine import backup, compact, files, storage

VALUE_BYTES = 1000
BATCH = 5_000
WRITER_KEYS = 10


def load(path: Path, megabytes: int, collections: int = 1) -> int:
    """Fills a store with ``megabytes`` of 1000-byte values spread over ``collections``; returns the raw
    bytes of keys and values in each collection."""
    records = megabytes * 1_000_000 // VALUE_BYTES // collections
    with Store.open(path, StoreConfig(background=False)) as store:
        for c in range(collections):
            col = store.create_collection(f"c{c}")
            col.start_generation(b"1")
            for start in range(0, records, BATCH):
                keys = range(start, min(records, start + BATCH))
                col.put_many([(b"key-%09d" % i, os.urandom(VALUE_BYTES)) for i in keys], generation_id=b"1")
            col.commit_generation(b"1")
    return records * (len(b"key-%09d" % 0) + VALUE_BYTES)


def lmdb_copy(source: Path, out: Path) -> float:
    env = lmdb.open(str(source), map_size=files.MAP_SIZE, max_dbs=files.MAX_DBS, max_readers=2048)
    try:
        out.mkdir()
        started = time.perf_counter()
        env.copy(str(out), compact=True)
        fd = os.open(out / storage.DATA_FILE, os.O_RDONLY)
        os.fsync(fd)  # as the backup does: both end with the copy on disk
        os.close(fd)
        return time.perf_counter() - started
    finally:
        env.close()


def diffstore_backup(source: Path, out: Path) -> float:
    started = time.perf_counter()
    backup.backup_directory(source, out)
    return time.perf_counter() - started


def writer(path: str) -> None:
    """The writer process: commits until stdin closes, then prints the monotonic time of each commit."""
    import threading

    stop = threading.Event()
    threading.Thread(target=lambda: (sys.stdin.read(), stop.set()), daemon=True).start()
    stamps: list[float] = []
    with Store.open(path, StoreConfig(background=False)) as store:
        col = store.create_collection("writer")
        print("ready", flush=True)
        n = 0
        while not stop.is_set():
            n += 1
            g = n.to_bytes(8, "big")
            col.start_generation(g)
            items = [(b"w%06d" % ((n * 31 + i) % 100_000), b"x" * 100) for i in range(WRITER_KEYS)]
            col.put_many(items, generation_id=g)
            col.commit_generation(g)
            stamps.append(time.monotonic())
    print(json.dumps(stamps), flush=True)


def rate(stamps: list[float], start: float, end: float) -> float:
    return sum(1 for t in stamps if start <= t < end) / (end - start)


def writer_figure(source: Path, work: Path) -> tuple[float, float, float]:
    proc = subprocess.Popen(
        [sys.executable, __file__, "--writer", str(source)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None and proc.stdin is not None
    assert proc.stdout.readline().strip() == "ready"
    time.sleep(1.0)  # warm up
    quiet_start = time.monotonic()
    time.sleep(5.0)
    busy_start = time.monotonic()
    backup.backup_directory(source, work / "during")
    busy_end = time.monotonic()
    after_start = busy_end
    time.sleep(5.0)
    after_end = time.monotonic()
    proc.stdin.close()
    stamps = json.loads(proc.stdout.read().strip().splitlines()[-1])
    proc.wait()
    proc.stdout.close()
    quiet = (rate(stamps, quiet_start, busy_start) + rate(stamps, after_start, after_end)) / 2
    return quiet, rate(stamps, busy_start, busy_end), busy_end - busy_start


def compaction_figure(work: Path, megabytes: int) -> tuple[int, int, int, int]:
    path = work / "compact"
    load(path, megabytes, collections=10)
    with Store.open(path, StoreConfig(background=False)) as store:
        for c in range(1, 10):
            store.delete_collection(f"c{c}")
        while store.run_background_once():
            pass
    result = compact.compact(path)
    fresh = work / "fresh"
    raw = load(fresh, megabytes // 10, collections=1)
    return result.before_bytes, result.after_bytes, (fresh / storage.DATA_FILE).stat().st_size, raw


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--mb", type=int, default=1000, help="store size in MB (default 1000)")
    parser.add_argument("--rounds", type=int, default=2, help="alternating rounds of each copy (default 2)")
    parser.add_argument("--writer", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.writer:  # the writer process: its first line must be its "ready"
        writer(args.writer)
        return
    print(machine())
    work = Path(tempfile.mkdtemp(prefix="diffstore-backup-bench-", dir=os.environ.get("BENCH_DIR")))
    try:
        source = work / "source"
        started = time.perf_counter()
        load(source, args.mb)
        size = (source / storage.DATA_FILE).stat().st_size
        print(f"store: {size / 1e6:,.0f} MB loaded in {time.perf_counter() - started:.0f} s")
        ours, theirs = [], []
        for r in range(args.rounds):
            theirs.append(lmdb_copy(source, work / f"lmdb-{r}"))
            ours.append(diffstore_backup(source, work / f"backup-{r}"))
            shutil.rmtree(work / f"lmdb-{r}")
            shutil.rmtree(work / f"backup-{r}")
        best_ours, best_theirs = min(ours), min(theirs)
        print(
            f"backup: {size / best_ours / 1e6:,.0f} MB/s; lmdb's compacting copy:"
            f" {size / best_theirs / 1e6:,.0f} MB/s; ratio {best_theirs / best_ours:.2f}x (goal >= 0.5x)"
        )
        quiet, busy, took = writer_figure(source, work)
        print(
            f"writer: {quiet:,.0f} commits/s around the backup, {busy:,.0f} commits/s during it"
            f" ({took:.1f} s, {size / took / 1e6:,.0f} MB/s); ratio {busy / quiet:.2f}x (goal >= 0.7x)"
        )
        shutil.rmtree(source)
        before, after, fresh, raw = compaction_figure(work, args.mb)
        print(
            f"compaction after deleting 90%: {before / 1e6:,.0f} MB -> {after / 1e6:,.0f} MB; live data: a"
            f" fresh store of it {fresh / 1e6:,.0f} MB, raw keys+values {raw / 1e6:,.0f} MB; ratio"
            f" {after / fresh:.2f}x the fresh store (goal <= 1.2x), {after / raw:.2f}x the raw bytes"
        )
        print(f"load average: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
