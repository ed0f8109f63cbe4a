"""Diffs between two generations, driven by the ``changes`` index so cost follows the writes.

The keys written in each generation of (from, to] form one sorted run in ``changes``. Two ways find the
changed keys, switched along the key range as the density of changes varies (:func:`iter_diff`):

* where few keys changed, a k-way merge of the runs yields them in order, deduplicated, holding one key
  per run in memory (never the range's keys), and the ``records`` cursor seeks to each (the keyed way);
* where keys changed side by side, one forward scan of ``records`` sees every version it needs and skips
  the ``changes`` index.

Both loops have a compiled twin in ``_accel.c``, used when it was built (the keyed way's for short keys
without intermediate values).

For each key, its versions in ``records`` give the value at ``to``, the values in between, and the value
at ``from``; keys whose two ends are equal are left out. Long keys and intermediate values always take
the merge's way.

A page covers at most ``max_diff_generations`` generations: a larger range answers a lower
``to_generation_id`` and clients repeat from it (SPEC §3). The :func:`iter_diff` iterator merges the
whole range at once instead, so every key appears once.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass

import lmdb

from diffstore.engine import changes, layout
from diffstore.engine.cursors import CursorCodec, DiffCursor
from diffstore.engine.layout import decode_value
from diffstore.engine.meta import CollectionMeta
from diffstore.engine.readers import load_reader, readable_floor
from diffstore.engine.reads import cached_cuts, check_split_count, even_form_cuts, pinned_seq_exists
from diffstore.engine.tables import (
    Tables,
    check_not_collected,
    generation_of_seq,
    load_meta,
    resolve_seq,
    validate_generation_id,
)
from diffstore.engine.types import DiffItem, DiffPage, DiffSpec, FromReader
from diffstore.engine.visibility import lower_form, upper_form
from diffstore.errors import (
    CursorExpired,
    InvalidRequest,
    NoSuchCursor,
    NoSuchGeneration,
    NoSuchReader,
    text_form,
)


@dataclass(frozen=True, slots=True)
class DiffRange:
    """A resolved diff: generation ids as answered, and the seqs of the generations it covers."""

    from_generation_id: bytes
    from_seq: int
    to_generation_id: bytes
    to_seq: int


def resolve_from(
    txn: lmdb.Transaction,
    tables: Tables,
    meta: CollectionMeta,
    from_generation_id: bytes | None,
    from_reader: str | FromReader | None,
) -> bytes:
    """The diff's start: the given id, else a reader's generation (null reader: ``""``), else ``""``.

    Naming both, the id wins (SPEC §3, as in diffbelt) and the reader is not even looked up.
    """
    if from_generation_id is not None or from_reader is None:
        return bytes(from_generation_id or b"")
    if isinstance(from_reader, str):
        from_reader = FromReader(from_reader)
    owner = (
        meta
        if from_reader.collection in (None, meta.name)
        else load_meta(txn, tables, from_reader.collection)
    )
    reader = load_reader(txn, tables, owner, from_reader.name)
    if reader is None:
        raise NoSuchReader(f"collection {owner.name!r} has no reader {from_reader.name!r}")
    return reader.generation_id or b""


def resolve_range(
    txn: lmdb.Transaction,
    tables: Tables,
    meta: CollectionMeta,
    from_generation_id: bytes,
    to_generation_id: bytes | None,
    max_generations: int | None,
) -> DiffRange:
    validate_generation_id(from_generation_id, "fromGenerationId")
    to_gen = meta.generation if to_generation_id is None else bytes(to_generation_id)
    validate_generation_id(to_gen, "toGenerationId")
    if to_gen > meta.generation and to_gen != meta.next:
        raise NoSuchGeneration(
            f"toGenerationId {text_form(to_gen)} is above the current generation {text_form(meta.generation)}"
            " and is not the open one"
        )
    # to the open generation: its pending changes, as a read there sees them (a writer checking its work)
    if from_generation_id > to_gen:
        raise InvalidRequest(
            f"fromGenerationId {text_form(from_generation_id)} is above "
            + (
                f"the current generation {text_form(to_gen)}"
                if to_gen == meta.generation
                else f"toGenerationId {text_form(to_gen)}"
            )
        )
    floor = readable_floor(txn, tables, meta)
    check_not_collected(meta, from_generation_id, floor, allow_beginning=True)
    check_not_collected(meta, to_gen, floor)
    from_seq = resolve_seq(txn, tables, meta, from_generation_id)
    to_seq = resolve_seq(txn, tables, meta, to_gen)
    # A diff from the very beginning after GC must not end below the horizon (what lies below is gone),
    # so its first piece reaches at least the horizon and the cut is counted from there.
    count_from = from_seq
    if floor is not None and from_generation_id < floor:
        count_from = max(from_seq, resolve_seq(txn, tables, meta, floor))
    if max_generations is not None and to_seq - count_from > max_generations:
        # seqs are not dense: count the generations really in the range before cutting it.
        cursor = txn.cursor(db=tables.gens)
        prefix = meta.cid_prefix
        counted = 0
        if cursor.set_range(layout.gen_key(prefix, count_from + 1)):
            for key in cursor.iternext(values=False):
                seq = layout.seq_of_gen_key(key)
                if not key.startswith(prefix) or seq > to_seq:
                    break
                counted += 1
                if counted == max_generations:
                    if seq < to_seq:
                        to_seq, to_gen = seq, generation_of_seq(txn, tables, meta, seq)
                    break
    return DiffRange(bytes(from_generation_id), from_seq, to_gen, to_seq)


def run_seqs(txn: lmdb.Transaction, tables: Tables, meta: CollectionMeta, span: DiffRange) -> list[int]:
    """The seqs of the generations registered in (from, to] of ``span``, ascending (committed ones, and the
    open one when ``span`` reaches it)."""
    prefix = meta.cid_prefix
    seqs: list[int] = []
    cursor = txn.cursor(db=tables.gens)
    if cursor.set_range(layout.gen_key(prefix, span.from_seq + 1)):
        for key in cursor.iternext(values=False):
            if not key.startswith(prefix):
                break
            seq = layout.seq_of_gen_key(key)
            if seq > span.to_seq:
                break
            seqs.append(seq)
    return seqs


def diff_splits(
    txn: lmdb.Transaction,
    tables: Tables,
    meta: CollectionMeta,
    from_generation_id: bytes,
    to_generation_id: bytes | None,
    count: int,
) -> list[bytes]:
    """Up to ``count - 1`` ascending keys cutting the keys changed in (from, to] into near-equal ranges:
    the key ranges parallel readers of that diff split it by.

    One pass over the generations' ``changes`` runs: it costs what the diff's changes number, where cutting
    the keys visible at ``to`` (:func:`~diffstore.engine.reads.splits`) reads the whole collection.

    Raises:
        InvalidRequest, NoSuchGeneration, GenerationCollected: as the diff of that range would.
    """
    check_split_count(count)
    span = resolve_range(txn, tables, meta, from_generation_id, to_generation_id, None)

    def cut() -> list[bytes]:
        forms = changed_forms(txn, tables, meta.cid_prefix, run_seqs(txn, tables, meta, span), b"", None)
        return even_form_cuts(forms, count)

    return cached_cuts(tables, (meta.cid, span.from_seq, span.to_seq, count), cut)


def changed_forms(
    txn: lmdb.Transaction, tables: Tables, prefix: bytes, seqs: list[int], lower: bytes, upper: bytes | None
) -> Iterator[bytes]:
    """The key forms written in any of ``seqs``, ascending, each once."""
    if len(seqs) == 1:
        return changes.forms(txn, tables, prefix, seqs[0], lower, upper)
    # a k-way merge: one form per run held at a time, nothing more
    return changes.merge_forms([changes.forms(txn, tables, prefix, seq, lower, upper) for seq in seqs])


def iter_items(
    txn: lmdb.Transaction,
    tables: Tables,
    meta: CollectionMeta,
    span: DiffRange,
    *,
    include_intermediate: bool,
    from_key: bytes | None,
    to_key: bytes | None,
    after_key: bytes | None,
) -> Iterator[DiffItem]:
    """Every changed key of the range in bytewise key order (long-key groups sorted in memory)."""
    return iter_diff(
        contextlib.nullcontext(txn),
        tables,
        lambda _txn: (meta, span),
        include_intermediate=include_intermediate,
        from_key=from_key,
        to_key=to_key,
        after_key=after_key,
    )


def iter_diff(
    snapshot: contextlib.AbstractContextManager[lmdb.Transaction],
    tables: Tables,
    resolve: Callable[[lmdb.Transaction], tuple[CollectionMeta, DiffRange]],
    *,
    include_intermediate: bool,
    from_key: bytes | None,
    to_key: bytes | None,
    after_key: bytes | None,
) -> Iterator[DiffItem]:
    """:func:`iter_items` in the ``snapshot`` it holds open while it runs, the range resolved in it.

    Callers hand this generator out as it is: every generator frame between the hot loop and its
    consumer costs a resumption per item.

    Two ways to find the changed keys, switched as the density of changes varies along the key range:
    where keys changed side by side, one forward scan of ``records`` sees every version it needs and
    skips the ``changes`` index (below); where few did, the ``changes`` runs name the keys and the records
    cursor seeks to each (:func:`_keyed_items`). Long keys and intermediate values take the keyed way.
    """
    with snapshot as txn:
        meta, span = resolve(txn)
        if span.to_seq <= span.from_seq:
            return
        seqs = run_seqs(txn, tables, meta, span)
        if not seqs:
            return
        prefix, records_prefix = meta.cid_prefix, meta.records_prefix
        lower = lower_form(after_key if after_key is not None else from_key)
        upper = upper_form(to_key)
        records = txn.cursor(db=tables.records)
        to_bound = layout.record_seq(span.to_seq + 1)  # versions below it are at or below ``to``
        # b"": no version is at or below it
        from_seq = layout.record_seq(span.from_seq) if span.from_seq >= 0 else b""
        bounds = (from_key, to_key, after_key)
        if include_intermediate:
            forms = changed_forms(txn, tables, prefix, seqs, lower, upper)
            yield from _keyed_items(records, records_prefix, forms, to_bound, from_seq, bounds, True, None)
            return
        bounded = from_key is not None or to_key is not None or after_key is not None
        stop = (
            layout.record_head(records_prefix, upper)
            if upper is not None
            else (layout.next_prefix(records_prefix) or _ABOVE_EVERY_KEY)
        )
        form_at, head_of = len(records_prefix), layout.record_head_of
        new = tuple.__new__
        scan_type = layout.ACCEL.DiffScan if layout.ACCEL is not None else None
        start: bytes | None = lower
        while start is not None:
            # The scan. Per version, byte comparisons only (a record key is head | seq, so "seq <= from"
            # is "key <= head | from"); per changed key, a few slices and one tuple. The hottest loop of
            # a diff: keep it inline (no helper calls, no generator in between).
            if not records.set_range(layout.record_head(records_prefix, start)):
                return
            handed: bytes | None = None
            if scan_type is not None:
                # the compiled twin of the scan below (layout.ACCEL): the same items and the same hand-over
                scan = scan_type(
                    records.iternext(),
                    from_seq,
                    to_bound,
                    stop,
                    from_key,
                    to_key,
                    after_key,
                    _IDLE_LIMIT,
                    DiffItem,
                    (),
                )
                yield from scan
                handed = scan.handed
                if handed is None:
                    return
            else:
                head, head_from, head_to = _ABOVE_EVERY_KEY, b"", b""  # no key begins with that head
                # A version at or below ``from`` sets both ends, one in (from, to] only ``to_raw``: the key
                # was written in the range exactly when ``to_raw is not from_raw`` (stored values are fresh
                # objects; a tombstone is the b"" singleton, equal to "absent", so it is rightly never a
                # change from it).
                from_raw = to_raw = b""
                idle = -1  # the first head is not a key
                unseal = layout.unseal
                for record_key, stored in records.iternext():
                    raw = unseal(record_key, stored)
                    # Heads are prefix-free, so every key of a later head is above head | anything: below
                    # head_to is a version of this head at or below ``to``.
                    if record_key < head_to:
                        if record_key <= head_from:
                            from_raw = to_raw = raw
                        else:
                            to_raw = raw
                        continue
                    if record_key.startswith(head):
                        continue  # a version above ``to``
                    if to_raw is not from_raw:
                        idle = 0
                        if to_raw != from_raw:
                            if to_raw >= _LONG_TAG:  # a long key: its group is sorted the keyed way
                                handed = head[form_at:]
                                break
                            key = head[form_at:-2].replace(b"\x00\xff", b"\x00")
                            if not bounded or not _outside(key, bounds):
                                yield new(
                                    DiffItem,
                                    (
                                        key,
                                        from_raw[1:] if from_raw else None,
                                        to_raw[1:] if to_raw else None,
                                        (),
                                    ),
                                )
                    else:
                        idle += 1
                        # sparse here: seeking the changed keys costs less (not at ``stop``: that row is
                        # past the range, another collection's, and the scan ends at it below)
                        if idle > _IDLE_LIMIT and record_key < stop:
                            handed = layout.record_form(record_key)
                            break
                    if record_key >= stop:
                        return
                    head = head_of(record_key)
                    head_from, head_to = head + from_seq, head + to_bound
                    if record_key < head_to:
                        if record_key <= head_from:
                            from_raw = to_raw = raw
                        else:
                            from_raw, to_raw = b"", raw
                    else:
                        from_raw = to_raw = b""
                else:
                    if to_raw is from_raw or to_raw == from_raw:
                        return
                    if to_raw >= _LONG_TAG:
                        handed = head[form_at:]
                    else:
                        key = head[form_at:-2].replace(b"\x00\xff", b"\x00")
                        if not bounded or not _outside(key, bounds):
                            yield new(
                                DiffItem,
                                (key, from_raw[1:] if from_raw else None, to_raw[1:] if to_raw else None, ()),
                            )
                        return
            assert handed is not None
            forms = changed_forms(txn, tables, prefix, seqs, handed, upper)
            start = yield from _keyed_items(
                records, records_prefix, forms, to_bound, from_seq, bounds, False, _KEYED_STRETCH
            )


# The scan hands over to the keyed way after this many unchanged keys in a row: a seek per changed key
# costs about as much as stepping over this many keys' versions...
_IDLE_LIMIT = 8
# ... and the keyed way hands back to the scan after this many changed keys (the scan probes again).
_KEYED_STRETCH = 64
_ABOVE_EVERY_KEY = b"\xff" * 512  # LMDB keys are at most 511 bytes
_LONG_TAG = b"\x02"  # stored values of long keys start with 02 or 03, short ones with 01 or are b""
_KeyBounds = tuple[bytes | None, bytes | None, bytes | None]  # from_key, to_key, after_key


def _outside(key: bytes, bounds: _KeyBounds) -> bool:
    from_key, to_key, after_key = bounds
    return (
        (after_key is not None and key <= after_key)
        or (from_key is not None and key < from_key)
        or (to_key is not None and key >= to_key)
    )


def _keyed_items(
    records: lmdb.Cursor,
    prefix: bytes,
    forms: Iterator[bytes],
    to_bound: bytes,
    from_seq: bytes,
    bounds: _KeyBounds,
    include_intermediate: bool,
    stretch: int | None,
) -> Generator[DiffItem, None, bytes | None]:
    """Changed keys named by ``forms``, a seek into ``records`` per key that the cursor is not already at
    (``prefix``: the collection's records prefix).

    Stops after ``stretch`` keys (None: at the end) outside a long-key group and returns the next form,
    not yet handled (None: the forms are done or ``to_key`` is reached).
    """
    from_key, to_key, after_key = bounds
    left = stretch
    if layout.ACCEL is not None and not include_intermediate:
        # the compiled twin of the loop below for short keys: it stops at a long form, which the loop
        # takes from there (with what is left of the stretch), or where the loop would return
        keyed = layout.ACCEL.KeyedScan(
            records,
            prefix,
            forms,
            from_seq,
            to_bound,
            from_key,
            to_key,
            after_key,
            -1 if left is None else left,
            DiffItem,
            (),
        )
        yield from keyed
        if keyed.long_form is None:
            return keyed.resume
        forms, left = itertools.chain((keyed.long_form,), forms), keyed.left
    bounded = from_key is not None or to_key is not None or after_key is not None
    long_mark = layout.LONG_MARK
    group: list[DiffItem] = []
    group_id: bytes | None = None
    # The records cursor only moves forward: changed keys come in key order, so close keys are reached by
    # stepping (next, no seek) and far ones by a seek. A key's versions are read oldest first: the last
    # at or below ``from``, those in between, the last at or below ``to``. Stored values are compared
    # before they are decoded.
    set_range, step, stored_item, unseal = records.set_range, records.next, records.item, layout.unseal

    def item() -> tuple[bytes, bytes]:
        record_key, raw = stored_item()
        return record_key, unseal(record_key, raw)

    current: bytes | None = None  # the record key under the cursor (None: not positioned or exhausted)
    current_value = b""
    for form in forms:
        long_form = long_mark in form
        if group and (not long_form or layout.long_group(form) != group_id):
            group.sort(key=lambda item: item.key)
            yield from _within(group, from_key, to_key, after_key)
            group, group_id = [], None
        if left is not None:
            if left <= 0 and not group:
                return form
            left -= 1
        head = prefix + form  # layout.record_head, inlined: this runs once per changed key
        if current is None or (not current.startswith(head) and current < head):
            current, current_value = item() if set_range(head) else (None, b"")
        to_raw: bytes | None = None
        from_raw = b""
        between: list[bytes | None] | None = None
        at = len(head)
        while current is not None and current.startswith(head):
            seq = current[at:]
            if seq <= from_seq:
                from_raw = current_value
            elif seq < to_bound:
                if to_raw is not None and include_intermediate:
                    between = between or []
                    between.append(decode_value(to_raw))
                to_raw = current_value
            current, current_value = item() if step() else (None, b"")
        if to_raw is None:
            continue
        if to_raw == from_raw:
            continue
        to_value = to_raw[1:] if to_raw and to_raw[0] == 1 else decode_value(to_raw)
        from_value = from_raw[1:] if from_raw and from_raw[0] == 1 else decode_value(from_raw)
        if to_value == from_value:
            continue
        if long_form:
            group_id = layout.long_group(form)
            group.append(
                DiffItem(layout.long_key_of_value(to_raw), from_value, to_value, tuple(between or ()))
            )
            continue
        key = form[:-2].replace(b"\x00\xff", b"\x00")
        if bounded:
            if (after_key is not None and key <= after_key) or (from_key is not None and key < from_key):
                continue
            if to_key is not None and key >= to_key:
                return None
        yield _new_item((key, from_value, to_value, tuple(between) if between else ()))
    if group:
        group.sort(key=lambda item: item.key)
        yield from _within(group, from_key, to_key, after_key)
    return None


_new_item = functools.partial(tuple.__new__, DiffItem)  # DiffItem(...) without its Python-level __new__


def _within(
    items: list[DiffItem], from_key: bytes | None, to_key: bytes | None, after_key: bytes | None
) -> Iterator[DiffItem]:
    for item in items:
        if (after_key is not None and item.key <= after_key) or (
            from_key is not None and item.key < from_key
        ):
            continue
        if to_key is not None and item.key >= to_key:
            return
        yield item


def diff_page(
    txn: lmdb.Transaction,
    tables: Tables,
    meta: CollectionMeta,
    request: DiffSpec | str,
    *,
    cursors: CursorCodec,
    max_limit: int,
    max_generations: int,
) -> DiffPage:
    """One page of a diff: the first page of ``request`` (its ``limit`` given), or the page after the
    cursor token ``request``, which carries everything else."""
    if isinstance(request, str):
        state = cursors.decode(request, DiffCursor, max_limit)
        assert isinstance(state, DiffCursor)
        if state.cid != meta.cid:
            raise NoSuchCursor("the cursor belongs to another collection")
        request = state.request
        from_gen, to_gen = request.from_generation_id, request.to_generation_id
        assert from_gen is not None and to_gen is not None  # DiffCursor checks it
        floor = readable_floor(txn, tables, meta)
        if floor is not None and (b"" < from_gen < floor or to_gen < floor):
            raise CursorExpired("the cursor's range was garbage-collected")
        if not pinned_seq_exists(txn, tables, meta, state.to_seq):  # a diff to the open generation
            raise CursorExpired("the cursor's generation was aborted")
        span = DiffRange(from_gen, state.from_seq, to_gen, state.to_seq)
        after: bytes | None = state.after_key
    else:
        start = resolve_from(txn, tables, meta, request.from_generation_id, request.from_reader)
        span = resolve_range(txn, tables, meta, start, request.to_generation_id, max_generations)
        after = None
    limit = request.limit
    assert limit is not None  # the caller's default
    items: list[DiffItem] = []
    more = False
    for item in iter_items(
        txn,
        tables,
        meta,
        span,
        include_intermediate=request.include_intermediate,
        from_key=request.from_key,
        to_key=request.to_key,
        after_key=after,
    ):
        if len(items) == limit:
            more = True
            break
        items.append(item)
    token = None
    if more:
        resumed = DiffSpec(
            from_generation_id=span.from_generation_id,
            to_generation_id=span.to_generation_id,
            include_intermediate=request.include_intermediate,
            # no from_key: the resume key is above it (a token carrying fewer keys stays shorter)
            to_key=request.to_key,
            limit=limit,
        )
        token = cursors.encode(DiffCursor(meta.cid, span.from_seq, span.to_seq, resumed, items[-1].key))
    return DiffPage(span.from_generation_id, span.to_generation_id, items, token)
