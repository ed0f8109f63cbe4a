"""Where ingestion writes: a manual collection, embedded (engine) or remote (HTTP client).

Both sinks hold a :class:`~diffstore.collection.Collection` (the ingestor runs its rounds on it, see
:mod:`diffstore.rounds`) and write a window's round: in one call when its items fit in one chunk sized
for their transport, in chunks when they do not.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from diffstore.collection import Collection
from diffstore.engine.types import ReaderUpdateLike
from diffstore.errors import CollectionExists, InvalidRequest, NoSuchCollection
from diffstore.rounds import Round
from diffstore.tls import CertFiles

if TYPE_CHECKING:
    from diffstore.client import Client
    from diffstore.engine.store import Store

PutItem = tuple[bytes, bytes | None]


class CollectionSink(Protocol):
    """The target collection of an ingestor: the collection, and how to write a window into it."""

    collection: Collection

    def write_round(
        self,
        round_: Round,
        items: Sequence[PutItem],
        updates: Sequence[ReaderUpdateLike],
        metadata: dict[str, str] | None = None,
    ) -> None:
        """Runs ``round_``: ``items`` into its generation, committed with ``updates`` and ``metadata`` (a
        failure aborts it and re-raises)."""
        ...

    def close(self) -> None: ...


class _CollectionSinkBase:
    """Shared adapter over a :class:`~diffstore.collection.Collection` (the engine's or the client's)."""

    put_chunk_records = 10_000

    def __init__(self, collection: Collection, closer: Any = None) -> None:
        self.collection = collection
        self._closer = closer
        self.name = collection.name
        if not collection.manual:
            raise InvalidRequest(f"collection {self.name!r} is not manual; ingestion needs a manual one")

    def write_round(
        self,
        round_: Round,
        items: Sequence[PutItem],
        updates: Sequence[ReaderUpdateLike],
        metadata: dict[str, str] | None = None,
    ) -> None:
        step = self.put_chunk_records
        if len(items) <= step:  # the common window: one call (one transaction on the engine)
            round_.write(items, updates, metadata)
            return

        def write(generation_id: bytes) -> None:
            for start in range(0, len(items), step):
                chunk = items[start : start + step]
                self.collection.put_many(chunk, generation_id=generation_id, lease=round_.lease)

        round_.run(updates, write, metadata)

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

    @classmethod
    def open(
        cls,
        url: str,
        collection: str,
        create: bool = False,
        token: str | None = None,
        ca_file: str | None = None,
        cert: CertFiles | None = None,
    ) -> HttpSink:
        """Connects to ``url`` (closed with the sink) and opens the collection, creating it if asked.

        ``token`` is the bearer token of a server started with ``--token``; ``ca_file`` and ``cert`` are
        the client's TLS files for an ``https://`` server (:class:`diffstore.client.Client`'s).
        """
        from diffstore.client import Client

        client = Client(url, token=token, ca_file=ca_file, cert=cert)
        try:
            return cls(_collection_or_create(client, collection, create), closer=client)
        except BaseException:
            client.close()
            raise


def _collection_or_create(owner: Store | Client, name: str, create: bool) -> Collection:
    try:
        return owner.collection(name)
    except NoSuchCollection:
        if not create:
            raise
    try:
        return owner.create_collection(name, manual=True)
    except CollectionExists:  # another ingestor (a standby of the same pipeline) created it meanwhile
        return owner.collection(name)
