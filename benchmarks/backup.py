"""Backups and compaction, each against a baseline measured in the same run.

1. Backup speed: ``diffstore backup --data`` (engine/backup.py: LMDB's compacting copy, then settling and
   flushing) of a store of ``--mb`` megabytes, against LMDB's own compacting copy of the same file into the
   same file system (``Environment.copy(path, compact=True)``), alternating, best of ``--rounds``, nobody
   committing.
2. Both goals at once: a second process commits small durable generations (10 keys each) without pause on
   the store being backed up, while backups run (``--rounds`` of them, with quiet windows before, between
   and after). Its commit rate during the backups against its rate in the quiet windows: goal >= 0.7x; and
   the backups' speed meanwhile against LMDB's copy of step 1 (nobody committing): goal >= 0.5x. The
   backup paces itself by the writer's commit rate (``--disk-share``, engine/copying.py). For scale, the
   same writer beside LMDB's own (unpaced) copy. Where the writer's time goes (on CPU, waiting for a CPU,
   blocked on the disk) is printed from /proc/self/schedstat.
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
from collections.abc import Callable
from pathlib import Path

import lmdb
from _harness import machine

from diffstore import Store, StoreConfig
from diffstore.engine import backup, compact, copying, files, storage

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


def filesystem(path: Path) -> str:
    """The file system holding ``path``: its type and device (from /proc/mounts), or "unknown"."""
    try:
        mounts = [line.split()[:3] for line in Path("/proc/mounts").read_text().splitlines()]
    except OSError:
        return "unknown"
    best = max(
        (m for m in mounts if str(path.resolve()).startswith(m[1].rstrip("/") + "/") or m[1] == "/"),
        key=lambda m: len(m[1]),
    )
    return f"{best[2]} on {best[0]}"


def lmdb_copy(source: Path, out: Path) -> float:
    """LMDB's compacting copy of ``source`` into the new directory ``out``, flushed; its time (s)."""
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
    """The writer process: commits until stdin closes, then prints, for each commit, its monotonic time and
    the process's time on a CPU and waiting for one so far (ns; /proc/self/schedstat, 0 where missing)."""
    import threading

    stop = threading.Event()
    threading.Thread(target=lambda: (sys.stdin.read(), stop.set()), daemon=True).start()
    stamps: list[tuple[float, int, int]] = []
    with Store.open(path, StoreConfig(background=False)) as store:
        name = f"writer-{os.getpid()}"
        col = store.create_collection(name)
        print("ready", flush=True)
        n = 0
        while not stop.is_set():
            n += 1
            g = n.to_bytes(8, "big")
            col.start_generation(g)
            items = [(b"w%06d" % ((n * 31 + i) % 100_000), b"x" * 100) for i in range(WRITER_KEYS)]
            col.put_many(items, generation_id=g)
            col.commit_generation(g)
            stamps.append((time.monotonic(), *schedstat()))
        store.delete_collection(name)
    print(json.dumps(stamps), flush=True)


def schedstat() -> tuple[int, int]:
    try:
        with open("/proc/self/schedstat") as f:
            on_cpu, waiting, _ = f.read().split()
        return int(on_cpu), int(waiting)
    except OSError:
        return 0, 0


Stamps = list[tuple[float, int, int]]
Windows = list[tuple[bool, float, float]]  # (copying, start, end)


def rate(stamps: Stamps, windows: Windows, copying: bool) -> float:
    chosen = [(a, b) for c, a, b in windows if c == copying]
    return sum(1 for t, _, _ in stamps for a, b in chosen if a <= t < b) / sum(b - a for a, b in chosen)


def time_split(stamps: Stamps, windows: Windows, copying: bool) -> str:
    """Per generation written: ms on a CPU + ms waiting for a CPU + ms blocked (the disk: its flushes)."""
    n = wall = cpu = queued = 0.0
    for c, a, b in windows:
        inside = [s for s in stamps if a <= s[0] < b]
        if c != copying or len(inside) < 2:
            continue
        n += len(inside) - 1
        wall += inside[-1][0] - inside[0][0]
        cpu += (inside[-1][1] - inside[0][1]) / 1e9
        queued += (inside[-1][2] - inside[0][2]) / 1e9
    if not n or not cpu:
        return "n/a"
    blocked = wall - cpu - queued
    per = [x / n * 1e3 for x in (cpu, queued, blocked)]
    return f"{per[0]:.1f} on CPU + {per[1]:.1f} waiting for a CPU + {per[2]:.1f} blocked"


