"""Everything diffstore knows of uvicorn's insides, in one module, checked against the installed uvicorn.

uvicorn's public interface is ASGI, ``uvicorn.Config`` and ``uvicorn.Server``. Beyond it the server uses:

* ``HttpToolsProtocol``, subclassed (:func:`protocol_class`): responses go out through a
  :class:`~diffstore.server.transport.CoalescingTransport` (one write per response), and half-sent
  requests are closed after a read timeout (headers: ``ServerConfig.header_timeout_s`` from the first
  byte -- or from the connection, for one that sends nothing; body: ``body_timeout_s`` between chunks,
  and a minimum rate, ``body_min_rate_bytes_s``, over the whole body). A request its parser refuses (a
  URL over 64 KiB, a bad byte in a header) is answered with the SPEC §2 error body, 400
  ``invalidRequest``, instead of uvicorn's plain text (``send_400_response``).
* ``RequestResponseCycle``'s state and ``STATUS_LINE``: a long-poll fan-out writes each answer as one
  whole response straight to the connection (:func:`direct_cycle`, :func:`write_directly`,
  :func:`finish_directly`; see :mod:`diffstore.server.longpoll`).
* Parking (:func:`park`, :class:`Parked`): a long poll that has to wait ends its ASGI call at once and
  leaves its connection to :class:`Parked`, which writes the answer when it comes and then does what
  uvicorn's ``send`` does at the end of a response. Meanwhile the protocol holds back what the client
  sends (it belongs to the next request) and tells the parked request when the client goes.
* Aborting a stalled response's connection (:func:`abort_connection`: ``GET /backup``).
* ``Server._captured_signals``: the signals a graceful shutdown caught (:func:`take_captured_signals`).
* ``RequestResponseCycle.access_logger``: replaced per request by a :class:`TimedAccessLog`, so that
  each access line also says how long the request took (from its first byte to its response's end).

``pyproject.toml`` pins uvicorn to :data:`SUPPORTED`. At start-up :func:`mismatch` checks the installed
uvicorn against it and against the names used here; on a mismatch the server logs why and runs on
uvicorn's own protocol with plain ASGI sends (no coalescing, no direct answers, no read timeouts beyond
uvicorn's own). ``tests/server/test_uvicorn_adapter.py`` fails loudly when the installed uvicorn stops
matching.
"""

from __future__ import annotations

import asyncio
import logging
import sys
from collections.abc import Callable
from functools import cache
from typing import Any

import uvicorn
from uvicorn.protocols.http import httptools_impl
from uvicorn.protocols.utils import get_client_addr, get_path_with_query_string

from diffstore.errors import InvalidRequest
from diffstore.server.transport import CoalescingTransport
from diffstore.wire import JSON, error_to_wire

SUPPORTED = ((0, 29), (0, 55))  # [lower, upper): the versions pyproject.toml admits
HELD_BACK_MAX_BYTES = 64 * 1024  # what a parked connection reads ahead before it pauses reading
_log = logging.getLogger("diffstore.server")

_CYCLE_ATTRIBUTES = (
    "response_started",
    "response_complete",
    "disconnected",
    "flow",
    "transport",
    "keep_alive",
    "default_headers",
    "message_event",
    "on_response",
    "access_log",
    "access_logger",
    "scope",
)
_PROTOCOL_METHODS = (
    "data_received",
    "connection_made",
    "connection_lost",
    "on_message_begin",
    "on_headers_complete",
    "on_body",
    "on_message_complete",
    "on_response_complete",
    "send_400_response",
)


def _version(text: str) -> tuple[int, ...]:
    parts = []
    for part in text.split(".")[:3]:
        digits = "".join(ch for ch in part if ch.isdigit())
        parts.append(int(digits or 0))
    return tuple(parts)


