"""The I/O edge of the client: turns a :class:`Call` into an HTTP exchange over httpx, sync or async.

Everything that is not the socket itself — building the request, choosing the codec of the answer,
turning an error answer into the diffstore exception of the same code — is a pure function shared by
:class:`SyncTransport` and :class:`AsyncTransport`, which only move bytes.

Errors:
    * an error answer ``{"error": code, "reason": ...}`` raises the class of that code
      (:func:`diffstore.errors.error_from_code`), so callers catch the same classes as with the engine;
      an answer without that shape (a proxy, diffbelt's bare 500s) raises by HTTP status;
    * a transport failure (refused connection, timeout, broken stream) raises
      :class:`~diffstore.errors.StorageError` — the store is unreachable, not the caller's fault —
      translated in :func:`translated_transport_errors` only, ``from`` the httpx exception.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

import httpx
import msgpack

from diffstore import tls
from diffstore.client._calls import Call
from diffstore.client._failover import DEFAULT_WAIT_S, perform, run_async, run_sync
from diffstore.client._leader import LeaderFinder, split_urls
from diffstore.errors import (
    BadRequest,
    Conflict,
    DiffstoreError,
    Gone,
    InvalidJson,
    MethodNotAllowed,
    NotFound,
    PayloadTooLarge,
    StorageError,
    Unauthorized,
    error_from_code,
)
from diffstore.wire import COLUMNS, JSON, MSGPACK, MSGPACK_CONTENT_TYPE, MSGPACK_MEDIA_TYPES, Codec
from diffstore.wire_columns import COLUMNS_CONTENT_TYPE

T = TypeVar("T")

WireFormat = Literal["msgpack", "json"]
DEFAULT_URL = "http://127.0.0.1:3030"
DEFAULT_TIMEOUT_S = 30.0

_ERRORS_BY_STATUS: dict[int, type[DiffstoreError]] = {
    400: BadRequest,
    401: Unauthorized,
    404: NotFound,
    405: MethodNotAllowed,
    409: Conflict,
    410: Gone,
    413: PayloadTooLarge,
}


@dataclass(frozen=True, slots=True)
class Settings:
    """What both transports need to know about the server.

    ``url`` may name several servers of one cluster, comma-separated (:attr:`members`): the client then
    follows their leader (:mod:`diffstore.client._failover`), waiting up to ``failover_wait_s`` for one.
    """

    url: str = DEFAULT_URL
    token: str | None = None
    format: WireFormat = "msgpack"
    timeout_s: float = DEFAULT_TIMEOUT_S
    term: int | None = None  # sent as Diffstore-Term: a primary below it steps down (docs/replicas.md)
    # how https:// servers are checked and a client certificate shown (DIFFSTORE_CA_FILE, ... when unset)
    ca_file: str | None = None
    cert: tls.CertFiles | None = None
    failover_wait_s: float = DEFAULT_WAIT_S

    def __post_init__(self) -> None:
        if self.format not in ("msgpack", "json"):
            raise ValueError(f"format must be 'msgpack' or 'json', not {self.format!r}")
        split_urls(self.url)  # raises ValueError when it names no server

    @property
    def members(self) -> tuple[str, ...]:
        """The servers ``url`` names (one, or the members of a cluster)."""
        return split_urls(self.url)

    def tls(self) -> tls.ClientTls:
        """The TLS files: those given, else those of the environment."""
        return tls.ClientTls.resolve(self.ca_file, self.cert, os.environ)

    def verify(self) -> Any:
        """httpx's ``verify``: an SSL context for https:// URLs (True, httpx's default, for http://)."""
        return self.tls().context() if self.members[0].startswith("https://") else True

    @property
    def codec(self) -> Codec:
        return MSGPACK if self.format == "msgpack" else JSON

    def headers(self) -> dict[str, str]:
        headers = {"Accept": self.codec.content_type}
        if self.token is not None:
            headers["Authorization"] = f"Bearer {self.token}"
        if self.term is not None:
            headers["Diffstore-Term"] = str(self.term)
        return headers


