"""The store: one LMDB environment holding every collection, its transactions, and background work.

Invariants:
- Any number of processes may open one directory (see ``docs/process-model.md``). Nothing the engine
  keeps in memory is trusted across transactions without being checked against LMDB inside the
  transaction that uses it (``tables.Tables`` lists the caches and what keys them).
- Every change is one LMDB write transaction: LMDB's write lock serializes them across processes,
  ``Store._write_lock`` within this one. Readers take no lock; reads of other threads step aside while a
  write transaction of this process is changing pages (see :mod:`diffstore.engine.priority`), except in
  a thread marked with :meth:`Store.never_wait_for_writers_here` (an event loop).
  A commit is durable when its transaction returns (``StoreConfig.sync``, the default); without it the
  worker flushes every ``sync_interval_ms``.
- Commit (and delete) listeners run after the transaction that committed, outside the lock: in the
  committing thread for events of this process; for those of others, in the wake-up thread, or in the
  thread of an event loop that took the notices over (:meth:`Store.commit_notices`,
  :mod:`diffstore.engine.wakeup`).
- Background work (automatic commits, GC steps, phantom purges, purges of deleted collections) is due
  in LMDB (the ``due`` table, ``dropped``, ``phantom_ttl``, reader positions), not in memory: any process's
  worker may do it, each item is taken inside the write transaction that does it (so it is done once),
  and a crash only leaves it for the next worker to take. Failed automatic commits are retried with
  backoff, never dropped (:meth:`Store.health`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import lmdb

from diffstore.engine import background, fencing, first_copy, ha_state, layout, migrate, replication, storage
from diffstore.engine.access import WriteScope
from diffstore.engine.collection import Collection
from diffstore.engine.cursors import CursorCodec, CursorSecret
from diffstore.engine.events import WriteEvent, WriteListener
from diffstore.engine.first_copy import Staged
from diffstore.engine.meta import CollectionMeta
from diffstore.engine.priority import WriterFirst
from diffstore.engine.readers import drop_readers_of
from diffstore.engine.tables import (
    Tables,
    create_meta,
    load_meta,
    validate_collection_name,
    validate_generation_id,
)
from diffstore.engine.types import (
    CollectionInfo,
    Fencing,
    Lease,
    Reader,
    ReplicaGeneration,
    ReplicaLag,
    ReplicaState,
    RetentionPolicy,
    StoreConfig,
)
from diffstore.engine.wakeup import NoticeSource, Wakeup
from diffstore.errors import DiffstoreError, InvalidRequest, StorageError

CommitListener = Callable[[str, bytes], None]
DeleteListener = Callable[[str], None]
_log = logging.getLogger("diffstore.engine")
_RETRY_FIRST_S = 0.05
_RETRY_MAX_S = 5.0
MAX_DBS = len(layout.TABLES) + 2
MAX_READERS = 2048


@dataclass(frozen=True, slots=True)
class AutoCommitFailure:
    """An automatic commit that failed and waits for its retry."""

    collection: str
    attempts: int
    reason: str
    retry_at: float  # time.monotonic() of the next attempt


@dataclass(frozen=True, slots=True)
class StoreHealth:
    """What :meth:`Store.health` reports: ``ok`` unless automatic commits are failing."""

    failing_auto_commits: tuple[AutoCommitFailure, ...]
    auto_commit_failures: int  # failed attempts since the store was opened (a counter for metrics)

    @property
    def ok(self) -> bool:
        return not self.failing_auto_commits

    @property
    def reason(self) -> str | None:
        if self.ok:
            return None
        return "; ".join(
            f"automatic commit of {f.collection!r} failed {f.attempts}x: {f.reason}"
            for f in self.failing_auto_commits
        )


def _now_ms() -> int:
    return int(time.time() * 1000)


class Store:
    """A directory holding collections. Thread-safe; use one ``Store`` per directory per process.

    Other processes may open the same directory at the same time (LMDB forbids a second environment on
    one directory in the same process).
    """

    def __init__(self, path: str | os.PathLike[str], config: StoreConfig | None = None) -> None:
        self.path = Path(path)
        self.config = config or StoreConfig()
        storage.refuse_unfinished_backup(self.path)
        # held shared while the store is open: a compaction (which needs the store to itself) waits for it
        self._directory_lock = storage.DirectoryLock(self.path)
        try:
            self.env = storage.open_environment(
                self.path,
                map_size=self.config.map_size,
                sync=self.config.sync,
                max_dbs=MAX_DBS,
                max_readers=MAX_READERS,
            )
        except BaseException:
            self._directory_lock.release()
            raise
        try:
            self.tables = Tables.open(self.env, self.config.now_ms)
            migrate.upgrade(self.env, self.tables)
        except StorageError:
            self.env.close()
            self._directory_lock.release()
            raise
        except lmdb.Error as exc:
            self.env.close()
            self._directory_lock.release()
            raise self._storage_error(exc, f"cannot open the store at {self.path}") from exc
        self.cursors = CursorCodec(CursorSecret(self.path))  # signs page tokens (one secret per directory)
        self._write_lock = threading.RLock()
        # turns at the write lock, which is not fair (a thread that lets go of it takes it again before a
        # waiting one wakes): a job of many write transactions lets the waiting writers in between them
        self._turns = threading.Condition(threading.Lock())
        self._writers_waiting = 0
        self._writes_entered = 0
        self._writer_first = WriterFirst(self.config.read_yield_ms)
        self._page_lock = threading.RLock()  # pages are built one at a time (see engine/priority.py)
        self._listeners: list[CommitListener] = []
        self._delete_listeners: list[DeleteListener] = []
        self._write_listeners: list[WriteListener] = []
        self._listeners_lock = threading.Lock()
        self._closed = False
        self.flushes = 0  # how many times the worker flushed an unsynced store (sync=False)
        self.stale_readers_cleared = 0  # LMDB reader slots of dead processes cleared by the worker
        self.reads_stepped_aside = 0  # times call_when_writes_done parked a read behind a writer
        # When this process's worker next looks at the due automatic commits (a hint: the rows in ``due``
        # are the truth, and the worker also looks every gc_interval_ms for rows other processes wrote).
        self._next_due = 0.0
        self._failures: dict[str, AutoCommitFailure] = {}
        self._failure_count = 0
        self._wake = threading.Condition()
        self._wakeup = Wakeup(self.path)
        self._adopt_pending_auto_commits()
        self._worker: threading.Thread | None = None
        if self.config.background:
            self._worker = threading.Thread(target=self._run_worker, name="diffstore-background", daemon=True)
            self._worker.start()

    @classmethod
    def open(cls, path: str | os.PathLike[str], config: StoreConfig | None = None) -> Store:
        """Opens (creating if needed) the store in directory ``path``."""
        return cls(path, config)

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        """Stops background work and closes LMDB; a later call is a no-op."""
        if self._closed:
            return
        self._closed = True
        with self._wake:
            self._wake.notify_all()
        if self._worker is not None:
            self._worker.join()
        self._wakeup.close()
        with self._write_lock:
            try:
                if not self.config.sync:
                    self.env.sync(True)
            except lmdb.Error as exc:  # the environment is closed all the same
                raise self._storage_error(exc, "flushing the store at close failed") from exc
            finally:
                self.env.close()
                self._directory_lock.release()

    # --- transactions ---------------------------------------------------------------------------

    @contextlib.contextmanager
    def read(self) -> Iterator[lmdb.Transaction]:
        """A read-only snapshot; LMDB failures surface as :class:`StorageError`.

        Starting it waits (at most ``read_yield_ms``) while another thread's write changes pages, unless
        the calling thread was marked with :meth:`never_wait_for_writers_here`.
        """
        self._writer_first.before_read()
        try:
            with self.env.begin(buffers=False) as txn:
                yield txn
        except lmdb.Error as exc:
            raise self._storage_error(exc, "read failed", writing=False) from exc

    def never_wait_for_writers_here(self) -> None:
        """Reads started by the calling thread never step aside for writers (call it from an event loop)."""
        self._writer_first.exempt_current_thread()

    def call_when_writes_done(self, callback: Callable[[], None]) -> float | None:
        """Stepping aside without blocking: when another thread of this process is changing pages in a write
        transaction, arranges ``callback()`` (quick, thread-safe) in that thread once it is done and returns
        how long a read may wait at most (``read_yield_ms``, in seconds); else None (read now).
        See :mod:`diffstore.engine.priority`."""
        priority = self._writer_first
        if not priority.call_when_done(callback):
            return None
        self.reads_stepped_aside += 1
        return priority.max_wait_s

    @contextlib.contextmanager
    def page_read(self) -> Iterator[lmdb.Transaction]:
        """A read-only snapshot for building one whole page; pages of other threads wait their turn.

        Never hold it across a ``yield`` to a caller: another thread's page would wait for that caller.
        """
        with self._page_lock, self.read() as txn:
            yield txn

    @contextlib.contextmanager
    def write(self) -> Iterator[WriteScope]:
        """One atomic write transaction; listeners (of every process) hear about its commits once durable."""
        due: float | None = None
        with self._turns:
            self._writers_waiting += 1
        with self._write_lock:
            with self._turns:
                self._writers_waiting -= 1
                self._writes_entered += 1
                self._turns.notify_all()
            try:
                with self.env.begin(write=True) as txn, self._writer_first.writing():
                    scope = WriteScope(txn)
                    yield scope
                    due = self._schedule(scope)
            except lmdb.Error as exc:
                raise self._storage_error(exc, "write failed") from exc
        if due is not None:
            with self._wake:
                if due < self._next_due:
                    self._next_due = due
                    self._wake.notify_all()
        if scope.commits or scope.deletions:
            self._wakeup.notify([*scope.commits, *((name, None) for name in scope.deletions)])
            for name, generation_id in scope.commits:
                self._announce(name, generation_id)
            for name in scope.deletions:
                self._announce_deleted(name)
        if self._write_listeners:
            self._tell_writers(scope)

    def let_waiting_writers_in(self, timeout_s: float = 1.0) -> None:
        """Waits (at most ``timeout_s``) until as many write transactions of this process began as threads
        were waiting for the write lock: a job of many write transactions (a revert in batches) calls it
        between two of them, outside :meth:`write`, so that the writers it held up go first."""
        with self._turns:
            wanted = self._writes_entered + self._writers_waiting
            deadline = time.monotonic() + timeout_s
            while self._writes_entered < wanted:
                left = deadline - time.monotonic()
                if left <= 0:
                    return
                self._turns.wait(left)

    @contextlib.contextmanager
    def user_write(self, hold: bool = False) -> Iterator[WriteScope]:
        """:meth:`write` for what a user asks (not background work, not replication): refused with
        ``Fenced`` in its own transaction once the store stepped down, so no write of any process lands
        after the step-down (``hold``: deleting a replica's hold, which a stepped-down store allows)."""
        with self.write() as scope:
            if not hold:
                ha_state.refuse_unless_leading(scope.txn, self.tables)
                fencing.refuse_if_fenced(scope.txn, self.tables)
            yield scope

    def _schedule(self, scope: WriteScope) -> float | None:
        """Writes the due rows of the scope's automatic commits; the monotonic due time of the first."""
        if not (scope.first_writes or scope.threshold_commits):
            return None
        txn, due_db = scope.txn, self.tables.due
        for name in scope.threshold_commits:
            txn.delete(layout.auto_commit_due_key(name), db=due_db)
        if not scope.first_writes:
            return None
        delay_ms = self.config.commit_delay_ms
        # a first write opens a new countdown; any older row was for a committed generation
        due_ms = layout.u64(_now_ms() + delay_ms)
        for name in scope.first_writes:
            txn.put(layout.auto_commit_due_key(name), due_ms, db=due_db)
        return time.monotonic() + delay_ms / 1000

    def _storage_error(self, exc: lmdb.Error, doing: str, writing: bool = True) -> StorageError:
        """``StorageFull`` for a full map or disk else ``StorageError``."""
        return storage.storage_error(exc, self.path, self.config.map_size, writing=writing, doing=doing)

    def _announce(self, name: str, generation_id: bytes) -> None:
        with self._listeners_lock:
            listeners = list(self._listeners)
        for listener in listeners:
            try:
                listener(name, generation_id)
            except Exception:
                # A listener's failure must neither hide the commit from the others nor stop the
                # thread that committed (the background worker commits non-manual collections).
                _log.exception("commit listener %r failed for %s", listener, name)

    def _announce_deleted(self, name: str) -> None:
        with self._listeners_lock:
            listeners = list(self._delete_listeners)
        for listener in listeners:
            try:
                listener(name)
            except Exception:
                _log.exception("delete listener %r failed for %s", listener, name)

    def _on_notice(self, name: str, generation_id: bytes | None) -> None:
        """An event of another process (see :mod:`diffstore.engine.wakeup`)."""
        if generation_id is None:
            self._announce_deleted(name)
        else:
            self._announce(name, generation_id)

    def _tell_writers(self, scope: WriteScope) -> None:
        event = WriteEvent(
            tuple(scope.commits),
            scope.records_written,
            scope.gc_versions_removed,
            scope.phantom_records_purged,
        )
        with self._listeners_lock:
            listeners = list(self._write_listeners)
        for listener in listeners:
            try:
                listener(event)
            except Exception:
                _log.exception("write listener %r failed", listener)

    def add_write_listener(self, listener: WriteListener) -> Callable[[], None]:
        """Calls ``listener(WriteEvent)`` after every write transaction; returns a remover."""
        with self._listeners_lock:
            self._write_listeners.append(listener)

        def remove() -> None:
            with self._listeners_lock, contextlib.suppress(ValueError):
                self._write_listeners.remove(listener)

        return remove

    def add_commit_listener(self, listener: CommitListener) -> Callable[[], None]:
        """Calls ``listener(collection_name, generation_id)`` after every commit; returns a remover."""
        with self._listeners_lock:
            self._listeners.append(listener)
        self._wakeup.listen(self._on_notice)  # events of other processes too (once per store)

        def remove() -> None:
            with self._listeners_lock, contextlib.suppress(ValueError):
                self._listeners.remove(listener)

        return remove

    def commit_notices(self) -> NoticeSource | None:
        """Lets the caller's event loop read other processes' commit notices instead of a thread.

        Register ``fileno()`` for reading and call ``drain()`` whenever it is readable: the events reach
        this store's listeners in that thread, at once. Call ``release()`` before the loop stops watching
        (a thread reads them again). None while another loop reads them (two servers over one store):
        its thread delivers them to every listener. See :mod:`diffstore.engine.wakeup`.
        """
        return self._wakeup.hand_over(self._on_notice)

    @property
    def commit_notices_dropped(self) -> int:
        """Commit notices not sent to another process because its queue was full (that process is marked
        and re-reads what it waits for: :meth:`commit_notices_missed`)."""
        return self._wakeup.dropped

    def commit_notices_missed(self) -> int:
        """How many times this process was found to have missed other processes' commit notices (a
        committer found its queue full); a caller whose last figure differs re-reads the current state of
        what it waits for. Cheap (one ``stat``); see :mod:`diffstore.engine.wakeup`."""
        return self._wakeup.check_missed()

    def add_delete_listener(self, listener: DeleteListener) -> Callable[[], None]:
        """Calls ``listener(name)`` once a collection is deleted (by any process); returns a remover."""
        with self._listeners_lock:
            self._delete_listeners.append(listener)
        self._wakeup.listen(self._on_notice)

        def remove() -> None:
            with self._listeners_lock, contextlib.suppress(ValueError):
                self._delete_listeners.remove(listener)

        return remove

    # --- collections ----------------------------------------------------------------------------

    def create_collection(
        self,
        name: str,
        manual: bool = True,
        initial_generation_id: bytes | None = None,
        retention: RetentionPolicy | None = None,
    ) -> Collection:
        """Creates a collection (raises :class:`CollectionExists`).

        Manual collections start at ``initial_generation_id`` (default ``b""``) with no open generation;
        others start at 8 zero bytes with the next generation open. ``retention`` None: the store's
        ``default_retention`` (an empty policy: none).
        """
        if retention is None:
            retention = self.config.default_retention
        validate_collection_name(name)
        if initial_generation_id is not None:
            validate_generation_id(initial_generation_id, "initialGenerationId")
            if not manual:
                raise InvalidRequest("initialGenerationId is only for manual collections")
        with self.user_write() as scope:
            create_meta(scope.txn, self.tables, name, manual, initial_generation_id, retention)
        return Collection(self, name)

    def collection(self, name: str) -> Collection:
        """A handle on an existing collection (raises :class:`NoSuchCollection`)."""
        with self.read() as txn:
            load_meta(txn, self.tables, name)
        return Collection(self, name)

    def collections(self) -> list[CollectionInfo]:
        """Every collection, sorted by name."""
        found: list[CollectionInfo] = []
        with self.read() as txn:
            for raw_name, raw in txn.cursor(db=self.tables.collections):
                if not layout.is_collection_row(raw_name):
                    continue
                meta = CollectionMeta.unpack(raw_name.decode(), raw)
                found.append(CollectionInfo(meta.name, meta.manual))
        return sorted(found, key=lambda info: info.name.encode())

    def delete_collection(self, name: str, *, replica_copy: bool = False) -> None:
        """Deletes a collection, its readers, and every reader anywhere that targets it — durably.

        The records themselves are purged in the background (they are unreachable at once). With
        ``replica_copy`` (a replica's follower dropping its copy) it raises ``NotReplica``, deleting
        nothing, once the store was promoted.
        """
        with self.write() as scope:
            txn, tables = scope.txn, self.tables
            if replica_copy:
                replication.require_following(txn, tables)
                abandoned = first_copy.abandon(txn, tables, name)
                if abandoned and txn.get(name.encode(), db=tables.collections) is None:
                    return  # only a first copy under way: dropped (not the collection: it is not there)
            else:
                ha_state.refuse_unless_leading(txn, tables)
                fencing.refuse_if_fenced(txn, tables)
            meta = load_meta(txn, tables, name)
            prefix = meta.cid_prefix
            drop_readers_of(txn, tables, meta)
            txn.delete(name.encode(), db=tables.collections)
            txn.delete(layout.auto_commit_due_key(name), db=tables.due)
            txn.delete(layout.gc_position_key(prefix), db=tables.due)
            txn.put(prefix, b"", db=tables.dropped)
            replication.forget(txn, tables, name)
            scope.deletions.append(name)
        with self._wake:
            self._failures.pop(name, None)

    # --- replication (see engine/replication.py; the follower is diffstore.replica) ---------------------

    def replica_state(self) -> ReplicaState:
        """Whether this store follows a primary, was promoted, how far behind it is."""
        with self.read() as txn:
            return replication.state(txn, self.tables)

    def read_only(self) -> bool:
        """Whether the store is a replica that refuses writes (not promoted); two point reads."""
        with self.read() as txn:
            return replication.is_following(txn, self.tables)

    def become_replica(self, primary: str, replica_id: str) -> ReplicaState:
        """Marks the store a replica of ``primary`` (a no-op when it is one already).

        Raises:
            InvalidRequest: the store holds collections of its own, follows another primary, or was
                promoted.
        """
        with self.write() as scope:
            return replication.become(scope.txn, self.tables, primary, replica_id)

    def promote_replica(self, term: int = 0, address: str | None = None) -> int:
        """Stops following, in one transaction: every later apply is refused, writes are accepted. The
        replication term becomes ``term`` or one more than it was, whichever is higher; returns it.
        ``address``: the URL it is promoted under (see ``replication.promote``).

        Raises:
            NotReplica: the store is not a replica (or was promoted already).
        """
        with self.write() as scope:
            raised = replication.promote(scope.txn, self.tables, self.config.now_ms(), term, address)
            first_copy.abandon_all(scope.txn, self.tables)  # never to be finished: purged
            return raised

    def check_writable(self) -> None:
        """Raises ``ReadOnlyReplica`` (a following replica) or ``Fenced`` (stepped down); three point
        reads. The HTTP server asks it before every write (see ``engine.fencing``)."""
        with self.read() as txn:
            ha_state.refuse_unless_leading(txn, self.tables)
            fencing.check_writable(txn, self.tables)

    def replication_term(self) -> int:
        """The store's replication term (0: it never took part in a promotion)."""
        with self.read() as txn:
            return fencing.term(txn, self.tables)

    def learn_term(self, term: int) -> bool:
        """A term a request carried: a higher one is stored and a primary steps down (``fenced``; its
        pending automatic writes are committed, as in :meth:`step_down`)."""
        if term <= self.replication_term():
            return False
        with self.write() as scope:
            learnt = fencing.learn_term(scope.txn, self.tables, term, self.config.now_ms())
            if learnt and fencing.fencing(scope.txn, self.tables) is not None:
                scope.commits.extend(background.commit_pending(scope.txn, self.tables, self.config.now_ms()))
            return learnt

    def step_down(self, term: int, primary: str, replica_id: str | None) -> Fencing | None:
        """Told by a new primary promoted at ``term``: see ``fencing.step_down``. The writes automatic
        collections took and had not committed yet are committed in the same transaction: when it
        returns, what the store holds is final (a replica that catches up holds every acknowledged write).
        """
        with self.write() as scope:
            now_ms = self.config.now_ms()
            stepped = fencing.step_down(scope.txn, self.tables, term, primary, replica_id, now_ms)
            if stepped is not None:
                scope.commits.extend(background.commit_pending(scope.txn, self.tables, now_ms))
            return stepped

    def step_up(self, term: int, replica_id: str | None) -> None:
        """An abandoned promotion lifts the fencing it set: see ``fencing.step_up``."""
        with self.write() as scope:
            fencing.step_up(scope.txn, self.tables, term, replica_id)

    def ha_record(self) -> ha_state.HaRecord | None:
        """A fail-over member's role as stored (None: the store is no member); see ``engine.ha_state``."""
        with self.read() as txn:
            return ha_state.read(txn, self.tables)

    def ha_publish(self, record: ha_state.HaRecord) -> None:
        """Stores the member's role as it is (a renewal moves the write deadline; stepping back: the
        automatic collections' pending writes are committed in the same transaction, so that what the
        member acknowledged is a generation its rejoin can compare)."""
        with self.write() as scope:
            ha_state.put(scope.txn, self.tables, record)
            if record.role != "leader":
                scope.commits.extend(background.commit_pending(scope.txn, self.tables, self.config.now_ms()))

    def ha_lead(self, record: ha_state.HaRecord) -> None:
        """The member took the leader key: the store becomes the primary at ``record.term``."""
        with self.write() as scope:
            ha_state.lead(scope.txn, self.tables, record, self.config.now_ms())

    def ha_follow(self, record: ha_state.HaRecord, replica_id: str) -> None:
        """The member follows ``record.leader_url``: the store becomes its replica, keeping its data."""
        with self.write() as scope:
            scope.commits.extend(background.commit_pending(scope.txn, self.tables, self.config.now_ms()))
            ha_state.follow(scope.txn, self.tables, record, replica_id)

    def ha_clear(self) -> bool:
        """Forgets a fail-over member's role (served without ``--ha-etcd``); whether there was one."""
        with self.write() as scope:
            return ha_state.clear(scope.txn, self.tables)

    def unfence(self) -> int:
        """Lifts a stepped-down store's fencing; returns its new term (see ``fencing.unfence``)."""
        with self.write() as scope:
            return fencing.unfence(scope.txn, self.tables)

    def apply_replica_generation(self, step: ReplicaGeneration) -> bool:
        """Applies one generation of the primary (its id, records, reader moves, the replica's position) in
        one transaction; False when it was applied before. See ``replication.apply`` for the errors."""
        with self.write() as scope:
            meta = replication.apply(scope.txn, self.tables, step)
            if meta is None:
                return False
            scope.commits.append((step.collection, meta.generation))
            if step.records:
                scope.records_written[step.collection] = len(step.records)
        return True

    def staged_first_copy(self, name: str) -> Staged | None:
        """The first copy of ``name`` under way on this replica, if any (see ``first_copy``)."""
        with self.read() as txn:
            return first_copy.staged(txn, self.tables, name)

    def stage_first_copy(self, name: str, manual: bool, generation_id: bytes) -> Staged | None:
        """Begins, or finds to resume, a first copy of ``name`` at ``generation_id`` written in batches
        (None: copied already). The collection stays invisible until :meth:`finish_first_copy`."""
        with self.write() as scope:
            return first_copy.stage(scope.txn, self.tables, name, manual, generation_id)

    def stage_first_copy_batch(
        self,
        name: str,
        generation_id: bytes,
        records: list[tuple[bytes, bytes | None]],
        next_key: bytes | None,
    ) -> bool:
        """Writes one batch of a staged first copy, in one transaction; False: no such copy is staged."""
        with self.write() as scope:
            return first_copy.stage_batch(scope.txn, self.tables, name, generation_id, records, next_key)

    def finish_first_copy(self, step: ReplicaGeneration) -> bool:
        """Writes the last batch of a staged first copy and commits it with everything
        :meth:`apply_replica_generation` stores; False: no such copy is staged."""
        with self.write() as scope:
            meta = first_copy.finish(scope.txn, self.tables, step)
            if meta is None:
                return False
            scope.commits.append((step.collection, meta.generation))
            if step.records:
                scope.records_written[step.collection] = len(step.records)
        return True

    def copy_replica_readers(
        self, name: str, at_generation: bytes, readers: list[Reader], leases: list[Lease]
    ) -> bool:
        """Sets a collection's readers and leases to the primary's, if the replica is still at
        ``at_generation`` (False: it is not; nothing changed)."""
        with self.write() as scope:
            return replication.copy_readers(
                scope.txn, self.tables, name, at_generation, readers, leases, self.config.now_ms()
            )

    def copy_replica_retention(self, name: str, policy: RetentionPolicy | None) -> bool:
        """Sets a collection's retention policy to its primary's; False when it was that already."""
        with self.write() as scope:
            return replication.copy_retention(scope.txn, self.tables, name, policy)

    def add_missing_replica_readers(self, name: str, readers: list[Reader]) -> int:
        """Creates at null the readers of ``readers`` the collection lacks (see ``replication``)."""
        with self.write() as scope:
            return replication.add_missing_readers(scope.txn, self.tables, name, readers)

    def set_replica_lag(self, name: str, generations: int, unapplied_since_ms: int | None) -> None:
        """Records how far a collection of the replica is behind (``/replica``, metrics)."""
        with self.write() as scope:
            replication.set_lag(scope.txn, self.tables, name, generations, unapplied_since_ms)

    def replica_status(self, name: str) -> ReplicaLag | None:
        """One collection's follower state and lag as stored (a point read), None when none is."""
        with self.read() as txn:
            return replication.status(txn, self.tables, name)

    def set_replica_status(self, name: str, state: str, reason: str | None, since_ms: int) -> None:
        """Records what the follower of a collection is doing (``copying``, ``following``, ``stalled``
        with a reason) and since when (``/replica``, metrics, the console)."""
        with self.write() as scope:
            replication.set_status(scope.txn, self.tables, name, state, reason, since_ms)

    def forget_replica_collection(self, name: str) -> None:
        """Drops the follower's state of a collection the replica does not hold (gone on the primary)."""
        with self.write() as scope:
            replication.forget(scope.txn, self.tables, name)

    # --- background work ----------------------------------------------------------------------------

    def _adopt_pending_auto_commits(self) -> None:
        """Makes due the writes of open generations that have no due row (stores written before ``due``)."""
        with self.read() as txn:
            missing = [
                meta.name
                for meta in background.collection_metas(txn, self.tables)
                if not meta.manual
                and meta.next_count > 0
                and txn.get(layout.auto_commit_due_key(meta.name), db=self.tables.due) is None
            ]
        if missing:
            with self.write() as scope:
                for name in missing:
                    scope.txn.put(layout.auto_commit_due_key(name), layout.u64(_now_ms()), db=self.tables.due)

    def health(self) -> StoreHealth:
        """Whether background work is keeping up: automatic commits that keep failing, with the reason."""
        with self._wake:
            failing = tuple(sorted(self._failures.values(), key=lambda f: f.collection))
            return StoreHealth(failing, self._failure_count)

    def run_background_once(self, now: float | None = None) -> bool:
        """Runs due automatic commits and one round of GC/purge steps; True if anything was done.

        ``now`` is a ``time.monotonic()`` value (later than now: as if that much time had passed).
        """
        mono = time.monotonic()
        now = mono if now is None else now
        now_ms = _now_ms() + int((now - mono) * 1000)
        due, next_ms = background.due_auto_commits(self, now_ms)
        worked = False
        for name in due:
            failure = self._failures.get(name)
            if failure is not None and failure.retry_at > now:
                continue  # backing off
            try:
                worked = background.auto_commit(self, name, now_ms) or worked
            except DiffstoreError as exc:  # never dropped: the row stays due; other collections go on
                self._auto_commit_failed(name, exc, mono)
            else:
                if failure is not None:
                    with self._wake:
                        self._failures.pop(name, None)
                    _log.warning("automatic commit of %r succeeded after %d failures", name, failure.attempts)
        with self._wake:
            retries = [f.retry_at for f in self._failures.values()]
            self._next_due = min(
                [mono + max(0, next_ms - now_ms) / 1000 if next_ms is not None else float("inf"), *retries]
            )
        worked = background.collect_step(self) or worked
        return worked

    def _auto_commit_failed(self, name: str, exc: DiffstoreError, now: float) -> None:
        with self._wake:
            previous = self._failures.get(name)
            attempts = 1 if previous is None else previous.attempts + 1
            backoff = min(_RETRY_FIRST_S * 2 ** (attempts - 1), _RETRY_MAX_S)
            self._failures[name] = AutoCommitFailure(name, attempts, str(exc), now + backoff)
            self._failure_count += 1
        _log.error(
            "automatic commit of %r failed (attempt %d, retry in %.2fs): %s", name, attempts, backoff, exc
        )

    def _run_worker(self) -> None:
        interval = self.config.gc_interval_ms / 1000
        sync_interval = self.config.sync_interval_ms / 1000
        last_gc = 0.0
        last_sync = time.monotonic()
        while not self._closed:
            now = time.monotonic()
            if not self.config.sync and now - last_sync >= sync_interval:
                self._flush()
                last_sync = now
            gc_due = now - last_gc >= interval
            if gc_due:
                self.clear_stale_readers()
            if self._next_due <= now or gc_due:
                try:
                    worked = self.run_background_once(now)
                except DiffstoreError:
                    _log.exception("background work failed; it is retried")
                    worked = False
                if gc_due and not worked:
                    last_gc = now
                continue
            wake_at = min(self._next_due, last_gc + interval)
            if not self.config.sync:
                wake_at = min(wake_at, last_sync + sync_interval)
            with self._wake:
                if self._closed:
                    return
                self._wake.wait(timeout=max(0.0, wake_at - now))

    def clear_stale_readers(self) -> None:
        """Frees LMDB reader slots left by dead processes: they would keep old pages from being reused."""
        try:
            cleared = self.env.reader_check()
        except lmdb.Error:
            _log.exception("checking LMDB's reader table failed")
            return
        if cleared:
            self.stale_readers_cleared += cleared
            _log.warning("cleared %d LMDB reader slot(s) of dead processes", cleared)

    def _flush(self) -> None:
        try:
            self.env.sync(True)
            self.flushes += 1
        except lmdb.Error:
            _log.exception("flushing the store to disk failed")
