"""The one visibility rule of SPEC §1, as streams of visible record versions.

A read at generation G sees, per key, the record with the greatest generation <= G (records are
stored by seq, so "<= G" is "<= resolve_seq(G)"). With a phantom id, the phantom's newest record at or
below G wins over a base record of the same or a lower generation. Tombstones are resolved here too:
what leaves this module is either a value or absent.

Streams are in *key form* order; :func:`in_key_order` restores the true order inside long-key groups.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import lmdb
import msgpack

from diffstore.engine import layout
from diffstore.engine.meta import CollectionMeta
from diffstore.engine.tables import Tables, generation_of_seq

# A visible version: (key form, stored record value, generation: seq of a base record or id of a phantom's)
Version = tuple[bytes, bytes, int | bytes]


@dataclass(frozen=True, slots=True)
class ReadPoint:
    """Where a read looks: the collection, the generation (id and seq), and an optional live phantom."""

    meta: CollectionMeta
    generation_id: bytes
    seq: int
    phantom: int | None = None


def live_phantom(
    txn: lmdb.Transaction, tables: Tables, meta: CollectionMeta, phantom_id: bytes | None
) -> int | None:
    """The phantom number of a started, unexpired phantom (None otherwise: the read sees the base only)."""
    if phantom_id is None:
        return None
    number = layout.phantom_number(phantom_id)
    if number is None:
        return None
    raw = txn.get(layout.phantom_prefix(meta.cid_prefix, number), db=tables.phantom_ttl)
    if raw is None or layout.read_u64(raw) < time.time() * 1000:
        return None
    return number


def phantom_version(entries: list[list[bytes]], generation_id: bytes) -> tuple[bytes, bytes] | None:
    """(generation id, stored value) of a phantom's newest version at or below ``generation_id``."""
    best: tuple[bytes, bytes] | None = None
    for gen, raw in entries:
        if gen <= generation_id:
            best = (gen, raw)
        else:
            break
    return best


def base_version(cursor: lmdb.Cursor, prefix: bytes, form: bytes, seq: int) -> tuple[int, bytes] | None:
    """(seq, stored value) of the newest base record of ``form`` at or below ``seq`` (``prefix``: the
    collection's records prefix)."""
    if seq < 0:
        return None
    head = layout.record_head(prefix, form)
    if cursor.set_range(head + layout.record_seq(seq + 1)):
        found = cursor.prev()
    else:
        found = cursor.last()
    if not found:
        return None
    key = cursor.key()
    if not key.startswith(head):  # heads are prefix-free: only K's versions begin with K's head
        return None
    return layout.read_record_seq(key[len(head) :]), layout.unseal(key, cursor.value())


def point_version(txn: lmdb.Transaction, tables: Tables, point: ReadPoint, form: bytes) -> Version | None:
    """The visible version of one key form, tombstone included (callers decide what absent means)."""
    base = base_version(txn.cursor(db=tables.records), point.meta.records_prefix, form, point.seq)
    if point.phantom is not None:
        raw = txn.get(layout.phantom_prefix(point.meta.cid_prefix, point.phantom) + form, db=tables.phantoms)
        if raw is not None:
            found = phantom_version(msgpack.unpackb(raw), point.generation_id)
            if found is not None:
                if base is None or found[0] >= generation_of_seq(txn, tables, point.meta, base[0]):
                    return form, found[1], found[0]
    if base is None:
        return None
    return form, base[1], base[0]


_ABOVE_EVERY_KEY = b"\xff" * 512  # LMDB keys are at most 511 bytes


