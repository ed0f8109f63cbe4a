"""The LMDB environment's I/O edge: opening it safely and translating its failures into diffstore errors.

Why the lock file is preallocated: LMDB sizes ``lock.mdb`` with ``ftruncate`` and then writes its reader
table through a shared memory map. On a full file system the first touch of a page that has no block
behind it is a SIGBUS, which kills the process without a word (starting a server on a full disk exited
135). Allocating the file's blocks with ``posix_fallocate`` first turns that into an ``ENOSPC`` we can
report.

Why unsynced stores do not write through the map (no ``writemap``): LMDB's writable map is a sparse file
as large as ``map_size``; when the disk fills, writing a page of it is a SIGBUS in the middle of a
transaction, and no amount of preallocation ahead of a transaction can bound what one transaction touches.
Without it LMDB writes dirty pages with ``pwrite`` at commit, and a full disk is an error returned by the
commit (the transaction is aborted; the store stays as it was). ``benchmarks/nosync_commits.py`` measures
what that costs small commits.

Why a short write counts as "full": LMDB reports a short ``pwrite`` (the file system ran out of blocks part
way through) as ``EIO``; an ``EIO`` on a file system left with (almost) no free space is reported as
:class:`~diffstore.errors.StorageFull`, any other as :class:`~diffstore.errors.StorageError`.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

import lmdb

from diffstore.errors import StorageError, StorageFull

# An EIO from a write on a file system with less free space than this is a full disk (see above).
FULL_DISK_FREE_BYTES = 1 << 20
# LMDB's lock file is a 192-byte header (MDB_txninfo) plus one cache-line (64-byte) slot per reader beyond
# the first (LMDB 0.9 on 64-bit). The file is given exactly that size, so that it never differs from what
# LMDB would make it: a process that opened it earlier derives its reader count from the size it saw.
_LOCK_HEADER_BYTES = 192
_READER_SLOT_BYTES = 64


def lock_file_bytes(max_readers: int) -> int:
    """The size LMDB gives ``lock.mdb`` for ``max_readers`` readers."""
    return _LOCK_HEADER_BYTES + (max_readers - 1) * _READER_SLOT_BYTES


def preallocate_lock_file(path: Path, max_readers: int) -> None:
    """Gives ``path/lock.mdb`` real blocks before LMDB maps it (see the module docstring).

    Raises:
        OSError: the file cannot be created or allocated (``ENOSPC`` on a full file system). File systems
            without ``posix_fallocate`` support are left to LMDB as before.
    """
    fd = os.open(path / "lock.mdb", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        # an existing lock file keeps its size (LMDB adopts it as it is); only its holes get blocks
        os.posix_fallocate(fd, 0, max(os.fstat(fd).st_size, lock_file_bytes(max_readers)))
    except OSError as exc:
        if exc.errno not in (errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL):
            raise
    finally:
        os.close(fd)


def open_environment(
    path: Path, *, map_size: int, sync: bool, max_dbs: int, max_readers: int
) -> lmdb.Environment:
    """Opens (creating if needed) the LMDB environment in directory ``path``.

    ``sync=False`` skips the flush at every commit (the caller flushes from time to time) but never writes
    through the map, so that a full disk is an error and not a SIGBUS.

    Raises:
        StorageFull: the file system is full (or the store's used size exceeds ``map_size``).
        StorageError: any other failure to create or open the store.
    """
    try:
        path.mkdir(parents=True, exist_ok=True)
        preallocate_lock_file(path, max_readers)
        return lmdb.open(
            str(path),
            map_size=map_size,
            max_dbs=max_dbs,
            max_readers=max_readers,
            readahead=False,
            sync=sync,
            metasync=sync,
        )
    except (lmdb.Error, OSError) as exc:
        raise storage_error(
            exc, path, map_size, writing=True, doing=f"cannot open the store at {path}"
        ) from exc


def free_bytes(path: Path) -> int | None:
    """Bytes an unprivileged writer may still use on the file system holding ``path`` (None if unknown)."""
    try:
        stat = os.statvfs(path)
    except OSError:
        return None
    return stat.f_bavail * stat.f_frsize


def storage_error(
    exc: BaseException, path: Path, map_size: int, *, writing: bool, doing: str = "storage failed"
) -> StorageError:
    """The diffstore error for an ``lmdb.Error`` or ``OSError`` of the store at ``path``.

    Args:
        exc: what LMDB or the OS raised.
        path: the store's directory (its file system is checked for free space).
        map_size: the map size in force (named in the message of a full map).
        writing: whether the failure happened in a write (only a write can find the disk full).
        doing: what failed, to start the message with.
    """
    if isinstance(exc, lmdb.MapFullError):
        return StorageFull(
            f"{doing}: the store's map is full ({map_size} bytes); delete data, or restart with a larger"
            " map size (--map-size, StoreConfig.map_size)"
        )
    full = isinstance(exc, lmdb.DiskError) or (
        isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT)
    )
    if not full and writing:
        free = free_bytes(path)
        full = free is not None and free < FULL_DISK_FREE_BYTES
    if full:
        return StorageFull(f"{doing}: no space left on the file system of {path} ({exc})")
    return StorageError(f"{doing}: {exc}")
