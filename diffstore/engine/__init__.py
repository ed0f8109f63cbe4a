"""The storage engine: collections, generations, readers, phantoms and diffs on LMDB.

It knows nothing of HTTP, gRPC or Spark; those fronts call it.
"""

from diffstore.engine.collection import Collection
from diffstore.engine.store import Store
from diffstore.engine.types import (
    UNSET,
    CollectionInfo,
    DiffItem,
    DiffPage,
    FromReader,
    GetResult,
    KeysAround,
    PutResult,
    QueryPage,
    Reader,
    ReaderUpdate,
    Record,
    StoreConfig,
)

__all__ = [
    "Collection",
    "CollectionInfo",
    "DiffItem",
    "DiffPage",
    "FromReader",
    "GetResult",
    "KeysAround",
    "PutResult",
    "QueryPage",
    "Reader",
    "ReaderUpdate",
    "Record",
    "Store",
    "StoreConfig",
    "UNSET",
]