def _base_stream(
    txn: lmdb.Transaction, tables: Tables, point: ReadPoint, lower: bytes, upper: bytes | None, reverse: bool
) -> Iterator[Version]:
    """Visible base versions (tombstones included) of forms in [lower, upper), ascending or descending."""
    prefix = point.meta.records_prefix
    seq_limit = point.seq
    if seq_limit < 0:
        return
    start = layout.record_head(prefix, lower)
    stop = layout.record_head(prefix, upper) if upper is not None else layout.next_prefix(prefix)
    cursor = txn.cursor(db=tables.records)
    # A key's versions follow its head (heads are prefix-free: a key begins with the head under the
    # scan exactly when it is one of that head's versions); the head's form follows the prefix.
    form_at = len(prefix)
    if not reverse:
        if not cursor.set_range(start):
            return
        # The hottest loop of a query: seqs are compared encoded, decoded only when yielded.
        if stop is None:
            stop = _ABOVE_EVERY_KEY
        limit = layout.record_seq(seq_limit)
        read_seq, head_of, unseal = layout.read_record_seq, layout.record_head_of, layout.unseal
        head = _ABOVE_EVERY_KEY  # longer than any key, so no key begins with it: the first starts a head
        best_raw: bytes | None = None
        best_seq = b""
        for key, stored in cursor:
            if key >= stop:
                break
            raw = unseal(key, stored)  # every row passed, as the compiled query_scan verifies them
            if not key.startswith(head):
                if best_raw is not None:
                    yield head[form_at:], best_raw, read_seq(best_seq)
                head, best_raw = head_of(key), None
            seq = key[len(head) :]
            if seq <= limit:
                best_raw, best_seq = raw, seq
        if best_raw is not None:
            yield head[form_at:], best_raw, read_seq(best_seq)
        return
    if stop is not None and cursor.set_range(stop):
        found = cursor.prev()
    else:
        found = cursor.last()
    skip_head: bytes | None = None  # the head whose visible version was yielded: older ones are skipped
    while found:
        key = cursor.key()
        if key < start:
            return
        if skip_head is None or not key.startswith(skip_head):
            head = layout.record_head_of(key)
            seq = layout.read_record_seq(key[len(head) :])
            if seq <= seq_limit:
                skip_head = head
                yield head[form_at:], layout.unseal(key, cursor.value()), seq
        found = cursor.prev()


def compiled_records(
    txn: lmdb.Transaction,
    tables: Tables,
    point: ReadPoint,
    lower: bytes,
    upper: bytes | None,
    bounds: tuple[bytes | None, bytes | None, bytes | None],
    count: int,
    record_type: type,
    names: Callable[[int], bytes],
    known: dict[Any, bytes],
) -> tuple[list[Any], bytes | None] | None:
    """Up to ``count`` visible records of keys in [lower, upper) and ``bounds`` (from_key, to_key,
    after_key), built by the compiled accelerator, and the key form where the key-order stream must take
    over (a long key), or None when the scan finished; None when there is no accelerator or the read has a
    phantom (the streams above serve those). A record's generation is ``known[seq]``, else ``names(seq)``.

    The compiled twin of :func:`visible_stream` with :func:`in_key_order` and the query page's loop over
    them (``reads.query_page``), for short keys: the same records, the same stop at ``to_key``."""
    accel = layout.ACCEL
    if accel is None or point.phantom is not None:
        return None
    if point.seq < 0:
        return [], None
    prefix = point.meta.records_prefix
    cursor = txn.cursor(db=tables.records)
    if not cursor.set_range(layout.record_head(prefix, lower)):
        return [], None
    stop = (
        layout.record_head(prefix, upper)
        if upper is not None
        else (layout.next_prefix(prefix) or _ABOVE_EVERY_KEY)
    )
    from_key, to_key, after_key = bounds
    return accel.query_scan(
        cursor.iternext(),
        layout.record_seq(point.seq),
        stop,
        from_key,
        to_key,
        after_key,
        count,
        record_type,
        known,
        names,
    )


