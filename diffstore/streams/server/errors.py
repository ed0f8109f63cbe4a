"""Errors of the embedded stream server, each with the gRPC status it is answered with.

Raised by the store and the servicer's domain logic; translated to a gRPC status in exactly one place
(``servicer._call``).

    StreamServerError
    ├── InvalidArgument ........ INVALID_ARGUMENT
    ├── ResourceNotFound ....... NOT_FOUND
    ├── AlreadyExists .......... ALREADY_EXISTS
    └── FailedPrecondition ..... FAILED_PRECONDITION
"""

from __future__ import annotations

from typing import ClassVar

import grpc


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
