"""The consumer's I/O loop: performs the actions of :class:`WindowMachine` on a store, and nothing else.

The store is anything satisfying :class:`ConsumerStore` — the HTTP :class:`~diffstore.client.Client`
or an embedded engine ``Store``; waiting when caught up uses the client's long poll
(``wait_for_change``) or, for the engine, :class:`CommitWaiter` on its commit listener. With
``workers`` > 1 the data events go to a :class:`~diffstore.consumer._pool.WorkerPool` (partitioned by
key, see :mod:`diffstore.consumer._partitions`) and the loop waits for its barrier before
``on_end_source``. With ``lease_ttl_ms`` the loop runs only while its
:class:`~diffstore.lease_keeper.LeaseGuard` holds the checkpoint collection's lease ``consumer``, and every
checkpoint carries the lease's fencing token. :meth:`Consumer.run` rides out an outage of the server
(``outage``, :mod:`diffstore.backoff`): the window in progress is rolled back as after any I/O error, and
after the back-off the loop goes on from the stored checkpoint.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from diffstore import rounds
from diffstore.backoff import RetryPolicy
from diffstore.collection import Collection
from diffstore.consumer._partitions import Failure
from diffstore.consumer._pool import WorkerPool
from diffstore.consumer._window import (
    Action,
    DataEvent,
    Deliver,
    EndSource,
    EndWindow,
    Event,
    FetchPage,
    LoadCheckpoint,
    Phase,
    Positions,
    ProtocolViolation,
    ReadHeads,
    Rollback,
    StartSource,
    StartWindow,
    WaitForChange,
    WindowMachine,
    WriteCheckpoint,
)
from diffstore.engine.types import LeaseToken, ReaderUpdate
from diffstore.errors import Conflict, DiffstoreError, InvalidRequest, LeaseLost
from diffstore.lease_keeper import LeaseConfig, LeaseGuard
from diffstore.outage import OutageWatch, is_outage

# tasks queued or in flight per worker: enough to keep every worker busy while the next page is fetched,
# few enough that a window's memory stays about one diff page
PENDING_PER_WORKER = 64

_log = logging.getLogger("diffstore.consumer")

LEASE_NAME = "consumer"
"""The lease of the checkpoint collection that a consumer with ``lease_ttl_ms`` holds while it runs."""


class WindowListener:
    """Callbacks of a consumer; override what you need. Return ``False`` (or raise) to roll back."""

    def on_start_window(self, from_positions: Positions) -> bool | None:
        return None

    def on_start_source(self, source: str) -> bool | None:
        return None

    def on_data_event(self, source: str, key: bytes, old: bytes | None, new: bytes | None) -> bool | None:
        return None

    def on_end_source(self, source: str) -> bool | None:
        return None

    def on_end_window(self, to_positions: Positions) -> bool | None:
        return None

    def on_rollback(self, from_positions: Positions, error: BaseException | None) -> None:
        return None


class ConsumerStore(Protocol):
    """An engine ``Store`` or a :class:`~diffstore.client.Client`."""

    def collection(self, name: str) -> Collection: ...

    def create_collection(
        self, name: str, manual: bool = ..., initial_generation_id: bytes | None = ...
    ) -> Collection: ...


class ChangeWaiter(Protocol):
    def wait_for_change(self, positions: Positions, timeout_ms: int) -> bool: ...


class CommitWaiter:
    """Waits for commits of an embedded engine ``Store`` through its commit listener (no polling)."""

    def __init__(self, store: Any) -> None:
        self._store = store
        self._changed = threading.Condition()
        self._commits = 0
        self._unsubscribe: Callable[[], None] = store.add_commit_listener(self._on_commit)

    def _on_commit(self, collection_name: str, generation_id: bytes) -> None:
        with self._changed:
            self._commits += 1
            self._changed.notify_all()

    def wait_for_change(self, positions: Positions, timeout_ms: int) -> bool:
        deadline = time.monotonic() + timeout_ms / 1000
        while True:
            with self._changed:
                seen = self._commits
            if any(self._store.collection(n).generation_id != g for n, g in positions.items()):
                return True
            with self._changed:
                while self._commits == seen:
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        return False
                    self._changed.wait(remaining)

    def close(self) -> None:
        self._unsubscribe()


class ConsumerStalled(RuntimeError):
    """The same window was rolled back ``max_rollbacks`` times in a row; ``__cause__`` is the last error."""


class Consumer:
    """Delivers consistency windows of ``sources`` to ``listener``; see the module docstring.

    Args:
        store: an engine ``Store`` or a :class:`~diffstore.client.Client`.
        sources: collection names, in the order their events are delivered within a window.
        checkpoint_collection: the consumer's own manual collection holding one reader per source
            (created when missing). One consumer per checkpoint collection.
        listener: the callbacks.
        waiter: how to wait when caught up; default: the client's long poll, or the store's commit
            listener.
        page_limit: diff page size (``None``: the server's default).
        wait_timeout_ms: one wait's length; :meth:`run` checks its stop event this often at worst.
        max_rollbacks: consecutive rollbacks before :class:`ConsumerStalled` is raised.
        replay_delay_s: pause before a window is replayed.
        workers: threads calling ``on_data_event`` (default 1: every callback on the calling thread).
            With N > 1, a window's data events are partitioned by key (``crc32(key) % N``): callbacks
            for different keys run concurrently, callbacks for one key one after the other in window
            order; every other callback runs on the calling thread after a barrier (``on_end_source``
            once every data event of the source finished). A failure in any partition drops the
            window's remaining events, waits for the callbacks in flight and rolls the whole window
            back (it is replayed; nothing is checkpointed). ``on_data_event`` must then be thread-safe.
        lease_ttl_ms: run as one of several consumers of the same checkpoint collection, exactly one
            active: the consumer delivers windows only while it holds the checkpoint collection's lease
            ``consumer`` (kept by a :class:`~diffstore.lease_keeper.LeaseGuard` thread, renewed every ttl/3),
            and each checkpoint carries its fencing token, so a consumer that lost the lease (paused
            past the ttl) can never checkpoint. A standby polls for the lease (every 250 ms, at most
            ttl/4) and takes over within ttl + one poll of the active consumer's death, from the stored
            checkpoint. On losing the lease inside a window the window is rolled back (``on_rollback``).
            ``None`` (default): no lease, and two consumers of one checkpoint race (see the module).
        outage: how :meth:`run` rides out a server that does not answer (refused, reset, timed out,
            ``overloaded``): the window in progress is rolled back (``on_rollback``), the back-off waited,
            and delivery goes on from the stored checkpoint -- one log line when the wait starts, one when
            the server is back (``outage_watch.waiting`` says it meanwhile). Default: retry for ever;
            ``None``: the first such error ends :meth:`run` (as any error ends :meth:`run_pending`).
        on_outage: told ``True`` when an outage starts and ``False`` when it ends (for a metric).
    """

    def __init__(
        self,
        store: ConsumerStore,
        sources: Sequence[str],
        checkpoint_collection: str,
        listener: WindowListener,
        *,
        waiter: ChangeWaiter | None = None,
        page_limit: int | None = None,
        wait_timeout_ms: int = 30_000,
        max_rollbacks: int = 10,
        replay_delay_s: float = 0.5,
        workers: int = 1,
        lease_ttl_ms: int | None = None,
        outage: RetryPolicy | None = RetryPolicy(),  # noqa: B008 - frozen, so one shared default is safe
        on_outage: Callable[[bool], None] | None = None,
    ) -> None:
        if workers < 1:
            raise InvalidRequest("workers must be 1 or more")
        self.lease: LeaseConfig | None = None
        if lease_ttl_ms is not None:
            try:
                self.lease = LeaseConfig(LEASE_NAME, ttl_ms=lease_ttl_ms)
            except ValueError as exc:
                raise InvalidRequest(f"lease_ttl_ms: {exc}") from exc
        self.store = store
        self.listener = listener
        self.machine = WindowMachine(sources)
        self.checkpoint_collection = checkpoint_collection
        self.page_limit = page_limit
        self.wait_timeout_ms = wait_timeout_ms
        self.max_rollbacks = max_rollbacks
        self.replay_delay_s = replay_delay_s
        self.workers = workers
        self._pool: WorkerPool | None = None
        self._guard: LeaseGuard | None = None
        self._token: LeaseToken | None = None  # the lease held by the running loop
        self._owned_waiter: CommitWaiter | None = None
        if waiter is None:
            if hasattr(store, "wait_for_change"):
                waiter = store  # type: ignore[assignment]
            else:
                waiter = self._owned_waiter = CommitWaiter(store)
        self.waiter: ChangeWaiter = waiter  # type: ignore[assignment]
        self._collections: dict[str, Collection] = {}
        self.outage = outage
        self.outage_watch = OutageWatch(
            f"the diffstore server of consumer {checkpoint_collection!r}",
            outage or RetryPolicy(),
            _log,
            on_outage,
        )

    def close(self) -> None:
        """Releases the lease (a standby takes over at once) and stops the consumer's threads."""
        if self._guard is not None:
            self._guard.close()
            self._guard = None
        if self._owned_waiter is not None:
            self._owned_waiter.close()

    def run_pending(self) -> int:
        """Delivers windows until caught up, without waiting; returns how many were checkpointed.

        With a lease it first waits for the lease up to one ttl, and returns 0 when another consumer
        keeps it that long.
        """
        return self._loop(stop=None, wait=False)

    def run(self, stop: threading.Event | None = None) -> None:
        """Delivers windows forever, waiting when caught up, until ``stop`` is set.

        With a lease: standby until the lease is held, active while it is, standby again when it is lost.
        An outage of the server is ridden out (see ``outage``); any other error ends the run.
        """
        stop = stop or threading.Event()
        while not stop.is_set():
            try:
                self._loop(stop, wait=True)
                return
            except DiffstoreError as exc:
                if self.outage is None or not is_outage(exc):
                    raise
                stop.wait(self.outage_watch.failed(exc))  # raises exc once the policy's limit passed

    def _loop(self, stop: threading.Event | None, wait: bool) -> int:
        if self.lease is None:
            return self._run_with_pool(stop, wait)
        if self._guard is None:
            self._guard = LeaseGuard(self._checkpoint(), self.lease)
        guard, lease = self._guard, self.lease
        checkpoints = 0
        while stop is None or not stop.is_set():
            token = guard.wait_active(stop, None if wait else lease.ttl_s)
            if token is None:
                return checkpoints  # stopped, or (run_pending) another consumer stays active
            if token != self._token:
                self._token = token
                self.machine.restart(LeaseLost("a new lease: continue from the stored checkpoint"))
            checkpoints += self._run_with_pool(stop, wait)
            if not wait:
                return checkpoints
        return checkpoints

    def _holds_lease(self) -> bool:
        return self._guard is not None and self._guard.holds(self._token)

    def _run_with_pool(self, stop: threading.Event | None, wait: bool) -> int:
        if self.workers == 1:
            return self._run_machine(stop, wait)
        self._pool = WorkerPool(self.workers, self._call_data, capacity=PENDING_PER_WORKER * self.workers)
        try:
            return self._run_machine(stop, wait)
        except BaseException as exc:
            # the pool is closed below and drops its queue: a window in progress must be replayed whole
            self.machine.abandon(exc)
            raise
        finally:
            self._pool.close()
            self._pool = None

    def _run_machine(self, stop: threading.Event | None, wait: bool) -> int:
        checkpoints = 0
        if self.machine.phase is Phase.WAIT:
            self.machine.wait_ended()  # a new call looks at the heads again before deciding to wait
        while stop is None or not stop.is_set():
            if self._token is not None and not self._holds_lease():
                self._lose_lease(stop)
                return checkpoints
            action = self.machine.next_action()
            if isinstance(action, WaitForChange):
                if not wait:
                    return checkpoints
                self.waiter.wait_for_change(action.positions, self.wait_timeout_ms)
                self.machine.wait_ended()
            elif isinstance(action, WriteCheckpoint):
                checkpoints += self._write_checkpoint(action)
            else:
                self._perform(action, stop)
            self.outage_watch.succeeded()  # the action's calls were answered: an outage is over
        return checkpoints

    def _perform(self, action: Action, stop: threading.Event | None) -> None:
        machine = self.machine
        if isinstance(action, LoadCheckpoint):
            machine.checkpoint_loaded(self._load_checkpoint())
        elif isinstance(action, ReadHeads):
            machine.heads_read({s: self._collection(s).generation_id for s in machine.sources})
        elif isinstance(action, FetchPage):
            try:
                page = self._collection(action.source).diff_page(
                    action.from_generation_id,
                    action.to_generation_id,
                    limit=self.page_limit,
                    cursor=action.cursor,
                )
            except Exception as exc:  # the window is broken whatever failed: roll back, then report
                machine.failed(exc)
                self._deliver(machine.next_action(), stop)
                raise
            machine.page_received(page)
        elif isinstance(action, Deliver):
            self._deliver(action, stop)

    def _deliver(self, action: Action, stop: threading.Event | None) -> None:
        assert isinstance(action, Deliver)
        event = action.event
        pool = self._pool
        if isinstance(event, Rollback):
            if pool is not None:
                pool.roll_back(event.error)  # no callback of the window runs during on_rollback or after
            self.listener.on_rollback(event.from_positions, event.error)
            self.machine.delivered(True)
            if self.machine.consecutive_rollbacks >= self.max_rollbacks:
                raise ConsumerStalled(f"window rolled back {self.max_rollbacks} times") from event.error
            if event.error is not None and self.replay_delay_s > 0:
                if stop is None:
                    time.sleep(self.replay_delay_s)
                else:
                    stop.wait(self.replay_delay_s)
            return
        if pool is not None and isinstance(event, DataEvent | EndSource):
            if isinstance(event, DataEvent) and pool.submit(event):
                self.machine.delivered(True)  # handed over: its outcome counts at the barrier
                return
            failure = pool.settle()  # the barrier (or a failed window: wait for the callbacks in flight)
            if failure is not None:
                self._fail_window(failure)
                return
        try:
            answer = self._call_listener(event)
        except Exception as exc:  # a failing callback rolls the window back, by contract
            self.machine.delivered(False, exc)
            return
        except BaseException as exc:  # Ctrl-C, exit: the window is rolled back if this loop runs again
            self.machine.delivered(False, exc)
            raise
        self.machine.delivered(answer is not False)

    def _lose_lease(self, stop: threading.Event | None) -> None:
        """Another consumer may own the checkpoint now: roll a window in progress back, reload later."""
        self._token = None
        self.machine.restart(LeaseLost(f"lease {LEASE_NAME!r} of {self.checkpoint_collection!r} lost"))
        action = self.machine.next_action()
        if isinstance(action, Deliver) and isinstance(action.event, Rollback):
            self._deliver(action, stop)

    def _fail_window(self, failure: Failure) -> None:
        """A partition failed: roll back (then replay); an exit raised in a worker propagates after that."""
        self.machine.delivered(False, failure.error)
        if failure.error is not None and not isinstance(failure.error, Exception):
            raise failure.error

    def _call_data(self, event: DataEvent) -> bool | None:
        if self.lease is not None:
            # Checked at every event, not only by the loop between actions: a consumer paused past its ttl
            # (SIGSTOP, a long GC) resumes with events queued for its workers, which must not reach the
            # listener -- its successor delivers that window again from the checkpoint. The failure
            # rolls the window back.
            token, guard = self._token, self._guard
            if token is None or guard is None or not guard.holds(token):
                raise LeaseLost(f"lease {LEASE_NAME!r} of {self.checkpoint_collection!r} lost")
        return self.listener.on_data_event(event.source, event.key, event.old, event.new)

    def _call_listener(self, event: Event) -> bool | None:
        listener = self.listener
        if isinstance(event, DataEvent):
            return self._call_data(event)
        if isinstance(event, StartWindow):
            return listener.on_start_window(event.from_positions)
        if isinstance(event, StartSource):
            return listener.on_start_source(event.source)
        if isinstance(event, EndSource):
            return listener.on_end_source(event.source)
        if isinstance(event, EndWindow):
            return listener.on_end_window(event.to_positions)
        raise ProtocolViolation(f"unexpected event {event!r}")

    def _collection(self, name: str) -> Collection:
        if name not in self._collections:
            self._collections[name] = self.store.collection(name)
        return self._collections[name]

    def _checkpoint(self) -> Collection:
        name = self.checkpoint_collection
        if name not in self._collections:
            try:
                self._collections[name] = self.store.create_collection(
                    name, manual=True, initial_generation_id=bytes(8)
                )
            except Conflict:
                self._collections[name] = self.store.collection(name)
        return self._collections[name]

    def _load_checkpoint(self) -> dict[str, bytes | None]:
        names = {source: rounds.checkpoint_reader(source) for source in self.machine.sources}
        stored = rounds.ensure_readers(self._checkpoint(), {names[s]: s for s in self.machine.sources})
        return {source: stored[names[source]].generation_id for source in self.machine.sources}

    def _write_checkpoint(self, action: WriteCheckpoint) -> int:
        """One generation of the checkpoint collection moves every reader, with CAS, or none."""
        updates = [
            ReaderUpdate(rounds.checkpoint_reader(s), action.new[s], expected=action.expected[s])
            for s in self.machine.sources
        ]
        try:
            rounds.Round.next(self._checkpoint(), lease=self._token).write((), updates)
        except LeaseLost:
            assert self._guard is not None
            self._guard.report_lost(self._token)  # another consumer took over: stand by at once
            self.machine.checkpoint_rejected()
            return 0
        except Conflict:
            self.machine.checkpoint_rejected()  # another consumer moved it: continue from there
            return 0
        except BaseException:
            self.machine.checkpoint_rejected()
            raise
        self.machine.checkpoint_written()
        return 1
