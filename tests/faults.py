"""The fault harness ("nemesis") of the process tests: kill -9, pauses, and a TCP proxy that misbehaves.

- :func:`kill9` sends SIGKILL to a process, or to its whole process group (a child started with
  ``start_new_session=True`` leads its own group, so its own children die with it), and reaps it.
- :func:`paused` is a context manager that SIGSTOPs a process (or its group) and always SIGCONTs it on
  the way out, whatever the body raised; :func:`pause` holds it stopped for a number of seconds (the
  length of a fault, not a wait for a condition). :func:`wait_stopped` waits until the kernel shows the
  process stopped (a signal is delivered asynchronously).
- :class:`TcpProxy` sits on 127.0.0.1 between a client and a server. An asyncio loop in a thread of the
  test process pumps each connection's two directions; the test switches it at run time, and each switch
  has taken effect when the call returns:

  ======================  ====================================================================
  ``passing()``            bytes flow (the initial mode; also ends a delay or a stall)
  ``delay(ms)``            every chunk, in either direction, waits ``ms`` before it is forwarded
  ``stall()``              chunks are held (not forwarded, and no more read, so TCP's window
                           fills and the sender blocks) until ``passing()`` releases them in order
  ``cut(refuse=True)``     every current connection is aborted (RST); with ``refuse`` new ones are
                           accepted and at once reset until ``accept()`` (the listener keeps its port)
  ======================  ====================================================================

  ``close()`` (or leaving the ``with`` block) aborts every connection, stops the listener, the loop and
  the thread.

Only the test process runs this module: the processes under test see a plain server address.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import struct
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from tests.helpers import wait_until

WAIT_S = 30.0
_CHUNK = 65536

Process = subprocess.Popen[Any] | int


def _pid(process: Process) -> int:
    return process if isinstance(process, int) else process.pid


def _signal(process: Process, signum: int, group: bool) -> None:
    pid = _pid(process)
    if group:
        os.killpg(os.getpgid(pid), signum)
    else:
        os.kill(pid, signum)


def kill9(process: Process, *, group: bool = False, timeout: float = WAIT_S) -> None:
    """SIGKILLs ``process`` (with ``group``: its whole process group) and reaps it when it is our child.

    A process already gone is not an error. With ``group`` the process must lead its group
    (``start_new_session=True``), else the test process's own group would be killed: refused.
    """
    pid = _pid(process)
    if group and os.getpgid(pid) == os.getpgrp():
        raise ValueError(f"process {pid} is in the test's own process group; start it with start_new_session")
    with contextlib.suppress(ProcessLookupError):
        _signal(process, signal.SIGKILL, group)
    if isinstance(process, subprocess.Popen):
        process.wait(timeout)


def process_state(pid: int) -> str:
    """The one-letter state in ``/proc/<pid>/stat`` (``T`` stopped, ``Z`` zombie, ``R``/``S`` running)."""
    with open(f"/proc/{pid}/stat") as stat:
        # the command name is in parentheses and may hold spaces: the state follows the last ')'
        return stat.read().rsplit(")", 1)[1].split()[0]


def wait_stopped(process: Process, timeout: float = WAIT_S) -> None:
    """Waits until the kernel shows ``process`` stopped (SIGSTOP is delivered asynchronously)."""
    pid = _pid(process)
    wait_until(lambda: process_state(pid) in "tT", timeout, what=f"process {pid} stopped")


@contextlib.contextmanager
def paused(process: Process, *, group: bool = False) -> Iterator[None]:
    """SIGSTOPs ``process`` (or its group) for the body of the ``with``, then SIGCONTs it, always.

    The process is stopped when the body starts (:func:`wait_stopped`, for a single process).
    """
    _signal(process, signal.SIGSTOP, group)
    try:
        if not group:
            wait_stopped(process)
        yield
    finally:
        with contextlib.suppress(ProcessLookupError):
            _signal(process, signal.SIGCONT, group)


def pause(process: Process, seconds: float, *, group: bool = False) -> None:
    """Holds ``process`` stopped for ``seconds`` (the length of the fault), then resumes it."""
    with paused(process, group=group):
        time.sleep(seconds)


@dataclass(eq=False)  # hashed by identity: a set of the open links
class _Link:
    """One proxied connection: the client's and the server's streams."""

    client: asyncio.StreamWriter
    server: asyncio.StreamWriter

    def abort(self) -> None:
        for writer in (self.client, self.server):
            writer.transport.abort()


class TcpProxy:
    """A TCP proxy on 127.0.0.1 towards ``upstream`` (``host:port``), switchable at run time.

    Use as a context manager, or call :meth:`start` and :meth:`close`. ``address`` is ``127.0.0.1:PORT``.
    """

    def __init__(self, upstream: str, port: int = 0) -> None:
        host, _, upstream_port = upstream.rpartition(":")
        self.upstream = (host, int(upstream_port))
        self._port = port
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="tcp-proxy", daemon=True)
        self._server: asyncio.Server | None = None
        self._links: set[_Link] = set()
        self._flowing: asyncio.Event | None = None  # cleared while stalled
        self._delay_s = 0.0
        self._refusing = False
        self.connections = 0  # connections accepted and joined to the upstream, ever
        self.forwarded = 0  # bytes forwarded, both directions
        self.held = 0  # chunks read and not yet forwarded (waiting for a delay or a release)

    # -- life cycle ---------------------------------------------------------------------------------

    def start(self) -> TcpProxy:
        self._thread.start()
        self._call(self._start())
        return self

    async def _start(self) -> None:
        self._flowing = asyncio.Event()
        self._flowing.set()
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", self._port)

    @property
    def port(self) -> int:
        assert self._server is not None, "start() first"
        port: int = self._server.sockets[0].getsockname()[1]
        return port

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def close(self) -> None:
        if not self._thread.is_alive():
            self._loop.close()
            return
        self._call(self._close())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(WAIT_S)
        self._loop.close()

    async def _close(self) -> None:
        if self._server is not None:
            self._server.close()
        self._abort_all()
        assert self._flowing is not None
        self._flowing.set()  # pumps waiting for a release see their link gone and end
        if self._server is not None:
            await self._server.wait_closed()
        tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def __enter__(self) -> TcpProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- switches (each has taken effect when it returns) -------------------------------------------

    def passing(self) -> None:
        """Bytes flow again: ends a delay and releases a stall (held chunks go first, in order)."""
        self._call(self._set(delay_s=0.0, flowing=True))

    def delay(self, ms: float) -> None:
        """Each chunk waits ``ms`` milliseconds before it is forwarded (one direction's chunks in order)."""
        self._call(self._set(delay_s=ms / 1000, flowing=True))

    def stall(self) -> None:
        """Holds every chunk, both directions, until :meth:`passing`; connections stay open."""
        self._call(self._set(delay_s=self._delay_s, flowing=False))

    def cut(self, *, refuse: bool = True) -> None:
        """Aborts every current connection; with ``refuse``, resets new ones until :meth:`accept`."""
        self._call(self._cut(refuse))

    def accept(self) -> None:
        """New connections are served again (after ``cut(refuse=True)``)."""
        self._call(self._cut_refusing(False))

    @property
    def open_connections(self) -> int:
        return len(self._links)

    async def _set(self, delay_s: float, flowing: bool) -> None:
        assert self._flowing is not None
        self._delay_s = delay_s
        if flowing:
            self._flowing.set()
        else:
            self._flowing.clear()

    async def _cut(self, refuse: bool) -> None:
        self._refusing = refuse
        self._abort_all()

    async def _cut_refusing(self, refusing: bool) -> None:
        self._refusing = refusing

    def _abort_all(self) -> None:
        for link in list(self._links):
            link.abort()
        self._links.clear()

    def _call(self, coroutine: Any) -> None:
        asyncio.run_coroutine_threadsafe(coroutine, self._loop).result(WAIT_S)

    # -- the pumps ----------------------------------------------------------------------------------

    async def _serve(self, client_reader: asyncio.StreamReader, client: asyncio.StreamWriter) -> None:
        if self._refusing:
            _reset(client)
            return
        try:
            server_reader, server = await asyncio.open_connection(*self.upstream)
        except OSError:
            _reset(client)
            return
        link = _Link(client, server)
        self._links.add(link)
        self.connections += 1
        try:
            await asyncio.gather(
                self._pump(client_reader, server, link), self._pump(server_reader, client, link)
            )
        except asyncio.CancelledError:
            # close() cancels the links' tasks; asyncio's done-callback of a connection handler asks a
            # cancelled one for its exception and logs the CancelledError as unhandled: end it quietly
            return
        finally:
            self._links.discard(link)
            link.abort()

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, link: _Link) -> None:
        assert self._flowing is not None
        try:
            while chunk := await reader.read(_CHUNK):
                self.held += 1
                try:
                    if self._delay_s:
                        await asyncio.sleep(self._delay_s)
                    await self._flowing.wait()
                finally:
                    self.held -= 1
                if link not in self._links:  # cut while this chunk was held
                    return
                self.forwarded += len(chunk)  # before the write: a reader that got the bytes sees the count
                writer.write(chunk)
                await writer.drain()
            if writer.can_write_eof():
                writer.write_eof()  # a half-close passes through
        except (ConnectionError, OSError):
            link.abort()


def _reset(writer: asyncio.StreamWriter) -> None:
    """Closes a connection with a RST (linger 0) rather than an orderly FIN: what a refused peer sees."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()
