"""The public handle on one collection: every operation of SPEC §1/§3 as a method.

A handle holds only the store and the name; each call opens its own transaction and looks the
collection up again, so a handle on a deleted collection raises ``noSuchCollection``.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from dataclasses import replace

import lmdb

from diffstore.engine import (
    crashpoints,
    cursor_spill,
    diff,
    first_copy,
    history,
    layout,
    leases,
    lineage,
    phantoms,
    producers,
    readers,
    reads,
    refs,
    refs_resolve,
    replication,
    retention,
    revert,
    writes,
)
from diffstore.engine import digests as stored_digests
from diffstore.engine.access import StoreAccess, WriteScope
from diffstore.engine.meta import CollectionMeta
from diffstore.engine.tables import load_meta, save_meta
from diffstore.engine.types import (
    UNSET,
    DiffItem,
    DiffPage,
    DiffSpec,
    Expected,
    FromReader,
    GenerationDigest,
    GenerationInfo,
    GenerationRecords,
    GetManyResult,
    GetResult,
    KeysAround,
    Lease,
    LeaseToken,
    Lineage,
    PhantomChanges,
    PutItem,
    PutResult,
    QueryPage,
    Reader,
    ReaderUpdate,
    ReaderUpdateLike,
    Record,
    ResolvedRef,
    RetentionPolicy,
    RevertResult,
)
from diffstore.errors import GenerationMismatch, InvalidRequest, StorageError, text_form

_ITER_PAGE = 1_000


class Collection:
    """A collection of ``store``; cheap to create, safe to share between threads."""

    __slots__ = ("_store", "name")

    def __init__(self, store: StoreAccess, name: str) -> None:
        self._store = store
        self.name = name

    def __repr__(self) -> str:
        return f"Collection({self.name!r})"

    def _meta(self) -> CollectionMeta:
        with self._store.read() as txn:
            return load_meta(txn, self._store.tables, self.name)

    @property
    def manual(self) -> bool:
        return self._meta().manual

    @property
    def generation_id(self) -> bytes:
        """The current (last committed) generation."""
        return self._meta().generation

    @property
    def next_generation_id(self) -> bytes | None:
        """The open generation, if any."""
        return self._meta().next

    def generation_state(self) -> tuple[bytes, bytes | None]:
        """The current and the open generation (``None``: none is open), read together."""
        meta = self._meta()
        return meta.generation, meta.next

    # --- generation lifecycle -----------------------------------------------------------------

    def start_generation(
        self, generation_id: bytes, abort_outdated: bool = False, lease: LeaseToken | None = None
    ) -> None:
        """Opens ``generation_id`` for writes (see ``writes`` for the lifecycle table).

        With ``lease`` (a fencing token) it is refused with ``LeaseLost`` unless that lease still holds;
        the generation then remembers it, and its writes, commit and abort must carry it. A start under a
        newer version of the lease drops a generation opened under an older one (or under none), even
        one of the same id (see :mod:`diffstore.engine.leases`).

        Raises:
            OutdatedGeneration: see SPEC §1.
            LeaseLost: ``lease`` no longer holds, or the open generation was started under another lease
                (or none) that ``lease`` does not supersede; nothing changes.
        """
        with self._store.user_write() as scope:
            meta = load_meta(scope.txn, self._store.tables, self.name)
            self._fence(scope.txn, meta, lease)
            self._start_in(scope, meta, generation_id, abort_outdated, lease)

    def _start_in(
        self,
        scope: WriteScope,
        meta: CollectionMeta,
        generation_id: bytes,
        abort_outdated: bool,
        lease: LeaseToken | None,
    ) -> CollectionMeta:
        """start_generation's work in ``scope`` (``lease`` already fenced); the new meta."""
        opened_holds = self._opened_holds(scope.txn, meta)
        return writes.start_generation(
            scope.txn, self._store.tables, meta, generation_id, abort_outdated, lease, opened_holds
        )

    def _opened_holds(self, txn: lmdb.Transaction, meta: CollectionMeta) -> bool:
        """Whether the open generation's lease (if any) still holds: once it does not, its owner is fenced
        out and anyone may start over or abort (a standby without a lease too)."""
        if meta.next_lease is None:
            return True
        return leases.holds(txn, self._store.tables, meta, meta.next_lease, self._store.config.now_ms())

    def _fence(self, txn: lmdb.Transaction, meta: CollectionMeta, lease: LeaseToken | None) -> None:
        if lease is not None:
            leases.fence(txn, self._store.tables, meta, lease, self._store.config.now_ms())

    def commit_generation(
        self,
        generation_id: bytes,
        update_readers: Iterable[ReaderUpdateLike] = (),
        lease: LeaseToken | None = None,
        metadata: dict[str, str] | None = None,
    ) -> None:
        """Makes the open generation current, applying reader updates in the same transaction, and records
        its commit time, changed keys and ``metadata`` (see :mod:`diffstore.engine.history`).

        Raises:
            GenerationMismatch: ``generation_id`` is not the open generation.
            InvalidRequest: ``metadata`` is not a flat map of strings of at most 4 KiB; nothing changes.
            NoSuchReader, BadVersion, GenerationCollected: a reader update is bad; nothing changes.
            LeaseLost: ``lease`` (a fencing token) no longer holds its lease, or is not the one the
                generation was started under (None included); nothing changes.
        """
        updates = _reader_updates(update_readers)
        stored = history.validate_metadata(metadata)
        with self._store.user_write() as scope:
            meta = load_meta(scope.txn, self._store.tables, self.name)
            self._fence(scope.txn, meta, lease)
            self._commit_in(scope, meta, generation_id, updates, lease, stored)

    def _commit_in(
        self,
        scope: WriteScope,
        meta: CollectionMeta,
        generation_id: bytes,
        updates: list[ReaderUpdate],
        lease: LeaseToken | None,
        metadata: dict[str, str] | None,
    ) -> None:
        """commit_generation's work in ``scope`` (``lease`` fenced, ``metadata`` validated)."""
        meta = writes.commit_generation(
            scope.txn,
            self._store.tables,
            meta,
            generation_id,
            updates,
            lease,
            self._store.config.now_ms(),
            metadata,
        )
        scope.commits.append((self.name, meta.generation))

    def write_generation(
        self,
        generation_id: bytes,
        items: Iterable[PutItem] = (),
        update_readers: Iterable[ReaderUpdateLike] = (),
        *,
        abort_outdated: bool = False,
        lease: LeaseToken | None = None,
        metadata: dict[str, str] | None = None,
    ) -> PutResult:
        """A whole generation in one call: :meth:`start_generation`, :meth:`put_many` of ``items`` and
        :meth:`commit_generation` with ``update_readers`` and ``metadata``, in one storage transaction.

        The outcome is that of the three calls in a row, except that a failure of any of them changes
        nothing (no generation is left open); and it costs one durable commit where they cost three (1,000
        scattered keys on 1M keys: 13-20% less time, see benchmarks/engine.py; the page writes dominate).

        Raises:
            what the three calls raise; nothing changes.
        """
        updates = _reader_updates(update_readers)
        stored = history.validate_metadata(metadata)
        with self._store.user_write() as scope:
            meta = load_meta(scope.txn, self._store.tables, self.name)
            self._fence(scope.txn, meta, lease)
            meta = self._start_in(scope, meta, generation_id, abort_outdated, lease)
            meta, result = self._put_in(scope, meta, items, generation_id=generation_id, lease=lease)
            self._commit_in(scope, meta, generation_id, updates, lease, stored)
        return result

    def abort_generation(self, generation_id: bytes, lease: LeaseToken | None = None) -> None:
        """Drops the open generation's records.

        Raises:
            GenerationMismatch: ``generation_id`` is not the open generation.
            LeaseLost: ``lease`` no longer holds, or neither is the generation's lease nor supersedes it.
        """
        with self._store.user_write() as scope:
            meta = load_meta(scope.txn, self._store.tables, self.name)
            self._fence(scope.txn, meta, lease)
            opened_holds = self._opened_holds(scope.txn, meta)
            writes.abort_generation(scope.txn, self._store.tables, meta, generation_id, lease, opened_holds)

    # --- writes -------------------------------------------------------------------------------

    def put_many(
        self,
        items: Iterable[PutItem],
        *,
        generation_id: bytes | None = None,
        phantom_id: bytes | None = None,
        if_not_present: bool = False,
        skip_unchanged: bool = False,
        producer_id: str | None = None,
        seq_no: int | None = None,
        lease: LeaseToken | None = None,
    ) -> PutResult:
        """Writes ``(key, value)`` (or ``(key, value, if_not_present)``) items; ``None`` is a tombstone.

        When a key repeats, its last item wins. With ``producer_id``/``seq_no`` a write whose seqNo is not
        above the producer's last one is skipped (``skipped=True``).

        Raises:
            LeaseLost: ``lease`` no longer holds, or (a manual collection's open generation) it is not
                the lease the generation was started under -- a write without one into a generation
                started with one included; nothing is written.
        """
        with self._store.user_write() as scope:
            meta = load_meta(scope.txn, self._store.tables, self.name)
            self._fence(scope.txn, meta, lease)
            _, result = self._put_in(
                scope,
                meta,
                items,
                generation_id=generation_id,
                phantom_id=phantom_id,
                if_not_present=if_not_present,
                skip_unchanged=skip_unchanged,
                producer_id=producer_id,
                seq_no=seq_no,
                lease=lease,
            )
        return result

    def _put_in(
        self,
        scope: WriteScope,
        meta: CollectionMeta,
        items: Iterable[PutItem],
        *,
        generation_id: bytes | None,
        phantom_id: bytes | None = None,
        if_not_present: bool = False,
        skip_unchanged: bool = False,
        producer_id: str | None = None,
        seq_no: int | None = None,
        lease: LeaseToken | None,
    ) -> tuple[CollectionMeta, PutResult]:
        """put_many's work in ``scope`` (``lease`` already fenced), counted for what runs after it."""
        config = self._store.config
        new_meta, result, first_write = writes.put_many(
            scope.txn,
            self._store.tables,
            meta,
            items,
            generation_id=generation_id,
            phantom_id=phantom_id,
            if_not_present=if_not_present,
            skip_unchanged=skip_unchanged,
            producer_id=producer_id,
            seq_no=seq_no,
            max_generation_records=config.max_generation_records,
            lease=lease,
            now_ms=config.now_ms(),
        )
        self._count_writes(scope, meta, new_meta, result, first_write)
        return new_meta, result

    def _count_writes(
        self,
        scope: WriteScope,
        meta: CollectionMeta,
        new_meta: CollectionMeta,
        result: PutResult,
        first_write: bool,
    ) -> None:
        """Tells the write scope what a put_many did (a commit at the threshold, a first write to schedule
        an automatic commit for, records for the metrics), for what runs after the transaction."""
        if new_meta.generation != meta.generation:
            scope.commits.append((self.name, new_meta.generation))
            scope.threshold_commits.append(self.name)
        if first_write:
            scope.first_writes.append(self.name)
        if result.records:
            scope.records_written[self.name] = scope.records_written.get(self.name, 0) + result.records

    def put(
        self,
        key: bytes,
        value: bytes | None,
        *,
        generation_id: bytes | None = None,
        phantom_id: bytes | None = None,
        if_not_present: bool = False,
        skip_unchanged: bool = False,
        producer_id: str | None = None,
        seq_no: int | None = None,
        lease: LeaseToken | None = None,
    ) -> PutResult:
        """Writes one record; with ``if_not_present`` an existing record wins (``was_put=False``)."""
        return self.put_many(
            [(key, value, if_not_present)],
            generation_id=generation_id,
            phantom_id=phantom_id,
            skip_unchanged=skip_unchanged,
            producer_id=producer_id,
            seq_no=seq_no,
            lease=lease,
        )

    def revert(
        self,
        to_generation_id: bytes,
        *,
        generation_id: bytes | None = None,
        lease: LeaseToken | None = None,
        batch_keys: int = revert.BATCH_KEYS,
    ) -> RevertResult:
        """Writes into the open generation exactly the changes that make the collection equal to its state
        at the committed generation ``to_generation_id`` (see :mod:`diffstore.engine.revert`). A manual
        collection's revert names its open generation (``generation_id``), carries its lease as a putMany
        does, and is written in batches of ``batch_keys`` candidate keys, one write transaction each, the
        writers waiting meanwhile going in between; a non-manual one's goes into the next generation, in
        one transaction.

        Returns:
            The generation written into and the number of keys changed there (0: already equal).

        Raises:
            GenerationMismatch: no generation is open, or ``generation_id`` is not the open one (or, between
                two batches, the open generation was aborted or committed: what was written stays in it).
            LeaseLost: as for :meth:`put_many`; nothing is written (by this batch).
            NoSuchGeneration: ``to_generation_id`` is not a committed generation of this collection.
            GenerationCollected: ``to_generation_id`` is below the readers' minimum.
        """
        if batch_keys < 1:
            raise InvalidRequest("batch_keys must be >= 1")
        written, lower, opened_seq = 0, b"", None
        while True:
            with self._store.user_write() as scope:
                meta = load_meta(scope.txn, self._store.tables, self.name)
                self._fence(scope.txn, meta, lease)
                target = writes.open_target(meta, generation_id, lease)
                if opened_seq is not None and meta.next_seq != opened_seq:
                    raise GenerationMismatch(
                        f"the open generation {text_form(target)} was ended and opened again while the"
                        f" revert ran: {written} keys were written into the one before"
                    )
                opened_seq = meta.next_seq
                to_seq = revert.committed_seq(scope.txn, self._store.tables, meta, to_generation_id)
                limit = batch_keys if meta.manual else None
                items, lower_next = revert.batch(scope.txn, self._store.tables, meta, to_seq, lower, limit)
                if items:
                    self._put_in(scope, meta, items, generation_id=target, lease=lease)
                written += len(items)
            if lower_next is None:
                return RevertResult(target, written)
            crashpoints.reached("revert-batch-written")
            lower = lower_next
            self._store.let_waiting_writers_in()

    # --- reads ---------------------------------------------------------------------------------

    def get_result(
        self, key: bytes, generation_id: bytes | None = None, phantom_id: bytes | None = None
    ) -> GetResult:
        """The visible record of ``key`` and the generation the answer is from."""
        with self._store.read() as txn:
            meta = load_meta(txn, self._store.tables, self.name)
            point = reads.read_point(txn, self._store.tables, meta, generation_id, phantom_id)
            return reads.get(txn, self._store.tables, point, key)

    def get(
        self, key: bytes, generation_id: bytes | None = None, phantom_id: bytes | None = None
    ) -> Record | None:
        """The visible record of ``key`` at ``generation_id`` (default: current), or None."""
        return self.get_result(key, generation_id, phantom_id).record

    def get_many(
        self, keys: list[bytes], generation_id: bytes | None = None, phantom_id: bytes | None = None
    ) -> GetManyResult:
        """The visible records of ``keys`` (``None`` for an absent key) in the order asked, all read in
        one transaction at ``generation_id`` (default: current); at most ``MAX_GET_MANY_KEYS`` keys."""
        with self._store.read() as txn:
            meta = load_meta(txn, self._store.tables, self.name)
            point = reads.read_point(txn, self._store.tables, meta, generation_id, phantom_id)
            return GetManyResult(point.generation_id, reads.get_many(txn, self._store.tables, point, keys))

    def query_page(
        self,
        generation_id: bytes | None = None,
        phantom_id: bytes | None = None,
        from_key: bytes | None = None,
        to_key: bytes | None = None,
        limit: int | None = None,
        cursor: str | None = None,
    ) -> QueryPage:
        """One page of visible records in key order; ``cursor`` continues a previous page.

        The page's cursor is short whatever the keys (a long one is stored: see ``cursor_spill``).
        """
        page = self._query_page(
            generation_id,
            phantom_id,
            from_key,
            to_key,
            limit,
            None if cursor is None else cursor_spill.expand(self._store, cursor),
        )
        if page.cursor is None or len(page.cursor) <= cursor_spill.INLINE_TOKEN_MAX:
            return page
        return QueryPage(page.generation_id, page.items, cursor_spill.shorten(self._store, page.cursor))

    def _query_page(
        self,
        generation_id: bytes | None,
        phantom_id: bytes | None,
        from_key: bytes | None,
        to_key: bytes | None,
        limit: int | None,
        cursor: str | None,
    ) -> QueryPage:
        config = self._store.config
        with self._store.page_read() as txn:
            meta = load_meta(txn, self._store.tables, self.name)
            return reads.query_page(
                txn,
                self._store.tables,
                meta,
                generation_id=generation_id,
                phantom_id=phantom_id,
                from_key=from_key,
                to_key=to_key,
                limit=limit,
                cursor=cursor,
                cursors=self._store.cursors,
                default_limit=config.default_page_limit,
                max_limit=config.max_page_limit,
            )

    def query(
        self,
        generation_id: bytes | None = None,
        phantom_id: bytes | None = None,
        from_key: bytes | None = None,
        to_key: bytes | None = None,
    ) -> Iterator[Record]:
        """Every visible record in key order, page by page (all pages read the same pinned generation)."""
        limit = min(_ITER_PAGE, self._store.config.max_page_limit)
        page = self._query_page(generation_id, phantom_id, from_key, to_key, limit, None)
        yield from page.items
        while page.cursor is not None:  # kept in hand: never stored, whatever its length
            page = self._query_page(None, None, None, None, None, page.cursor)
            yield from page.items

    def keys_around(
        self,
        key: bytes,
        limit: int,
        require_key_existence: bool = True,
        generation_id: bytes | None = None,
        phantom_id: bytes | None = None,
    ) -> KeysAround:
        """Up to ``limit`` visible keys before (descending) and after ``key``."""
        with self._store.read() as txn:
            meta = load_meta(txn, self._store.tables, self.name)
            point = reads.read_point(txn, self._store.tables, meta, generation_id, phantom_id)
            return reads.keys_around(txn, self._store.tables, point, key, limit, require_key_existence)

    def splits(
        self, count: int, generation_id: bytes | None = None, from_generation_id: bytes | None = None
    ) -> list[bytes]:
        """Up to ``count - 1`` keys cutting the keys visible at ``generation_id`` into near-equal ranges; with
        ``from_generation_id``, the keys changed in (from, generation] instead -- the diff's, at the cost of
        its changes rather than a pass over the collection."""
        with self._store.page_read() as txn:
            tables = self._store.tables
            meta = load_meta(txn, tables, self.name)
            if from_generation_id is not None:
                return diff.diff_splits(txn, tables, meta, from_generation_id, generation_id, count)
            return reads.splits(txn, tables, reads.read_point(txn, tables, meta, generation_id, None), count)

    # --- diffs ---------------------------------------------------------------------------------

    def diff_page(
        self,
        from_generation_id: bytes | None = None,
        to_generation_id: bytes | None = None,
        from_reader: str | FromReader | None = None,
        include_intermediate: bool = False,
        from_key: bytes | None = None,
        to_key: bytes | None = None,
        limit: int | None = None,
        cursor: str | None = None,
    ) -> DiffPage:
        """One page of the diff (from, to]; the answer's ``to_generation_id`` may be lower than asked."""
        if cursor is not None:
            return self._diff_page(cursor_spill.expand(self._store, cursor))
        spec = DiffSpec.of(
            from_generation_id=from_generation_id,
            from_reader=from_reader,
            to_generation_id=to_generation_id,
            include_intermediate=include_intermediate,
            from_key=from_key,
            to_key=to_key,
            limit=limit,
        )
        return self.diff_page_of(spec)

    def diff_page_of(self, spec: DiffSpec) -> DiffPage:
        """The first page of the diff ``spec``, as :meth:`diff_page` answers it; an end named by an
        instant (SPEC §8) is the generation current then."""
        if spec.from_as_of_ms is not None:
            from_id = self.generation_at(spec.from_as_of_ms)
            spec = replace(spec, from_generation_id=from_id, from_as_of_ms=None)
        if spec.to_as_of_ms is not None:
            to_id = self.generation_at(spec.to_as_of_ms)
            spec = replace(spec, to_generation_id=to_id, to_as_of_ms=None)
        config = self._store.config
        limit = reads.check_limit(spec.limit, config.default_page_limit, config.max_page_limit)
        if limit != spec.limit:
            spec = replace(spec, limit=limit)
        return self._diff_page(spec)

    def _diff_page(self, request: DiffSpec | str) -> DiffPage:
        """The first page of ``request`` (its limit given) or the page after the cursor token ``request``."""
        config = self._store.config
        with self._store.page_read() as txn:
            meta = load_meta(txn, self._store.tables, self.name)
            page = diff.diff_page(
                txn,
                self._store.tables,
                meta,
                request,
                cursors=self._store.cursors,
                max_limit=config.max_page_limit,
                max_generations=config.max_diff_generations,
            )
        if page.cursor is None or len(page.cursor) <= cursor_spill.INLINE_TOKEN_MAX:
            return page
        shortened = cursor_spill.shorten(self._store, page.cursor)
        return DiffPage(page.from_generation_id, page.to_generation_id, page.items, shortened)

    def diff(
        self,
        from_generation_id: bytes | None = None,
        to_generation_id: bytes | None = None,
        from_reader: str | FromReader | None = None,
        include_intermediate: bool = False,
        from_key: bytes | None = None,
        to_key: bytes | None = None,
    ) -> Iterator[DiffItem]:
        """Every changed key of (from, to] once, in key order, from one snapshot.

        Memory stays bounded by the number of generations in the range, not by its keys.
        """
        tables = self._store.tables

        def resolve(txn: lmdb.Transaction) -> tuple[CollectionMeta, diff.DiffRange]:
            meta = load_meta(txn, tables, self.name)
            start = diff.resolve_from(txn, tables, meta, from_generation_id, from_reader)
            return meta, diff.resolve_range(txn, tables, meta, start, to_generation_id, None)

        # the diff's own generator is handed out: a generator here would cost a resumption per item
        return diff.iter_diff(
            self._store.read(),
            tables,
            resolve,
            include_intermediate=include_intermediate,
            from_key=from_key,
            to_key=to_key,
            after_key=None,
        )

    # --- readers -------------------------------------------------------------------------------

    def create_reader(
        self, name: str, collection: str | None = None, generation_id: bytes | None = None
    ) -> None:
        """Creates reader ``name`` targeting ``collection`` (default: this one); same data again is fine
        (a replica's hold also on a stepped-down store, as :meth:`update_reader`)."""
        with self._store.user_write(hold=name.startswith(readers.HOLD_PREFIX)) as scope:
            meta = load_meta(scope.txn, self._store.tables, self.name)
            target = self.name if collection is None else collection
            readers.create_reader(scope.txn, self._store.tables, meta, name, target, generation_id)

    def update_reader(self, name: str, generation_id: bytes | None, expected: Expected = UNSET) -> None:
        """Moves a reader; with ``expected`` only if it is still there (else ``badVersion``). A replica's
        hold moves on a stepped-down store too: it is the replica's bookkeeping, not data, and the replica
        that is catching up with the final state before its promotion moves it."""
        with self._store.user_write(hold=name.startswith(readers.HOLD_PREFIX)) as scope:
            meta = load_meta(scope.txn, self._store.tables, self.name)
            readers.apply_updates(
                scope.txn, self._store.tables, meta, [ReaderUpdate(name, generation_id, expected)]
            )

    def delete_reader(self, name: str) -> None:
        """Deletes a reader (a missing one is fine)."""
        with self._store.user_write(hold=name.startswith(readers.HOLD_PREFIX)) as scope:
            meta = load_meta(scope.txn, self._store.tables, self.name)
            readers.delete_reader(scope.txn, self._store.tables, meta, name)

    def readers(self) -> list[Reader]:
        """The readers stored in this collection, by name."""
        with self._store.read() as txn:
            meta = load_meta(txn, self._store.tables, self.name)
            return readers.list_readers(txn, self._store.tables, meta)

    def lineage(self, generation_id: bytes, depth: int = 1) -> Lineage:
        """The readers moved by the commit of ``generation_id`` (see :mod:`diffstore.engine.lineage`).

        With ``depth`` > 1 each source collection's entry holds the moves of its generations in the
        reader's (from, to], merged per reader, walked ``depth - 1`` levels further (streams are leaves).

        Raises:
            InvalidRequest: ``depth`` is not 1..10, the generation is not a committed one of this collection,
                or the walk holds more than 10,000 sources.
            GenerationCollected: the generation is below the readers' minimum (its lineage is collected).
        """
        with self._store.read() as txn:
            meta = load_meta(txn, self._store.tables, self.name)
            return lineage.lineage(txn, self._store.tables, meta, generation_id, depth)

    # --- phantoms and producers -------------------------------------------------------------------

    def start_phantom(self, ttl_seconds: float = 3600) -> bytes:
        """Allocates a phantom id whose private writes live ``ttl_seconds`` (then they are purged)."""
        if (
            isinstance(ttl_seconds, bool)
            or not isinstance(ttl_seconds, int | float)
            or not 0 < ttl_seconds <= 10**8
        ):
            raise InvalidRequest("ttlSeconds must be a positive number")
        with self._store.user_write() as scope:
            meta = load_meta(scope.txn, self._store.tables, self.name)
            counter = meta.phantom_counter + 1
            if counter > layout.PHANTOM_COUNTER_MAX:
                raise StorageError(f"collection {self.name!r} has used up its phantom ids")
            save_meta(scope.txn, self._store.tables, meta.with_(phantom_counter=counter))
            number = layout.phantom_of(meta.cid, counter)
            expiry = int(time.time() * 1000 + ttl_seconds * 1000)
            scope.txn.put(
                layout.phantom_prefix(meta.cid_prefix, number),
                layout.u64(expiry),
                db=self._store.tables.phantom_ttl,
            )
        return layout.phantom_id_bytes(number)

    def phantom_changes(
        self,
        phantom_id: bytes,
        generation_id: bytes | None = None,
        from_key: bytes | None = None,
        to_key: bytes | None = None,
        limit: int | None = None,
    ) -> PhantomChanges:
        """One page of what phantom ``phantom_id`` changes for reads at ``generation_id`` (default:
        current), in key order within ``[from_key, to_key)``; the next page starts at ``next_key``.

        Raises:
            InvalidRequest: ``phantom_id`` is not a live phantom of this collection (see
                :mod:`diffstore.engine.phantoms`), or a bad limit.
            GenerationCollected: ``generation_id`` is below the GC horizon.
        """
        config = self._store.config
        limit = reads.check_limit(limit, config.default_page_limit, config.max_page_limit)
        with self._store.read() as txn:
            meta = load_meta(txn, self._store.tables, self.name)
            return phantoms.changes_page(
                txn, self._store.tables, meta, phantom_id, generation_id, from_key, to_key, limit
            )

    # --- leases (see diffstore.engine.leases) ------------------------------------------------------

    def acquire_lease(self, name: str, owner: str, ttl_ms: int) -> Lease:
        """Takes lease ``name`` for ``owner`` for ``ttl_ms``: free, expired or already ``owner``'s.

        Returns the lease with its new version (the fencing token for generation/start and /commit).

        Raises:
            LeaseLost: another owner holds it, unexpired (the reason names it).
        """
        tables, clock = self._store.tables, self._store.config
        with self._store.read() as txn:  # a standby polling a held lease costs a read, not the write lock
            meta = load_meta(txn, tables, self.name)
            leases.validate_name(name)
            leases.validate_name(owner, "owner")
            leases.validate_ttl(ttl_ms)
            leases.refuse_acquire(txn, tables, meta, name, owner, clock.now_ms())
        with self._store.user_write() as scope:
            meta = load_meta(scope.txn, tables, self.name)
            return leases.acquire(scope.txn, tables, meta, name, owner, ttl_ms, clock.now_ms())

    def renew_lease(self, name: str, owner: str, version: int, ttl_ms: int | None = None) -> Lease:
        """Extends ``owner``'s lease (at ``version``) by ``ttl_ms`` (default: the acquire's) from now.

        Raises:
            LeaseLost: the lease is not at ``version`` of ``owner`` any more.
        """
        with self._store.user_write() as scope:
            meta = load_meta(scope.txn, self._store.tables, self.name)
            return leases.renew(
                scope.txn, self._store.tables, meta, name, owner, version, ttl_ms, self._store.config.now_ms()
            )

    def release_lease(self, name: str, owner: str, version: int) -> None:
        """Frees ``owner``'s lease at once, so that a standby takes over without waiting for its expiry.

        Raises:
            LeaseLost: the lease is not at ``version`` of ``owner`` (releasing it twice is fine).
        """
        with self._store.user_write() as scope:
            meta = load_meta(scope.txn, self._store.tables, self.name)
            leases.release(scope.txn, self._store.tables, meta, name, owner, version)

    def leases(self) -> list[Lease]:
        """Every lease of this collection by name, released ones included (``owner`` None)."""
        with self._store.read() as txn:
            meta = load_meta(txn, self._store.tables, self.name)
            return leases.list_leases(txn, self._store.tables, meta)

    # --- what replicas read ---------------------------------------------------------------------

    def generations(self, before: bytes | None = None, limit: int = 100) -> tuple[list[bytes], bool]:
        """Committed generation ids below ``before`` (default: from the current one), newest first (collected
        ones too: reads there answer 410); and whether more remain."""
        with self._store.read() as txn:
            meta = load_meta(txn, self._store.tables, self.name)
            return replication.committed_generations(txn, self._store.tables, meta, before, limit)

    def generation_at(self, at_ms: int) -> bytes:
        """The newest generation committed at or before ``at_ms`` (Unix ms; raises ``NoSuchGeneration``)."""
        with self._store.read() as txn:
            meta = load_meta(txn, self._store.tables, self.name)
            return history.generation_at(txn, self._store.tables, meta, at_ms)

    def resolve_ref(self, ref: str) -> ResolvedRef:
        """The generation ``ref`` names (a generation id's text form, ``@current``, ``@open``, ``~N``,
        ``@reader:[OWNER/]NAME`` or ``@`` and an ISO time; see ``engine/refs.py``) and its commit time.

        Raises:
            InvalidRequest: not a ref, an ambiguous reader name. NoSuchGeneration,
            NoSuchReader: it names nothing. GenerationCollected: below the readers' minimum.
        """
        parsed = refs.parse(ref)
        with self._store.read() as txn:
            meta = load_meta(txn, self._store.tables, self.name)
            return refs_resolve.resolve(txn, self._store.tables, meta, parsed)

    def history(self, before: bytes | None = None, limit: int = 100) -> tuple[list[GenerationInfo], bool]:
        """Committed generations below ``before`` (default: from the current one), newest first, each with
        its commit time, changed keys and metadata (None: unknown, committed by an older store) and whether
        it is collected (reads there answer 410); and whether more remain."""
        with self._store.read() as txn:
            tables = self._store.tables
            meta = load_meta(txn, tables, self.name)
            floor = readers.readable_floor(txn, tables, meta, self._store.config.now_ms())
            return history.committed(txn, tables, meta, before, limit, floor)

    def retention(self) -> RetentionPolicy | None:
        """The collection's retention policy (None: none; see :mod:`diffstore.engine.retention`)."""
        return self._meta().retention

    def set_retention(self, policy: RetentionPolicy | None) -> RetentionPolicy | None:
        """Replaces the retention policy (None or an empty policy: none) and returns it as stored.

        A longer policy keeps what is still there from now on; what GC collected before stays collected.
        """
        stored = retention.effective(policy)
        with self._store.user_write() as scope:
            meta = load_meta(scope.txn, self._store.tables, self.name)
            if meta.retention != stored:
                save_meta(scope.txn, self._store.tables, meta.with_(retention=stored))
        return stored

    def digest(self, generation_id: bytes | None = None) -> GenerationDigest:
        """The digest of the live records at committed generation ``generation_id`` (default: the current
        one): equal on a primary and its replicas (see ``engine/digests.py``); records/digest None: unknown,
        committed by an older store (``diffstore migrate`` computes them).

        Raises:
            InvalidRequest: ``generation_id`` is above the current generation (not committed).
        """
        with self._store.read() as txn:
            meta = load_meta(txn, self._store.tables, self.name)
            if generation_id is None:
                generation_id = meta.generation
            elif generation_id > meta.generation:
                raise InvalidRequest(
                    f"generation {text_form(generation_id)} of {self.name!r} is not committed: only a"
                    f" committed generation has a digest (the current one is {text_form(meta.generation)})"
                )
            return stored_digests.at(txn, self._store.tables, meta, generation_id)

    def digests(self, before: bytes | None = None, limit: int = 1000) -> tuple[list[GenerationDigest], bool]:
        """Committed generations below ``before`` (default: from the current one), newest first, each with
        its digest (collected ones too: a digest outlives GC); and whether more remain."""
        with self._store.read() as txn:
            meta = load_meta(txn, self._store.tables, self.name)
            return stored_digests.newest_first(txn, self._store.tables, meta, before, limit)

    def generation_records(
        self,
        generation_id: bytes,
        from_key: bytes | None = None,
        limit: int = 1000,
        hold: str | None = None,
        visible: bool = False,
    ) -> GenerationRecords:
        """A page of the records the committed generation ``generation_id`` wrote (``None``: a tombstone)
        from ``from_key`` in storage order; the first page also holds the previous generation, the readers
        its commit moved and the collection's readers (what a read replica copies, in one read).

        With ``visible``: every record visible there instead, in key order, tombstones left out (a
        replica's first copy; ``first_copy.visible_records``), nothing more.

        Raises:
            NoSuchGeneration: not a committed generation. GenerationCollected: below the kept floor.
            NoSuchReader: ``hold`` names no reader of the collection.
        """
        with self._store.page_read() as txn:
            meta = load_meta(txn, self._store.tables, self.name)
            if visible:
                return first_copy.visible_records(
                    txn, self._store.tables, meta, generation_id, from_key, limit, hold
                )
            return replication.generation_records(
                txn, self._store.tables, meta, generation_id, from_key, limit, hold
            )

    def producer_last_seq_no(self, producer_id: str) -> int:
        """The last seqNo stored for ``producer_id`` (0 when unknown)."""
        with self._store.read() as txn:
            meta = load_meta(txn, self._store.tables, self.name)
            return producers.last_seq_no(txn, self._store.tables, meta, producer_id)


def _reader_updates(update_readers: Iterable[ReaderUpdateLike]) -> list[ReaderUpdate]:
    """Reader updates as given (``ReaderUpdate``s or ``(name, generation)`` pairs), as ``ReaderUpdate``s."""
    return [u if isinstance(u, ReaderUpdate) else ReaderUpdate(u[0], u[1]) for u in update_readers]
