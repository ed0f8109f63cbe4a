"""LMDB's compacting copy of a store into a file, paced so that the store's writers keep their disk.

``mdb_env_copyfd2`` with ``MDB_CP_COMPACT`` reads the store in one read transaction and writes its live
pages, packed, as fast as the disk takes them. A writer of the store meanwhile commits with a flush to disk
per commit, and each flush waits behind the copy's writes queued at the device: measured here
(benchmarks/backup.py), a writer kept a third of its commit rate while an unpaced copy ran.

So the copy goes through a pipe (LMDB writes into it from a thread, giving up the GIL) and this module
writes it into the file a chunk at a time, with ``O_DIRECT`` where the file system takes it (as
``mdb_env_copy2`` does: no gigabytes of dirty pages for the kernel to write back behind the writers'
flushes, no store pages pushed out of the page cache). While the store's writers are committing (LMDB's
last transaction id moved in the last second), it waits after each chunk so that the copy keeps the
disk busy at most ``disk_share`` of the time; while nobody commits, it writes at full speed. A chunk is
1 MiB, so a writer's flush waits behind one chunk at most.
"""

from __future__ import annotations

import contextlib
import fcntl
import mmap
import os
import threading
import time
from collections.abc import Callable

import lmdb

Progress = Callable[[int, int], None]
"""Called with (bytes copied so far, bytes expected in all: an estimate) while a copy runs."""

DISK_SHARE = 0.1
"""The share of the time a backup's copy keeps the disk busy by default while the store's writers commit.
Measured on a quiet machine (benchmarks/backup.py, load 2.5): a writer of durable commits kept 0.14x of its
rate beside a copy paced at 0.5 (the copy's writes land in the device's cache at once, so they take little
time, and each of the writer's flushes then pays for flushing them), 0.74x at 0.1, the copy writing 36 MB/s
meanwhile."""

_CHUNK = 1 << 20  # a multiple of every page size; a writer's flush waits behind one chunk at most
_PIPE_BYTES = 1 << 20
_REPORT_S = 0.1
_BUSY_S = 1.0
_ALIGN = 4096  # O_DIRECT writes must be whole blocks


def copy_to_file(
    env: lmdb.Environment,
    fd: int,
    expected: int,
    progress: Progress | None = None,
    disk_share: float = DISK_SHARE,
) -> int:
    """Writes the compacting copy of ``env`` into the empty file ``fd``; returns the bytes written.

    Raises:
        lmdb.Error, OSError: the copy or a write failed (the file holds a part of the copy).
    """
    if not 0 < disk_share <= 1:
        raise ValueError("disk_share must be in (0, 1]")
    reading, writing = os.pipe()
    with contextlib.suppress(OSError):  # past the system's pipe limit the default size works too
        fcntl.fcntl(writing, fcntl.F_SETPIPE_SZ, _PIPE_BYTES)
    failure: list[BaseException] = []

    def copy() -> None:
        try:
            env.copyfd(writing, compact=True)
        except BaseException as exc:  # handed to the writing thread, raised there
            failure.append(exc)
        finally:
            os.close(writing)

    worker = threading.Thread(target=copy, name="diffstore-copy", daemon=True)
    worker.start()
    direct = _direct(fd)
    committing = _commits_of(env)
    chunk = mmap.mmap(-1, _CHUNK)  # page-aligned memory, as O_DIRECT needs
    view = memoryview(chunk)
    written = filled = 0
    reported = time.monotonic()
    try:
        while True:
            got = os.readv(reading, [view[filled:]])
            if got == 0:
                break
            filled += got
            if filled < _CHUNK:
                continue
            written += _write(fd, view, filled, disk_share if committing() else 1.0)
            filled = 0
            if progress is not None and time.monotonic() - reported >= _REPORT_S:
                reported = time.monotonic()
                progress(written, max(expected, written))
        if filled:
            if direct and filled % _ALIGN:  # LMDB writes whole pages; should it not, write the rest cached
                fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~direct)
            written += _write(fd, view, filled, disk_share)
    finally:
        os.close(reading)  # on a failure here, the copy's next write fails and its read transaction ends
        worker.join()
        view.release()
        chunk.close()
    if failure:
        raise failure[0]
    if progress is not None:
        progress(written, written)
    return written


def _commits_of(env: lmdb.Environment) -> Callable[[], bool]:
    """A function telling whether the store committed a transaction in the last :data:`_BUSY_S` seconds
    (a writer committing a few times a second counts as committing between its commits too)."""
    last_txnid, last_seen = env.info()["last_txnid"], float("-inf")

    def committing() -> bool:
        nonlocal last_txnid, last_seen
        txnid, now = env.info()["last_txnid"], time.monotonic()
        if txnid != last_txnid:
            last_txnid, last_seen = txnid, now
        return now - last_seen < _BUSY_S

    return committing


def _direct(fd: int) -> int:
    """Turns ``O_DIRECT`` on for ``fd`` where the file system takes it; the flag, or 0."""
    direct = getattr(os, "O_DIRECT", 0)
    if not direct:
        return 0
    try:
        fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) | direct)
    except OSError:  # a file system without it (tmpfs): written through the page cache
        return 0
    return direct


def _write(fd: int, view: memoryview, length: int, disk_share: float) -> int:
    started = time.perf_counter()
    done = 0
    while done < length:
        with view[done:length] as part:
            done += os.write(fd, part)
    if disk_share < 1:
        time.sleep((time.perf_counter() - started) * (1 / disk_share - 1))
    return length
