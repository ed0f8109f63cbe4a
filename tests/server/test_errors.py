"""The one error-to-status table: every error class is mapped, and statuses follow the hierarchy."""

from __future__ import annotations

from diffstore import errors
from diffstore.server.errors import STATUS_BY_ERROR, status_for


def all_error_classes() -> list[type[errors.DiffstoreError]]:
    found: list[type[errors.DiffstoreError]] = []
    pending: list[type[errors.DiffstoreError]] = [errors.DiffstoreError]
    while pending:
        cls = pending.pop()
        found.append(cls)
        pending.extend(cls.__subclasses__())
    return [cls for cls in found if cls.__module__ == errors.__name__]


def test_every_error_class_is_mapped() -> None:
    classes = all_error_classes()
    leaves = [
        cls for cls in classes if not any(sub.__module__ == errors.__name__ for sub in cls.__subclasses__())
    ]
    assert len(leaves) >= 19  # the leaves of the tree drawn in diffstore/errors.py
    missing = [cls.__name__ for cls in classes if cls not in STATUS_BY_ERROR]
    assert missing == []


def test_statuses_follow_the_documented_tree() -> None:
    expected = {
        errors.BadRequest: 400,
        errors.Unauthorized: 401,
        errors.Forbidden: 403,
        errors.NotFound: 404,
        errors.MethodNotAllowed: 405,
        errors.Conflict: 409,
        errors.Gone: 410,
        errors.PayloadTooLarge: 413,
        errors.Overloaded: 503,
        errors.NotReplicated: 503,
        errors.StorageError: 500,
        errors.StorageFull: 507,
    }
    for cls in all_error_classes():
        nearest = next((base for base in cls.__mro__ if base in expected), None)
        if nearest is not None:
            assert status_for(cls()) == expected[nearest], cls


def test_every_client_error_code_is_a_4xx() -> None:
    """Every error but the server's own state (storage, load, replicas) is the request's: a 4xx."""
    server_side = errors.StorageError | errors.Overloaded | errors.NotReplicated
    for code, cls in errors.ERROR_CLASSES_BY_CODE.items():
        if not issubclass(cls, server_side) and cls is not errors.DiffstoreError:
            assert 400 <= status_for(cls()) < 500, code


def test_unmapped_subclass_uses_its_nearest_ancestor() -> None:
    class Custom(errors.NoSuchReader):
        pass

    assert status_for(Custom()) == 404
