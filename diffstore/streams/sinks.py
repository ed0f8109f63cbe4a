"""Where ingestion writes: a manual collection, embedded (engine) or remote (HTTP client).

Both sinks expose the few calls SPEC §5 needs — generation state, start, put_many, commit with reader
updates, abort, readers — so :class:`~diffstore.streams.ingest.Ingestor` is written once.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

from diffstore.errors import InvalidRequest, NoSuchCollection

PutItem = tuple[bytes, bytes | None]


class CollectionSink(Protocol):
    """The target collection of an ingestor."""

    name: str

    def generation_state(self) -> tuple[bytes, bytes | None]:
        """``(current, next or None)``."""
        ...

    def start_generation(self, generation_id: bytes) -> None: ...

    def abort_generation(self, generation_id: bytes) -> None: ...

    def put_many(self, items: Sequence[PutItem], generation_id: bytes) -> None: ...

    def commit_generation(self, generation_id: bytes, reader_updates: Sequence[tuple[str, bytes]]) -> None:
        """Commits the generation and the reader updates in one transaction."""
        ...

    def readers(self) -> dict[str, tuple[str, bytes | None]]:
        """Reader name → (target, generation id)."""
        ...

    def create_reader(self, name: str, target: str) -> None:
        """Creates a reader with a null generation (an existing identical reader is fine)."""
        ...

    def close(self) -> None: ...


class _CollectionSinkBase:
    """Shared adapter over a Collection-like object (engine or HTTP client: same method names)."""

    put_chunk_records = 10_000

    def __init__(self, collection: Any, closer: Any = None) -> None:
        self._collection = collection
        self._closer = closer
        self.name: str = collection.name
        if not collection.manual:
            raise InvalidRequest(f"collection {self.name!r} is not manual; ingestion needs a manual one")

    def generation_state(self) -> tuple[bytes, bytes | None]:
        return self._collection.generation_id, self._collection.next_generation_id

    def start_generation(self, generation_id: bytes) -> None:
        self._collection.start_generation(generation_id, abort_outdated=True)

    def abort_generation(self, generation_id: bytes) -> None:
        self._collection.abort_generation(generation_id)

    def put_many(self, items: Sequence[PutItem], generation_id: bytes) -> None:
        step = self.put_chunk_records
        for start in range(0, len(items), step):
            self._collection.put_many(items[start : start + step], generation_id=generation_id)

    def commit_generation(self, generation_id: bytes, reader_updates: Sequence[tuple[str, bytes]]) -> None:
        self._collection.commit_generation(generation_id, update_readers=list(reader_updates))

    def readers(self) -> dict[str, tuple[str, bytes | None]]:
        return {r.name: (r.collection, r.generation_id) for r in self._collection.readers()}

    def create_reader(self, name: str, target: str) -> None:
        self._collection.create_reader(name, collection=target, generation_id=None)

    def close(self) -> None:
        if self._closer is not None:
            self._closer.close()


class EngineSink(_CollectionSinkBase):
    """A manual collection of an embedded :class:`~diffstore.Store`."""

    @classmethod
    def open(
        cls, data_dir: str | Path, collection: str, create: bool = False, map_size: int | None = None
    ) -> EngineSink:
        """Opens the store at ``data_dir`` (closed with the sink) and the collection, creating it if asked.

        ``map_size`` is the store's ``StoreConfig.map_size`` (default: StoreConfig's).
        """
        from diffstore.engine import Store, StoreConfig

        store = Store.open(
            str(data_dir), StoreConfig() if map_size is None else StoreConfig(map_size=map_size)
        )
        try:
            return cls(_collection_or_create(store, collection, create), closer=store)
        except BaseException:
            store.close()
            raise


class HttpSink(_CollectionSinkBase):
    """A manual collection of a remote ``diffstore serve`` (through :mod:`diffstore.client`).

    Bodies stay far below the 32 MiB putMany limit: items go in chunks of ``put_chunk_records``.
    """

    put_chunk_records = 5_000

    def generation_state(self) -> tuple[bytes, bytes | None]:
        state = self._collection.state()  # one request for both ids
        return state.generation_id or b"", state.next_generation_id

    @classmethod
    def open(cls, url: str, collection: str, create: bool = False, token: str | None = None) -> HttpSink:
        """Connects to ``url`` (closed with the sink) and opens the collection, creating it if asked.

        ``token`` is the bearer token of a server started with ``--token``.
        """
        from diffstore.client import Client

        client = Client(url, token=token)
        try:
            return cls(_collection_or_create(client, collection, create), closer=client)
        except BaseException:
            client.close()
            raise


def _collection_or_create(owner: Any, name: str, create: bool) -> Any:
    try:
        return owner.collection(name)
    except NoSuchCollection:
        if not create:
            raise
    return owner.create_collection(name, manual=True)
