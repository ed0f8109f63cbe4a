"""Synchronous replication (``serve --synchronous N``): a write is acknowledged once N replicas applied it.

A replica keeps one *hold* in every collection of its primary (a reader named ``diffstore-replica:<id>``,
see ``docs/replicas.md``) and moves it to a generation right after it has applied that generation in its
own store. So "N replicas applied generation G of collection C" is, on the primary, "N holds of distinct
replicas in C stand at G or above" (generation ids are compared bytewise and only grow). The holds are in
the store: every worker process sees them, and they survive restarts of either side.

After the commit of a manual collection (``generation/commit``), or a ``put``/``putMany`` that wrote into
an automatic collection's open generation, the route's engine call is done -- the write is durable
locally, the write lock released -- and the route awaits :meth:`SynchronousReplication.wait` on the event
loop: a future, not a thread, so other writers and readers go on meanwhile. What wakes it:

* a hold moved or created through this process (the readers routes call :meth:`hold_moved`): at once --
  this is the usual signal, since a replica moves its hold right after each generation it applies;
* a re-read of the waited collections' holds every :data:`RECHECK_S` while anyone waits: a hold moved
  through another worker process of ``serve --workers N``.

Past ``timeout_s`` the wait ends with :class:`~diffstore.errors.NotReplicated` (503 ``notReplicated``):
the write stays committed and visible on the primary (as PostgreSQL's ``synchronous_commit`` leaves a
cancelled wait committed locally), but fewer than N replicas confirmed it, so a fail-over may lose it.

Invariants:
    * A waiter is answered once: by a check that counts N holds at or above its generation, its timeout,
      the collection's deletion or :meth:`close` (shutdown) -- the last three raise ``NotReplicated``.
    * The hold check reads the store on the loop's thread (one read transaction, microseconds; the loop's
      reads never wait for writers).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from diffstore.engine.readers import HOLD_PREFIX
from diffstore.errors import DiffstoreError, NoSuchCollection, NotReplicated, text_form

if TYPE_CHECKING:
    from starlette.requests import Request

    from diffstore.engine.store import Store

RECHECK_S = 0.1
"""While someone waits, how often the holds are re-read (for moves made through other worker processes)."""


def synchronous_of(request: Request) -> SynchronousReplication:
    return request.app.state.synchronous  # type: ignore[no-any-return]


def holds_at_or_above(store: Store, collection: str, generation_id: bytes) -> list[str]:
    """The ids of the replicas whose hold in ``collection`` stands at ``generation_id`` or above.

    Raises:
        NoSuchCollection: the collection is gone.
    """
    found = []
    for reader in store.collection(collection).readers():
        if reader.name.startswith(HOLD_PREFIX) and reader.generation_id is not None:
            if reader.generation_id >= generation_id:
                found.append(reader.name[len(HOLD_PREFIX) :])
    return found


@dataclass(frozen=True, slots=True)
class ReplicaStanding:
    """One replica as the primary sees it through its holds (``GET /replication``, ``/metrics``).

    Attributes:
        replica_id: the replica's id (its holds are ``diffstore-replica:<id>``).
        collections: the collections it holds a hold in.
        behind: how many of those its hold is below the collection's current generation in.
        last_moved_ms: when this process last saw it move a hold (ms since the epoch; None: not since
            the server started).
        in_sync: caught up everywhere, or a hold moved within the synchronous timeout: it confirms writes.
    """

    replica_id: str
    collections: int
    behind: int
    last_moved_ms: int | None
    in_sync: bool


class SynchronousReplication:
    """The acknowledgement waits of one app (see the module); ``required`` 0 makes :meth:`wait` a no-op."""

    def __init__(
        self,
        store: Store,
        required: int,
        timeout_s: float | None,
        observe: Callable[[float], None] | None = None,
    ) -> None:
        self.store = store
        self.required = required
        self.timeout_s = timeout_s
        self.observe = observe  # the wait's duration, in seconds (the /metrics histogram)
        self._waiters: dict[str, dict[asyncio.Future[None], bytes]] = {}
        self._moved_ms: dict[str, int] = {}  # replica id -> when it last moved a hold through this process
        self._recheck: asyncio.Task[None] | None = None
        self.timeouts = 0

    @property
    def enabled(self) -> bool:
        return self.required > 0

    # --- signals ----------------------------------------------------------------------------------------

    def hold_moved(self, collection: str, reader_name: str) -> None:
        """A reader was moved or created through this process (call on the loop): checks the waiters of
        ``collection`` when it is a replica's hold."""
        if not reader_name.startswith(HOLD_PREFIX):
            return
        self._moved_ms[reader_name[len(HOLD_PREFIX) :]] = time.time_ns() // 1_000_000
        if collection in self._waiters:
            self._check(collection)

    def close(self) -> None:
        """Answers every waiter (shutdown): their writes are committed here, not confirmed by replicas."""
        for collection in list(self._waiters):
            self._fail(collection, "the server is shutting down")
        if self._recheck is not None:
            self._recheck.cancel()
            self._recheck = None

    # --- waiting ----------------------------------------------------------------------------------------

    async def wait(self, collection: str, generation_id: bytes) -> None:
        """Returns once ``required`` replicas applied ``generation_id`` of ``collection`` (at once when
        synchronous replication is off).

        Raises:
            NotReplicated: not confirmed within ``timeout_s``, the collection was deleted meanwhile, or the
                server is shutting down. The write is committed on this server all the same.
        """
        if not self.enabled:
            return
        started = time.monotonic()
        try:
            if self._count(collection, generation_id) >= self.required:
                return
            loop = asyncio.get_running_loop()
            future: asyncio.Future[None] = loop.create_future()
            self._waiters.setdefault(collection, {})[future] = generation_id
            if self._recheck is None or self._recheck.done():
                self._recheck = loop.create_task(self._recheck_while_waiting())
            try:
                await asyncio.wait_for(asyncio.shield(future), self.timeout_s)
            except TimeoutError:
                self.timeouts += 1
                raise self._not_replicated(collection, generation_id, "timed out") from None
            finally:
                self._forget(collection, future)
        finally:
            if self.observe is not None:
                self.observe(time.monotonic() - started)

    def _count(self, collection: str, generation_id: bytes) -> int:
        try:
            return len(holds_at_or_above(self.store, collection, generation_id))
        except NoSuchCollection:
            raise self._not_replicated(collection, generation_id, "the collection was deleted") from None

    def _not_replicated(self, collection: str, generation_id: bytes, why: str) -> NotReplicated:
        try:
            confirmed = len(holds_at_or_above(self.store, collection, generation_id))
        except DiffstoreError:
            confirmed = 0
        return NotReplicated(
            f"generation {text_form(generation_id)} of {collection} is committed on this server, but"
            f" {confirmed} of the {self.required} replicas required applied it ({why}): a fail-over"
            " may lose it",
            generation_id=generation_id,
            replicated=confirmed,
            required=self.required,
        )

    def _check(self, collection: str) -> None:
        waiters = self._waiters.get(collection)
        if not waiters:
            return
        try:
            holds = [
                reader.generation_id
                for reader in self.store.collection(collection).readers()
                if reader.name.startswith(HOLD_PREFIX) and reader.generation_id is not None
            ]
        except NoSuchCollection:
            self._fail(collection, "the collection was deleted")
            return
        for future, generation_id in list(waiters.items()):
            if not future.done() and sum(hold >= generation_id for hold in holds) >= self.required:
                future.set_result(None)

    def _fail(self, collection: str, why: str) -> None:
        for future, generation_id in list(self._waiters.get(collection, {}).items()):
            if not future.done():
                future.set_exception(self._not_replicated(collection, generation_id, why))

    def _forget(self, collection: str, future: asyncio.Future[None]) -> None:
        waiters = self._waiters.get(collection)
        if waiters is not None:
            waiters.pop(future, None)
            if not waiters:
                del self._waiters[collection]
        if not future.done():
            future.cancel()
        elif not future.cancelled():
            future.exception()  # retrieved: an answered waiter that timed out meanwhile is not "never"

    async def _recheck_while_waiting(self) -> None:
        while self._waiters:
            await asyncio.sleep(RECHECK_S)
            for collection in list(self._waiters):
                with contextlib.suppress(DiffstoreError):  # a read failing now: the next round, or time out
                    self._check(collection)

    # --- what it shows ----------------------------------------------------------------------------------

    def standings(self) -> list[ReplicaStanding]:
        """Every replica holding a hold in some collection, by id (reads every collection's readers: call
        it off the event loop)."""
        held: dict[str, int] = {}
        behind: dict[str, int] = {}
        for info in self.store.collections():
            try:
                collection = self.store.collection(info.name)
                current = collection.generation_id
                readers = collection.readers()
            except NoSuchCollection:
                continue
            for reader in readers:
                if not reader.name.startswith(HOLD_PREFIX):
                    continue
                replica_id = reader.name[len(HOLD_PREFIX) :]
                held[replica_id] = held.get(replica_id, 0) + 1
                if (reader.generation_id or b"") < current:
                    behind[replica_id] = behind.get(replica_id, 0) + 1
        now_ms = time.time_ns() // 1_000_000
        window_ms = 1000 * (self.timeout_s if self.timeout_s is not None else 10.0)
        standings = []
        for replica_id in sorted(held):
            moved = self._moved_ms.get(replica_id)
            recent = moved is not None and now_ms - moved <= window_ms
            late = behind.get(replica_id, 0)
            standings.append(ReplicaStanding(replica_id, held[replica_id], late, moved, late == 0 or recent))
        return standings
