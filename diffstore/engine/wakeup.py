"""Commits seen by every process: a UNIX datagram socket per listening process, named in the data dir.

Any number of processes may open one data directory (``serve`` workers, ``ingest --data``, a script's
``Store``). A process that listens for commits (``Store.add_commit_listener``: long polls, consumers)
binds a datagram socket and registers it as an empty file ``<data>/wake/<id>``; on Linux the socket
itself is in the abstract namespace (``\\0diffstore-wake-<id>``), so the data directory's path length
does not matter and nothing is left on disk by a process that dies. After every write transaction
that committed generations or deleted a collection -- once it is durable -- the committing process sends
one datagram per event (msgpack ``[collection, generation id]`` for a commit, ``[collection, nil]`` for a
deletion, so that long polls of a deleted collection answer at once in every process) to every
registered socket but its own::

    committer (any process)                     listener (each process with commit listeners)
    ------------------------                    ---------------------------------------------
    write txn commits (durable)
    Store._announce -> own listeners
    Wakeup.notify: listdir <data>/wake ------->  Wakeup thread: recv -> Store._announce -> listeners
                   sendto each peer (no wait)                      (the HTTP hub: call_soon_threadsafe)

A send never blocks the committer (``MSG_DONTWAIT``): a peer whose queue is full misses that datagram
(counted in :attr:`Wakeup.dropped`; long polls answer at their timeout at the latest); a peer that is
gone (connection refused) has its registration removed by the first committer that notices.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import sys
import threading
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path

import msgpack

_log = logging.getLogger("diffstore.engine")
_ABSTRACT = sys.platform.startswith("linux")
_RECEIVE_BUFFER = 1 << 20
_MAX_DATAGRAM = 64 * 1024
_STOP = b""

# (collection, generation id) of a commit, or (collection, None) of a deleted collection
Deliver = Callable[[str, bytes | None], None]


class Wakeup:
    """Tells the other processes of one data directory about commits, and hears about theirs."""

    def __init__(self, data_dir: Path) -> None:
        self.directory = data_dir / "wake"
        self._sender: socket.socket | None = None
        self._sender_lock = threading.Lock()
        self._listener: socket.socket | None = None
        self._thread: threading.Thread | None = None
        self._id: str | None = None
        self.dropped = 0  # datagrams not sent because a peer's queue was full
        self.received = 0

    def _address(self, peer: str) -> str | bytes:
        if _ABSTRACT:
            return b"\0diffstore-wake-" + peer.encode()
        return str(self.directory / (peer + ".sock"))

    def _peers(self) -> list[str]:
        try:
            names = os.listdir(self.directory)
        except FileNotFoundError:
            return []
        own = self._id
        return [name for name in names if name != own and not name.endswith(".sock")]

    def notify(self, events: Sequence[tuple[str, bytes | None]]) -> None:
        """Sends ``events`` to every other listening process; never waits.

        An event is (collection, generation id) for a commit, (collection, None) for a deletion.
        """
        peers = self._peers()
        if not peers or not events:
            return
        payloads = [msgpack.packb([name, generation], use_bin_type=True) for name, generation in events]
        with self._sender_lock:
            if self._sender is None:
                self._sender = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
                self._sender.setblocking(False)
            sender = self._sender
            for peer in peers:
                address = self._address(peer)
                for payload in payloads:
                    try:
                        sender.sendto(payload, address)
                    except (ConnectionRefusedError, FileNotFoundError):
                        self._forget(peer)  # its process is gone
                        break
                    except BlockingIOError:
                        self.dropped += 1
                    except OSError:
                        _log.exception("telling process %s about a commit failed", peer)
                        break

    def _forget(self, peer: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.directory / peer)

    def listen(self, deliver: Deliver) -> None:
        """Hears other processes' events, in a thread: ``deliver(collection, generation_id or None)``."""
        if self._listener is not None:
            return
        peer = uuid.uuid4().hex
        self.directory.mkdir(exist_ok=True)
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, _RECEIVE_BUFFER)
        listener.bind(self._address(peer))
        self._listener, self._id = listener, peer
        (self.directory / peer).touch()  # registered only once it can receive
        self._thread = threading.Thread(
            target=self._receive, args=(listener, deliver), name="diffstore-wakeup", daemon=True
        )
        self._thread.start()

    def _receive(self, listener: socket.socket, deliver: Deliver) -> None:
        while True:
            try:
                data = listener.recv(_MAX_DATAGRAM)
            except OSError:
                return
            if data == _STOP:
                return
            try:
                name, generation_id = msgpack.unpackb(data, raw=False)
            except Exception:
                _log.warning("ignored a malformed commit notice of %d bytes", len(data))
                continue
            self.received += 1
            deliver(str(name), None if generation_id is None else bytes(generation_id))

    def close(self) -> None:
        """Unregisters and stops listening; a later call is a no-op."""
        listener, peer = self._listener, self._id
        self._listener = None
        if listener is not None and peer is not None:
            self._forget(peer)
            with contextlib.suppress(OSError):
                stopper = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
                with stopper:
                    stopper.sendto(_STOP, self._address(peer))
            if self._thread is not None:
                self._thread.join(timeout=5)
            listener.close()
            if not _ABSTRACT:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(self._address(peer))
        with self._sender_lock:
            if self._sender is not None:
                self._sender.close()
                self._sender = None
