"""``diffstore compact``: gives a store's free pages back to the disk.

LMDB reuses freed pages but never shrinks its file (``space.py``). A compaction writes LMDB's compacting
copy (the live pages only, packed) beside the data file and renames it over the data file: ``rename`` is
atomic, so a crash at any point leaves either the old file or the new one, never neither, and never a
mix::

    data.mdb.compacting   the copy, written and flushed (a crash here: the old store, and this leftover,
                          which the next compaction removes)
    rename -> data.mdb    the new store from here on; the directory is flushed

The swap is only safe while no other process has the store open (they map the old file and would go on
writing into it). A compaction holds the directory lock exclusively (``storage.DirectoryLock``: every
``Store`` and stream store holds it shared while open, so it refuses while one is open, and a process
starting meanwhile refuses to open until it is done), and it also makes sure that no program at all holds
LMDB's own lock (``storage.lmdb_lock_is_free``). LMDB's lock file is left as it is: the next process to
open the store is alone, and LMDB then rebuilds the lock file's state from the new data file.

Before the copy, a diffstore store in the current layout gets the checksum of every record written before
records carried one (``migrate.seal_records``): the copy is then sealed whole.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import lmdb

from diffstore.engine import copying, crashpoints, files, layout, migrate, storage
from diffstore.engine.tables import Tables
from diffstore.errors import StorageError

COMPACTING_FILE = "data.mdb.compacting"


@dataclass(frozen=True, slots=True)
class CompactResult:
    """The data file's size before and after."""

    kind: files.Kind
    before_bytes: int
    after_bytes: int
    sealed: int = 0  # records given their checksum before the copy (migrate.seal_records)


def compact(path: Path, progress: copying.Progress | None = None) -> CompactResult:
    """Compacts the store in ``path``, which no process may have open.

    Raises:
        InvalidRequest: ``path`` holds no store (nothing changed).
        StorageError: another process has the store open, or the copy failed (the store is unchanged).
    """
    path = Path(path)
    storage.refuse_unfinished_backup(path)
    files.require_data_file(path)
    lock = storage.DirectoryLock(path, exclusive=True)
    try:
        if not storage.lmdb_lock_is_free(path):
            raise StorageError(
                f"the store at {path} is open in another program (it holds LMDB's lock): stop it first"
            )
        temp = path / COMPACTING_FILE
        temp.unlink(missing_ok=True)  # left by a compaction that was cut off: the old store is whole
        data = path / storage.DATA_FILE
        before = data.stat().st_size
        with files.opened_environment(path) as opened:
            sealed = _seal(opened)
            expected = files.expected_bytes(opened)
            fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
            try:
                copying.copy_to_file(opened.env, fd, expected, progress, disk_share=1.0)
                os.fsync(fd)
            except (lmdb.Error, OSError) as exc:
                os.close(fd)
                temp.unlink(missing_ok=True)
                raise storage.storage_error(
                    exc,
                    path,
                    files.MAP_SIZE,
                    writing=True,
                    doing="compaction failed (the store is unchanged)",
                ) from exc
            os.close(fd)
            kind = opened.kind
        crashpoints.reached("compact-copied")
        os.rename(temp, data)
        crashpoints.reached("compact-renamed")
        files.sync_directory(path)
        return CompactResult(kind, before, data.stat().st_size, sealed)
    finally:
        lock.release()


def _seal(opened: files.Opened) -> int:
    """Seals the records of a diffstore store in the current layout (an older layout is upgraded, keys
    and all, when the store is next opened, and sealed by ``diffstore migrate`` after that)."""
    if opened.kind is not files.Kind.STORE:
        return 0
    tables = Tables.open(opened.env)
    with opened.env.begin() as txn:
        if migrate.layout_version(txn, tables) != layout.LAYOUT_VERSION:
            return 0
    return migrate.seal_records(opened.env, tables)
