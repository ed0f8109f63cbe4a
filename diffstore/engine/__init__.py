"""The storage engine: collections, generations, readers, phantoms and diffs on LMDB.

It knows nothing of HTTP, gRPC or Spark; those fronts call it. ``Store`` and ``Collection`` (which need
LMDB) are imported on first use, so that the value types of :mod:`diffstore.engine.types`, which the HTTP
client shares, come without LMDB.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from diffstore.engine.types import (
    UNSET,
    CollectionInfo,
    DiffItem,
    DiffPage,
    DiffSpec,
    FromReader,
    GenerationInfo,
    GetResult,
    KeysAround,
    Lease,
    LeaseToken,
    PutResult,
    QueryPage,
    Reader,
    ReaderUpdate,
    Record,
    RevertResult,
    StoreConfig,
)

if TYPE_CHECKING:
    from diffstore.engine.collection import Collection
    from diffstore.engine.store import Store

__all__ = [
    "Collection",
    "CollectionInfo",
    "DiffItem",
    "DiffPage",
    "DiffSpec",
    "FromReader",
    "GenerationInfo",
    "GetResult",
    "KeysAround",
    "Lease",
    "LeaseToken",
    "PutResult",
    "QueryPage",
    "Reader",
    "ReaderUpdate",
    "Record",
    "RevertResult",
    "Store",
    "StoreConfig",
    "UNSET",
]


def __getattr__(name: str) -> Any:
    if name == "Collection":
        from diffstore.engine.collection import Collection

        return Collection
    if name == "Store":
        from diffstore.engine.store import Store

        return Store
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
