"""Long-poll waiters of ``generationId/stream``: asyncio futures woken by the store's commit listener.

Invariants:
    * A waiter is one future in ``_waiters[collection]``; no thread is held while it waits.
    * The commit listener runs in the committing thread and only schedules ``_wake`` on the event loop
      (``call_soon_threadsafe``); ``_wake`` pops the collection's whole set, so one commit answers every
      waiter of that collection at once.
    * A waiter registers before it reads the current generation, so a commit between the two is never lost.
    * ``close`` (graceful shutdown) resolves every waiter with ``None`` and refuses new ones.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from diffstore.engine.store import Store


class CommitHub:
    """Routes commits of a store to the futures waiting on each collection."""

    def __init__(self) -> None:
        self._waiters: dict[str, set[asyncio.Future[bytes | None]]] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._unsubscribe: Callable[[], None] | None = None
        self.closed = False

    def attach(self, store: Store, loop: asyncio.AbstractEventLoop) -> None:
        """Starts listening to ``store``'s commits; wake-ups are delivered on ``loop``."""
        self._loop = loop
        self.closed = False
        self._unsubscribe = store.add_commit_listener(self._on_commit)

    def detach(self) -> None:
        if self._unsubscribe is not None:
            self._unsubscribe()
            self._unsubscribe = None

    def waiting(self, collection: str | None = None) -> int:
        """How many waiters are registered (for one collection, or in all)."""
        if collection is not None:
            return len(self._waiters.get(collection, ()))
        return sum(len(group) for group in self._waiters.values())

    def add(self, collection: str) -> asyncio.Future[bytes | None]:
        """A future that resolves with the generation id of the next commit of ``collection``."""
        future: asyncio.Future[bytes | None] = asyncio.get_running_loop().create_future()
        if self.closed:
            future.set_result(None)
        else:
            self._waiters.setdefault(collection, set()).add(future)
        return future

    def discard(self, collection: str, future: asyncio.Future[bytes | None]) -> None:
        group = self._waiters.get(collection)
        if group is not None:
            group.discard(future)
            if not group:
                del self._waiters[collection]

    def _on_commit(self, collection: str, generation_id: bytes) -> None:
        loop = self._loop
        # Reading the dict from another thread is safe under the GIL; a waiter added after this check
        # reads the current generation itself (see the invariants above).
        if loop is not None and collection in self._waiters and not loop.is_closed():
            loop.call_soon_threadsafe(self._wake, collection, generation_id)

    def _wake(self, collection: str, generation_id: bytes | None) -> None:
        for future in self._waiters.pop(collection, ()):
            if not future.done():
                future.set_result(generation_id)

    def close(self) -> None:
        """Answers every waiter (with ``None``) and refuses new ones; must run on the event loop."""
        self.closed = True
        for collection in list(self._waiters):
            self._wake(collection, None)
