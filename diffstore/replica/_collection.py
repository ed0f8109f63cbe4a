"""One collection's follower: its first copy, its catch-up from the replica's position, its idle check.

Everything it reads comes from the primary's public HTTP API (:mod:`diffstore.client`); everything it
writes goes through the engine's replication API (``Store.apply_replica_generation`` and friends), whose
transactions carry the replica's position. The decisions are in :mod:`diffstore.replica._plan`. It holds
no thread: the follower's pool (:mod:`diffstore.replica._follow`) calls :meth:`CollectionFollower.sync`.

1. No copy yet: take one. The oldest generation G0 that readers may still read (``query`` answers there)
   is found among those the primary lists (a binary search: a collection whose history was collected
   lists generations it no longer serves); a hold (a reader of ours) is placed there, so the primary's GC
   keeps what is visible at G0; every record visible there is read in pages (``generations/records`` with
   ``visible``, answered down to what the hold keeps, so readers moving on meanwhile do not end the copy)
   and applied as G0 (docs/replicas.md, "Where it starts").
2. Else, from the replica's position R: the primary's generations above R, oldest first, each fetched
   with the readers its commit moved (our hold checked in the same read, and that it stands at R: a hold
   elsewhere means the primary's history is not the one we copied -- restored from a backup), applied one
   transaction each; then the hold moves to the new position.
3. Idle: the primary's readers and leases are copied when they changed outside commits.

Whenever the copy cannot go on -- the hold is gone (deleted by hand, the collection deleted and created
again), R is not among the primary's generations, the next generation was collected -- the copy is
dropped and taken again from the oldest readable generation: :class:`Dropped` tells the pool why.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from diffstore.client import Client, Collection
from diffstore.client import _calls as calls
from diffstore.engine.store import Store
from diffstore.engine.types import GenerationInfo, GenerationRecords, Reader, ReplicaGeneration
from diffstore.errors import (
    Fenced,
    GenerationCollected,
    NoSuchCollection,
    NoSuchGeneration,
    NoSuchReader,
    ReaderExists,
    text_form,
)
from diffstore.replica._plan import READER_PREFIX, Pending, copies_differ, reader_copies, reader_name
from diffstore.replica._stream import Abandoned, stream

FIRST_COPY_PAGE = 10_000  # records a page of a first copy (the most a page holds)


class Dropped(Exception):
    """The replica's copy of a collection was dropped (the message says why, in one line): copy it again."""


class Waiting(Exception):
    """The work cannot go on yet (the message says what it waits for); it is tried again later."""


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


@dataclass(frozen=True, slots=True)
class CopySettings:
    """What a collection's follower needs of the follower's configuration."""

    replica_id: str
    batch_records: int = 20_000
    page_records: int = 5_000


