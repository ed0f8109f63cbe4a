"""One socket write per response: a transport that joins a response's head and body.

uvicorn writes a response's status line and headers in ``send(http.response.start)`` and its body in the
next ``send``; on uvloop each write is a ``send()`` system call at once, and on loopback each call also
wakes the client. :class:`CoalescingTransport` holds a write while nothing else is pending and sends it
together with the next one, so a response is one system call and one segment -- half the kernel work of
every answer, a large part of the cost of answering a thousand long polls at once.

Invariants:
    * Bytes leave in the order they were written; at most one write is held at a time.
    * A held write is sent by the next write, by ``close``/``write_eof``, or at the latest by a callback
      scheduled when it was held (the next pass of the event loop): a head whose body is late is delayed
      by one loop pass, never lost.
    * ``abort`` drops a held write, as it drops the transport's own buffer.

uvicorn's protocol is given this transport in :mod:`diffstore.server.uvicorn_adapter`.
"""

from __future__ import annotations

import asyncio
from typing import Any

JOIN_MAX_BYTES = 64 * 1024  # up to this size a body is copied behind the head; past it, a vectored write


class CoalescingTransport:
    """Wraps a write transport: a write is held until the next one, then both go out as one."""

    __slots__ = ("_transport", "_loop", "_held")

    def __init__(self, transport: Any, loop: asyncio.AbstractEventLoop) -> None:
        self._transport = transport
        self._loop = loop
        self._held: bytes | None = None

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if not data:
            return
        held = self._held
        if held is None:
            self._held = bytes(data)
            self._loop.call_soon(self.flush)
        else:
            self._held = None
            if len(data) <= JOIN_MAX_BYTES:
                self._transport.write(held + data)
            else:  # a big body is not copied: one vectored write
                self._transport.writelines((held, data))

    def write_now(self, data: bytes) -> None:
        """Writes ``data`` at once (after a held write, if any): for a response that is whole already."""
        if self._held is not None:
            self.flush()
        self._transport.write(data)

    def writelines(self, chunks: Any) -> None:
        self.write(b"".join(chunks))

    def flush(self) -> None:
        """Sends the held write, if any (a transport closed meanwhile drops it, as it drops late writes)."""
        held = self._held
        if held is not None:
            self._held = None
            if not self._transport.is_closing():
                self._transport.write(held)

    def write_eof(self) -> None:
        self.flush()
        self._transport.write_eof()

    def close(self) -> None:
        self.flush()
        self._transport.close()

    def abort(self) -> None:
        self._held = None
        self._transport.abort()

    def get_write_buffer_size(self) -> int:
        return int(self._transport.get_write_buffer_size()) + len(self._held or b"")

    def __getattr__(self, name: str) -> Any:  # reads, extra info, buffer limits: the transport's own
        return getattr(self._transport, name)
