"""diffstore: a generational key-value diff store on LMDB.

The embedded engine is importable from here; the fronts live in ``diffstore.server`` (HTTP),
``diffstore.client`` (HTTP client), ``diffstore.streams`` (HStream) and ``diffstore.spark`` (PySpark).
``Collection`` is the Protocol both the engine's and the client's handles implement
(:mod:`diffstore.collection`). ``Store`` (which needs LMDB) is imported on first use, so that
``import diffstore.client`` does not load LMDB.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from diffstore.collection import Collection
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
    Lineage,
    LineageSource,
    PutResult,
    QueryPage,
    Reader,
    ReaderUpdate,
    Record,
    ResolvedRef,
    RetentionPolicy,
    RevertResult,
    StoreConfig,
)
from diffstore.errors import DiffstoreError

if TYPE_CHECKING:
    from diffstore.engine.store import Store

__version__ = "0.1.0"

__all__ = [
    "Collection",
    "CollectionInfo",
    "DiffItem",
    "DiffPage",
    "DiffSpec",
    "DiffstoreError",
    "FromReader",
    "GenerationInfo",
    "GetResult",
    "KeysAround",
    "Lease",
    "LeaseToken",
    "Lineage",
    "LineageSource",
    "PutResult",
    "QueryPage",
    "Reader",
    "ReaderUpdate",
    "Record",
    "ResolvedRef",
    "RetentionPolicy",
    "RevertResult",
    "Store",
    "StoreConfig",
    "UNSET",
]


def __getattr__(name: str) -> Any:
    if name == "Store":
        from diffstore.engine.store import Store

        return Store
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