@cache
def mismatch() -> str | None:
    """Why the installed uvicorn does not match what this module expects (None: it matches)."""
    version = _version(uvicorn.__version__)
    if not SUPPORTED[0] <= version < SUPPORTED[1]:
        return f"uvicorn {uvicorn.__version__} is outside the supported range {SUPPORTED}"
    missing = [
        name
        for name in ("STATUS_LINE", "HttpToolsProtocol", "RequestResponseCycle")
        if not hasattr(httptools_impl, name)
    ]
    missing += [name for name in _PROTOCOL_METHODS if not hasattr(httptools_impl.HttpToolsProtocol, name)]
    if not hasattr(uvicorn.Server, "capture_signals"):
        missing.append("Server.capture_signals")
    if missing:
        return f"uvicorn {uvicorn.__version__} lacks {', '.join(missing)}"
    return None


def http_protocol(header_timeout_s: float, body_timeout_s: float, body_min_rate_bytes_s: int = 0) -> Any:
    """The ``http`` option of ``uvicorn.Config``: our protocol class, or uvicorn's own on a mismatch."""
    reason = mismatch()
    if reason is not None:
        _log.warning("%s: serving with uvicorn's own protocol and plain ASGI sends", reason)
        return "httptools"
    return protocol_class(header_timeout_s, body_timeout_s, body_min_rate_bytes_s)


@cache
def protocol_class(header_timeout_s: float, body_timeout_s: float, body_min_rate_bytes_s: int = 0) -> type:
    """uvicorn's httptools protocol writing through a coalescing transport, with read timeouts.

    A body is closed when it stalls ``body_timeout_s`` between two chunks, or (with a minimum rate) when
    it has not arrived within ``body_timeout_s`` plus one second per ``body_min_rate_bytes_s`` bytes
    received (Apache's ``mod_reqtimeout`` ``MinRate``): a slow sender holds what it sent of the in-flight
    budget for a bounded time. Time during which the server itself holds the body back (reading paused:
    a request pipelined behind another, an app that has not taken what came) is not counted.
    """
    base: type = httptools_impl.HttpToolsProtocol
    per_byte_s = 1.0 / body_min_rate_bytes_s if body_min_rate_bytes_s > 0 else 0.0

    class Protocol(base):  # type: ignore[misc]
        _read_timer: asyncio.TimerHandle | None = None
        parks = True  # park() may hold this protocol's connection for a long poll
        parked: Parked | None = None
        held_back = b""  # bytes received while parked: the next request's, fed to the parser after
        # the body being read: when its clock started, when its last chunk came, how much came since
        _body_started = 0.0
        _body_last = 0.0
        _body_received = 0
        _request_started = 0.0  # the loop's time of the request's first byte (its access line's clock)

        def data_received(self, data: bytes) -> None:
            parked = self.parked
            if parked is not None and parked.owed is not None:  # answered, its bookkeeping left for later
                parked.finish(parked.owed)
                parked = self.parked
            if parked is None:
                super().data_received(data)
                return
            self.held_back += data
            if len(self.held_back) > HELD_BACK_MAX_BYTES:  # a client that will not wait: stop reading it
                self.flow.pause_reading()

        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            super().connection_made(CoalescingTransport(transport, self.loop))
            self._arm(header_timeout_s)  # a connection that never sends a request is closed too

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            parked, self.parked = self.parked, None
            if parked is not None:
                parked.on_lost()
            super().connection_lost(exc)

        def on_message_begin(self) -> None:
            super().on_message_begin()
            self._request_started = self.loop.time()
            if self._read_timer is None:
                self._arm(header_timeout_s)

        def on_headers_complete(self) -> None:
            self._disarm()
            if body_timeout_s > 0:
                self._body_started = self._body_last = self.loop.time()
                self._body_received = 0
                self._read_timer = self.loop.call_later(body_timeout_s, self._body_check)
            super().on_headers_complete()
            cycle = getattr(self, "cycle", None)
            if cycle is not None and cycle.access_log:
                cycle.access_logger = TimedAccessLog(
                    cycle.access_logger, self._request_started, self.loop.time
                )

        def on_body(self, body: bytes) -> None:
            # no timer per chunk: the one armed is due no later than the deadline these move forward
            self._body_last = self.loop.time()
            self._body_received += len(body)
            super().on_body(body)

        def on_message_complete(self) -> None:
            self._disarm()
            super().on_message_complete()

        def send_400_response(self, msg: str) -> None:
            # uvicorn calls this in its ``except`` clause of the parser's error, which says what was wrong
            self.transport.write(bad_request(sys.exc_info()[1], self.server_state.default_headers))
            self.transport.close()

        def _arm(self, seconds: float) -> None:
            self._disarm()
            if seconds > 0:
                self._read_timer = self.loop.call_later(seconds, self._read_timed_out)

        def _disarm(self) -> None:
            if self._read_timer is not None:
                self._read_timer.cancel()
                self._read_timer = None

        def _read_timed_out(self) -> None:
            """A request (or the first one) was not read whole in time: the connection is closed."""
            self._read_timer = None
            if not self.transport.is_closing():
                self.transport.close()

        def _body_check(self) -> None:
            """Closes the connection if its body is late, else waits for its (moved) deadline."""
            now = self.loop.time()
            if self.flow.read_paused:  # the server holds the body back: its clock starts again after
                self._body_started = self._body_last = now
                self._body_received = 0
            deadline = self._body_last + body_timeout_s
            if per_byte_s:
                allowed_s = body_timeout_s + self._body_received * per_byte_s
                deadline = min(deadline, self._body_started + allowed_s)
            if now < deadline:
                self._read_timer = self.loop.call_at(deadline, self._body_check)
            else:
                self._read_timed_out()

    Protocol.__name__ = Protocol.__qualname__ = "DiffstoreHttpToolsProtocol"
    return Protocol


