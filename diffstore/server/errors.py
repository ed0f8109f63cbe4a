"""Every error to HTTP status mapping of the server, in this one place.

``STATUS_BY_ERROR`` names every class of :mod:`diffstore.errors` (a test checks that no leaf is missing);
:func:`install_error_handlers` turns domain errors, Starlette's routing errors and FastAPI's parameter
validation errors into the SPEC §2 error body ``{"error", "reason"}`` (plus ``bytesMax`` for 413).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from fastapi import FastAPI, Request, Response
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from diffstore import errors as e
from diffstore.server.negotiation import response_codec
from diffstore.wire import Codec, error_to_wire

log = logging.getLogger(__name__)

STATUS_BY_ERROR: dict[type[e.DiffstoreError], int] = {
    e.DiffstoreError: 500,
    e.BadRequest: 400,
    e.InvalidJson: 400,
    e.InvalidRequest: 400,
    e.InvalidEncoding: 400,
    e.Unauthorized: 401,
    e.Forbidden: 403,
    e.NotFound: 404,
    e.NoSuchRoute: 404,
    e.NoSuchCollection: 404,
    e.NoSuchReader: 404,
    e.NoSuchCursor: 404,
    e.NoSuchGeneration: 404,
    e.MethodNotAllowed: 405,
    e.Conflict: 409,
    e.CollectionExists: 409,
    e.ReaderExists: 409,
    e.OutdatedGeneration: 409,
    e.GenerationMismatch: 409,
    e.NotManual: 409,
    e.NotAutomatic: 409,
    e.BadVersion: 409,
    e.LeaseLost: 409,
    e.ReadOnlyReplica: 409,
    e.NotReplica: 409,
    e.ReplicaBehind: 409,
    e.Fenced: 409,
    e.Gone: 410,
    e.GenerationCollected: 410,
    e.CursorExpired: 410,
    e.PayloadTooLarge: 413,
    e.Overloaded: 503,
    e.NotReplicated: 503,
    e.StorageError: 500,
    e.StorageFull: 507,
    e.CorruptRecord: 500,
    e.NoLeader: 500,  # a client's own errors (several servers): no server raises them
    e.LeaderChanged: 500,
}


def status_for(exc: e.DiffstoreError) -> int:
    """The HTTP status of an error: its own class's, else its nearest mapped ancestor's."""
    for cls in type(exc).__mro__:
        status = STATUS_BY_ERROR.get(cls)
        if status is not None:
            return status
    return 500


def encode_error(exc: e.DiffstoreError, codec: Codec, method: str, path: str) -> tuple[int, bytes]:
    """The status and the SPEC §2 body of an error; a 5xx is logged (naming ``method`` and ``path``)."""
    status = status_for(exc)
    if status >= 500:
        log.error("%s %s failed: %r", method, path, exc)
    bytes_max = exc.bytes_max if isinstance(exc, e.PayloadTooLarge) else None
    body = error_to_wire(exc.code, exc.reason, bytes_max)
    # bytes in the details (a generation id) are EncodedStrings of the answer's format
    body.update({k: codec.es(v) if isinstance(v, bytes) else v for k, v in exc.details().items()})
    return status, codec.dumps(body)


def count_error(app: object, exc: e.DiffstoreError) -> None:
    """Counts an answered error that has a metric of its own (``corruptRecord``) in ``app``'s metrics."""
    if isinstance(exc, e.CorruptRecord):
        metrics = getattr(getattr(app, "state", None), "metrics", None)
        if metrics is not None:
            metrics.corrupt_records.inc()


def error_headers(exc: e.DiffstoreError) -> dict[str, str]:
    """The headers an error answer needs beyond the content type."""
    headers: dict[str, str] = {}
    if isinstance(exc, e.PayloadTooLarge | e.Overloaded):
        # the rest of the body is left unread: the connection cannot carry another request
        headers["connection"] = "close"
    if isinstance(exc, e.Overloaded):
        headers["retry-after"] = str(exc.retry_after_s)
    return headers


def error_response(request: Request, exc: e.DiffstoreError) -> Response:
    """Renders an error in the format the client accepts (JSON unless it asked for msgpack)."""
    codec = response_codec(request.headers.get("accept"))
    count_error(request.app, exc)
    status, body = encode_error(exc, codec, request.method, request.url.path)
    return Response(body, status_code=status, media_type=codec.content_type, headers=error_headers(exc))


def _routing_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, StarletteHTTPException)
    error: e.DiffstoreError
    if exc.status_code == 404:
        error = e.NoSuchRoute(f"no route {request.method} {request.url.path}")
    elif exc.status_code == 405:
        error = e.MethodNotAllowed(f"{request.method} is not allowed on {request.url.path}")
    elif exc.status_code < 500:
        error = e.InvalidRequest(str(exc.detail))
    else:
        error = e.DiffstoreError(str(exc.detail))
    return error_response(request, error)


def _validation_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, RequestValidationError)
    parts = [f"{_field(err.get('loc', ()))}: {err.get('msg')}" for err in exc.errors()]
    return error_response(request, e.InvalidRequest("; ".join(parts) or "invalid request"))


def _field(loc: Sequence[object]) -> str:
    """A field as the user sent it (``limit``), not where the framework found it (``query.limit``)."""
    if loc and loc[0] in ("body", "query", "path", "header", "cookie"):
        if len(loc) == 1:
            return f"the request {loc[0]}"
        loc = loc[1:]
    return "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in loc).lstrip(".")


def _domain_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, e.DiffstoreError)
    return error_response(request, exc)


def _unexpected_error(request: Request, exc: Exception) -> Response:
    log.exception("%s %s failed", request.method, request.url.path, exc_info=exc)
    return error_response(request, e.DiffstoreError(f"internal error: {type(exc).__name__}"))


def install_error_handlers(app: FastAPI) -> None:
    """Registers the handlers; Starlette finds the one for an exception by walking its class hierarchy."""
    app.add_exception_handler(e.DiffstoreError, _domain_error)
    app.add_exception_handler(StarletteHTTPException, _routing_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(Exception, _unexpected_error)
