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

Why every opener holds ``store.lock`` shared: ``diffstore compact`` swaps the data file for a compacted copy,
which is only safe while no other process has the store open. LMDB's own lock (a POSIX lock on ``lock.mdb``)
says whether one has, but cannot keep a new one out for the duration; an ``flock`` on a file of our own can:
every :class:`Store` and stream store holds it shared from before LMDB opens the directory to after it is
closed, and compaction takes it exclusively (:class:`DirectoryLock`). ``flock`` and POSIX locks do not
interact on Linux, and the file is never ``lock.mdb`` itself (closing any descriptor of that file would
drop LMDB's POSIX locks of the whole process).

Why an unfinished backup is refused: a backup is written into its directory behind a mark file
(:data:`UNFINISHED_BACKUP`), removed only once the copy is whole and settled; a directory that still holds
it was cut off midway, and opening it would serve half a store.

Why a short write counts as "full": LMDB reports a short ``pwrite`` (the file system ran out of blocks part
way through) as ``EIO``; an ``EIO`` on a file system left with (almost) no free space is reported as
:class:`~diffstore.errors.StorageFull`, any other as :class:`~diffstore.errors.StorageError`.
"""

from __future__ import annotations

import errno
import fcntl
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
DATA_FILE = "data.mdb"
LOCK_FILE = "lock.mdb"
DIRECTORY_LOCK = "store.lock"
UNFINISHED_BACKUP = "backup.incomplete"


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


def refuse_unfinished_backup(path: Path) -> None:
    """Raises StorageError when ``path`` holds a backup that was cut off midway (see the module docstring)."""
    if (path / UNFINISHED_BACKUP).exists():
        raise StorageError(
            f"{path} holds an unfinished backup (it was interrupted): it is not a usable store; delete it and"
            " take the backup again"
        )


def existing_max_readers(path: Path, default: int) -> int:
    """The reader count LMDB's lock file of ``path`` was made for (``default`` when there is none yet).

    A process that only reads an existing store (backup, check) must not grow the lock file: a process
    that opened it earlier sees the reader slots of the size it saw, and a reader in a slot past them
    would be invisible to its writer, which could then reuse the pages that reader is copying.
    """
    try:
        size = (path / LOCK_FILE).stat().st_size
    except FileNotFoundError:
        return default
    if size < lock_file_bytes(1):
        return default
    return (size - _LOCK_HEADER_BYTES) // _READER_SLOT_BYTES + 1


class DirectoryLock:
    """``store.lock`` of a data directory, held shared by every process that has the store open and
    exclusively by a compaction (see the module docstring). Release it after closing the environment."""

    def __init__(self, path: Path, *, exclusive: bool = False) -> None:
        """Takes the lock at once, never waiting.

        Raises:
            StorageError: the lock is held the other way (a compaction is running, or, for ``exclusive``,
                another process has the store open), or the file cannot be made.
        """
        self.path = path
        try:
            path.mkdir(parents=True, exist_ok=True)
            self._fd: int | None = os.open(
                path / DIRECTORY_LOCK, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644
            )
        except OSError as exc:
            raise storage_error(exc, path, 0, writing=True, doing=f"cannot lock the store at {path}") from exc
        try:
            fcntl.flock(self._fd, (fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH) | fcntl.LOCK_NB)
        except BlockingIOError:
            self.release()
            if exclusive:
                raise StorageError(
                    f"the store at {path} is open in another process (a server, an ingestor, a script):"
                    " stop it first"
                ) from None
            raise StorageError(
                f"the store at {path} is being compacted (diffstore compact): open it when that is done"
            ) from None

    def release(self) -> None:
        """Lets go of the lock; a later call is a no-op."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def lmdb_lock_is_free(path: Path) -> bool:
    """Whether no process holds LMDB's lock of ``path`` (no environment is open on it anywhere, whatever
    program opened it). Call it only before this process opens the environment itself: it opens and
    closes ``lock.mdb``, which would drop this process's own LMDB locks on it."""
    try:
        fd = os.open(path / LOCK_FILE, os.O_RDWR | os.O_CLOEXEC)
    except FileNotFoundError:
        return True
    try:
        # LMDB holds a read lock on the first byte for as long as an environment is open
        fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, 0)
    except OSError:
        return False
    finally:
        os.close(fd)  # releases the probe's lock too
    return True


def open_environment(
    path: Path,
    *,
    map_size: int,
    sync: bool,
    max_dbs: int,
    max_readers: int,
    unfinished_backup: bool = False,
) -> lmdb.Environment:
    """Opens (creating if needed) the LMDB environment in directory ``path``.

    ``sync=False`` skips the flush at every commit (the caller flushes from time to time) but never writes
    through the map, so that a full disk is an error and not a SIGBUS. A directory holding an unfinished
    backup is refused unless ``unfinished_backup`` (the backup itself, settling its copy).

    Raises:
        StorageFull: the file system is full (or the store's used size exceeds ``map_size``).
        StorageError: any other failure to create or open the store, or an unfinished backup.
    """
    if not unfinished_backup:
        refuse_unfinished_backup(path)
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
