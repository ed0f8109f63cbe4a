"""The one ``Collection`` Protocol: what a handle on a collection offers, embedded or remote.

Two classes implement it with the same method names, parameters and results: the engine's
:class:`diffstore.engine.Collection` (in-process, on LMDB) and the HTTP client's
:class:`diffstore.client.Collection`. Code that only needs a collection — the stream ingestor's sinks,
the Spark transform, the consumer, the exactly-once round of :mod:`diffstore.rounds` — is written against
this Protocol and runs over either. Implementations may take more (optional) parameters than listed here.

This module imports neither LMDB nor httpx.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Protocol

from diffstore.engine.types import (
    UNSET,
    DiffItem,
    DiffPage,
    DiffSpec,
    Expected,
    FromReader,
    GenerationInfo,
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


class Collection(Protocol):
    """A handle on one collection (SPEC §1/§3); see the engine's class for each method's contract."""

    @property
    def name(self) -> str: ...

    @property
    def manual(self) -> bool: ...

    @property
    def generation_id(self) -> bytes:
        """The current (last committed) generation."""
        ...

    @property
    def next_generation_id(self) -> bytes | None:
        """The open generation, if any."""
        ...

    def generation_state(self) -> tuple[bytes, bytes | None]:
        """The current and the open generation (``None``: none is open), read together."""
        ...

    # --- generations --------------------------------------------------------------------------

    def start_generation(
        self, generation_id: bytes, abort_outdated: bool = False, lease: LeaseToken | None = None
    ) -> None: ...

    def commit_generation(
        self,
        generation_id: bytes,
        update_readers: Iterable[ReaderUpdateLike] = (),
        lease: LeaseToken | None = None,
        metadata: dict[str, str] | None = None,
    ) -> None: ...

    def abort_generation(self, generation_id: bytes, lease: LeaseToken | None = None) -> None: ...

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
        """start + put_many + commit (the engine's: in one transaction, all or nothing)."""
        ...

    def start_phantom(self, ttl_seconds: int = 3600) -> bytes: ...

    def phantom_changes(
        self,
        phantom_id: bytes,
        generation_id: bytes | None = None,
        from_key: bytes | None = None,
        to_key: bytes | None = None,
        limit: int | None = None,
    ) -> PhantomChanges: ...

    # --- leases (see diffstore.engine.leases and diffstore.lease_keeper) ---------------------------------

    def acquire_lease(self, name: str, owner: str, ttl_ms: int) -> Lease: ...

    def renew_lease(self, name: str, owner: str, version: int, ttl_ms: int | None = None) -> Lease: ...

    def release_lease(self, name: str, owner: str, version: int) -> None: ...

    def leases(self) -> list[Lease]: ...

    # --- writes --------------------------------------------------------------------------------

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
    ) -> PutResult: ...

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
    ) -> PutResult: ...

    def revert(
        self,
        to_generation_id: bytes,
        *,
        generation_id: bytes | None = None,
        lease: LeaseToken | None = None,
    ) -> RevertResult:
        """(SPEC §8) writes into the open generation the changes that restore ``to_generation_id``."""
        ...

    def producer_last_seq_no(self, producer_id: str) -> int: ...

    # --- reads ---------------------------------------------------------------------------------

    def get_result(
        self, key: bytes, generation_id: bytes | None = None, phantom_id: bytes | None = None
    ) -> GetResult: ...

    def get(
        self, key: bytes, generation_id: bytes | None = None, phantom_id: bytes | None = None
    ) -> Record | None: ...

    def get_many(
        self, keys: list[bytes], generation_id: bytes | None = None, phantom_id: bytes | None = None
    ) -> GetManyResult:
        """(beyond SPEC) ``getMany``: the records of up to 10,000 keys, in the order asked."""
        ...

    def keys_around(
        self,
        key: bytes,
        limit: int,
        require_key_existence: bool = True,
        generation_id: bytes | None = None,
        phantom_id: bytes | None = None,
    ) -> KeysAround: ...

    def query_page(
        self,
        generation_id: bytes | None = None,
        phantom_id: bytes | None = None,
        from_key: bytes | None = None,
        to_key: bytes | None = None,
        limit: int | None = None,
        cursor: str | None = None,
    ) -> QueryPage: ...

    def query(
        self,
        generation_id: bytes | None = None,
        phantom_id: bytes | None = None,
        from_key: bytes | None = None,
        to_key: bytes | None = None,
    ) -> Iterator[Record]: ...

    def splits(self, count: int, generation_id: bytes | None = None) -> list[bytes]: ...

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
    ) -> DiffPage: ...

    def diff_page_of(self, spec: DiffSpec) -> DiffPage:
        """The first page of the diff ``spec``, as :meth:`diff_page` answers it."""
        ...

    def diff(
        self,
        from_generation_id: bytes | None = None,
        to_generation_id: bytes | None = None,
        from_reader: str | FromReader | None = None,
        include_intermediate: bool = False,
        from_key: bytes | None = None,
        to_key: bytes | None = None,
    ) -> Iterator[DiffItem]: ...

    # --- readers -------------------------------------------------------------------------------

    def readers(self) -> list[Reader]: ...

    def create_reader(
        self, name: str, collection: str | None = None, generation_id: bytes | None = None
    ) -> None: ...

    def update_reader(self, name: str, generation_id: bytes | None, expected: Expected = UNSET) -> None: ...

    def delete_reader(self, name: str) -> None: ...

    # --- lineage -------------------------------------------------------------------------------

    def lineage(self, generation_id: bytes, depth: int = 1) -> Lineage:
        """The readers moved by the commit of ``generation_id``, walked ``depth`` levels back."""
        ...

    # --- history (SPEC §8) ----------------------------------------------------------------------

    def generation_at(self, at_ms: int) -> bytes:
        """The newest generation committed at or before ``at_ms`` (raises ``NoSuchGeneration``)."""
        ...

    def history(self, before: bytes | None = None, limit: int = 100) -> tuple[list[GenerationInfo], bool]:
        """Committed generations below ``before`` (default: all), newest first, and whether more remain."""
        ...

    def retention(self) -> RetentionPolicy | None:
        """The collection's retention policy (None: none)."""
        ...

    def resolve_ref(self, ref: str) -> ResolvedRef:
        """The generation ``ref`` names (``@current``, ``@open``, ``~N``, ``@reader:NAME``, ``@TIME``, an id)
        and its commit time."""
        ...
