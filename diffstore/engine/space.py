"""How much of a store's data file holds data, and how much a compaction would give back to the disk.

LMDB never shrinks its file: pages freed by deletes (and by GC) go to its freelist and are reused by later
writes, so after a large delete the file stays as large as it ever was. The figures here say how far, from
LMDB's own counters in one read transaction:

- ``file_bytes``: the data file's size on disk;
- ``used_pages``: the pages of every table (branch, leaf and overflow pages of the main table and of each
  named table) plus LMDB's two meta pages: what a compacting copy writes;
- ``free_pages``: every other page below LMDB's highest page (its freelist, and the freelist's own pages):
  what a compaction gives back. py-lmdb does not open LMDB's freelist table, so this is counted from the
  other side; the result is the same number a compacting copy leaves out.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import lmdb

from diffstore.engine.storage import DATA_FILE
from diffstore.engine.tables import Table

_META_PAGES = 2


@dataclass(frozen=True, slots=True)
class Space:
    """The figures of one store's data file (see the module docstring)."""

    file_bytes: int
    page_bytes: int
    used_pages: int
    free_pages: int

    @property
    def used_bytes(self) -> int:
        return self.used_pages * self.page_bytes

    @property
    def free_bytes(self) -> int:
        return self.free_pages * self.page_bytes


def _pages(stat: dict[str, int]) -> int:
    return int(stat["branch_pages"] + stat["leaf_pages"] + stat["overflow_pages"])


def measure(env: lmdb.Environment, tables: Iterable[Table], path: Path) -> Space:
    """The figures of ``env`` (whose directory is ``path``, and whose named tables are ``tables``).

    Raises:
        lmdb.Error: LMDB failed (the caller translates it at its edge).
    """
    with env.begin() as txn:
        info = env.info()
        used = _META_PAGES + _pages(txn.stat()) + sum(_pages(txn.stat(db)) for db in tables)
        page_bytes = int(txn.stat()["psize"])
        # last_pgno is that of the newest committed transaction, which may be a little newer than this one
        highest = int(info["last_pgno"]) + 1
    try:
        file_bytes = os.stat(path / DATA_FILE).st_size
    except FileNotFoundError:
        file_bytes = 0
    return Space(file_bytes, page_bytes, used, max(0, highest - used))
