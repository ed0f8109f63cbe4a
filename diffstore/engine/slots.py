"""Counted slots shared by every process of a data directory: at most N holders of a kind at once.

A slot is an ``flock`` held exclusively on one of N files ``DIR/slots/<kind>.<i>``: taken without
waiting, let go by :meth:`Slot.release` or by the holder's death (the kernel drops the lock of a killed
process; nothing to clean up). ``flock`` locks belong to an open file, so two holders in one process
exclude each other as two processes do, and they do not touch LMDB's own POSIX locks (other files).

``GET /backup`` uses them to cap the copies streamed at once by every worker of a server together.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

from diffstore.engine import storage

SLOTS_DIRECTORY = "slots"


class Slot:
    """One slot held; :meth:`release` lets go of it (a later call is a no-op)."""

    def __init__(self, fd: int, index: int) -> None:
        self._fd: int | None = fd
        self.index = index

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def take(path: Path, kind: str, count: int) -> Slot | None:
    """One of the ``count`` slots of ``kind`` in the data directory ``path``, or None when all are held.

    Raises:
        StorageError: the slot files cannot be made.
    """
    directory = path / SLOTS_DIRECTORY
    for index in range(count):
        try:
            directory.mkdir(exist_ok=True)
            fd = os.open(directory / f"{kind}.{index}", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except OSError as exc:
            raise storage.storage_error(exc, path, 0, writing=True, doing="cannot take a slot") from exc
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            continue
        return Slot(fd, index)
    return None