class CollectionFollower:
    """Copies one collection (see the module); :meth:`sync` brings it up to the primary's generation."""

    def __init__(
        self,
        store: Store,
        client: Client,
        name: str,
        settings: CopySettings,
        primary_names: Callable[[], frozenset[str]] = frozenset,
    ) -> None:
        self.primary_names = primary_names
        self.store = store
        self.client = client
        self.name = name
        self.settings = settings
        self.reader = reader_name(settings.replica_id)
        self.primary = Collection(client, name, True)  # the calls made here do not depend on the kind
        self.behind_since_ms: int | None = None
        self.hold_at: bytes | None = None  # where we last placed our hold (None: not known)
        self.target_waits = 0  # first copies put off for a reader's target not copied yet

    def position(self) -> bytes | None:
        try:
            return self.store.collection(self.name).generation_id
        except NoSuchCollection:
            return None

    # --- the work ---------------------------------------------------------------------------------------

    def sync(self, idle_check: bool = False, told: bytes | None = None) -> bytes | None:
        """Brings the copy up to the primary's current generation; returns the replica's position (None:
        the primary has the collection no more and neither has the replica). ``told``: the primary's
        current generation as a long poll just answered it (saves asking again).

        Raises:
            Dropped: the copy was dropped (the reason in the message); the next sync copies it again.
            Waiting: a reader these commits move targets a collection not copied yet.
            DiffstoreError: the primary failed to answer (the pool backs off).
        """
        position = self.position()
        if position is None:
            return self.copy_whole()
        try:
            current = told
            if current is None:
                current = self.client.execute(calls.generation_stream(self.name, None))
        except NoSuchCollection:
            self.drop("deleted on the primary")
            return None
        if self.hold_at != position:
            self.move_hold(position)
        if current == position:
            if idle_check:
                self.copy_readers(position)
            return position
        self.catch_up(position, current)
        return self.position()

    def wait_change(self, position: bytes, timeout_ms: int) -> bytes | None:
        """Long-polls the primary for a generation other than ``position``: the primary's current one when
        it moved, ``position`` when the wait ended without a change, None when the collection is gone
        (the next sync sees it)."""
        try:
            return self.client.execute(calls.generation_stream(self.name, position, timeout_ms))
        except NoSuchCollection:
            return None

    def drop(self, why: str) -> None:
        """Drops the replica's copy (taken again by the next sync); refused (``NotReplica``) once promoted.

        Raises:
            Dropped: with ``why`` -- unless the collection is gone from the primary (then nothing is raised:
                the replica just follows the deletion).
        """
        try:
            self.store.delete_collection(self.name, replica_copy=True)
        except NoSuchCollection:
            pass
        self.hold_at = None
        if why != "deleted on the primary":
            raise Dropped(why)

    def move_hold(self, position: bytes) -> None:
        """Places our hold at the replica's position (after a restart, or a move that failed)."""
        try:
            self.primary.update_reader(self.reader, position)
        except NoSuchReader:
            self.drop("our hold on the primary is gone (deleted, or the collection was created again)")
        except GenerationCollected:
            self.drop(f"generation {text_form(position)} was collected on the primary")
        except NoSuchGeneration:
            self.drop(f"generation {text_form(position)} is not on the primary any more")
        except NoSuchCollection:
            return  # the next sync sees it gone
        except Fenced:
            return  # the primary stepped down (a promotion under way): the hold stays where it stands
        self.hold_at = position

    def copy_whole(self) -> bytes | None:
        """Takes the first copy of the collection (see the module); None: the primary has no such one."""
        try:
            resumed = self.resume_copy()
            if resumed is not None:
                return resumed
            listed = self.listed()
            if not listed:
                raise Waiting("the primary listed no generation")
            first = self.oldest_readable(listed)
            oldest = first.generation_id
            self.primary.delete_reader(self.reader)
            # the hold first, at null (the beginning): from here on the primary's GC keeps what is visible
            # at oldest; it moves there once applied, as every hold moves to what the replica applied
            # (a hold is the replica's confirmation: serve --synchronous counts them)
            self.primary.create_reader(self.reader, generation_id=None)
            manual = self.client.collection(self.name).manual
            before, moves = self.first_moves(oldest)
            page = self.first_copy_page(oldest, None)
            if page.next_key is not None:  # more than a page: staged, in batches (see _stream)
                self.store.stage_first_copy(self.name, manual, oldest)
                self.stream_copy(oldest, None, first, before, moves)
                self.move_hold(oldest)  # once applied: a hold is the replica's confirmation (--synchronous)
                return oldest
        except NoSuchCollection:
            return None
        except NoSuchReader as exc:
            raise Waiting("the collection was created again on the primary while it was copied") from exc
        except (GenerationCollected, ReaderExists) as exc:
            raise Waiting(f"the primary moved while it was copied ({exc.reason})") from exc
        except Abandoned as exc:
            raise Waiting(str(exc)) from exc
        self.store.apply_replica_generation(self.first_step(manual, first, page.records, before, moves))
        self.move_hold(oldest)  # once applied: a hold is the replica's confirmation (--synchronous)
        return oldest

    def first_step(
        self,
        manual: bool,
        first: GenerationInfo,
        records: list[tuple[bytes, bytes | None]],
        before: tuple[Reader, ...],
        moves: tuple[Reader, ...],
    ) -> ReplicaGeneration:
        """The first copy's generation as applied: its commit time and metadata as the primary lists them
        (none listed: none kept); its changed keys are those the copy wrote (every record visible there:
        what its index holds)."""
        return ReplicaGeneration(
            self.name,
            manual,
            None,
            first.generation_id,
            records,
            floor=True,
            committed_at_ms=first.committed_at_ms,
            metadata=first.metadata,
            recorded=first.committed_at_ms is not None,
            readers=moves,
            before=before,
            following_since_ms=time.time_ns() // 1_000_000,
        )

    def first_copy_page(self, generation_id: bytes, from_key: bytes | None) -> GenerationRecords:
        """A page of the records visible at ``generation_id``, kept by our hold."""
        return self.primary.generation_records(
            generation_id, from_key, FIRST_COPY_PAGE, self.reader, visible=True
        )

    def stream_copy(
        self,
        oldest: bytes,
        from_key: bytes | None,
        first: GenerationInfo,
        before: tuple[Reader, ...],
        moves: tuple[Reader, ...],
    ) -> None:
        staged = self.store.staged_first_copy(self.name)
        if staged is None:
            raise Abandoned(f"the first copy of {self.name!r} was dropped meanwhile")
        manual = staged.meta.manual
        stream(
            self.store,
            self.name,
            oldest,
            lambda key: self.first_copy_page(oldest, key),
            from_key,
            lambda records: self.first_step(manual, first, records, before, moves),
        )

    def resume_copy(self) -> bytes | None:
        """Goes on with a first copy a crash or a failure cut (None: none is staged, or it cannot go on --
        then it is dropped, and copied again from the start)."""
        staged = self.store.staged_first_copy(self.name)
        if staged is None:
            return None
        oldest = staged.generation_id
        first = next((info for info in self.listed() if info.generation_id == oldest), None)
        try:
            if first is None:
                raise NoSuchGeneration(f"{text_form(oldest)} is not on the primary any more")
            before, moves = self.first_moves(oldest)
            self.stream_copy(oldest, staged.next_key, first, before, moves)
        except (NoSuchReader, GenerationCollected, NoSuchGeneration, NoSuchCollection):
            # the hold is gone or its generation with it: the copy starts again from the oldest readable
            self.store.delete_collection(self.name, replica_copy=True)
            return None
        self.move_hold(oldest)  # once applied: a hold is the replica's confirmation (--synchronous)
        return oldest

    def first_moves(self, oldest: bytes) -> tuple[tuple[Reader, ...], tuple[Reader, ...]]:
        """The readers the commit of ``oldest`` moved, where they stood before and after it (its lineage,
        which the first copy keeps); waits while one targets a collection not copied yet (a few times:
        two collections whose readers target each other must not wait for each other for ever)."""
        lineage = self.primary.lineage(oldest)
        sources = [s for s in lineage.sources if not s.reader_name.startswith(READER_PREFIX)]
        targets = {s.collection_name for s in sources if s.collection_name not in (None, self.name)}
        missing = targets - {info.name for info in self.store.collections()}
        if missing and self.target_waits < 20:
            self.target_waits += 1
            raise Waiting(f"waiting for {', '.join(sorted(missing))} (a reader's target) to be copied")
        self.target_waits = 0
        return (
            tuple(Reader(s.reader_name, s.target, s.from_generation_id) for s in sources),
            tuple(Reader(s.reader_name, s.target, s.to_generation_id) for s in sources),
        )

    def listed(self) -> list[GenerationInfo]:
        """Every generation the primary lists for the collection, oldest first (collected ones too)."""
        found: list[GenerationInfo] = []
        before: bytes | None = None
        while True:
            infos, more = self.primary.history(before, limit=1000)
            found.extend(infos)
            if not more or not infos:
                break
            before = infos[-1].generation_id
        found.reverse()
        return found

    def oldest_readable(self, listed: list[GenerationInfo]) -> GenerationInfo:
        """The oldest of ``listed`` that ``query`` reads (those below the readers' minimum answer 410; the
        readable ones are the newest ones, so a binary search finds it)."""
        low, high = 0, len(listed) - 1  # the newest one, the current generation, is always readable
        while low < high:
            middle = (low + high) // 2
            try:
                self.primary.query_page(generation_id=listed[middle].generation_id, limit=1)
            except GenerationCollected:
                low = middle + 1
            else:
                high = middle
        return listed[low]

    def holds_reader(self) -> bool:
        """Whether our reader is still there: the collection is the one we copy, not a new one."""
        return any(reader.name == self.reader for reader in self.primary.readers())

    def fetch(self, generation_id: bytes, position: bytes) -> Fetched:
        """Everything of one primary generation, its first page read with our hold checked in the same
        transaction (``NoSuchReader``: another collection of that name)."""
        page = self.primary.generation_records(generation_id, None, self.settings.page_records, self.reader)
        hold = next((r for r in page.readers if r.name == self.reader), None)
        if hold is not None and (hold.generation_id or b"") != position and self.hold_at == position:
            self.drop(
                f"our hold on the primary stands at {text_form(hold.generation_id or b'')}, not at"
                f" {text_form(position)}: the primary's history changed (restored from a backup?)"
            )
        records = list(page.records)
        from_key = page.next_key
        while from_key is not None:
            more = self.primary.generation_records(
                generation_id, from_key, self.settings.page_records, self.reader
            )
            records.extend(more.records)
            from_key = more.next_key
        moves = tuple(r for r in page.moves if not r.name.startswith(READER_PREFIX))
        return Fetched(page.previous, records, moves, reader_copies(list(page.readers)), page.info)

    def fetch_or_drop(self, generation_id: bytes, position: bytes) -> Fetched:
        try:
            return self.fetch(generation_id, position)
        except NoSuchReader:
            self.drop("our hold on the primary is gone (deleted, or the collection was created again)")
        except GenerationCollected:
            self.drop(
                f"generation {text_form(generation_id)} was collected on the primary before it was copied"
            )
        except NoSuchGeneration:
            self.drop(f"generation {text_form(generation_id)} is not on the primary any more")
        raise AssertionError("drop raises")  # pragma: no cover

    def catch_up(self, position: bytes, current: bytes) -> None:
        """Applies the primary's generations above ``position`` up to ``current``."""
        newest = self.fetch_or_drop(current, position)
        if newest.previous == position:  # the usual case: one generation, fetched with one request
            self.apply(position, [current], {current: newest})
            return
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
            self.drop(f"generation {text_form(position)} is not on the primary any more")
        self.apply(position, pending.ahead, {current: newest}, known)

    def targets_not_copied_yet(self, batch: list[tuple[bytes, Fetched]]) -> set[str]:
        """The collections of the primary that readers these commits move target and that the replica has
        not copied yet (applied now, the move's lineage would not know its target was a collection)."""
        targets = {move.collection for _, one in batch for move in one.moves} & self.primary_names()
        if not targets:
            return set()
        local = {info.name for info in self.store.collections()}
        return targets - local

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
            while done + len(batch) < len(ahead) and (not batch or size < self.settings.batch_records):
                generation_id = ahead[done + len(batch)]
                one = fetched.pop(generation_id, None) or self.fetch_or_drop(generation_id, position)
                batch.append((generation_id, one))
                size += len(one.records)
            waiting = self.targets_not_copied_yet(batch)
            if waiting:
                raise Waiting(f"waiting for {', '.join(sorted(waiting))} (a reader's target) to be copied")
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
            self.move_hold(position)
        self.behind_since_ms = None

    def copy_readers(self, position: bytes) -> None:
        """Copies the primary's readers, leases and retention policy when they changed outside commits (the
        idle check)."""
        readers = self.primary.readers()
        if not any(reader.name == self.reader for reader in readers):
            self.drop("our hold on the primary is gone (deleted, or the collection was created again)")
        leases = self.primary.leases()
        local = self.store.collection(self.name)
        policy = self.primary.state().retention  # what GC keeps here follows the primary's policy too
        if policy != local.retention():
            self.store.copy_replica_retention(self.name, policy)
        if not copies_differ(readers, leases, local.readers(), local.leases()):
            return
        if self.primary.generation_id != position:
            return  # moved meanwhile: the next sync applies it first
        self.store.copy_replica_readers(self.name, position, reader_copies(readers), leases)