def _phantom_stream(
    txn: lmdb.Transaction, tables: Tables, point: ReadPoint, lower: bytes, upper: bytes | None, reverse: bool
) -> Iterator[Version]:
    assert point.phantom is not None
    prefix = layout.phantom_prefix(point.meta.cid_prefix, point.phantom)
    rows: list[Version] = []
    cursor = txn.cursor(db=tables.phantoms)
    if cursor.set_range(prefix + lower):
        for key, raw in cursor:
            if not key.startswith(prefix):
                break
            form = key[len(prefix) :]
            if upper is not None and form >= upper:
                break
            found = phantom_version(msgpack.unpackb(raw), point.generation_id)
            if found is not None:
                rows.append((form, found[1], found[0]))
    # Phantom rows are few (private what-if writes), so holding them is fine.
    return iter(reversed(rows)) if reverse else iter(rows)


def visible_stream(
    txn: lmdb.Transaction,
    tables: Tables,
    point: ReadPoint,
    lower: bytes = b"",
    upper: bytes | None = None,
    reverse: bool = False,
) -> Iterator[Version]:
    """Visible versions in form order, phantom overlay applied, tombstones included."""
    base = _base_stream(txn, tables, point, lower, upper, reverse)
    if point.phantom is None:
        return base
    phantom = _phantom_stream(txn, tables, point, lower, upper, reverse)
    return _with_phantom(txn, tables, point, base, phantom, reverse)


def _with_phantom(
    txn: lmdb.Transaction,
    tables: Tables,
    point: ReadPoint,
    base: Iterator[Version],
    phantom: Iterator[Version],
    reverse: bool,
) -> Iterator[Version]:
    gen_cache: dict[int, bytes] = {}

    def base_gen(seq: int) -> bytes:
        if seq not in gen_cache:
            gen_cache[seq] = generation_of_seq(txn, tables, point.meta, seq)
        return gen_cache[seq]

    def before(a: bytes, b: bytes) -> bool:
        return a > b if reverse else a < b

    b_item = next(base, None)
    p_item = next(phantom, None)
    while b_item is not None or p_item is not None:
        if p_item is None or (b_item is not None and before(b_item[0], p_item[0])):
            assert b_item is not None
            yield b_item
            b_item = next(base, None)
        elif b_item is None or before(p_item[0], b_item[0]):
            yield p_item
            p_item = next(phantom, None)
        else:
            assert isinstance(b_item[2], int) and isinstance(p_item[2], bytes)
            yield p_item if p_item[2] >= base_gen(b_item[2]) else b_item
            b_item = next(base, None)
            p_item = next(phantom, None)


def in_key_order(
    stream: Iterator[tuple[bytes, bytes, int | bytes]],
    reverse: bool = False,
) -> Iterator[tuple[bytes, bytes, int | bytes]]:
    """Turns (form, stored value, gen) into (user key, stored value, gen) in true bytewise key order.

    Only long keys sharing a 200-byte prefix can be out of order; such a group is sorted in memory.
    """
    group: list[tuple[bytes, bytes, int | bytes]] = []
    group_id: bytes | None = None
    long_mark = layout.LONG_MARK
    for form, raw, gen in stream:
        if long_mark in form:  # layout.is_long_form, inlined: this runs once per record read
            gid = layout.long_group(form)
            if gid != group_id:
                if group:
                    group.sort(key=lambda row: row[0], reverse=reverse)
                    yield from group
                group, group_id = [], gid
            group.append((layout.key_of(form, raw), raw, gen))
            continue
        if group:
            group.sort(key=lambda row: row[0], reverse=reverse)
            yield from group
            group, group_id = [], None
        yield form[:-2].replace(b"\x00\xff", b"\x00"), raw, gen  # layout.short_key_of_form
    if group:
        group.sort(key=lambda row: row[0], reverse=reverse)
        yield from group


def lower_form(key: bytes | None) -> bytes:
    """The first form a scan starting at ``key`` (inclusive) must look at."""
    if key is None:
        return b""
    form = layout.key_form(key)
    return layout.long_group(form) if layout.is_long_form(form) else form


def upper_form(key: bytes | None) -> bytes | None:
    """The form at which a scan ending before ``key`` (exclusive) may stop (None: the end)."""
    if key is None:
        return None
    form = layout.key_form(key)
    if layout.is_long_form(form):
        return layout.next_prefix(layout.long_group(form))
    return form
