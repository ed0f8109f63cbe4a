"""The asyncio client: :class:`AsyncClient` and :class:`AsyncCollection`, twins of the blocking ones.

Same calls, same plans, same parsing as :mod:`diffstore.client._sync`; only the transport awaits.
Iterators (``query``, ``diff``, ``watch``) are async iterators: ``async for item in coll.diff(...)``.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping, Sequence
from typing import Any, TypeVar

import httpx

from diffstore import tls
from diffstore.client import _calls, _columns, _plans
from diffstore.client._calls import DEFAULT_LONG_POLL_MS, Call
from diffstore.client._columns import DiffColumns, GetManyColumns, QueryColumns
from diffstore.client._failover import DEFAULT_WAIT_S
from diffstore.client._transport import (
    DEFAULT_TIMEOUT_S,
    DEFAULT_URL,
    AsyncTransport,
    Settings,
    WireFormat,
    join_urls,
)
from diffstore.engine.types import (
    UNSET,
    CollectionInfo,
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
    ReaderUpdateLike,
    Record,
    ResolvedRef,
    RetentionPolicy,
    RevertResult,
)
from diffstore.errors import NoSuchGeneration
from diffstore.wire import CollectionState
from diffstore.wire_requests import PhantomChangesRequest, QueryRequest, ReadAt, WriteOptions

T = TypeVar("T")


class AsyncClient:
    """An asyncio client of a diffstore (or diffbelt) HTTP server.

    Args:
        url: the server's base URL; or several servers of one cluster, as a list or comma-separated
            (``"http://a:3030,http://b:3030"``): calls then go to their leader, found and followed across
            a fail-over (see docs/client.md, "Several servers").
        token: sent as ``Authorization: Bearer <token>`` when given.
        format: ``"msgpack"`` (default, compact and fast) or ``"json"`` (what diffbelt speaks).
        timeout_s: the timeout of every request but long polls (which get the poll's own timeout).
        http: an httpx client to use instead of a private one (it is then not closed by :meth:`close`).
        term: the newest replication term this client knows of, sent with every request
            (``Diffstore-Term``): a primary whose term is below it steps down (``fenced``).
        ca_file: for ``https://``: PEM file of the authority that signed the server's certificate (default:
            ``$DIFFSTORE_CA_FILE``, else the system's authorities).
        cert: for a server that asks for one: the client certificate and its key, PEM files (default:
            ``$DIFFSTORE_CLIENT_CERT`` and ``$DIFFSTORE_CLIENT_KEY``); an encrypted key's passphrase as a
            third item (default: ``$DIFFSTORE_CLIENT_KEY_PASSWORD``).
        failover_wait_s: with several servers, how long a call waits for one of them to take writes
            (then :class:`~diffstore.errors.NoLeader`).

    Errors are the engine's exception classes (:mod:`diffstore.errors`); an unreachable server raises
    :class:`~diffstore.errors.StorageError`.
    """

    def __init__(
        self,
        url: str | Sequence[str] = DEFAULT_URL,
        token: str | None = None,
        format: WireFormat = "msgpack",
        timeout_s: float = DEFAULT_TIMEOUT_S,
        http: httpx.AsyncClient | None = None,
        term: int | None = None,
        ca_file: str | None = None,
        cert: tls.CertFiles | None = None,
        failover_wait_s: float = DEFAULT_WAIT_S,
    ) -> None:
        self.settings = Settings(
            join_urls(url), token, format, timeout_s, term, ca_file, cert, failover_wait_s
        )
        self._transport = AsyncTransport(self.settings, http)

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def close(self) -> None:
        await self._transport.close()

    async def execute(self, call: Call[T]) -> T:
        """Performs one raw call (see :mod:`diffstore.client._calls`)."""
        return await self._transport.execute(call)

    async def replica_status(self) -> Any:
        """A read replica's ``{primary, collections: [{collectionName, lagGenerations, lagSeconds}]}``
        (raises :class:`~diffstore.errors.NotReplica` on a primary)."""
        return await self.execute(_calls.replica_status())

    async def promote(self, force: bool = False, wait_ms: int | None = None) -> bool:
        """Turns a read replica into a primary (raises :class:`~diffstore.errors.NotReplica` on a primary,
        :class:`~diffstore.errors.ReplicaBehind` when it is not caught up, unless ``force``)."""
        return await self.execute(_calls.promote(force, wait_ms))

    async def healthz(self) -> bool:
        return await self.execute(_calls.healthz())

    async def collections(self) -> list[CollectionInfo]:
        """Every collection, sorted by name."""
        return await self.execute(_calls.list_collections())

    async def create_collection(
        self,
        name: str,
        manual: bool = True,
        initial_generation_id: bytes | None = None,
        retention: RetentionPolicy | None = None,
    ) -> AsyncCollection:
        """Creates a collection (raises :class:`~diffstore.errors.CollectionExists`); ``retention`` None: the
        server's default policy, an empty policy: none."""
        await self.execute(_calls.create_collection(name, manual, initial_generation_id, retention))
        return AsyncCollection(self, name, manual)

    async def collection(self, name: str) -> AsyncCollection:
        """A handle on an existing collection (raises :class:`~diffstore.errors.NoSuchCollection`)."""
        state = await self.execute(_calls.collection_state(name))
        return AsyncCollection(self, name, state.manual)

    async def delete_collection(self, name: str) -> None:
        await self.execute(_calls.delete_collection(name))

    def watch(
        self, name: str, since: bytes | None = None, timeout_ms: int = DEFAULT_LONG_POLL_MS
    ) -> AsyncIterator[bytes]:
        """Yields each new generation id of a collection as it commits (see ``Collection.watch``)."""
        return _plans.drive_async(_plans.watch_generations(name, since, timeout_ms), self.execute)

    async def wait_for_change(
        self, positions: Mapping[str, bytes], timeout_ms: int = DEFAULT_LONG_POLL_MS
    ) -> bool:
        """Waits until one collection's generation differs from ``positions[name]``, or the timeout.

        Returns whether a change was seen. The collections are long-polled concurrently; the polls
        that lose the race are cancelled (the server then frees their waiters).
        """
        return await wait_any(self.execute, positions, timeout_ms)


async def wait_any(
    execute: Callable[[Call[bytes]], Awaitable[bytes]], positions: Mapping[str, bytes], timeout_ms: int
) -> bool:
    """Long-polls every collection of ``positions`` at once; True as soon as one has moved."""
    polls: dict[asyncio.Future[bytes], bytes] = {
        asyncio.ensure_future(execute(_calls.generation_stream(name, since, timeout_ms))): since
        for name, since in positions.items()
    }
    pending: set[asyncio.Future[bytes]] = set(polls)
    try:
        while pending:
            done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            if any(task.result() != polls[task] for task in done):
                return True
        return False
    finally:
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)


