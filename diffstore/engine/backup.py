"""Hot backups: one consistent committed state of a store, copied beside the processes that write it.

A backup is LMDB's compacting copy (``mdb_env_copy2`` with ``MDB_CP_COMPACT``): it reads the whole store
in ONE read transaction, so every table is as of one instant -- each collection at a committed
generation, with the readers, lineage, leases and producer states of that same instant -- and it writes
the live pages only, packed. A read transaction never blocks LMDB's writer, so writers keep committing
meanwhile (the pages they free cannot be reused until the copy ends; the file may grow by that much).

The copy then holds what the open generations had received so far, which no commit acknowledged; it is
*settled* (:func:`settle`) before it counts as a backup:

- a manual collection's open generation is left out, as if aborted: its records and its registration
  are dropped and it has no open generation (its writer, restored, gets ``generationMismatch`` and starts
  the generation again, as after any abort);
- a non-manual collection keeps its open generation (it always has one) but empty: the records written
  into it, its count and its automatic-commit countdown are dropped, and so are producer seqNos pending in
  it (a producer's retry of those writes is then written, not skipped);
- phantoms are left out (private what-if writes with an expiry, never part of a committed state).

Where the copy is written, and the promise that it is never half valid::

    OUT/backup.incomplete   written first (storage.UNFINISHED_BACKUP); Store.open refuses OUT while it exists
    OUT/data.mdb            the copy; flushed to disk, then settled in one write transaction
    (mark removed)          last, and the directory flushed: OUT is now a store ``serve --data OUT`` opens

A backup killed at any point leaves the source as it was (it was only read) and OUT with its mark.

The same copy, streamed (:func:`stream_to`, made by a process of its own: :mod:`.copier`), is what
``GET /backup`` sends; the receiving side writes it
into OUT behind the same mark (:func:`receive`) and settles it there. A stream server's store
(``diffstore streams serve``) is copied the same way and needs no settling (each of its operations is one
transaction).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import lmdb

from diffstore.engine import (
    background,
    changes,
    copier,
    copying,
    crashpoints,
    digests,
    files,
    layout,
    manifest,
    producers,
    space,
    storage,
    writes,
)
from diffstore.engine.tables import Table, Tables, save_meta
from diffstore.errors import InvalidRequest, Overloaded, StorageError

if TYPE_CHECKING:
    from diffstore.engine.store import Store

Progress = copying.Progress
_MIN_BYTES = 2 * 4096  # LMDB's two meta pages: anything shorter is not a data file at all
_MARK_TEXT = (
    "This directory holds a diffstore backup that was cut off before it was finished.\n"
    "It is not a usable store: delete it and take the backup again.\n"
)


@dataclass(frozen=True, slots=True)
class BackupResult:
    """What a finished backup holds."""

    kind: files.Kind
    bytes: int  # size of the data file written
    collections: int
    open_generations_left_out: int  # manual collections' open generations (as if aborted)
    open_generations_emptied: int  # non-manual collections' open generations (kept open, empty)
    phantoms_left_out: int


def check_target(out: Path) -> None:
    """Refuses (InvalidRequest) an ``out`` that exists and is not an empty directory; touches nothing."""
    if out.is_dir():
        if any(out.iterdir()):
            raise InvalidRequest(f"{out} exists and is not empty: back up into a new directory")
    elif out.exists():
        raise InvalidRequest(f"{out} exists and is not a directory: back up into a new directory")


def claim_target(out: Path) -> None:
    """Makes ``out`` (or takes it, empty) and marks it unfinished, durably, before anything is copied."""
    check_target(out)
    out.mkdir(parents=True, exist_ok=True)
    mark = out / storage.UNFINISHED_BACKUP
    with open(mark, "x") as f:
        f.write(_MARK_TEXT)
        f.flush()
        os.fsync(f.fileno())
    files.sync_directory(out)


def backup_directory(
    source: Path, out: Path, progress: Progress | None = None, disk_share: float = copying.DISK_SHARE
) -> BackupResult:
    """Backs up the store in ``source`` (open in other processes or not) into the new directory ``out``.

    Raises:
        InvalidRequest: ``source`` holds no store, or ``out`` exists and is not empty (nothing changed).
        StorageError: reading or writing failed (``out`` keeps its unfinished mark).
    """
    source, out = Path(source), Path(out)
    storage.refuse_unfinished_backup(source)
    files.require_data_file(source)
    check_target(out)
    with files.open_existing(source) as opened:
        expected = files.expected_bytes(opened)
        claim_target(out)
        crashpoints.reached("backup-claimed")
        target = out / storage.DATA_FILE
        fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
        try:
            copying.copy_to_file(opened.env, fd, expected, progress, disk_share)
            os.fsync(fd)
        except (lmdb.Error, OSError) as exc:
            raise storage.storage_error(
                exc, out, files.MAP_SIZE, writing=True, doing="backup failed"
            ) from exc
        finally:
            os.close(fd)
    crashpoints.reached("backup-copied")
    return finish(out)


def receive(
    chunks: Iterable[bytes], out: Path, expected: int, progress: Progress | None = None
) -> BackupResult:
    """Writes a streamed copy (``GET /backup``) into the new directory ``out``, then settles it.

    The caller has checked ``out`` (:func:`check_target`) and the stream's first answer.

    Raises:
        StorageError: writing failed, or the stream ended before a whole data file arrived (``out`` keeps
            its unfinished mark).
    """
    out = Path(out)
    claim_target(out)
    crashpoints.reached("backup-claimed")
    written = 0
    try:
        with open(out / storage.DATA_FILE, "xb") as f:
            for chunk in chunks:
                f.write(chunk)
                written += len(chunk)
                if progress is not None:
                    progress(written, max(expected, written))
            f.flush()
            os.fsync(f.fileno())
    except OSError as exc:
        raise storage.storage_error(exc, out, files.MAP_SIZE, writing=True, doing="backup failed") from exc
    crashpoints.reached("backup-copied")
    return finish(out)


def finish(out: Path) -> BackupResult:
    """Settles the copy in ``out`` (see the module docstring) and removes its unfinished mark.

    Raises:
        StorageError: the copy is not a whole store (a stream cut short) or cannot be settled.
    """
    size = (out / storage.DATA_FILE).stat().st_size
    if size < _MIN_BYTES:
        raise StorageError(f"the copy in {out} is cut short ({size} bytes): take the backup again")
    with files.opened_environment(out, unfinished_backup=True) as opened:
        try:
            if opened.kind is files.Kind.STORE:
                counts = _settle_store(opened.env)
            else:
                counts = (0, 0, 0, 0)
            opened.env.sync(True)
        except lmdb.Error as exc:
            raise storage.storage_error(
                exc, out, files.MAP_SIZE, writing=True, doing="settling the backup failed"
            ) from exc
    crashpoints.reached("backup-settled")
    manifest.write(out)  # the backup's proof (engine/manifest.py), before the mark goes
    for leftover in (
        storage.LOCK_FILE,
        storage.DIRECTORY_LOCK,
    ):  # made by the settling; a restore makes its own
        (out / leftover).unlink(missing_ok=True)
    (out / storage.UNFINISHED_BACKUP).unlink()
    files.sync_directory(out)
    collections, left_out, emptied, phantoms = counts
    return BackupResult(
        opened.kind, (out / storage.DATA_FILE).stat().st_size, collections, left_out, emptied, phantoms
    )


def _settle_store(env: lmdb.Environment) -> tuple[int, int, int, int]:
    tables = Tables.open(env)
    with env.begin(write=True) as txn:
        return settle(txn, tables)


def settle(txn: lmdb.Transaction, tables: Tables) -> tuple[int, int, int, int]:
    """Turns a copy of a store into a committed state (see the module docstring), in one transaction.

    Returns:
        (collections, manual open generations left out, non-manual open generations emptied, phantom
        rows left out).
    """
    metas = background.collection_metas(txn, tables)
    left_out = emptied = 0
    for meta in metas:
        if meta.next is None:
            continue
        if meta.manual:
            save_meta(txn, tables, writes.drop_open_generation(txn, tables, meta))
            left_out += 1
        elif meta.next_count or _has_records(txn, tables, meta.cid_prefix, meta.next_seq):
            assert meta.next_seq is not None
            writes.drop_open_records(txn, tables, meta)
            digests.drop_pending(txn, tables, meta)
            producers.forget_pending(txn, tables, meta, meta.next_seq)
            save_meta(txn, tables, meta.with_(next_count=0))
            emptied += 1
    phantoms = txn.stat(tables.phantoms)["entries"]
    txn.drop(tables.phantoms, delete=False)
    txn.drop(tables.phantom_ttl, delete=False)
    _drop_auto_commit_countdowns(txn, tables)
    return len(metas), left_out, emptied, int(phantoms)


def _has_records(txn: lmdb.Transaction, tables: Tables, cid_prefix: bytes, seq: int | None) -> bool:
    if seq is None:
        return False
    return changes.any_written(txn, tables, cid_prefix, seq)


def _drop_auto_commit_countdowns(txn: lmdb.Transaction, tables: Tables) -> None:
    """Every open generation is empty now: no automatic commit is due."""
    cursor = txn.cursor(db=tables.due)
    if not cursor.set_range(layout.AUTO_COMMIT_DUE_PREFIX):
        return
    while layout.name_of_auto_commit_due_key(cursor.key()) is not None:
        if not cursor.delete():
            break


def stream_to(store: Store, fd: int, stop: threading.Event | None = None) -> None:
    """Writes the compacting copy of ``store`` into ``fd`` (a pipe: ``GET /backup``) and closes it.

    The copy is made by a process of its own (:mod:`diffstore.engine.copier`): a copy in this process would
    hold py-lmdb's lock of the store's environment, which a failing writer's abort waits for. Setting
    ``stop`` kills that process (a stream that stalled); its reader slot is freed at once.

    Raises:
        Overloaded: LMDB's reader table is full (no copy started).
        StorageError: the copy failed, was stopped, or the reader of ``fd`` went away (a broken pipe).
    """
    copy = copier.Copy(store.path, fd, stop)
    try:
        copy.wait()
    finally:
        if copy.process.returncode != 0:  # a killed copy leaves its reader slot taken: free it now
            store.clear_stale_readers()


def expected_bytes(store: Store) -> int:
    """About the size of the store's compacting copy (its pages in use), for progress.

    Raises:
        Overloaded: LMDB's reader table is full (a copy could not start either).
        StorageError: reading failed.
    """
    try:
        return space.measure(store.env, _tables_of(store.tables), store.path).used_bytes
    except lmdb.ReadersFullError as exc:
        raise Overloaded(copier.READERS_FULL_REASON) from exc
    except lmdb.Error as exc:
        raise storage.storage_error(
            exc, store.path, store.config.map_size, writing=False, doing="backup failed"
        ) from exc


def _tables_of(tables: Tables) -> list[Table]:
    return [getattr(tables, name.decode()) for name in layout.TABLES]
