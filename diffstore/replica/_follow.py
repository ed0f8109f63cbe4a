"""The follower's loop: one thread per collection of the primary, one that watches the list of collections.

Everything it reads comes from the primary's public HTTP API (:mod:`diffstore.client`); everything it
writes goes through the engine's replication API (``Store.apply_replica_generation`` and friends), whose
transactions carry the replica's position. The decisions are in :mod:`diffstore.replica._plan`.

One collection's step, from the replica's position R (its current generation there):

1. no copy yet: take one -- the oldest generation G0 the primary still serves, a reader of ours on the
   primary at G0 (so its GC keeps what we have not copied), every record visible at G0 -- applied as G0;
2. long-poll the primary for a generation other than R (the poll's timeout is the idle beat: then the
   readers and leases are copied again if they changed outside commits);
3. list the primary's generations above R; for each, oldest first, read the records it wrote and the
   readers its commit moved, check that our reader is still there (the collection was not deleted and
   created again meanwhile), apply it; then move our reader on the primary to the new position.

A collection deleted on the primary is deleted on the replica. Errors reaching the primary are retried
after ``retry_s``; a promotion (``NotReplica`` from the engine) stops every thread, and the readers the
replica held on its primary are deleted (best effort: the primary may be the reason of the promotion).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from diffstore.client import Client, Collection
from diffstore.client import _calls as calls
from diffstore.engine.store import Store
from diffstore.engine.types import GenerationInfo, Reader, ReplicaGeneration
from diffstore.errors import (
    DiffstoreError,
    GenerationCollected,
    NoSuchCollection,
    NoSuchGeneration,
    NoSuchReader,
    NotReplica,
    ReaderExists,
    text_form,
)
from diffstore.replica._plan import READER_PREFIX, Pending, copies_differ, reader_copies, reader_name

_log = logging.getLogger("diffstore.replica")


@dataclass(frozen=True, slots=True)
class FollowerConfig:
    """How a replica follows its primary.

    Attributes:
        primary: the primary's base URL.
        token: the primary's bearer token, if it has one.
        replica_id: names the readers this replica holds on the primary (stored with the replica's state).
        poll_ms: the long poll's timeout: how often an idle collection's readers and leases are compared.
        collections_poll_s: how often the primary's list of collections is read (creations, deletions).
        batch_records: records read ahead before they are applied (bounds the follower's memory; a larger
            generation is read whole, it is applied in one transaction).
        page_records: records per request.
        retry_s: the wait after a failed request to the primary.
        ca_file, cert: how an ``https://`` primary is checked and shown a client certificate.
    """

    primary: str
    token: str | None
    replica_id: str
    poll_ms: int = 2_000
    collections_poll_s: float = 0.5
    batch_records: int = 20_000
    page_records: int = 5_000
    retry_s: float = 0.5
    ca_file: str | None = None
    cert: tuple[str, str] | None = None


class Follower:
    """Follows every collection of ``config.primary`` into ``store`` until :meth:`stop` or a promotion."""

    def __init__(self, store: Store, config: FollowerConfig) -> None:
        self.store = store
        self.config = config
        self._stopping = threading.Event()
        self._threads: dict[str, threading.Thread] = {}
        self._main: threading.Thread | None = None
        self.primary_names: frozenset[str] = frozenset()  # the primary's collections, as last listed

    def start(self) -> None:
        self._main = threading.Thread(target=self.run, name="diffstore-replica", daemon=True)
        self._main.start()

    def stop(self, timeout_s: float = 10.0) -> None:
        self._stopping.set()
        if self._main is not None:
            self._main.join(timeout_s)

    @property
    def stopped(self) -> bool:
        return self._stopping.is_set()

    def run(self) -> None:
        """Watches the primary's collections and keeps one thread per collection (either side has)."""
        with self._client() as client:
            while not self._stopping.is_set():
                if not self.store.read_only():
                    break
                try:
                    names = {info.name for info in client.collections()}
                    self.primary_names = frozenset(names)
                except DiffstoreError as exc:
                    _log.warning("replica: cannot list the primary's collections: %s", exc.reason)
                    names = set()
                else:
                    names |= {info.name for info in self.store.collections()}
                for name in sorted(names):
                    thread = self._threads.get(name)
                    if thread is None or not thread.is_alive():
                        self._threads[name] = thread = threading.Thread(
                            target=self._follow, args=(name,), name=f"diffstore-replica:{name}", daemon=True
                        )
                        thread.start()
                self._stopping.wait(self.config.collections_poll_s)
            self._stopping.set()
            for thread in self._threads.values():
                thread.join(self.config.poll_ms / 1000 + 15)
            if not self.store.read_only():
                self._promoted(client)  # after the threads: none of them acts on a hold that went away

    def _client(self) -> Client:
        return Client(
            self.config.primary, token=self.config.token, ca_file=self.config.ca_file, cert=self.config.cert
        )

    def _follow(self, name: str) -> None:
        with self._client() as client:
            follower = CollectionFollower(self.store, client, name, self.config, lambda: self.primary_names)
            while not self._stopping.is_set():
                try:
                    if not follower.step():
                        return
                except NotReplica:
                    self._stopping.set()  # promoted: the main thread lets the primary's readers go
                    return
                except DiffstoreError as exc:
                    _log.warning("replica: %s: %s (%s); retrying", name, exc.reason, exc.code)
                    self._stopping.wait(self.config.retry_s)

    def _promoted(self, client: Client) -> None:
        """Lets go of the readers this replica held on its primary (best effort)."""
        ours = reader_name(self.config.replica_id)
        for info in self.store.collections():
            try:
                client.collection(info.name).delete_reader(ours)
            except DiffstoreError:
                pass


@dataclass(frozen=True, slots=True)
class Fetched:
    """One primary generation as read: the generation before it, its records, the readers its commit
    moved, the collection's readers then (holds left out), and its commit time and metadata (None: a
    primary older than them)."""

    previous: bytes | None
    records: list[tuple[bytes, bytes | None]]
    moves: tuple[Reader, ...]
    readers: list[Reader]
    info: GenerationInfo | None = None


class CollectionFollower:
    """Copies one collection; :meth:`step` does one step of the module's loop."""

    def __init__(
        self,
        store: Store,
        client: Client,
        name: str,
        config: FollowerConfig,
        primary_names: Callable[[], frozenset[str]] = frozenset,
    ) -> None:
        self.primary_names = primary_names
        self.store = store
        self.client = client
        self.name = name
        self.config = config
        self.reader = reader_name(config.replica_id)
        self.primary = Collection(client, name, True)  # the calls made here do not depend on the kind
        self.behind_since_ms: int | None = None

    def position(self) -> bytes | None:
        try:
            return self.store.collection(self.name).generation_id
        except NoSuchCollection:
            return None

    def step(self) -> bool:
        """One step; False when the collection is gone on both sides (the thread ends)."""
        position = self.position()
        if position is None:
            return self.copy_whole()
        try:
            current = self.client.execute(calls.generation_stream(self.name, position, self.config.poll_ms))
        except NoSuchCollection:
            self.drop()
            return False
        if current == position:
            self.copy_readers(position)
            return True
        try:
            newest = self.fetch(current)
        except (NoSuchGeneration, GenerationCollected, NoSuchReader):
            self.drop()  # not the collection we copy any more
            return True
        if newest.previous == position:  # the usual case: one generation, fetched with one request
            self.apply(position, [current], {current: newest})
            return True
        pending = Pending.after(position)
        before: bytes | None = None
        known: dict[bytes, GenerationInfo] = {}  # the primary's commit time and metadata, kept as they are
        while True:
            infos, more = self.primary.history(before, limit=1000)
            known.update((info.generation_id, info) for info in infos)
            ids = [info.generation_id for info in infos]
            if pending.page(ids, more) or not ids:
                break
            before = ids[-1]
        if not pending.found:
            _log.warning(
                "replica: %s: generation %s is not on the primary any more; copying it again",
                self.name,
                text_form(position),
            )
            self.drop()
            return True
        self.apply(position, pending.ahead, {current: newest}, known)
        return True

    def drop(self) -> None:
        """Drops the replica's copy (it is copied again); refused (``NotReplica``) once promoted."""
        try:
            self.store.delete_collection(self.name, replica_copy=True)
        except NoSuchCollection:
            pass

    def copy_whole(self) -> bool:
        """Takes the first copy of the collection; False when the primary has no such collection."""
        try:
            manual = self.client.collection(self.name).manual
            listed: list[GenerationInfo] = []
            before: bytes | None = None
            while True:
                infos, more = self.primary.history(before, limit=1000)
                listed.extend(infos)
                if not more or not infos:
                    break
                before = infos[-1].generation_id
            self.primary.delete_reader(self.reader)
            first: GenerationInfo | None = None
            for info in reversed(listed):  # the oldest one readers may still read
                try:
                    self.primary.create_reader(self.reader, generation_id=info.generation_id)
                except GenerationCollected:
                    continue
                first = info
                break
            if first is None:
                return True  # the primary moved under us: try again
            oldest = first.generation_id
            records: list[tuple[bytes, bytes | None]] = [
                (r.key, r.value)
                for r in self.primary.query(generation_id=oldest, limit=self.config.page_records)
            ]
            if not self.holds_reader():
                return True
        except NoSuchCollection:
            return False
        except (GenerationCollected, ReaderExists):
            return True  # the primary moved under us: try again
        # its commit time and metadata as the primary lists them (none listed: none kept); its changed
        # keys are those the copy wrote (every record visible there: what its index holds)
        step = ReplicaGeneration(
            self.name,
            manual,
            None,
            oldest,
            records,
            floor=True,
            committed_at_ms=first.committed_at_ms,
            metadata=first.metadata,
            recorded=first.committed_at_ms is not None,
        )
        self.store.apply_replica_generation(step)
        return True

    def holds_reader(self) -> bool:
        """Whether our reader is still there: the collection is the one we copy, not a new one."""
        return any(reader.name == self.reader for reader in self.primary.readers())

    def fetch(self, generation_id: bytes) -> Fetched:
        """Everything of one primary generation, its first page read with our hold checked in the same
        transaction (``NoSuchReader``: another collection of that name)."""
        page = self.primary.generation_records(generation_id, None, self.config.page_records, self.reader)
        records = list(page.records)
        from_key = page.next_key
        while from_key is not None:
            more = self.primary.generation_records(
                generation_id, from_key, self.config.page_records, self.reader
            )
            records.extend(more.records)
            from_key = more.next_key
        moves = tuple(r for r in page.moves if not r.name.startswith(READER_PREFIX))
        return Fetched(page.previous, records, moves, reader_copies(list(page.readers)), page.info)

    def targets_not_copied_yet(self, batch: list[tuple[bytes, Fetched]]) -> bool:
        """Whether a reader these commits move targets a collection of the primary that the replica has
        not copied yet (another thread copies it): applied now, the move's lineage would not know its
        target was a collection."""
        targets = {move.collection for _, one in batch for move in one.moves} & self.primary_names()
        if not targets:
            return False
        local = {info.name for info in self.store.collections()}
        return not targets <= local

    def stop_wait(self) -> None:
        time.sleep(self.config.retry_s / 5)

    def add_missing_readers(self, readers: list[Reader]) -> None:
        local = {reader.name for reader in self.store.collection(self.name).readers()}
        missing = [reader for reader in readers if reader.name not in local]
        if missing:
            self.store.add_missing_replica_readers(self.name, missing)

    def apply(
        self,
        position: bytes,
        ahead: list[bytes],
        fetched: dict[bytes, Fetched],
        known: dict[bytes, GenerationInfo] | None = None,
    ) -> None:
        """Applies ``ahead`` with the primary's commit time and metadata of each: from its fetched first
        page, else from ``known`` (the history listed on the catch-up path, for a primary whose pages do
        not carry them); when neither knows, the replica's clock stands in, with no metadata."""
        now_ms = time.time_ns() // 1_000_000
        if self.behind_since_ms is None:
            self.behind_since_ms = now_ms
        if len(ahead) > 1:
            self.store.set_replica_lag(self.name, len(ahead), self.behind_since_ms)
        manual = self.store.collection(self.name).manual
        done = 0
        while done < len(ahead):
            batch: list[tuple[bytes, Fetched]] = []
            size = 0
            while done + len(batch) < len(ahead) and (not batch or size < self.config.batch_records):
                generation_id = ahead[done + len(batch)]
                try:
                    one = fetched.pop(generation_id, None) or self.fetch(generation_id)
                except (NoSuchGeneration, GenerationCollected, NoSuchReader):
                    self.drop()  # not the collection we copy any more
                    return
                batch.append((generation_id, one))
                size += len(one.records)
            if self.targets_not_copied_yet(batch):
                self.stop_wait()
                return
            # readers created outside commits, before these generations: there before them (at null)
            self.add_missing_readers(batch[-1][1].readers)
            for generation_id, one in batch:
                done += 1
                left = len(ahead) - done
                told = one.info or (known or {}).get(generation_id)
                info = told or GenerationInfo(generation_id)
                self.store.apply_replica_generation(
                    ReplicaGeneration(
                        self.name,
                        manual,
                        position,
                        generation_id,
                        one.records,
                        one.moves,
                        lag_generations=left,
                        unapplied_since_ms=self.behind_since_ms if left else None,
                        committed_at_ms=info.committed_at_ms,
                        metadata=info.metadata,
                        recorded=told is None or told.committed_at_ms is not None,
                    )
                )
                position = generation_id
            try:
                self.primary.update_reader(self.reader, position)
            except NoSuchReader:
                self.drop()
                return
        self.behind_since_ms = None

    def copy_readers(self, position: bytes) -> None:
        """Copies the primary's readers and leases when they changed outside commits (the idle beat)."""
        readers = self.primary.readers()
        if not any(reader.name == self.reader for reader in readers):
            self.drop()
            return
        leases = self.primary.leases()
        local = self.store.collection(self.name)
        if not copies_differ(readers, leases, local.readers(), local.leases()):
            return
        if self.primary.generation_id != position:
            return  # moved meanwhile: the next step applies it first
        self.store.copy_replica_readers(self.name, position, reader_copies(readers), leases)
