"""Commits seen by every process: a UNIX datagram socket per listening process, named in the data dir.

Any number of processes may open one data directory (``serve`` workers, ``ingest --data``, a script's
``Store``). A process that listens for commits (``Store.add_commit_listener``: long polls, consumers)
binds a datagram socket and registers it as an empty file ``<data>/wake/<id>``; on Linux the socket
itself is in the abstract namespace (``\\0diffstore-wake-<id>``), so the data directory's path length
does not matter and nothing is left on disk by a process that dies. After every write transaction
that committed generations or deleted a collection -- once it is durable -- the committing process sends
one datagram holding every event of that transaction (msgpack ``[[collection, generation id], ...]``; a
generation id of nil is a deletion, so that long polls of a deleted collection answer at once in every
process) to every registered socket but its own.

Who reads a listening process's socket depends on the process. One without an event loop (an embedded
store, a consumer, ``ingest --data``) has a thread blocked in ``recv``. One with an event loop (a ``serve``
worker) takes the socket over (:meth:`Wakeup.hand_over`, through ``Store.commit_notices``): its loop
watches :meth:`NoticeSource.fileno` and calls :meth:`NoticeSource.drain` when it is readable, which
receives every queued datagram without blocking and delivers its events right there, in the loop's
thread -- no thread switch, no GIL hand-off, no second wake-up of the loop. The engine knows nothing of
the loop: it only hands out a file descriptor and a function::

    committer (any process)                     listener (each process with commit listeners)
    ------------------------                    ---------------------------------------------
    write txn commits (durable)
    Store._announce -> own listeners
    Wakeup.notify: listdir <data>/wake ------->  with an event loop: the loop sees the socket readable
                   one sendto per peer          -> NoticeSource.drain: recv every queued datagram
                   (MSG_DONTWAIT, no wait)         (non-blocking) -> Store._announce -> listeners
                                                   (the HTTP hub: its fan-out pass, on the spot)
                                                without: the Wakeup thread, blocked in recv
                                                -> Store._announce -> listeners
                                                   (the HTTP hub: call_soon_threadsafe)

A send never blocks the committer (``MSG_DONTWAIT``): a peer whose queue is full (Linux queues at most
``net.unix.max_dgram_qlen`` datagrams, 10 by default, whatever the buffer -- a peer stalled during a burst
of commits, say) misses that datagram. The committer counts it (:attr:`Wakeup.dropped`) and *marks* the
peer: it appends a byte to the peer's registration file (never creating it: a peer that is gone stays
gone). The peer looks at its registration's size now and then (:meth:`Wakeup.check_missed`, one
``stat``): a mark means it may have missed commits, so it re-reads what its listeners wait for (the HTTP
hub: the current generation of every collection with waiters) -- within a second, not at a long poll's
timeout. A peer that is gone (connection refused) has its registration removed by the first committer that
notices. One datagram per transaction, not per event, keeps a transaction that commits many collections
within that queue.
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
_MAX_PAYLOAD = _MAX_DATAGRAM - 8  # the events of one datagram, beside its array header
_STOP = b""
_DRAIN_MAX = 256  # datagrams one drain() takes at most: a flood cannot hold the caller's loop for long

# (collection, generation id) of a commit, or (collection, None) of a deleted collection
Deliver = Callable[[str, bytes | None], None]
Event = tuple[str, bytes | None]


def _encode(events: Sequence[Event]) -> list[bytes]:
    """The datagrams that carry ``events``: all of them in one, unless they pass what a receiver takes in
    one ``recv`` (then as few as fit)."""
    datagrams: list[bytes] = []
    chunk: list[bytes] = []
    size = 0
    for name, generation in events:
        item = msgpack.packb([name, generation])
        if chunk and size + len(item) > _MAX_PAYLOAD:
            datagrams.append(_array(chunk))
            chunk, size = [], 0
        chunk.append(item)
        size += len(item)
    if chunk:
        datagrams.append(_array(chunk))
    return datagrams


def _array(items: list[bytes]) -> bytes:
    return bytes(msgpack.Packer().pack_array_header(len(items))) + b"".join(items)


def _decode(data: bytes) -> list[Event]:
    """The events of one datagram (a single ``[collection, generation]`` too, as older versions sent).

    Raises ValueError (or a msgpack error) on anything else.
    """
    decoded = msgpack.unpackb(data, raw=False)
    if not isinstance(decoded, list):
        raise ValueError("not a list")
    if len(decoded) == 2 and isinstance(decoded[0], str):
        decoded = [decoded]
    events: list[Event] = []
    for name, generation in decoded:
        if not isinstance(name, str) or not (generation is None or isinstance(generation, bytes)):
            raise ValueError("not an event")
        events.append((name, generation))
    return events


class NoticeSource:
    """The listening socket of a process whose own event loop reads it (see :meth:`Wakeup.hand_over`).

    Register :meth:`fileno` for reading in the loop and call :meth:`drain` each time it is readable;
    :meth:`release` gives the socket back to a thread (call it before the loop stops watching).
    """

    def __init__(self, wakeup: Wakeup, listener: socket.socket, deliver: Deliver) -> None:
        self._wakeup = wakeup
        self._listener = listener
        self._deliver = deliver
        self.released = False

    def fileno(self) -> int:
        return self._listener.fileno()

    def drain(self) -> int:
        """Receives every queued datagram (at most a few hundred) without blocking and delivers their
        events in the calling thread; returns how many datagrams it took."""
        taken = 0
        recv, deliver, wakeup = self._listener.recv, self._deliver, self._wakeup
        while taken < _DRAIN_MAX and not self.released:
            try:
                data = recv(_MAX_DATAGRAM, socket.MSG_DONTWAIT)
            except (BlockingIOError, InterruptedError):
                break
            except OSError:  # closed under us: the store is closing
                break
            taken += 1
            wakeup.deliver_datagram(data, deliver)
        return taken

    def release(self) -> None:
        """Stops reading in the caller: the process's thread reads the socket again (if it still listens)."""
        if not self.released:
            self.released = True
            self._wakeup.take_back(self)