@dataclass(frozen=True, slots=True)
class HttpRequest:
    method: str
    url: str
    path: str
    content: bytes | None
    headers: dict[str, str]
    params: dict[str, str] | None
    timeout_s: float


def join_urls(urls: str | Sequence[str]) -> str:
    """The ``url`` of :class:`Settings` for one server or several (a list, or comma-separated)."""
    return ",".join(split_urls(urls if isinstance(urls, str) else tuple(urls)))


def build_request(call: Call[Any], settings: Settings, base_url: str | None = None) -> HttpRequest:
    """The HTTP request for a call to ``base_url`` (default: the only server of ``settings``), its body
    encoded with the client's codec."""
    codec = settings.codec
    content, headers = None, settings.headers()
    if call.columns and codec.binary:
        headers["Accept"] = f"{COLUMNS_CONTENT_TYPE}, {MSGPACK_CONTENT_TYPE};q=0.9"
    if call.body is not None:
        content = codec.dumps(call.body(codec))
        headers["Content-Type"] = codec.content_type
    timeout_s = call.timeout_s if call.timeout_s is not None else settings.timeout_s
    url = (base_url or settings.url).rstrip("/") + call.path
    return HttpRequest(call.method, url, call.path, content, headers, call.params, timeout_s)


def codec_of(content_type: str | None) -> Codec:
    """The codec an answer is written in (diffbelt answers JSON whatever was asked for)."""
    media_type = (content_type or "").split(";", 1)[0].strip().lower()
    if media_type == COLUMNS_CONTENT_TYPE:
        return COLUMNS
    return MSGPACK if media_type in MSGPACK_MEDIA_TYPES else JSON


def read_response(call: Call[T], status: int, content_type: str | None, content: bytes) -> T:
    """Parses a 2xx answer into the call's result; raises the diffstore error of any other answer."""
    codec = codec_of(content_type)
    if 200 <= status < 300:
        try:
            return call.parse(decode(content, codec, call.tuples) if content else {}, codec)
        except BadRequest as exc:
            raise StorageError(f"{call.method} {call.path}: malformed answer: {exc.reason}") from exc
    raise error_from_response(status, codec, content)


def decode(content: bytes, codec: Codec, tuples: bool = False) -> Any:
    """A 2xx body; with ``tuples`` a msgpack body's arrays come as tuples (no list objects built)."""
    if not (tuples and codec.binary):
        return codec.loads(content)
    try:
        return msgpack.unpackb(content, raw=False, use_list=False, strict_map_key=False)
    except Exception as exc:  # msgpack raises a zoo of exception types for bad input
        raise InvalidJson(f"malformed msgpack body: {exc}") from exc


def error_from_response(status: int, codec: Codec, content: bytes) -> DiffstoreError:
    """The exception for an error answer: by its ``error`` code, else by its HTTP status."""
    try:
        body = codec.loads(content)
    except BadRequest:
        body = None
    if isinstance(body, dict) and isinstance(body.get("error"), str):
        reason = str(body.get("reason") or "")
        error = error_from_code(body["error"], reason)
        if isinstance(error, PayloadTooLarge) and isinstance(body.get("bytesMax"), int):
            error.bytes_max = body["bytesMax"]
        error.take_details(body)
        return error
    text = content[:500].decode("utf-8", "replace")
    cls = _ERRORS_BY_STATUS.get(status, StorageError if status >= 500 else DiffstoreError)
    error = cls(f"HTTP {status}: {text}")
    # not diffstore's answer (a proxy's, a gateway's): its status is all there is to go by (an outage?)
    error.http_status = status  # type: ignore[attr-defined]
    return error


