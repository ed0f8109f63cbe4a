"""The compacting copy of a store, made in a process of its own, so that no copy can delay a writer.

Why a process: py-lmdb (3.0) holds a lock of its ``Environment`` object for the whole of
``copyfd``, and a write transaction's ``abort()`` takes the same lock. A copy streamed to a client that
reads slowly, or not at all, runs as long as the client lets it: meanwhile a write that fails (a 409, a
507) hangs in its abort while it still holds LMDB's write lock, and every later write of the store -- any
collection, any process -- waits behind it (``scripts/copyfd_blocks_abort.py`` shows it with py-lmdb
alone). A copy made by another process holds no lock of the server's environment: it is one more reader
of the store, in its own reader slot, as ``diffstore backup --data`` beside a running server.

The child (``python -m diffstore.engine.copier DIR``) opens the store in DIR beside its other processes
(``files.open_existing``: the directory lock shared, the reader table of the lock file in place), writes
the copy to its standard output (the parent's pipe) and exits 0. It exits :data:`READERS_FULL` when
LMDB's reader table has no free slot, and 1 on any other failure, with one line on its standard error; a
reader that went away (a broken pipe) ends it the same way, its read transaction aborted.

:class:`Copy` is the parent's side: it starts the child with the write end of a pipe as its output,
waits for it, and kills it when its ``stop`` event is set (a killed reader's slot is freed by the
store's background worker within ``gc_interval_ms``; ``backup.stream_to`` frees it at once).
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

import lmdb

from diffstore.errors import DiffstoreError, Overloaded, StorageError

READERS_FULL = 75  # EX_TEMPFAIL: no reader slot free now; the same copy may start later
READERS_FULL_REASON = (
    "LMDB's reader table is full (every reader slot of the store is taken by a read of some process):"
    " retry when reads end"
)
_POLL_S = 0.05


class Copy:
    """A copy of the store in ``path`` being written by a child process into ``fd`` (closed here)."""

    def __init__(self, path: Path, fd: int, stop: threading.Event | None = None) -> None:
        self._stop = stop or threading.Event()
        try:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "diffstore.engine.copier", str(path)],
                stdin=subprocess.DEVNULL,
                stdout=fd,
                stderr=subprocess.PIPE,
            )
        except OSError as exc:
            raise StorageError(f"backup copy failed: cannot start its process ({exc})") from exc
        finally:
            os.close(fd)  # the child has it: the reading side sees the end when the child is gone

    def wait(self) -> None:
        """Waits for the child to finish.

        Raises:
            Overloaded: LMDB's reader table was full.
            StorageError: the copy failed, or was stopped (``stop`` set) before it ended.
        """
        while True:
            try:
                code = self.process.wait(_POLL_S)
                break
            except subprocess.TimeoutExpired:
                if self._stop.is_set():
                    self.process.kill()
        assert self.process.stderr is not None
        reason = self.process.stderr.read().decode(errors="replace").strip()
        self.process.stderr.close()
        if code == 0:
            return
        if self._stop.is_set():
            raise StorageError("backup copy stopped")
        if code == READERS_FULL:
            raise Overloaded(READERS_FULL_REASON)
        raise StorageError(f"backup copy failed: {reason or f'its process exited {code}'}")


def main(argv: list[str]) -> int:
    """The child: writes the compacting copy of the store in ``argv[0]`` to standard output."""
    from diffstore.engine import crashpoints, files

    if len(argv) != 1:
        print("usage: python -m diffstore.engine.copier DIR", file=sys.stderr)
        return 2
    try:
        with files.open_existing(Path(argv[0])) as opened:
            crashpoints.reached("copier-opened")
            opened.env.copyfd(sys.stdout.fileno(), compact=True)
    except (lmdb.Error, OSError, DiffstoreError) as exc:  # DiffstoreError: a store that cannot be opened
        if isinstance(exc, lmdb.ReadersFullError) or isinstance(exc.__cause__, lmdb.ReadersFullError):
            print(READERS_FULL_REASON, file=sys.stderr)
            return READERS_FULL
        print(str(getattr(exc, "reason", exc)), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
