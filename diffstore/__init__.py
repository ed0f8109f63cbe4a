"""diffstore: a generational key-value diff store on LMDB.

The embedded engine is importable from here; the fronts live in ``diffstore.server`` (HTTP),
``diffstore.client`` (HTTP client), ``diffstore.streams`` (HStream) and ``diffstore.spark`` (PySpark).
"""

from diffstore.engine import (
    UNSET,
    Collection,
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
    Store,
    StoreConfig,
)
from diffstore.errors import DiffstoreError

__version__ = "0.1.0"

__all__ = [
    "Collection",
    "CollectionInfo",
    "DiffItem",
    "DiffPage",
    "DiffstoreError",
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