class TimedAccessLog:
    """uvicorn's access logger for one request: each line it logs ends with how long the request took
    (`` in 1.2 ms``), and its record carries the duration as a sixth argument (``duration_ms`` in JSON
    logs, see :mod:`diffstore.logs`)."""

    def __init__(self, logger: logging.Logger, started: float, clock: Callable[[], float]) -> None:
        self.logger, self.started, self.clock = logger, started, clock

    def info(self, message: str, *args: Any) -> None:
        duration_ms = round((self.clock() - self.started) * 1000, 3)
        self.logger.info(message + " in %s ms", *args, duration_ms)

    def __getattr__(self, name: str) -> Any:  # anything else uvicorn may ask of its logger
        return getattr(self.logger, name)


def bad_request(error: BaseException | None, default_headers: Any) -> bytes:
    """The whole 400 ``invalidRequest`` response (JSON, the connection closed) to a request the parser
    refused with ``error`` (httptools names the cause, e.g. a URL too long, in the error's context)."""
    cause = (error.__context__ or error) if error is not None else None
    reason = (
        f"malformed HTTP request: {cause}" if cause is not None and str(cause) else "malformed HTTP request"
    )
    refused = InvalidRequest(reason)
    body = JSON.dumps(error_to_wire(refused.code, refused.reason))
    parts = [httptools_impl.STATUS_LINE[400]]
    for name, value in default_headers:
        parts += (name, b": ", value, b"\r\n")
    parts += (
        b"content-type: %s\r\ncontent-length: %d\r\nconnection: close\r\n\r\n"
        % (JSON.content_type.encode(), len(body)),
        body,
    )
    return b"".join(parts)


def take_captured_signals(server: uvicorn.Server) -> list[int]:
    """The signals ``server.capture_signals`` caught, forgotten so that uvicorn does not re-raise them."""
    captured = getattr(server, "_captured_signals", None)
    if not isinstance(captured, list):
        return []
    taken = list(captured)
    captured.clear()
    return taken


# --- long-poll answers written straight to uvicorn's request cycle -----------------------------------

Answer = tuple[Any, Any]  # the two ASGI messages of a response (longpoll.encode_answer)
Rendered = dict[tuple[int, int, bool], bytes]  # (id(answer), id(uvicorn's default headers), keep-alive)


