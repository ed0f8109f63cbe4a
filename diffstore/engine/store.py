"""The store: one LMDB environment holding every collection, its transactions, and background work.

Invariants:
- Every change is one LMDB write transaction, taken under ``Store._write_lock`` (one writer at a time
  in this process; readers take no lock, but step aside while another thread's write transaction is
  changing pages: see :mod:`diffstore.engine.priority`). A commit is durable when its transaction returns
  (``StoreConfig.sync``, the default); without it the worker flushes every ``sync_interval_ms``.
- Commit listeners run after the transaction that committed, outside the lock, in the committing
  thread (the background worker for automatic commits).
- The background worker only does work that is safe to repeat or resume after a crash: automatic
  commits, GC steps, phantom purges and purges of deleted collections, each in small transactions.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import lmdb
import msgpack

from diffstore.engine import background, layout
from diffstore.engine.collection import Collection
from diffstore.engine.meta import CollectionMeta, non_manual_generation
from diffstore.engine.priority import WriterFirst
from diffstore.engine.tables import (
    Tables,
    load_meta,
    register_generation,
    save_meta,
    validate_collection_name,
    validate_generation_id,
)
from diffstore.engine.types import CollectionInfo, StoreConfig
from diffstore.errors import CollectionExists, DiffstoreError, InvalidRequest, StorageError

CommitListener = Callable[[str, bytes], None]
_log = logging.getLogger("diffstore.engine")
_NEXT_CID = b"\x00next_cid"  # not a legal collection name, so it cannot collide with one


@dataclass(slots=True)
class WriteScope:
    """An open write transaction plus what to announce once it has committed."""

    txn: lmdb.Transaction
    commits: list[tuple[str, bytes]] = field(default_factory=list)
    first_writes: list[str] = field(default_factory=list)
    threshold_commits: list[str] = field(default_factory=list)


class Store:
    """A directory holding collections. Thread-safe; use one ``Store`` per directory per process."""

    def __init__(self, path: str | os.PathLike[str], config: StoreConfig | None = None) -> None:
        self.path = Path(path)
        self.config = config or StoreConfig()
        try:
            self.path.mkdir(parents=True, exist_ok=True)
            self.env = lmdb.open(
                str(self.path),
                map_size=self.config.map_size,
                max_dbs=len(layout.TABLES) + 2,
                max_readers=2048,
                readahead=False,
                sync=self.config.sync,
                metasync=self.config.sync,
                # unsynced, a commit need not write its pages at all: they are changed in the shared map
                writemap=not self.config.sync,
                map_async=not self.config.sync,
            )
            self.tables = Tables.open(self.env)
        except (lmdb.Error, OSError) as exc:
            raise StorageError(f"cannot open the store at {self.path}: {exc}") from exc
        self._write_lock = threading.RLock()
        self._writer_first = WriterFirst(self.config.read_yield_ms)
        self._page_lock = threading.RLock()  # pages are built one at a time (see engine/priority.py)
        self._listeners: list[CommitListener] = []
        self._listeners_lock = threading.Lock()
        self._closed = False
        self.flushes = 0  # how many times the worker flushed an unsynced store (sync=False)
        # name -> monotonic deadline of the automatic commit of its open generation
        self._auto_commit_due: dict[str, float] = {}
        # name -> (generation seq, last key form) where the GC of a long generation resumes
        self.gc_positions: dict[str, tuple[int, bytes]] = {}
        self._wake = threading.Condition()
        self._schedule_pending_auto_commits()
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
        with self._write_lock:
            if not self.config.sync:
                self.env.sync(True)
            self.env.close()

    # --- transactions ---------------------------------------------------------------------------

    @contextlib.contextmanager
    def read(self) -> Iterator[lmdb.Transaction]:
        """A read-only snapshot; LMDB failures surface as :class:`StorageError`.

        Starting it waits (at most ``read_yield_ms``) while another thread's write changes pages.
        """
        self._writer_first.before_read()
        try:
            with self.env.begin(buffers=False) as txn:
                yield txn
        except lmdb.Error as exc:
            raise StorageError(str(exc)) from exc

    @contextlib.contextmanager
    def page_read(self) -> Iterator[lmdb.Transaction]:
        """A read-only snapshot for building one whole page; pages of other threads wait their turn.

        Never hold it across a ``yield`` to a caller: another thread's page would wait for that caller.
        """
        with self._page_lock, self.read() as txn:
            yield txn

    @contextlib.contextmanager
    def write(self) -> Iterator[WriteScope]:
        """One atomic write transaction; listeners hear about its commits after it is durable."""
        with self._write_lock:
            try:
                with self.env.begin(write=True) as txn, self._writer_first.writing():
                    scope = WriteScope(txn)
                    yield scope
            except lmdb.Error as exc:
                raise StorageError(str(exc)) from exc
        if scope.first_writes or scope.threshold_commits:
            due = time.monotonic() + self.config.commit_delay_ms / 1000
            with self._wake:
                for name in scope.threshold_commits:
                    self._auto_commit_due.pop(name, None)
                for name in scope.first_writes:
                    # a first write opens a new countdown; any older deadline was for a committed generation
                    self._auto_commit_due[name] = due
                self._wake.notify_all()
        for name, generation_id in scope.commits:
            self._announce(name, generation_id)

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

    def add_commit_listener(self, listener: CommitListener) -> Callable[[], None]:
        """Calls ``listener(collection_name, generation_id)`` after every commit; returns a remover."""
        with self._listeners_lock:
            self._listeners.append(listener)

        def remove() -> None:
            with self._listeners_lock, contextlib.suppress(ValueError):
                self._listeners.remove(listener)

        return remove

    # --- collections ----------------------------------------------------------------------------

    def create_collection(
        self, name: str, manual: bool = True, initial_generation_id: bytes | None = None
    ) -> Collection:
        """Creates a collection (raises :class:`CollectionExists`).

        Manual collections start at ``initial_generation_id`` (default ``b""``) with no open generation;
        others start at 8 zero bytes with the next generation open.
        """
        validate_collection_name(name)
        if initial_generation_id is not None:
            validate_generation_id(initial_generation_id, "initialGenerationId")
            if not manual:
                raise InvalidRequest("initialGenerationId is only for manual collections")
        with self.write() as scope:
            txn = scope.txn
            if txn.get(name.encode(), db=self.tables.collections) is not None:
                raise CollectionExists(f"collection {name!r} exists")
            raw_cid = txn.get(_NEXT_CID, db=self.tables.collections)
            cid = layout.read_u64(raw_cid) if raw_cid else 1
            txn.put(_NEXT_CID, layout.u64(cid + 1), db=self.tables.collections)
            if manual:
                gen = bytes(initial_generation_id or b"")
                meta = CollectionMeta(name, cid, True, gen, 0, None, None, 0)
                register_generation(txn, self.tables, meta, gen, 0)
            else:
                meta = CollectionMeta(
                    name, cid, False, non_manual_generation(0), 0, non_manual_generation(1), 1, 1
                )
                register_generation(txn, self.tables, meta, meta.generation, 0)
                register_generation(txn, self.tables, meta, non_manual_generation(1), 1)
            save_meta(txn, self.tables, meta)
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
                if raw_name == _NEXT_CID:
                    continue
                meta = CollectionMeta.unpack(raw_name.decode(), raw)
                found.append(CollectionInfo(meta.name, meta.manual))
        return sorted(found, key=lambda info: info.name.encode())

    def delete_collection(self, name: str) -> None:
        """Deletes a collection, its readers, and every reader anywhere that targets it — durably.

        The records themselves are purged in the background (they are unreachable at once).
        """
        with self.write() as scope:
            txn, tables = scope.txn, self.tables
            meta = load_meta(txn, tables, name)
            prefix = meta.cid_prefix
            cursor = txn.cursor(db=tables.readers)
            owned: list[tuple[bytes, str]] = []
            if cursor.set_range(prefix):
                for key in cursor.iternext(values=False):
                    if not key.startswith(prefix):
                        break
                    owned.append((key, key[4:].decode()))
            for key, reader_name in owned:
                target = self._reader_target(txn, key)
                txn.delete(key, db=tables.readers)
                txn.delete(layout.target_key(target, prefix, reader_name), db=tables.targets)
            targeting: list[bytes] = []
            cursor = txn.cursor(db=tables.targets)
            tprefix = layout.target_prefix(name)
            if cursor.set_range(tprefix):
                for key in cursor.iternext(values=False):
                    if not key.startswith(tprefix):
                        break
                    targeting.append(key)
            for key in targeting:
                reader_name = msgpack.unpackb(txn.get(key, db=tables.targets), raw=False)[0]
                owner = layout.cid_bytes(layout.owner_of_target_key(key))
                txn.delete(layout.reader_key(owner, reader_name), db=tables.readers)
                txn.delete(key, db=tables.targets)
            txn.delete(name.encode(), db=tables.collections)
            txn.put(prefix, b"", db=tables.dropped)
        with self._wake:
            self._auto_commit_due.pop(name, None)

    def _reader_target(self, txn: lmdb.Transaction, reader_key: bytes) -> str:
        raw = txn.get(reader_key, db=self.tables.readers)
        return str(msgpack.unpackb(raw, raw=False)[0]) if raw else ""

    # --- background work ----------------------------------------------------------------------------

    def _schedule_pending_auto_commits(self) -> None:
        now = time.monotonic()
        with self.read() as txn:
            for raw_name, raw in txn.cursor(db=self.tables.collections):
                if raw_name == _NEXT_CID:
                    continue
                meta = CollectionMeta.unpack(raw_name.decode(), raw)
                if not meta.manual and meta.next_count > 0:
                    self._auto_commit_due[meta.name] = now

    def run_background_once(self, now: float | None = None) -> bool:
        """Runs due automatic commits and one round of GC/purge steps; True if anything was done."""
        now = time.monotonic() if now is None else now
        with self._wake:
            due = [name for name, deadline in self._auto_commit_due.items() if deadline <= now]
            for name in due:
                del self._auto_commit_due[name]
        worked = False
        for name in due:
            worked = background.auto_commit(self, name) or worked
        worked = background.collect_step(self) or worked
        return worked

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
            with self._wake:
                due_times = list(self._auto_commit_due.values())
            next_due = min(due_times, default=now + interval)
            if next_due <= now or now - last_gc >= interval:
                try:
                    worked = self.run_background_once(now)
                except DiffstoreError:
                    worked = False
                if now - last_gc >= interval and not worked:
                    last_gc = now
                continue
            wake_at = min(next_due, last_gc + interval)
            if not self.config.sync:
                wake_at = min(wake_at, last_sync + sync_interval)
            with self._wake:
                if self._closed:
                    return
                self._wake.wait(timeout=max(0.0, wake_at - now))

    def _flush(self) -> None:
        try:
            self.env.sync(True)
            self.flushes += 1
        except lmdb.Error:
            _log.exception("flushing the store to disk failed")