def never_sent(exc: BaseException) -> bool:
    """Whether ``exc`` is a call whose connection never opened (refused, no route, connect timeout): the
    request did not leave, so nothing of it can have been applied."""
    return isinstance(exc, StorageError) and isinstance(
        exc.__cause__, httpx.ConnectError | httpx.ConnectTimeout | httpx.PoolTimeout
    )


def unreachable(exc: BaseException) -> bool:
    """Whether ``exc`` is a call that never got an answer (refused, reset, timed out): the server is away,
    or the link to it, rather than a failure the server reported."""
    return isinstance(exc, StorageError) and isinstance(exc.__cause__, httpx.TransportError)


@contextmanager
def translated_transport_errors(request: HttpRequest) -> Iterator[None]:
    """The one place where httpx's failures become diffstore errors."""
    try:
        yield
    except httpx.TransportError as exc:
        where = f"{request.method} {request.url}"
        explained = tls.explain(request.url.removesuffix(request.path), exc)
        if explained is not None:
            # not chained: the server was reached and spoke; retrying with the same settings cannot help
            raise StorageError(explained) from None
        raise StorageError(f"{where}: {type(exc).__name__}: {exc}") from exc


def finder_of(settings: Settings) -> LeaderFinder | None:
    """The leader finder of a client of several servers (None for one server: calls go there, as they are)."""
    members = settings.members
    return LeaderFinder(members) if len(members) > 1 else None


class SyncTransport:
    """Performs calls on a blocking :class:`httpx.Client` (thread-safe, pooled connections); with several
    servers, on their leader (:mod:`diffstore.client._failover`)."""

    def __init__(self, settings: Settings, http: httpx.Client | None = None) -> None:
        self.settings = settings
        self._http = http or httpx.Client(verify=settings.verify())
        self._owns_http = http is None
        self.finder = finder_of(settings)
        self._lock = threading.Lock()

    def execute(self, call: Call[T]) -> T:
        if self.finder is None:
            return self.send(self.settings.url, call)
        plan = perform(
            call, self.finder, time.monotonic, unreachable, never_sent, self.settings.failover_wait_s
        )
        return run_sync(plan, self.send, time.sleep, self._lock)

    def send(self, base_url: str, call: Call[T]) -> T:
        """Performs ``call`` on the server at ``base_url``."""
        request = build_request(call, self.settings, base_url)
        with translated_transport_errors(request):
            response = self._http.request(
                request.method,
                request.url,
                content=request.content,
                headers=request.headers,
                params=request.params,
                timeout=request.timeout_s,
            )
        return read_response(
            call, response.status_code, response.headers.get("content-type"), response.content
        )

    def close(self) -> None:
        if self._owns_http:
            self._http.close()


class AsyncTransport:
    """Performs calls on an :class:`httpx.AsyncClient`; the async twin of :class:`SyncTransport`."""

    def __init__(self, settings: Settings, http: httpx.AsyncClient | None = None) -> None:
        self.settings = settings
        self._http = http or httpx.AsyncClient(verify=settings.verify())
        self._owns_http = http is None
        self.finder = finder_of(settings)

    async def execute(self, call: Call[T]) -> T:
        if self.finder is None:
            return await self.send(self.settings.url, call)
        plan = perform(
            call, self.finder, time.monotonic, unreachable, never_sent, self.settings.failover_wait_s
        )
        return await run_async(plan, self.send, asyncio.sleep)

    async def send(self, base_url: str, call: Call[T]) -> T:
        """Performs ``call`` on the server at ``base_url``."""
        request = build_request(call, self.settings, base_url)
        with translated_transport_errors(request):
            response = await self._http.request(
                request.method,
                request.url,
                content=request.content,
                headers=request.headers,
                params=request.params,
                timeout=request.timeout_s,
            )
        return read_response(
            call, response.status_code, response.headers.get("content-type"), response.content
        )

    async def close(self) -> None:
        if self._owns_http:
            await self._http.aclose()
