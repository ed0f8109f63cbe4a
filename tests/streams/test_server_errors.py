"""The one mapping of errors to gRPC statuses of the embedded stream server (``server/errors.py``)."""

from __future__ import annotations

import grpc

from diffstore import errors as e
from diffstore.streams.server import errors as s


def _subclasses(root: type) -> list[type]:
    found, pending = [], [root]
    while pending:
        cls = pending.pop()
        found.append(cls)
        pending.extend(cls.__subclasses__())
    return found


def test_storage_errors_map_to_their_statuses() -> None:
    assert s.grpc_status(e.StorageFull("full")) == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert s.grpc_status(e.StorageError("eio")) == grpc.StatusCode.INTERNAL
    assert s.grpc_status(e.InvalidRequest("bad")) == grpc.StatusCode.INVALID_ARGUMENT
    assert s.grpc_status(e.LeaseLost("moved")) == grpc.StatusCode.FAILED_PRECONDITION


def test_every_error_has_a_status_and_no_client_error_is_internal() -> None:
    for cls in _subclasses(e.DiffstoreError):
        if cls.__module__ != e.__name__:
            continue
        status = s.grpc_status(cls("x"))
        assert isinstance(status, grpc.StatusCode)
        if issubclass(cls, e.BadRequest):
            assert status == grpc.StatusCode.INVALID_ARGUMENT, cls
    expected = {
        s.InvalidArgument: grpc.StatusCode.INVALID_ARGUMENT,
        s.ResourceNotFound: grpc.StatusCode.NOT_FOUND,
        s.AlreadyExists: grpc.StatusCode.ALREADY_EXISTS,
        s.FailedPrecondition: grpc.StatusCode.FAILED_PRECONDITION,
    }
    for cls in _subclasses(s.StreamServerError):
        if cls is not s.StreamServerError and cls.__module__ == s.__name__:
            assert s.grpc_status(cls("x")) == expected[cls], cls
