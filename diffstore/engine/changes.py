"""The index of the keys each generation wrote (its *run*), read and trimmed in both its forms.

A run is the union of its ``changes`` rows (one per key) and its ``change_chunks`` rows (sorted key forms
packed up to 1,500 bytes to a row, ~75 keys of 16 bytes; the chunks of a run never overlap, and a key is
in at most one of the two forms): see layout.py. Stores written before chunks existed hold ``changes``
rows only; everything here reads both, so such a store needs no migration. Writes choose the form
(writes.py: chunks where they append).
"""

from __future__ import annotations

import bisect
import collections
import heapq
import itertools
import operator
from collections.abc import Callable, Iterable, Iterator

import lmdb

from diffstore.engine import layout
from diffstore.engine.tables import Tables


def _per_key(
    txn: lmdb.Transaction, tables: Tables, run: bytes, lower: bytes, upper: bytes | None
) -> Iterator[bytes] | None:
    """The run's ``changes`` rows in ``[lower, upper)`` (None: it has none there)."""
    cursor = txn.cursor(db=tables.changes)
    stop = run + upper if upper is not None else layout.next_prefix(run)
    if not cursor.set_range(run + lower) or (stop is not None and cursor.key() >= stop):
        return None
    keys = cursor.iternext(values=False)
    if stop is not None:
        # C-level iterators only: a single generation's keys are the hottest loop of a keyed diff
        keys = itertools.takewhile(stop.__gt__, keys)
    return map(operator.itemgetter(slice(len(run), None)), keys)


def _chunk_at(cursor: lmdb.Cursor, run: bytes, form: bytes) -> bool:
    """Positions ``cursor`` (of ``change_chunks``) on the chunk of ``run`` that would hold ``form`` (the
    last one starting at or below it), else on the run's first chunk above it; False: neither exists."""
    if cursor.set_range(run + form):
        if cursor.key() == run + form:
            return True
        if cursor.prev() and cursor.key().startswith(run):
            return True
        return bool(cursor.set_range(run + form)) and cursor.key().startswith(run)
    return bool(cursor.last()) and cursor.key().startswith(run)


def _chunked(
    txn: lmdb.Transaction, tables: Tables, run: bytes, lower: bytes, upper: bytes | None
) -> Iterator[bytes]:
    cursor = txn.cursor(db=tables.change_chunks)
    if not _chunk_at(cursor, run, lower):
        return
    start = len(run)
    first = True
    for key, value in cursor.iternext():
        if not key.startswith(run) or (upper is not None and key[start:] >= upper):
            return
        held = layout.unpack_forms(value)
        if first:
            first = False
            if held[0] < lower:
                held = held[bisect.bisect_left(held, lower) :]
        if upper is not None and held and held[-1] >= upper:
            yield from held[: bisect.bisect_left(held, upper)]
            return
        yield from held


def has_chunks(txn: lmdb.Transaction, tables: Tables, run: bytes) -> bool:
    cursor = txn.cursor(db=tables.change_chunks)
    return bool(cursor.set_range(run)) and cursor.key().startswith(run)


def forms(
    txn: lmdb.Transaction,
    tables: Tables,
    prefix: bytes,
    seq: int,
    lower: bytes = b"",
    upper: bytes | None = None,
) -> Iterator[bytes]:
    """The key forms generation ``seq`` wrote in ``[lower, upper)``, ascending, each once."""
    run = layout.change_prefix(prefix, seq)
    per_key = _per_key(txn, tables, run, lower, upper)
    if per_key is None:  # a generation written since chunks exist: often all in chunks
        return _chunked(txn, tables, run, lower, upper)
    if not has_chunks(txn, tables, run):  # a generation written before
        return per_key
    return merge_forms([per_key, _chunked(txn, tables, run, lower, upper)])


MERGE_IN_C_MAX = 8
"""Iterators of forms that :func:`merge_forms` merges with the compiled merge, which compares every head
per form; more take ``heapq`` (a heap)."""


def merge_forms(runs: list[Iterator[bytes]]) -> Iterator[bytes]:
    """The distinct forms of strictly ascending ``runs``, ascending."""
    if layout.ACCEL is not None and len(runs) <= MERGE_IN_C_MAX:
        return layout.ACCEL.MergeForms(runs)
    return map(operator.itemgetter(0), itertools.groupby(heapq.merge(*runs)))