def direct_cycle(raw_send: Any) -> Any:
    """The uvicorn httptools request cycle behind ``raw_send``, if answers can be written to it directly.

    None for any other server, a uvicorn that does not match (:func:`mismatch`), or a cycle that lacks an
    attribute :func:`write_directly` and :func:`finish_directly` use: the caller then sends the ASGI
    messages. Checked once, when a waiter registers, so that a fan-out pass only reads the cycle's state.
    """
    cycle = getattr(raw_send, "__self__", None)
    if mismatch() is not None or type(cycle) is not httptools_impl.RequestResponseCycle:
        return None
    if not all(hasattr(cycle, name) for name in _CYCLE_ATTRIBUTES):
        return None
    return cycle


def render(answer: Answer, default_headers: Any, keep_alive: bool) -> bytes:
    """``answer`` as the bytes uvicorn's ``send`` would write: its status line and headers, ours, the body."""
    parts = [httptools_impl.STATUS_LINE[answer[0]["status"]]]
    for name, value in (*default_headers, *answer[0]["headers"]):
        parts += (name, b": ", value, b"\r\n")
    if not keep_alive:
        parts.append(b"connection: close\r\n")
    parts += (b"\r\n", answer[1]["body"])
    return b"".join(parts)


def abandon_if_gone(cycle: Any) -> bool:
    """True if ``cycle``'s connection is closing: the cycle is then marked disconnected and its app woken
    (its ``receive()`` returns ``http.disconnect``).

    uvicorn marks only a connection's newest request disconnected when the client goes; a request with
    another pipelined behind it would otherwise wait for ever, and writing to it fails on uvloop.
    """
    if not cycle.transport.is_closing():
        return False
    cycle.disconnected = True
    cycle.message_event.set()
    return True


def abort_connection(raw_send: Any) -> bool:
    """Drops the connection of the request behind ``raw_send`` at once (RST: nothing it buffered is sent)
    and marks its cycle disconnected, so that its pending and later sends return and uvicorn logs no
    unfinished response. False when it cannot (not uvicorn's httptools cycle): the caller ends it its way.

    A response that stalled (a client that stopped reading) ends this way: a graceful close would wait
    for the client to read what is buffered.
    """
    cycle = direct_cycle(raw_send) if raw_send is not None else None
    if cycle is None:
        return False
    cycle.transport.abort()
    cycle.disconnected = True
    cycle.message_event.set()
    cycle.flow.resume_writing()
    return True


def write_directly(cycle: Any, answer: Answer, rendered: Rendered) -> bool:
    """Writes ``answer`` as one whole response to ``cycle`` (see :func:`direct_cycle`) if it can take it now.

    False -- nothing done -- once the cycle has started a response, lost its client or paused writing;
    the caller then uses the ASGI sends. On True the caller completes the cycle with
    :func:`finish_directly` (the bookkeeping that lets the connection serve on). ``rendered`` caches
    whole responses across the waiters of one pass.
    """
    if cycle.response_started or cycle.disconnected or cycle.flow.write_paused:
        return False
    default_headers, keep_alive = cycle.default_headers, cycle.keep_alive
    key = (id(answer), id(default_headers), keep_alive)
    data = rendered.get(key)
    if data is None:
        data = rendered[key] = render(answer, default_headers, keep_alive)
    cycle.response_started = cycle.response_complete = True
    transport = cycle.transport
    if type(transport) is CoalescingTransport:
        transport.write_now(data)
    else:
        transport.write(data)
    return True


def finish_directly(cycle: Any, status: int) -> None:
    """What uvicorn's ``send`` does once a response is complete: log it, wake the app, let the
    connection take its next request (or close it)."""
    cycle.message_event.set()
    _end_response(cycle, status, cycle.on_response)


