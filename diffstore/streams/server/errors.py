"""Errors of the embedded stream server and their gRPC statuses, in this one place.

The store and the servicer's domain logic raise :class:`StreamServerError` subclasses (each names its
status); the store also raises the engine's :class:`~diffstore.errors.StorageError` (``StorageFull`` for a
full map or disk). :func:`grpc_status` is the one translation of any of them into a gRPC status; the
servicer calls it, through :func:`abort`, for unary RPCs and StreamingFetch alike.

    StreamServerError
    ├── InvalidArgument ........ INVALID_ARGUMENT
    ├── ResourceNotFound ....... NOT_FOUND
    ├── AlreadyExists .......... ALREADY_EXISTS
    └── FailedPrecondition ..... FAILED_PRECONDITION
    diffstore.errors.StorageFull  RESOURCE_EXHAUSTED (the failed append or call changed nothing)
    diffstore.errors.StorageError INTERNAL
"""

from __future__ import annotations

from typing import ClassVar, NoReturn

import grpc

from diffstore import errors as e


class StreamServerError(Exception):
    """Base of the stream server's errors."""

    status: ClassVar[grpc.StatusCode] = grpc.StatusCode.INTERNAL

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class InvalidArgument(StreamServerError):
    status = grpc.StatusCode.INVALID_ARGUMENT


class ResourceNotFound(StreamServerError):
    status = grpc.StatusCode.NOT_FOUND


class AlreadyExists(StreamServerError):
    status = grpc.StatusCode.ALREADY_EXISTS


class FailedPrecondition(StreamServerError):
    status = grpc.StatusCode.FAILED_PRECONDITION


# The engine's errors that can reach the stream server (through its LMDB store), nearest class first.
_STATUS_BY_ENGINE_ERROR: dict[type[e.DiffstoreError], grpc.StatusCode] = {
    e.StorageFull: grpc.StatusCode.RESOURCE_EXHAUSTED,
    e.StorageError: grpc.StatusCode.INTERNAL,
    e.BadRequest: grpc.StatusCode.INVALID_ARGUMENT,
    e.LeaseLost: grpc.StatusCode.FAILED_PRECONDITION,  # gRPC's code for "the state moved, do not retry"
    e.DiffstoreError: grpc.StatusCode.INTERNAL,
}


def grpc_status(exc: StreamServerError | e.DiffstoreError) -> grpc.StatusCode:
    """The gRPC status of a stream-server or engine error (the one mapping)."""
    if isinstance(exc, StreamServerError):
        return exc.status
    for cls in type(exc).__mro__:
        status = _STATUS_BY_ENGINE_ERROR.get(cls)
        if status is not None:
            return status
    return grpc.StatusCode.INTERNAL


async def abort(context: grpc.aio.ServicerContext, exc: StreamServerError | e.DiffstoreError) -> NoReturn:
    """Ends the call with the error's status and reason."""
    await context.abort(grpc_status(exc), exc.reason)
    raise AssertionError("unreachable: abort raises")
