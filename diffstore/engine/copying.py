"""LMDB's compacting copy of a store into a file, paced by its effect on the store's writers.

``mdb_env_copyfd2`` with ``MDB_CP_COMPACT`` reads the store in one read transaction and writes its live
pages, packed, as fast as the disk takes them. A writer of the store meanwhile commits with a flush to disk
per commit, and each flush waits for the copy's writes that reached the device before it: measured here
(benchmarks/backup.py), a writer kept 0.14-0.35x of its commit rate beside an unpaced copy.

So the copy goes through a pipe (LMDB writes into it from a thread, giving up the GIL) and this module
writes it into the file a chunk at a time, with ``O_DIRECT`` where the file system takes it (as
``mdb_env_copy2`` does: no gigabytes of dirty pages for the kernel to write back behind the writers'
flushes, no store pages pushed out of the page cache). A chunk is 1 MiB.

While nobody commits (LMDB's last transaction id did not move in the last second), the copy runs at full
speed. While writers commit, :class:`_Pacer` writes chunks evenly spaced at a byte rate, in turns of a
second or two, and after every other turn stops the copy for a moment to measure the writers' commit rate
without it: the rate goes up while the writers kept ``1 - disk_share`` of their commit rate in the turn,
down when they did not. The cost of a chunk to a writer is not its write time: an ``O_DIRECT`` write
returns once the device's write cache holds it, and the writer's next flush pays for it. Pacing by write
time (the previous design) let the copy run as if unpaced on a quiet disk (the writer kept 0.14x) and
slowed it to 36 MB/s on a busy one; pacing by the writers' own commit rate measures what is to be kept.
"""

from __future__ import annotations

import collections
import contextlib
import fcntl
import mmap
import os
import threading
import time
from collections.abc import Callable

import lmdb

from diffstore.engine import crashpoints

Progress = Callable[[int, int], None]
"""Called with (bytes copied so far, bytes expected in all: an estimate) while a copy runs."""

DISK_SHARE = 0.3
"""The share of the store's commit rate a backup may take by default while writers commit (they keep 0.7x
of it, and more: the measuring pauses are theirs). 1 is full speed."""

_CHUNK = 1 << 20  # a multiple of every page size; a writer's flush waits behind one chunk at most
_PIPE_BYTES = 1 << 20
_REPORT_S = 0.1
_BUSY_S = 1.0
_START_RATE = 64e6  # bytes/s: a fraction of a disk's speed; found in a few turns either way
_MIN_RATE, _MAX_RATE = 1e6, 1e10
_UP, _DOWN = 2.0, 0.7  # the most a turn moves the rate either way
_BURST_S = 0.05  # a copy that fell behind its rate (a slow read) catches up this much at once
_TURN_S, _MAX_TURN_S = 1.5, 4.0
_PAUSE_S, _MAX_PAUSE_S, _PAUSE_STEP_S = 0.5, 2.0, 0.01
_PAUSES = 3  # the writers' rate without the copy: over this many pauses
_PAUSE_EVERY = 2  # turns: a pause after every other one (the rate without the copy moves slowly)
_ENOUGH = 20  # commits counted in a turn or a pause for a rate worth comparing (else it waits longer)
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
    pacer = _Pacer(env, disk_share)
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
            written += _write(fd, view, filled)
            pacer.wrote(filled)
            filled = 0
            if written == _CHUNK:  # the first chunk is written, the read transaction open: under way
                crashpoints.reached("copy-midway")
            if progress is not None and time.monotonic() - reported >= _REPORT_S:
                reported = time.monotonic()
                progress(written, max(expected, written))
        if filled:
            if direct and filled % _ALIGN:  # LMDB writes whole pages; should it not, write the rest cached
                fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~direct)
            written += _write(fd, view, filled)
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


def next_rate(rate: float, with_copy: float, without: float, keep: float) -> float:
    """The copy's next byte rate: up while the writers kept ``keep`` of their commit rate ``without`` the
    copy (their rate in the last pauses) in the turn just run at ``rate`` (``with_copy`` commits/s), down
    when they did not."""
    # by the square of the miss (a noisy turn near the goal moves the rate a little, a copy far below what
    # the writers spare doubles its rate per turn), within bounds
    factor = _UP if without <= 0 else min(_UP, max(_DOWN, (with_copy / without / keep) ** 2))
    return min(_MAX_RATE, max(_MIN_RATE, rate * factor))


class _Pacer:
    """Paces the copy by its effect on the store's writers: their commit rate.

    While nobody commits, the copy runs at full speed. While writers commit, the copy runs at a byte rate
    (evenly spaced chunks) in turns with short pauses; each pause measures the writers' commit rate
    without the copy, each turn with it; the rate goes up while the writers keep ``1 - disk_share`` of
    their rate and down when they do not."""

    def __init__(self, env: lmdb.Environment, disk_share: float) -> None:
        self.env = env
        self.keep = 1 - disk_share
        self.rate = _START_RATE
        self.txnid = self._txnid()
        self.last_commit = float("-inf")
        self.turn_start = time.monotonic()
        self.turn_txnid = self.txnid
        self.next_at = 0.0
        self.pauses: collections.deque[tuple[int, float]] = collections.deque(maxlen=_PAUSES)
        self.turns = 0

    def _txnid(self) -> int:
        return int(self.env.info()["last_txnid"])

    def wrote(self, length: int) -> None:
        if self.keep <= 0:
            return
        now = time.monotonic()
        txnid = self._txnid()
        if txnid != self.txnid:
            self.txnid, self.last_commit = txnid, now
        if now - self.last_commit >= _BUSY_S:  # nobody commits: full speed, a fresh turn when they do
            self.turn_start, self.turn_txnid, self.next_at = now, txnid, now
            return
        self.next_at = max(self.next_at, now - _BURST_S) + length / self.rate
        if self.next_at > now:
            time.sleep(self.next_at - now)
        now = time.monotonic()
        commits = self.txnid - self.turn_txnid
        if now - self.turn_start < _TURN_S or (commits < _ENOUGH and now - self.turn_start < _MAX_TURN_S):
            return
        with_copy = commits / (now - self.turn_start)
        self.turns += 1
        pause = self.turns % _PAUSE_EVERY == 1 or not self.pauses
        self.rate = next_rate(self.rate, with_copy, self._pause() if pause else self._without(), self.keep)
        self.turn_start, self.turn_txnid = time.monotonic(), self._txnid()
        self.next_at = self.turn_start

    def _pause(self) -> float:
        """Waits with the copy stopped until the writers commit enough (or long enough); returns their
        rate over the last few pauses (one pause is a small sample)."""
        started, first = time.monotonic(), self._txnid()
        while True:
            time.sleep(_PAUSE_STEP_S)
            now, txnid = time.monotonic(), self._txnid()
            if (now - started >= _PAUSE_S and txnid - first >= _ENOUGH) or now - started >= _MAX_PAUSE_S:
                self.txnid = txnid
                if txnid != first:
                    self.last_commit = now
                self.pauses.append((txnid - first, now - started))
                return self._without()

    def _without(self) -> float:
        return sum(c for c, _ in self.pauses) / sum(t for _, t in self.pauses)


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


def _write(fd: int, view: memoryview, length: int) -> int:
    done = 0
    while done < length:
        with view[done:length] as part:
            done += os.write(fd, part)
    return length