class Parked:
    """A request whose ASGI call has ended before its answer: the connection is held until :meth:`finish`.

    Made by :func:`park`. The cycle counts as answered for uvicorn, so the app's call returns without a
    500; the protocol holds back further bytes of the client and calls ``on_lost`` if the client goes.
    The answer goes out with :meth:`write` (one whole response) and :meth:`finish` (uvicorn's
    end-of-response bookkeeping, after which the connection reads its next request). A fan-out may leave
    :meth:`finish` for later by setting :attr:`owed`: the client has its answer, and the protocol finishes
    the request itself before it reads anything more from that client.
    """

    __slots__ = ("cycle", "protocol", "on_response", "on_lost", "shape", "send", "owed")

    def __init__(self, cycle: Any, protocol: Any, on_lost: Callable[[], None]) -> None:
        self.cycle = cycle
        self.protocol = protocol
        self.on_response = cycle.on_response  # uvicorn replaces the cycle's own once the app returns
        self.on_lost = on_lost
        # What the bytes of an answer depend on besides the answer: waiters of one shape share them.
        # Neither changes while parked (uvicorn's shutdown closes a completed cycle's connection instead).
        self.shape = (id(cycle.default_headers), cycle.keep_alive)
        transport = cycle.transport
        self.send: Callable[[bytes], None] = (
            transport.write_now if type(transport) is CoalescingTransport else transport.write
        )
        # The status of an answer written whose :meth:`finish` is still to come: it comes at the latest
        # when the client sends its next request (the protocol calls it before reading a byte of it).
        self.owed: int | None = None

    def render(self, answer: Answer) -> bytes:
        """``answer`` as the whole response :meth:`send` writes (see :func:`render`)."""
        return render(answer, self.cycle.default_headers, self.cycle.keep_alive)

    def write(self, answer: Answer) -> bool:
        """Writes ``answer`` as one whole response (a fan-out renders once per shape: :meth:`write_bytes`).

        False: the connection is closed already (its ``on_lost`` comes, or came, from the protocol).
        """
        return self.write_bytes(self.render(answer))

    def write_bytes(self, data: bytes) -> bool:
        """Writes a whole response rendered by :meth:`render`; False as :meth:`write`."""
        try:
            self.send(data)
        except RuntimeError:  # uvloop refuses writes to a closed handle; asyncio drops them silently
            return False
        return True

    def finish(self, status: int) -> None:
        """What uvicorn's ``send`` does once a response is complete; then the held-back bytes are read.

        Once only: later calls, and calls after the connection was lost, do nothing.
        """
        protocol = self.protocol
        if protocol.parked is not self:
            return
        protocol.parked = None
        self.owed = None
        cycle = self.cycle
        _end_response(cycle, status, self.on_response)
        held, protocol.held_back = protocol.held_back, b""
        if held and not cycle.transport.is_closing():
            protocol.data_received(held)


def park(cycle: Any, on_lost: Callable[[], None]) -> Parked | None:
    """Parks the request of ``cycle`` (see :class:`Parked`), or returns None if it cannot be parked.

    It can when ``cycle`` (from :func:`direct_cycle`) is its connection's current request, nothing of a
    response has gone out, no later request is queued behind it and the connection is open, on this
    module's protocol. The caller's ASGI call must then return without sending anything.
    """
    protocol: Any = getattr(cycle.on_response, "__self__", None)
    if (
        not getattr(protocol, "parks", False)
        or protocol.cycle is not cycle
        or protocol.pipeline
        or cycle.response_started
        or cycle.disconnected
        or cycle.transport.is_closing()
    ):
        return None
    parked = Parked(cycle, protocol, on_lost)
    cycle.response_started = cycle.response_complete = True
    protocol.parked = parked
    return parked


def _end_response(cycle: Any, status: int, on_response: Callable[[], None]) -> None:
    """uvicorn's end of a complete response: the access log, the close of a connection not kept alive,
    and ``on_response`` (the protocol's: it arms the keep-alive timer and reads the next request)."""
    if cycle.access_log:
        scope = cycle.scope
        cycle.access_logger.info(
            '%s - "%s %s HTTP/%s" %d',
            get_client_addr(scope),
            scope["method"],
            get_path_with_query_string(scope),
            scope["http_version"],
            status,
        )
    if not cycle.keep_alive:
        cycle.transport.close()
    on_response()
