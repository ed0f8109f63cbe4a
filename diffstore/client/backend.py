"""Where a data command's store is: a server (``--url``) or a data directory opened in this process
(``--data DIR``), picked in one place for every command.

Both backends hand out the same ``Collection`` handles (:mod:`diffstore.collection`: the HTTP client's or
the engine's), so a command is written once and prints the same either way. What the two reach
differently — the net changes of a diff, waiting for an automatic commit, watching commits — is here.

A data directory may be open in other processes at the same time (a server, an ingestor: see
docs/process-model.md). A command other than ``collections create`` refuses a directory that holds no
store, so that a typo in ``--data`` is said rather than answered from a new, empty store.
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from diffstore import shell, tls
from diffstore.client._transport import DEFAULT_URL, WireFormat
from diffstore.collection import Collection
from diffstore.engine.types import CollectionInfo, DiffItem, DiffSpec, RetentionPolicy
from diffstore.errors import InvalidRequest, StorageError

if TYPE_CHECKING:
    from diffstore.client._sync import Client
    from diffstore.engine.store import Store

COMMIT_WAIT_S = 30.0
"""How long ``put``, ``delete`` and ``revert`` wait for an automatic commit of what they wrote."""

WATCH_SLICE_MS = 5_000
"""One wait of ``watch`` on a data directory (it then checks the collection again)."""

STORE_FILE = "data.mdb"
"""The file that makes a directory a store (LMDB's)."""


class Backend(Protocol):
    """What a data command needs of a store, whichever way it is reached."""

    def collections(self) -> list[CollectionInfo]: ...

    def create_collection(
        self, name: str, manual: bool, retention: RetentionPolicy | None = None
    ) -> Collection: ...

    def collection(self, name: str) -> Collection: ...

    def delete_collection(self, name: str) -> None: ...

    def changes(self, collection: Collection, spec: DiffSpec) -> Iterator[DiffItem]:
        """Each key changed in (from, to] once, in key order, from its value at from to its value at to."""
        ...

    def wait_for_commit(self, name: str, generation_id: bytes) -> None:
        """Returns once ``generation_id`` of ``name`` is committed (at most :data:`COMMIT_WAIT_S`)."""
        ...

    def watch(self, name: str, since: bytes) -> Iterator[bytes]:
        """Each new current generation of ``name`` after ``since``, forever (close commits may merge)."""
        ...


def options(data: bool = True) -> argparse.ArgumentParser:
    """The options that say where the store is (an argparse parent parser): ``--url`` and ``--token``,
    and with ``data`` (a data command) ``--data DIR`` instead of ``--url``."""
    parent = argparse.ArgumentParser(add_help=False)
    group = parent.add_argument_group("store" if data else "server")
    where = group.add_mutually_exclusive_group() if data else group
    where.add_argument(
        "--url",
        default=os.environ.get("DIFFSTORE_URL", DEFAULT_URL),
        type=shell.http_urls,
        help="the server's base URL, or several servers of one cluster comma-separated (writes and reads go"
        f" to their leader, followed across a fail-over) (env DIFFSTORE_URL; default {DEFAULT_URL})",
    )
    if data:
        where.add_argument(
            "--data",
            metavar="DIR",
            help="a data directory, opened in this process instead of asking a server (other processes, "
            "a server too, may have it open at the same time)",
        )
    tls.add_client_token_arguments(
        group,
        "bearer token of a server started with --token (env DIFFSTORE_TOKEN; other users of the machine"
        " can read a command line: prefer the environment or --token-from-file)",
    )
    tls.add_client_arguments(group)
    return parent


@contextmanager
def open_backend(args: argparse.Namespace, create: bool = False) -> Iterator[Backend]:
    """The store ``args`` name (``--data DIR`` or the server), closed when the block ends.

    Args:
        create: a data directory that does not hold a store yet is created (``collections create``);
            otherwise it is refused with :class:`InvalidRequest`.
    """
    data = getattr(args, "data", None)
    if data:
        with _open_store(Path(data), create) as store:
            yield LocalBackend(store)
        return
    from diffstore.client._sync import Client

    wire: WireFormat = "json" if getattr(args, "wire", None) == "json" else "msgpack"
    with Client(args.url, token=args.token or None, format=wire, **tls.client_kwargs(args)) as client:
        yield RemoteBackend(client)


@contextmanager
def _open_store(path: Path, create: bool) -> Iterator[Store]:
    from diffstore.engine.store import Store

    if not (path / STORE_FILE).is_file() and not create:
        what = "does not exist" if not path.exists() else "holds no diffstore store"
        raise InvalidRequest(
            f"data directory {path} {what}: check --data (a directory 'diffstore serve --data' or "
            "'diffstore collections create --data' made)"
        )
    with Store.open(path) as store:
        yield store


class RemoteBackend:
    """A server, through the blocking client."""

    def __init__(self, client: Client) -> None:
        self.client = client

    def collections(self) -> list[CollectionInfo]:
        return self.client.collections()

    def create_collection(
        self, name: str, manual: bool, retention: RetentionPolicy | None = None
    ) -> Collection:
        return self.client.create_collection(name, manual=manual, retention=retention)

    def collection(self, name: str) -> Collection:
        return self.client.collection(name)

    def delete_collection(self, name: str) -> None:
        self.client.delete_collection(name)

    def changes(self, collection: Collection, spec: DiffSpec) -> Iterator[DiffItem]:
        from diffstore.client import _plans

        return _plans.drive(_plans.net_diff_items(collection.name, spec), self.client.execute)

    def wait_for_commit(self, name: str, generation_id: bytes) -> None:
        from diffstore.client import _calls

        deadline = time.monotonic() + COMMIT_WAIT_S
        current = self.client.execute(_calls.generation_stream(name, None))
        while current < generation_id:
            left_ms = int((deadline - time.monotonic()) * 1000)
            if left_ms <= 0:
                raise _not_committed(name, generation_id)
            current = self.client.execute(_calls.generation_stream(name, current, min(left_ms, 5_000)))

    def watch(self, name: str, since: bytes) -> Iterator[bytes]:
        return self.client.watch(name, since)


class LocalBackend:
    """A data directory opened in this process (its background worker commits automatic collections)."""

    def __init__(self, store: Store) -> None:
        self.store = store

    def collections(self) -> list[CollectionInfo]:
        return self.store.collections()

    def create_collection(
        self, name: str, manual: bool, retention: RetentionPolicy | None = None
    ) -> Collection:
        return self.store.create_collection(name, manual=manual, retention=retention)

    def collection(self, name: str) -> Collection:
        return self.store.collection(name)

    def delete_collection(self, name: str) -> None:
        self.store.delete_collection(name)

    def changes(self, collection: Collection, spec: DiffSpec) -> Iterator[DiffItem]:
        # the engine's diff is already net (each key once, from one snapshot) over any range
        return collection.diff(
            spec.from_generation_id,
            spec.to_generation_id,
            spec.from_reader,
            include_intermediate=False,
            from_key=spec.from_key,
            to_key=spec.to_key,
        )

    def wait_for_commit(self, name: str, generation_id: bytes) -> None:
        deadline = time.monotonic() + COMMIT_WAIT_S
        with _waiter(self.store) as waiter:
            current = self.store.collection(name).generation_id
            while current < generation_id:
                left_ms = int((deadline - time.monotonic()) * 1000)
                if left_ms <= 0:
                    raise _not_committed(name, generation_id)
                waiter.wait_for_change({name: current}, min(left_ms, WATCH_SLICE_MS))
                current = self.store.collection(name).generation_id

    def watch(self, name: str, since: bytes) -> Iterator[bytes]:
        with _waiter(self.store) as waiter:
            while True:
                waiter.wait_for_change({name: since}, WATCH_SLICE_MS)
                current = self.store.collection(name).generation_id  # noSuchCollection once deleted
                if current != since:
                    yield current
                    since = current


@contextmanager
def _waiter(store: Store) -> Iterator[Any]:
    from diffstore.consumer._loop import CommitWaiter

    waiter = CommitWaiter(store)
    try:
        yield waiter
    finally:
        waiter.close()


def _not_committed(name: str, generation_id: bytes) -> StorageError:
    return StorageError(
        f"generation {shell.show(generation_id)} of {name} was not committed within "
        f"{COMMIT_WAIT_S:.0f} s: the write is stored and will be visible once it commits"
    )