class AsyncCollection:
    """A collection on the server, with the method names and semantics of the engine's ``Collection``.

    The engine's ``generation_id`` / ``next_generation_id`` attributes are read with ``await state()``.
    """

    def __init__(self, client: AsyncClient, name: str, manual: bool) -> None:
        self.client = client
        self.name = name
        self.manual = manual

    def __repr__(self) -> str:
        return f"AsyncCollection({self.name!r}, url={self.client.settings.url!r})"

    async def _run(self, call: Call[T]) -> T:
        return await self.client.execute(call)

    async def state(self) -> CollectionState:
        """Manual flag, current and next generation in one request."""
        return await self._run(_calls.collection_state(self.name))

    async def generation_state(self) -> tuple[bytes, bytes | None]:
        """The current and the open generation, in one request."""
        state = await self.state()
        return state.generation_id or b"", state.next_generation_id

    # --- generations ---------------------------------------------------------------------------

    async def start_generation(
        self, generation_id: bytes, abort_outdated: bool = False, lease: LeaseToken | None = None
    ) -> None:
        """Opens a generation; with ``lease`` (a fencing token) refused by ``LeaseLost`` once it moved."""
        await self._run(_calls.start_generation(self.name, generation_id, abort_outdated, lease))

    async def commit_generation(
        self,
        generation_id: bytes,
        update_readers: Iterable[ReaderUpdateLike] = (),
        lease: LeaseToken | None = None,
        metadata: dict[str, str] | None = None,
    ) -> None:
        """Commits; reader updates (with optional CAS) are applied in the same transaction, or none is.

        With ``lease`` (a fencing token) the commit is refused by ``LeaseLost`` once the lease moved.
        ``metadata`` (a flat map of strings, at most 4 KiB) is kept with the generation (:meth:`history`).
        """
        await self._run(_calls.commit_generation(self.name, generation_id, update_readers, lease, metadata))

    async def write_generation(
        self,
        generation_id: bytes,
        items: Iterable[PutItem] = (),
        update_readers: Iterable[ReaderUpdateLike] = (),
        *,
        abort_outdated: bool = False,
        lease: LeaseToken | None = None,
        metadata: dict[str, str] | None = None,
    ) -> PutResult:
        """A whole generation: start, ``put_many(items)``, commit with ``update_readers`` and ``metadata``.

        Over HTTP these are three requests (the engine's handle does them in one transaction): when one
        fails the generation may stay open; abort it, or start the next one with ``abort_outdated``.
        """
        await self.start_generation(generation_id, abort_outdated, lease)
        items = list(items)
        result = PutResult(generation_id, was_put=False)
        if items:
            result = await self.put_many(items, generation_id=generation_id, lease=lease)
        await self.commit_generation(generation_id, update_readers, lease, metadata)
        return result

    async def abort_generation(self, generation_id: bytes, lease: LeaseToken | None = None) -> None:
        """Drops the open generation; one started under a lease needs that lease (or a newer version)."""
        await self._run(_calls.abort_generation(self.name, generation_id, lease))

    async def revert(
        self,
        to_generation_id: bytes,
        *,
        generation_id: bytes | None = None,
        lease: LeaseToken | None = None,
    ) -> RevertResult:
        """Writes into the open generation exactly the changes that make the collection equal to its state
        at the committed generation ``to_generation_id`` (SPEC §8), uncommitted writes already there
        included. A manual collection's revert names its open generation (``generation_id``) and carries
        its lease when it was started under one; a non-manual one's goes into the next generation.

        Returns the generation written into and how many keys changed there. Raises ``GenerationMismatch``
        (no open generation, or not that one), ``NoSuchGeneration`` (not a committed generation),
        ``GenerationCollected`` (below the readers' minimum), ``LeaseLost``.
        """
        return await self._run(_calls.revert(self.name, to_generation_id, generation_id, lease))

    async def start_phantom(self, ttl_seconds: int = 3600) -> bytes:
        return await self._run(_calls.start_phantom(self.name, ttl_seconds))

    async def phantom_changes(
        self,
        phantom_id: bytes,
        generation_id: bytes | None = None,
        from_key: bytes | None = None,
        to_key: bytes | None = None,
        limit: int | None = None,
    ) -> PhantomChanges:
        """One page of what a phantom changes at a generation (**beyond diffbelt**; see the engine)."""
        request = PhantomChangesRequest(phantom_id, generation_id, from_key, to_key, limit)
        return await self._run(_calls.phantom_changes(self.name, request))

    # --- writes --------------------------------------------------------------------------------

    async def put(
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
        options = WriteOptions(generation_id, phantom_id, skip_unchanged, producer_id, seq_no, lease)
        return await self._run(_calls.put(self.name, key, value, if_not_present, options))

    async def put_many(
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
        options = WriteOptions(generation_id, phantom_id, skip_unchanged, producer_id, seq_no, lease)
        return await self._run(_calls.put_many(self.name, items, options, if_not_present))

    # --- leases --------------------------------------------------------------------------------

    async def acquire_lease(self, name: str, owner: str, ttl_ms: int) -> Lease:
        """Takes lease ``name`` for ``owner`` (free, expired or its own): a new version, or ``LeaseLost``."""
        return await self._run(_calls.acquire_lease(self.name, name, owner, ttl_ms))

    async def renew_lease(self, name: str, owner: str, version: int, ttl_ms: int | None = None) -> Lease:
        """Extends ``owner``'s lease at ``version``; ``LeaseLost`` once another version holds it."""
        return await self._run(_calls.renew_lease(self.name, name, owner, version, ttl_ms))

    async def release_lease(self, name: str, owner: str, version: int) -> None:
        """Frees ``owner``'s lease at once (a standby takes over without waiting for the expiry)."""
        await self._run(_calls.release_lease(self.name, name, owner, version))

    async def leases(self) -> list[Lease]:
        """Every lease of the collection by name (released ones have ``owner`` None)."""
        return await self._run(_calls.leases(self.name))

    async def producer_last_seq_no(self, producer_id: str) -> int:
        return await self._run(_calls.producer_last_seq_no(self.name, producer_id))

    # --- reads ---------------------------------------------------------------------------------

    async def get_result(
        self, key: bytes, generation_id: bytes | None = None, phantom_id: bytes | None = None
    ) -> GetResult:
        return await self._run(_calls.get(self.name, key, ReadAt(generation_id, phantom_id)))

    async def get(
        self, key: bytes, generation_id: bytes | None = None, phantom_id: bytes | None = None
    ) -> Record | None:
        return (await self.get_result(key, generation_id, phantom_id)).record

    async def get_many(
        self, keys: list[bytes], generation_id: bytes | None = None, phantom_id: bytes | None = None
    ) -> GetManyResult:
        """(beyond SPEC) ``getMany``: the records of up to 10,000 keys (``None``: absent), in the order
        asked, read at one generation in one request; ``keys`` may repeat."""
        return await self._run(_calls.get_many(self.name, list(keys), ReadAt(generation_id, phantom_id)))

    async def get_many_columns(
        self, keys: list[bytes], generation_id: bytes | None = None, phantom_id: bytes | None = None
    ) -> GetManyColumns:
        """:meth:`get_many` as columns of raw bytes (no per-record objects): the bulk readers' path."""
        at = ReadAt(generation_id, phantom_id)
        return await self._run(_columns.get_many_columns(self.name, list(keys), at))

    async def keys_around(
        self,
        key: bytes,
        limit: int,
        require_key_existence: bool = True,
        generation_id: bytes | None = None,
        phantom_id: bytes | None = None,
    ) -> KeysAround:
        at = ReadAt(generation_id, phantom_id)
        return await self._run(_calls.keys_around(self.name, key, limit, require_key_existence, at))

    async def query_page(
        self,
        generation_id: bytes | None = None,
        phantom_id: bytes | None = None,
        from_key: bytes | None = None,
        to_key: bytes | None = None,
        limit: int | None = None,
        cursor: str | None = None,
    ) -> QueryPage:
        request = QueryRequest(ReadAt(generation_id, phantom_id), from_key, to_key, limit)
        return await self._run(_calls.query_page(self.name, request, cursor))

    async def query_page_columns(
        self,
        generation_id: bytes | None = None,
        phantom_id: bytes | None = None,
        from_key: bytes | None = None,
        to_key: bytes | None = None,
        limit: int | None = None,
        cursor: str | None = None,
    ) -> QueryColumns:
        """:meth:`query_page` as columns of raw bytes (no per-record objects): the bulk readers' path."""
        request = QueryRequest(ReadAt(generation_id, phantom_id), from_key, to_key, limit)
        return await self._run(_columns.query_columns(self.name, request, cursor))

    def query(
        self,
        generation_id: bytes | None = None,
        phantom_id: bytes | None = None,
        from_key: bytes | None = None,
        to_key: bytes | None = None,
        limit: int | None = None,
    ) -> AsyncIterator[Record]:
        """Every visible record in key order, following cursors (``limit`` is the page size)."""
        request = QueryRequest(ReadAt(generation_id, phantom_id), from_key, to_key, limit)
        return _plans.drive_async(_plans.query_records(self.name, request), self.client.execute)

    async def diff_page(
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
        """One page; its ``to_generation_id`` may be lower than asked (repeat from it)."""
        request = DiffSpec.of(
            from_generation_id=from_generation_id,
            from_reader=from_reader,
            to_generation_id=to_generation_id,
            include_intermediate=include_intermediate,
            from_key=from_key,
            to_key=to_key,
            limit=limit,
        )
        return await self._run(_calls.diff_page(self.name, request, cursor))

    async def diff_page_of(self, spec: DiffSpec) -> DiffPage:
        """The first page of the diff ``spec``, as :meth:`diff_page` answers it."""
        return await self._run(_calls.diff_page(self.name, spec, None))

    async def diff_page_columns(
        self,
        from_generation_id: bytes | None = None,
        to_generation_id: bytes | None = None,
        from_reader: str | FromReader | None = None,
        from_key: bytes | None = None,
        to_key: bytes | None = None,
        limit: int | None = None,
        cursor: str | None = None,
    ) -> DiffColumns:
        """:meth:`diff_page` as columns of raw bytes (no intermediate values): the bulk readers' path."""
        request = DiffSpec.of(
            from_generation_id=from_generation_id,
            from_reader=from_reader,
            to_generation_id=to_generation_id,
            from_key=from_key,
            to_key=to_key,
            limit=limit,
        )
        return await self._run(_columns.diff_columns(self.name, request, cursor))

    def diff(
        self,
        from_generation_id: bytes | None = None,
        to_generation_id: bytes | None = None,
        from_reader: str | FromReader | None = None,
        include_intermediate: bool = False,
        from_key: bytes | None = None,
        to_key: bytes | None = None,
        limit: int | None = None,
    ) -> AsyncIterator[DiffItem]:
        """Every changed key in (from, to], to = the current generation when not given.

        Follows cursors and repeats split ranges, so it yields every item; ``limit`` is the page size.
        """
        request = DiffSpec.of(
            from_generation_id=from_generation_id,
            from_reader=from_reader,
            to_generation_id=to_generation_id,
            include_intermediate=include_intermediate,
            from_key=from_key,
            to_key=to_key,
            limit=limit,
        )
        return _plans.drive_async(_plans.diff_items(self.name, request), self.client.execute)

    async def generation_at(self, at_ms: int) -> bytes:
        """The newest generation committed at or before ``at_ms`` (Unix ms), from :meth:`history`.

        Raises:
            NoSuchGeneration: none was committed by then (as far as the server knows).
        """
        before: bytes | None = None
        while True:
            infos, more = await self.history(before, limit=1000)
            for info in infos:
                if info.committed_at_ms is not None and info.committed_at_ms <= at_ms:
                    return info.generation_id
            if not more or not infos:
                raise NoSuchGeneration(f"no generation of {self.name!r} was committed by {at_ms} ms")
            before = infos[-1].generation_id

    async def resolve_ref(self, ref: str) -> ResolvedRef:
        """The generation ``ref`` names and its commit time: a generation id's text form, ``@current``,
        ``@open``, ``~N`` (N commits back), ``@reader:NAME`` or ``@reader:OWNER/NAME`` (a reader of this
        collection), or ``@`` and an ISO time such as ``@2026-11-25T10:00:00Z`` (see docs/http.md).

        Raises:
            InvalidRequest: not a ref, a reader name several collections own.
            NoSuchGeneration, NoSuchReader: it names nothing. GenerationCollected: below the minimum.
        """
        return await self._run(_calls.resolve_ref(self.name, ref))

    async def retention(self) -> RetentionPolicy | None:
        """The collection's retention policy (None: none)."""
        return await self._run(_calls.retention(self.name))

    async def set_retention(self, policy: RetentionPolicy | None) -> RetentionPolicy | None:
        """Replaces the retention policy (None or an empty policy: none); returns it as stored."""
        return await self._run(_calls.set_retention(self.name, policy))

    async def history(
        self, before: bytes | None = None, limit: int = 100
    ) -> tuple[list[GenerationInfo], bool]:
        """Committed generations below ``before`` (default: from the current one), newest first, with commit
        time (Unix ms), changed keys and metadata (None: unknown, committed by an older server); and whether
        more remain (the next page: ``before=items[-1].generation_id``)."""
        return await self._run(_calls.history(self.name, before, limit))

    async def digest(self, generation_id: bytes | None = None) -> GenerationDigest:
        """The digest of the live records at committed generation ``generation_id`` (default: the current
        one), equal on a primary and its replicas; records/digest None: unknown (an older store)."""
        return await self._run(_calls.digest(self.name, generation_id))

    async def digests(
        self, before: bytes | None = None, limit: int = 1000
    ) -> tuple[list[GenerationDigest], bool]:
        """Committed generations below ``before`` (default: from the current one), newest first, each with
        its digest; and whether more remain (the next page: ``before=items[-1].generation_id``)."""
        return await self._run(_calls.digests(self.name, before, limit))

    async def generations(self, before: bytes | None = None, limit: int = 100) -> tuple[list[bytes], bool]:
        """Committed generation ids below ``before`` (default: from the current one), newest first (collected
        ones too: reads there answer 410); and whether more remain."""
        return await self._run(_calls.generations(self.name, before, limit))

    async def generation_records(
        self,
        generation_id: bytes,
        from_key: bytes | None = None,
        limit: int = 1000,
        hold: str | None = None,
        visible: bool = False,
    ) -> GenerationRecords:
        """A page of the records the committed generation ``generation_id`` wrote, from ``from_key``; the
        first page also holds the previous generation, the readers its commit moved and the collection's
        readers. With ``hold``: ``NoSuchReader`` unless the collection holds that reader. With
        ``visible``: every record visible there instead, in key order (a replica's first copy)."""
        call = _calls.generation_records(self.name, generation_id, from_key, limit, hold, visible)
        return await self._run(call)

    async def splits(
        self, count: int, generation_id: bytes | None = None, from_generation_id: bytes | None = None
    ) -> list[bytes]:
        """See :meth:`diffstore.client.Collection.splits`."""
        return await self._run(_calls.splits(self.name, count, generation_id, from_generation_id))

    # --- readers -------------------------------------------------------------------------------

    async def readers(self) -> list[Reader]:
        return await self._run(_calls.readers(self.name))

    async def create_reader(
        self, name: str, collection: str | None = None, generation_id: bytes | None = None
    ) -> None:
        await self._run(_calls.create_reader(self.name, name, collection, generation_id))

    async def update_reader(self, name: str, generation_id: bytes | None, expected: Expected = UNSET) -> None:
        """Moves a reader; with ``expected`` (``None`` = "must be null") a mismatch raises BadVersion."""
        await self._run(_calls.update_reader(self.name, name, generation_id, expected))

    async def delete_reader(self, name: str) -> None:
        await self._run(_calls.delete_reader(self.name, name))

    # --- lineage -------------------------------------------------------------------------------

    async def lineage(self, generation_id: bytes, depth: int = 1) -> Lineage:
        """The readers moved by the commit of ``generation_id``; ``depth`` > 1 walks back through the
        source collections' own lineage (each source's generations in (from, to], merged per reader) to
        the streams they were ingested from. Raises ``InvalidRequest`` for a depth outside 1..10 or a
        generation that is not committed, ``GenerationCollected`` below the readers' minimum."""
        return await self._run(_calls.lineage(self.name, generation_id, depth))

    # --- watching ------------------------------------------------------------------------------

    def watch(
        self, since: bytes | None = None, timeout_ms: int = DEFAULT_LONG_POLL_MS
    ) -> AsyncIterator[bytes]:
        """Yields each new generation id as it commits, forever (long poll, ``timeout_ms`` per poll).

        ``since=None`` starts from the current generation (not yielded). Commits closer together than
        a round trip may be coalesced into the latest one.
        """
        return _plans.drive_async(_plans.watch_generations(self.name, since, timeout_ms), self.client.execute)