def beside_a_writer(
    source: Path, dest: Path, copy: Callable[[Path], object], rounds: int, quiet_s: float = 5.0
) -> tuple[Stamps, Windows]:
    """Runs ``copy`` ``rounds`` times beside a committing writer, with quiet windows around each."""
    proc = subprocess.Popen(
        [sys.executable, __file__, "--writer", str(source)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None and proc.stdin is not None
    try:
        assert proc.stdout.readline().strip() == "ready"
        time.sleep(1.0)  # warm up
        windows: Windows = []
        for r in range(rounds + 1):
            start = time.monotonic()
            time.sleep(quiet_s)
            windows.append((False, start, time.monotonic()))
            if r == rounds:
                break
            out = dest / "beside-writer"
            start = time.monotonic()
            copy(out)
            windows.append((True, start, time.monotonic()))
            shutil.rmtree(out)
        proc.stdin.close()
        stamps = [tuple(s) for s in json.loads(proc.stdout.read().strip().splitlines()[-1])]
        proc.wait()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdout.close()
    return stamps, windows  # type: ignore[return-value]


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
    parser.add_argument(
        "--disk-share",
        type=float,
        default=copying.DISK_SHARE,
        help=f"the backup's --disk-share beside the writer (default {copying.DISK_SHARE})",
    )
    parser.add_argument(
        "--out-dir",
        help="where the copies go, LMDB's and the backup's alike (default: beside the store, the same"
        " file system; a backup that outlives its disk goes to another one)",
    )
    parser.add_argument("--writer", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.writer:  # the writer process: its first line must be its "ready"
        writer(args.writer)
        return
    print(machine())
    work = Path(tempfile.mkdtemp(prefix="diffstore-backup-bench-", dir=os.environ.get("BENCH_DIR")))
    dest = work
    if args.out_dir:
        dest = Path(tempfile.mkdtemp(prefix="diffstore-backup-out-", dir=args.out_dir))
    try:
        source = work / "source"
        print(f"store in {work}, copies into {dest} ({filesystem(work)} -> {filesystem(dest)})")
        started = time.perf_counter()
        load(source, args.mb)
        size = (source / storage.DATA_FILE).stat().st_size
        print(f"store: {size / 1e6:,.0f} MB loaded in {time.perf_counter() - started:.0f} s")
        ours, theirs = [], []
        for r in range(args.rounds):
            theirs.append(lmdb_copy(source, dest / f"lmdb-{r}"))
            ours.append(diffstore_backup(source, dest / f"backup-{r}"))
            shutil.rmtree(dest / f"lmdb-{r}")
            shutil.rmtree(dest / f"backup-{r}")
        best_ours, best_theirs = min(ours), min(theirs)
        lmdb_speed = size / best_theirs / 1e6
        print(
            f"backup, nobody committing: {size / best_ours / 1e6:,.0f} MB/s; lmdb's compacting copy:"
            f" {lmdb_speed:,.0f} MB/s; ratio {best_theirs / best_ours:.2f}x (goal >= 0.5x)"
        )
        stamps, windows = beside_a_writer(
            source,
            dest,
            lambda out: backup.backup_directory(source, out, disk_share=args.disk_share),
            args.rounds,
        )
        took = [b - a for c, a, b in windows if c]
        quiet, busy = rate(stamps, windows, False), rate(stamps, windows, True)
        speed = size * len(took) / sum(took) / 1e6
        print(
            f"at the same time (--disk-share {args.disk_share}): backup {speed:,.0f} MB/s"
            f" ({' '.join(f'{t:.1f}' for t in took)} s), ratio {speed / lmdb_speed:.2f}x lmdb's copy"
            f" (goal >= 0.5x); writer {busy:,.0f} generations/s during the backups, {quiet:,.0f}/s"
            f" around them, ratio {busy / quiet:.2f}x (goal >= 0.7x)"
        )
        print(f"  writer's time per generation, quiet: {time_split(stamps, windows, False)} ms")
        print(f"  writer's time per generation, during the backups: {time_split(stamps, windows, True)} ms")
        stamps, windows = beside_a_writer(source, dest, lambda out: lmdb_copy(source, out), 1)
        took = [b - a for c, a, b in windows if c]
        quiet, busy = rate(stamps, windows, False), rate(stamps, windows, True)
        print(
            f"for scale, lmdb's own copy beside the same writer: {size / took[0] / 1e6:,.0f} MB/s; writer"
            f" {busy:,.0f}/s during it, {quiet:,.0f}/s around it, ratio {busy / quiet:.2f}x"
        )
        print(f"  writer's time per generation, during lmdb's copy: {time_split(stamps, windows, True)} ms")
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
        shutil.rmtree(dest, ignore_errors=True)


if __name__ == "__main__":
    main()