def count(txn: lmdb.Transaction, tables: Tables, prefix: bytes, seq: int) -> int:
    """How many distinct keys generation ``seq`` wrote."""
    # C-level iterators only (a commit without a running count counts its keys): the last numbered form
    last = collections.deque(enumerate(forms(txn, tables, prefix, seq), 1), maxlen=1)
    return last[0][0] if last else 0


def any_written(txn: lmdb.Transaction, tables: Tables, prefix: bytes, seq: int) -> bool:
    """Whether generation ``seq`` wrote any key."""
    run = layout.change_prefix(prefix, seq)
    cursor = txn.cursor(db=tables.changes)
    return (bool(cursor.set_range(run)) and cursor.key().startswith(run)) or has_chunks(txn, tables, run)


def any_run_below(txn: lmdb.Transaction, tables: Tables, prefix: bytes, seq: int) -> bool:
    """Whether any generation below ``seq`` still holds a key in its run (a version of it is stored)."""
    below = layout.change_prefix(prefix, seq)
    for db in (tables.changes, tables.change_chunks):
        cursor = txn.cursor(db=db)
        if cursor.set_range(prefix) and cursor.key().startswith(prefix) and cursor.key() < below:
            return True
    return False


def last_key(txn: lmdb.Transaction, tables: Tables, run: bytes) -> bytes | None:
    """``run | K`` of the greatest key form K of the run, over both forms (None: the run is empty)."""
    stop = layout.next_prefix(run)
    found: bytes | None = None
    for db in (tables.changes, tables.change_chunks):
        cursor = txn.cursor(db=db)
        positioned = cursor.prev() if stop is not None and cursor.set_range(stop) else cursor.last()
        if positioned and cursor.key().startswith(run):
            key = cursor.key() if db is tables.changes else run + layout.unpack_forms(cursor.value())[-1]
            found = key if found is None else max(found, key)
    return found


def held_in_chunks(txn: lmdb.Transaction, tables: Tables, run: bytes, sought: Iterable[bytes]) -> set[bytes]:
    """Those of the forms ``sought`` that the run's chunks hold."""
    cursor = txn.cursor(db=tables.change_chunks)
    held: set[bytes] = set()
    for form in sought:
        if _chunk_at(cursor, run, form) and cursor.key()[len(run) :] <= form:
            if form in layout.unpack_forms(cursor.value()):
                held.add(form)
    return held


def remove(txn: lmdb.Transaction, tables: Tables, prefix: bytes, seq: int, removed: Iterable[bytes]) -> None:
    """Takes the forms ``removed`` out of generation ``seq``'s run (GC: their versions are gone); a
    chunk is rewritten once for all of them it holds."""
    run = layout.change_prefix(prefix, seq)
    rest = [form for form in sorted(set(removed)) if not txn.delete(run + form, db=tables.changes)]
    cursor = txn.cursor(db=tables.change_chunks)
    index = 0
    while index < len(rest):
        form = rest[index]
        if not _chunk_at(cursor, run, form):
            return
        held = layout.unpack_forms(cursor.value())
        if cursor.key()[len(run) :] > form or held[-1] < form:
            index += 1  # not in the run's chunks
            continue
        dropped = set()
        while index < len(rest) and rest[index] <= held[-1]:
            dropped.add(rest[index])
            index += 1
        kept = [form for form in held if form not in dropped]
        if len(kept) != len(held):
            cursor.delete()
            if kept:
                txn.put(run + kept[0], layout.pack_forms(kept), db=tables.change_chunks)


def drop(
    txn: lmdb.Transaction, tables: Tables, prefix: bytes, seq: int, each: Callable[[bytes], None]
) -> None:
    """Deletes generation ``seq``'s run, calling ``each`` with every form first (abort: its records)."""
    run = layout.change_prefix(prefix, seq)
    cursor = txn.cursor(db=tables.changes)
    if cursor.set_range(run):
        while cursor.key().startswith(run):
            each(cursor.key()[len(run) :])
            if not cursor.delete():
                break
    cursor = txn.cursor(db=tables.change_chunks)
    if cursor.set_range(run):
        while cursor.key().startswith(run):
            for form in layout.unpack_forms(cursor.value()):
                each(form)
            if not cursor.delete():
                break
