"""Brings a store written in an older storage layout to the current one, once, when it is opened.

The layout version is the ``collections`` row ``layout.LAYOUT_ROW`` (no row: version 1). Versions:

    1  records keys  cid(u32) | K | seq(u64)
    2  records keys  records_prefix(cid) | K | record_seq(seq)   (layout.py: 6 or 7 bytes shorter for
       most collections and generations, so the B-tree holds more of them to a branch page, and a
       generation of keys spread over a big collection dirties fewer pages: benchmarks/RESULTS.md,
       session 21)

An upgrade rewrites every records row in one write transaction: a crash leaves the old layout, whole, and
the next open starts over. Both encodings sort alike (cids and seqs are big-endian, and the new ones are
length-prefixed), so the new rows go in in LMDB's append mode.

Checksums (sealed record values, ``layout.py``) need no upgrade to open a store: a plain value reads as it
did. A store that holds no record when it is opened is marked ``layout.SEALED_ROW`` (everything it will
hold is written sealed); an older one is sealed by :func:`seal_records` (``diffstore migrate``), in
batches of its own write transactions beside a running server, and marked when the last batch finds
nothing left to seal.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable

import lmdb

from diffstore.engine import crashpoints, layout
from diffstore.engine.tables import Table, Tables
from diffstore.errors import StorageError

_SCRATCH = b"records_upgrading"  # a table of its own for the new rows, within the upgrade's transaction
_BATCH = 10_000


def layout_version(txn: lmdb.Transaction, tables: Tables) -> int | None:
    """The store's layout version; None when its row is damaged (not 8 bytes)."""
    raw = txn.get(layout.LAYOUT_ROW, db=tables.collections)
    if raw is None:
        return 1
    return layout.read_u64(raw) if len(raw) == 8 else None


def upgrade(env: lmdb.Environment, tables: Tables) -> int:
    """Brings the store to ``layout.LAYOUT_VERSION``; how many records rows it rewrote (0: none to).

    Raises:
        StorageError: the store is in a newer layout than this diffstore knows.
    """
    with env.begin() as txn:
        if layout_version(txn, tables) == layout.LAYOUT_VERSION and not _unmarked_empty(txn, tables):
            return 0
    with env.begin(write=True) as txn:
        if _unmarked_empty(txn, tables):
            txn.put(layout.SEALED_ROW, b"", db=tables.collections)
        version = layout_version(txn, tables)  # another process may have upgraded it meanwhile
        if version is None:
            raise StorageError("the store's layout version row is damaged (not 8 bytes): run diffstore check")
        if version > layout.LAYOUT_VERSION:
            raise StorageError(
                f"the store is in storage layout {version}, newer than this diffstore's"
                f" ({layout.LAYOUT_VERSION}): upgrade diffstore to open it"
            )
        rewritten = _records_to_version_2(env, txn, tables) if version < 2 else 0
        txn.put(layout.LAYOUT_ROW, layout.u64(layout.LAYOUT_VERSION), db=tables.collections)
        if rewritten:
            crashpoints.reached("upgrade-written")  # everything rewritten, nothing committed
    return rewritten


def _unmarked_empty(txn: lmdb.Transaction, tables: Tables) -> bool:
    """Whether the store holds no record and is not marked sealed yet (every record it gets is sealed)."""
    return (
        txn.get(layout.SEALED_ROW, db=tables.collections) is None and txn.stat(tables.records)["entries"] == 0
    )


def seal_records(env: lmdb.Environment, tables: Tables, batch: int = _BATCH) -> int:
    """Seals every records row that predates checksums, ``batch`` rows examined per write transaction, and
    marks the store sealed; how many rows it sealed (0: none left, or marked already)."""
    sealed = 0
    after = b""
    while True:
        with env.begin(write=True) as txn:
            if txn.get(layout.SEALED_ROW, db=tables.collections) is not None:
                return sealed
            cursor = txn.cursor(db=tables.records)
            rows: list[tuple[bytes, bytes]] = []
            examined = 0
            if cursor.set_range(after):
                for key, raw in cursor:
                    examined += 1
                    if not layout.is_sealed(raw):
                        rows.append((bytes(key), layout.seal(key, raw)))
                    if examined == batch:
                        after = bytes(key) + b"\x00"  # the smallest key above it
                        break
            for key, value in rows:
                txn.put(key, value, db=tables.records)
            sealed += len(rows)
            if examined < batch:
                txn.put(layout.SEALED_ROW, b"", db=tables.collections)
                return sealed


def _version_1_key(raw: bytes) -> bytes:
    """A version-1 records key in the current layout."""
    cid, form, seq = layout.parse_record_key_of_layout_1(raw)
    return layout.record_key(layout.records_prefix(cid), form, seq)


def _records_to_version_2(env: lmdb.Environment, txn: lmdb.Transaction, tables: Tables) -> int:
    scratch = env.open_db(_SCRATCH, txn=txn, create=True)
    count = _copy(txn, tables.records, scratch, _version_1_key)
    txn.drop(tables.records, delete=False)
    _copy(txn, scratch, tables.records, bytes)
    txn.drop(scratch, delete=True)
    return count


def _copy(txn: lmdb.Transaction, source: Table, target: Table, key_of: Callable[[bytes], bytes]) -> int:
    """Copies every row of ``source`` into the empty ``target``, keys through ``key_of`` (which keeps their
    order), in batches in append mode; how many rows."""
    count = 0
    with txn.cursor(db=source) as reading, txn.cursor(db=target) as writing:
        rows = reading.iternext()
        while batch := [(key_of(key), value) for key, value in itertools.islice(rows, _BATCH)]:
            writing.putmulti(batch, append=True)
            count += len(batch)
    return count
