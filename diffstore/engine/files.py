"""Opening a data directory that must already hold a store, for the whole-store tools (backup, check,
compact), which work beside the processes that have it open.

Such a tool never creates a store: a directory without a data file, or whose data file is not a store of
ours, is refused before anything is written into it. It holds the directory lock (``storage``) shared, or
exclusively for a compaction, and opens LMDB with the reader count of the lock file that is already there
(``storage.existing_max_readers``), so that the writers of other processes see its reader slot.

Two kinds of store exist: a diffstore store (``Store``: its tables are ``layout.TABLES``) and the embedded
stream server's (``diffstore streams serve``); a tool tells them apart by their table names.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass
from enum import Enum
from pathlib import Path

import lmdb

from diffstore.engine import layout, space, storage
from diffstore.errors import InvalidRequest, StorageError

MAP_SIZE = 1 << 40  # an upper bound, as the store's default: the file is mapped, never allocated
MAX_DBS = 32  # at least the tables of either kind
DEFAULT_MAX_READERS = 126  # LMDB's own, when no lock file says otherwise
_STREAM_TABLE = b"streams"  # a table of the stream server's store (diffstore/streams/server/keys.py)


class Kind(Enum):
    STORE = "diffstore store"
    STREAMS = "stream server store"


@dataclass(frozen=True, slots=True)
class Opened:
    """An existing store, open: its environment, its kind and its directory."""

    env: lmdb.Environment
    kind: Kind
    path: Path


def require_data_file(path: Path) -> None:
    """Refuses (InvalidRequest) a directory that holds no data file, touching nothing."""
    if not path.is_dir():
        raise InvalidRequest(f"{path} is not a directory holding a store")
    if not (path / storage.DATA_FILE).is_file():
        raise InvalidRequest(f"{path} is not a store: it holds no {storage.DATA_FILE}")


def kind_of(env: lmdb.Environment) -> Kind | None:
    """The kind of store ``env`` holds, from the names of its tables (None: neither kind)."""
    with env.begin() as txn:
        if txn.get(layout.TABLES[0]) is not None:
            return Kind.STORE
        if txn.get(_STREAM_TABLE) is not None:
            return Kind.STREAMS
    return None


@contextlib.contextmanager
def open_existing(path: Path, *, unfinished_backup: bool = False, sync: bool = True) -> Iterator[Opened]:
    """Opens the store in ``path`` beside any other processes (holding the directory lock shared).

    Raises:
        InvalidRequest: ``path`` holds no store (nothing was written into it).
        StorageError: it cannot be opened (a compaction runs, an unfinished backup, not an LMDB file).
    """
    if not unfinished_backup:
        storage.refuse_unfinished_backup(path)
    require_data_file(path)
    lock = storage.DirectoryLock(path)
    try:
        with opened_environment(path, unfinished_backup=unfinished_backup, sync=sync) as opened:
            yield opened
    finally:
        lock.release()


def require_whole(env: lmdb.Environment, path: Path) -> None:
    """Refuses a data file shorter than its own meta page says (a copy cut short): LMDB would map pages past
    its end, and reading them is a SIGBUS. Reads only the meta pages, never a page of a table."""
    info, page = env.info(), env.stat()["psize"]
    needed = (info["last_pgno"] + 1) * page
    size = (path / storage.DATA_FILE).stat().st_size
    if needed > size:
        raise StorageError(f"the data file of {path} is cut short ({size} bytes; its pages need {needed})")


@contextlib.contextmanager
def opened_environment(path: Path, *, unfinished_backup: bool = False, sync: bool = True) -> Iterator[Opened]:
    """The environment of ``path`` with its kind; the caller holds the directory lock."""
    env = storage.open_environment(
        path,
        map_size=MAP_SIZE,
        sync=sync,
        max_dbs=MAX_DBS,
        max_readers=storage.existing_max_readers(path, DEFAULT_MAX_READERS),
        unfinished_backup=unfinished_backup,
    )
    try:
        try:
            require_whole(env, path)
            kind = kind_of(env)
        except lmdb.Error as exc:
            raise storage.storage_error(
                exc, path, MAP_SIZE, writing=False, doing=f"cannot read {path}"
            ) from exc
        if kind is None:
            raise InvalidRequest(
                f"{path} is not a store: its data file holds neither a diffstore store nor a stream server's"
            )
        yield Opened(env, kind, path)
    finally:
        env.close()


def expected_bytes(opened: Opened) -> int:
    """About the size of the compacting copy of ``opened`` (its pages in use), for progress."""
    names = [name for name in _table_names(opened.env)]
    handles = [opened.env.open_db(name, create=False) for name in names]
    return space.measure(opened.env, handles, opened.path).used_bytes


def _table_names(env: lmdb.Environment) -> list[bytes]:
    with env.begin() as txn:
        return [bytes(key) for key, _ in txn.cursor()]


def sync_directory(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
