"""Keeps LMDB-heavy work of one thread from queueing behind other threads for the GIL.

py-lmdb releases the GIL around every LMDB call -- each item of a ``putmulti`` included -- and takes it
back afterwards. While another thread is running Python code, taking it back waits for CPython's switch
interval, so a writer in the middle of a 10k-item ``put_many`` advances by about one item per interval
(the "convoy effect"). Measured here: ``put_many`` fell from ~600k to ~11k records/s with one busy thread
beside it, and the HTTP server's putMany from 445k to 32k records/s while 32 clients were reading.

The other threads' work that the engine sees is reads. So a read that starts while another thread's write
transaction is changing pages waits, for at most ``StoreConfig.read_yield_ms``, until those changes are
done. The commit that follows (page writes, fsync) is one LMDB call without the GIL and is not waited for;
nor is a write by the reading thread itself.

Two threads building pages (query, diff, splits) hand the GIL to each other on every LMDB call, each
handover a thread switch. Pages are therefore built one at a time, under ``Store.page_read``'s lock (a
plain ``RLock``, so it lives there): two threads reading pages at once got
0.69x (query) and 0.71x (diff) the rate of one thread reading the same pages in turn, and 0.95x / 0.99x
built in turn (``benchmarks/concurrent_pages.py``).
Point reads do not queue behind pages: they are short, and often on the event loop.

A thread that must never block -- the HTTP server's event loop -- is exempt (``exempt_current_thread``):
its reads never block on a writer. Such a thread steps aside without blocking instead: it asks to be told
when the writer is done (``call_when_done``, with the same bound) and serves its other work meanwhile;
the HTTP server parks its point gets that way (``benchmarks/mixed_load.py`` measures putMany beside 32
clients sending gets; in one process it fell to 0.11x its rate alone while the gets ran beside the
writer). The convoy this module fights is a matter of threads of one process; writers in other processes
(``serve --workers``, ``ingest --data``) do not share our GIL, so with them nothing here applies.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Iterator

_log = logging.getLogger("diffstore.engine")


class WriterFirst:
    """Lets reads of other threads step aside while one thread's write transaction changes pages."""

    __slots__ = ("_writer", "_done", "_max_wait_s", "_exempt", "_callbacks", "_lock")

    def __init__(self, max_wait_ms: float) -> None:
        self._writer: int | None = None  # the thread changing pages, if any
        self._done = threading.Event()
        self._done.set()
        self._max_wait_s = max_wait_ms / 1000
        self._exempt: frozenset[int] = frozenset()  # threads whose reads never wait
        self._callbacks: list[Callable[[], None]] = []  # told when the writer is done (call_when_done)
        self._lock = threading.Lock()

    @property
    def max_wait_s(self) -> float:
        """The bound on a read's wait, in seconds (0: reads never step aside)."""
        return self._max_wait_s

    def exempt_current_thread(self) -> None:
        """Reads of the calling thread never wait from now on (an event loop must not block)."""
        self._exempt = self._exempt | {threading.get_ident()}

    @contextlib.contextmanager
    def writing(self) -> Iterator[None]:
        """Marks the caller's thread as changing pages (call it under the store's write lock)."""
        if self._writer is not None or not self._max_wait_s:  # nested in the same thread, or switched off
            yield
            return
        self._writer = threading.get_ident()
        self._done.clear()
        try:
            yield
        finally:
            with self._lock:
                self._writer = None
                callbacks, self._callbacks = self._callbacks, []
            self._done.set()
            for callback in callbacks:
                try:
                    callback()
                except Exception:  # never into the writer: its transaction has yet to commit
                    _log.exception("a callback waiting for the writer failed")

    def call_when_done(self, callback: Callable[[], None]) -> bool:
        """Calls ``callback`` (in the writer's thread) when another thread's page changes end: True, or
        False (and never calls it) when no other thread is changing pages now or stepping aside is off.

        For a thread that must not block (an event loop): the callback must be quick and thread-safe
        (``loop.call_soon_threadsafe``); bounding the wait by :attr:`max_wait_s` is the caller's.
        """
        if not self._max_wait_s or self._writer is None:  # the common case, without the lock
            return False
        me = threading.get_ident()
        with self._lock:
            if self._writer is None or self._writer == me:
                return False
            self._callbacks.append(callback)
            return True

    def before_read(self) -> bool:
        """Waits (bounded) while another thread is changing pages; True if it waited."""
        writer = self._writer
        if writer is None:
            return False
        me = threading.get_ident()
        if writer == me or me in self._exempt:
            return False
        self._done.wait(self._max_wait_s)
        return True
