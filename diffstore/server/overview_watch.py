"""The long polls of ``GET /overview/changes``: many waiters, one check of the overview's version at a time.

A waiter is one future, filed under the version it has (``since``). Waiting costs nothing per waiter: no
timer of its own beyond its timeout, no digest. The version (:func:`diffstore.engine.overview.version`, a
digest of the collections and readers) is computed once per *check*, in a worker thread, and every waiter
whose ``since`` differs is answered by that one check.

A check runs when something may have changed what the overview shows:

* a commit or a deletion, of this process or of another one (the store's commit and delete listeners,
  fed by the commit notices of :mod:`diffstore.engine.wakeup`: at once);
* any other write of any process -- a collection created, a generation started or aborted, a reader
  created, moved or deleted -- which sends no notice: every :data:`TICK_S` the watch reads LMDB's last
  transaction id (one read of the shared meta page, no scan) and checks when it moved since the last
  check. An idle store thus costs no digest at all, however many consoles wait.

Invariants:
    * At most one check runs at a time, and checks start at least :data:`CHECK_SPACING_S` apart: a burst
      of commits costs a few digests per second per process, never one per commit or per waiter. A poke
      during a check starts another one after it (the check may have read the store before the change).
    * The transaction id is read before the digest: a write that lands during the digest moves the id
      past the one recorded, so the next tick checks again.
    * A waiter is answered once: by a check, its timeout or :meth:`OverviewWatch.close` (shutdown),
      which answer with the latest version known.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

import anyio.to_thread

from diffstore.engine import overview

if TYPE_CHECKING:
    from diffstore.engine.store import Store

_log = logging.getLogger("diffstore.server")
TICK_S = 0.25
"""How often the watch looks for writes that send no notice (only while someone waits)."""
CHECK_SPACING_S = 0.2
"""The least time between the starts of two checks."""


class OverviewWatch:
    """Answers ``/overview/changes`` long polls of one store, on one event loop."""

    def __init__(self, store: Store) -> None:
        self._store = store
        self._waiters: dict[str, set[asyncio.Future[str]]] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread: int | None = None
        self._unsubscribe: list[Callable[[], None]] = []
        self._tick: asyncio.TimerHandle | None = None
        self._checking: asyncio.Task[None] | None = None
        self._again = False  # poked during a check: check once more after it
        self._last_start = float("-inf")
        self._checked_txn: int | None = None  # LMDB's last transaction id when the last check began
        self._started = 0  # checks started (numbered from 1)
        self._done = 0  # the number of the last check that answered
        self.version: str | None = None  # the latest version computed
        self.checks = 0  # digests computed (each answers every waiter it concerns)
        self.closed = False

    def attach(self, loop: asyncio.AbstractEventLoop) -> None:
        """Starts hearing commits and deletions; called on ``loop``'s thread."""
        self._loop = loop
        self._loop_thread = threading.get_ident()
        self.closed = False
        self._unsubscribe = [
            self._store.add_commit_listener(lambda name, generation_id: self._heard()),
            self._store.add_delete_listener(lambda name: self._heard()),
        ]

    def close(self) -> None:
        """Answers every waiter with the latest version known and refuses new ones (on the loop)."""
        self.closed = True
        for remove in self._unsubscribe:
            remove()
        self._unsubscribe = []
        if self._tick is not None:
            self._tick.cancel()
            self._tick = None
        for since, group in list(self._waiters.items()):
            for future in group:
                if not future.done():
                    future.set_result(self.version or since)
        self._waiters.clear()

    def waiting(self) -> int:
        """How many long polls wait."""
        return sum(len(group) for group in self._waiters.values())

    async def current(self) -> str:
        """The version now, from the next check (shared with every caller of the moment)."""
        return await self.wait("", None)  # no digest is empty: the next check answers

    async def wait(self, since: str, timeout_s: float | None) -> str:
        """The version as soon as it differs from ``since``, or at the timeout the latest one known.

        At least one check starts after the call, even past the timeout: a change made before the call
        is never answered with ``since``.
        """
        if self.closed:
            return self.version or since
        future: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        self._waiters.setdefault(since, set()).add(future)
        mark = self._started
        if self._tick is None:
            self._schedule_tick()
        self._poke()
        try:
            return await asyncio.wait_for(asyncio.shield(future), timeout_s)
        except TimeoutError:
            checking = self._checking
            if not future.done() and checking is not None and self._done <= mark:
                await asyncio.shield(checking)  # the check that started after the call
            return future.result() if future.done() else since
        finally:
            group = self._waiters.get(since)
            if group is not None:
                group.discard(future)
                if not group:
                    del self._waiters[since]

    def _heard(self) -> None:
        """A commit or a deletion (in the committing thread, the wake-up thread, or on the loop)."""
        loop = self._loop
        if not self._waiters or loop is None or loop.is_closed():
            return
        if threading.get_ident() == self._loop_thread:
            self._poke()
        else:
            with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
                loop.call_soon_threadsafe(self._poke)

    def _schedule_tick(self) -> None:
        loop = self._loop
        if loop is not None and not loop.is_closed() and not self.closed:
            self._tick = loop.call_later(TICK_S, self._on_tick)

    def _on_tick(self) -> None:
        self._tick = None
        if not self._waiters:
            return  # ticks again once someone waits
        if self._last_txn() != self._checked_txn:
            self._poke()
        self._schedule_tick()

    def _last_txn(self) -> int:
        return int(self._store.env.info()["last_txnid"])

    def _poke(self) -> None:
        if self.closed or not self._waiters:
            return
        if self._checking is not None:
            self._again = True
            return
        self._checking = asyncio.get_running_loop().create_task(self._check())

    async def _check(self) -> None:
        try:
            while True:
                self._again = False
                loop = asyncio.get_running_loop()
                spacing = self._last_start + CHECK_SPACING_S - loop.time()
                if spacing > 0:
                    await asyncio.sleep(spacing)
                self._last_start = loop.time()
                self._started += 1
                number = self._started
                try:
                    version = await self._digest()
                except Exception:  # the store closing under a shutdown, say: the waiters time out
                    _log.exception("computing the overview's version failed")
                    return
                self._done = number
                for since in [since for since in self._waiters if since != version]:
                    for future in self._waiters.pop(since):
                        if not future.done():
                            future.set_result(version)
                if not self._again or not self._waiters or self.closed:
                    return
        finally:
            self._checking = None

    async def _digest(self) -> str:
        self._checked_txn = self._last_txn()
        version = await anyio.to_thread.run_sync(overview.version, self._store)
        self.checks += 1
        self.version = version
        return version