class Wakeup:
    """Tells the other processes of one data directory about commits, and hears about theirs."""

    def __init__(self, data_dir: Path) -> None:
        self.directory = data_dir / "wake"
        self._sender: socket.socket | None = None
        self._sender_lock = threading.Lock()
        self._listener: socket.socket | None = None
        self._deliver: Deliver | None = None
        self._thread: threading.Thread | None = None
        self._source: NoticeSource | None = None  # the caller's loop reads the socket (hand_over)
        self._state_lock = threading.Lock()
        self._id: str | None = None
        self.dropped = 0  # datagrams not sent because a peer's queue was full
        self.received = 0  # datagrams received from other processes
        self.malformed = 0  # datagrams received that were not events
        self.missed = 0  # times this process found itself marked as having missed notices

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

    def notify(self, events: Sequence[Event]) -> None:
        """Sends ``events`` to every other listening process; never waits.

        An event is (collection, generation id) for a commit, (collection, None) for a deletion.
        """
        peers = self._peers()
        if not peers or not events:
            return
        payloads = _encode(events)
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
                        self._mark(peer)
                        break  # the peer re-reads everything once it sees the mark
                    except OSError:
                        _log.exception("telling process %s about a commit failed", peer)
                        break

    def _mark(self, peer: str) -> None:
        """Tells ``peer`` it missed a notice: one byte appended to its registration (see the module)."""
        try:
            fd = os.open(self.directory / peer, os.O_WRONLY | os.O_APPEND)  # no O_CREAT: gone stays gone
        except OSError:
            return
        try:
            os.write(fd, b"!")
        except OSError:
            pass
        finally:
            os.close(fd)

    def check_missed(self) -> int:
        """How many times this process was found to have missed notices (another process could not send
        it one), the marks seen now included: a caller whose last figure differs re-reads what it waits
        for. Clears the marks; one ``stat`` when there are none."""
        with self._state_lock:
            peer = self._id
            if peer is None:
                return self.missed
            registration = self.directory / peer
            try:
                if registration.stat().st_size == 0:
                    return self.missed
                os.truncate(registration, 0)  # before the re-read: a mark made after it is seen next time
            except OSError:
                return self.missed
            self.missed += 1
            return self.missed

    def _forget(self, peer: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.directory / peer)

    def _bind(self, deliver: Deliver) -> socket.socket:
        """This process's listening socket, bound and registered on the first call."""
        if self._listener is None:
            peer = uuid.uuid4().hex
            self.directory.mkdir(exist_ok=True)
            listener = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, _RECEIVE_BUFFER)
            listener.bind(self._address(peer))
            self._listener, self._id, self._deliver = listener, peer, deliver
            (self.directory / peer).touch()  # registered only once it can receive
        return self._listener

    def listen(self, deliver: Deliver) -> None:
        """Hears other processes' events: ``deliver(collection, generation_id or None)``, in a thread of
        its own unless the socket was handed over to the caller's loop (:meth:`hand_over`)."""
        with self._state_lock:
            listener = self._bind(deliver)
            if self._thread is None and self._source is None:
                self._start_thread(listener)

    def hand_over(self, deliver: Deliver) -> NoticeSource | None:
        """Hands the reading of the listening socket (bound now if it was not) to the caller's event loop:
        the thread stops (or never starts) until the source is released. None while another loop holds
        the source (one at a time): that loop's thread then delivers to every listener."""
        with self._state_lock:
            if self._source is not None:
                return None
            listener = self._bind(deliver)
            self._stop_thread()
            self._source = NoticeSource(self, listener, self._deliver or deliver)
            return self._source

    def take_back(self, source: NoticeSource) -> None:
        """``source`` is released: the thread reads the socket again if the process still listens."""
        with self._state_lock:
            if self._source is not source:
                return
            self._source = None
            if self._listener is not None:
                self._start_thread(self._listener)

    def _start_thread(self, listener: socket.socket) -> None:
        deliver = self._deliver
        assert deliver is not None
        self._thread = threading.Thread(
            target=self._receive, args=(listener, deliver), name="diffstore-wakeup", daemon=True
        )
        self._thread.start()

    def _stop_thread(self) -> None:
        """Stops the thread once it has delivered what was queued before the stop (the rest stays queued)."""
        thread, self._thread = self._thread, None
        if thread is None or self._id is None:
            return
        with contextlib.suppress(OSError):
            stopper = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
            with stopper:
                stopper.settimeout(5)
                stopper.sendto(_STOP, self._address(self._id))
        thread.join(timeout=5)

    def deliver_datagram(self, data: bytes, deliver: Deliver) -> None:
        """Delivers the events of one received datagram (an empty one stops nothing here)."""
        if data == _STOP:
            return
        try:
            events = _decode(data)
        except Exception:
            self.malformed += 1
            _log.warning("ignored a malformed commit notice of %d bytes", len(data))
            return
        self.received += 1
        for name, generation_id in events:
            deliver(name, generation_id)

    def _receive(self, listener: socket.socket, deliver: Deliver) -> None:
        while True:
            try:
                data = listener.recv(_MAX_DATAGRAM)
            except OSError:
                return
            if data == _STOP:
                return
            self.deliver_datagram(data, deliver)

    def close(self) -> None:
        """Unregisters and stops listening; a later call is a no-op."""
        with self._state_lock:
            listener, peer = self._listener, self._id
            self._listener = None
            if listener is not None and peer is not None:
                self._forget(peer)
                self._stop_thread()
                if self._source is not None:
                    self._source.released = True
                    self._source = None
                listener.close()
                if not _ABSTRACT:
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(self._address(peer))
        with self._sender_lock:
            if self._sender is not None:
                self._sender.close()
                self._sender = None
