"""Writes: the generation lifecycle of SPEC §1 and put/putMany, each inside one write transaction.

Lifecycle of a manual collection (G = requested id, cur = current, next = open generation)::

    start G:   G <= cur -> outdatedGeneration | no next -> next := G | G == next -> ok
               G > next and abort_outdated -> drop next's records, next := G | else outdatedGeneration
    commit G:  G != next -> generationMismatch | cur := G, next := none, reader updates (all or nothing)
    abort G:   G != next -> generationMismatch | drop next's records, next := none

The open generation keeps the lease token it was started under; start, commit, abort and writes check it
(see :mod:`diffstore.engine.leases` for that table).

A non-manual collection always has next = cur + 1 open; its writes are committed automatically (see
``background.auto_commit``) or at once when the open generation reaches ``max_generation_records``.
"""

from __future__ import annotations

import functools
import itertools
import operator
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import lmdb
import msgpack

from diffstore.engine import changes, digests, history, layout, leases, lineage, producers, readers
from diffstore.engine.meta import CollectionMeta, non_manual_generation
from diffstore.engine.tables import (
    Tables,
    generation_of_seq,
    register_generation,
    resolve_seq,
    save_meta,
    unregister_generation,
    validate_generation_id,
)
from diffstore.engine.types import LeaseToken, PutItem, PutResult, ReaderUpdate
from diffstore.engine.visibility import ReadPoint, live_phantom, point_version
from diffstore.errors import GenerationMismatch, InvalidRequest, NotManual, OutdatedGeneration, text_form

if TYPE_CHECKING:
    from diffstore.engine._accel import SortedRows  # the compiled accelerator's (it may not be built)


def _require_manual(meta: CollectionMeta) -> None:
    if not meta.manual:
        raise NotManual(f"collection {meta.name!r} is not manual")


def drop_open_generation(txn: lmdb.Transaction, tables: Tables, meta: CollectionMeta) -> CollectionMeta:
    """Deletes the open generation's records (cost follows its writes) and forgets it."""
    assert meta.next is not None and meta.next_seq is not None
    drop_open_records(txn, tables, meta)
    digests.drop_pending(txn, tables, meta)
    unregister_generation(txn, tables, meta, meta.next, meta.next_seq)
    return meta.with_(next=None, next_seq=None, next_count=0, next_lease=None)


def drop_open_records(txn: lmdb.Transaction, tables: Tables, meta: CollectionMeta) -> None:
    """Deletes the records written into the open generation (and their index rows); it stays registered."""
    seq = meta.next_seq
    assert seq is not None
    records, records_prefix = txn.cursor(db=tables.records), meta.records_prefix

    def drop_record(form: bytes) -> None:
        if records.set_key(layout.record_key(records_prefix, form, seq)):
            records.delete()

    changes.drop(txn, tables, meta.cid_prefix, seq, drop_record)


def start_generation(
    txn: lmdb.Transaction,
    tables: Tables,
    meta: CollectionMeta,
    generation_id: bytes,
    abort_outdated: bool,
    lease: LeaseToken | None = None,
    opened_holds: bool = True,
) -> CollectionMeta:
    """Opens ``generation_id`` under ``lease`` (already fenced by the caller, in this transaction);
    ``opened_holds``: whether the open generation's lease, if any, still holds."""
    _require_manual(meta)
    validate_generation_id(generation_id)
    if generation_id <= meta.generation:
        raise OutdatedGeneration(
            f"generation {text_form(generation_id)} is not above the current generation "
            f"{text_form(meta.generation)}{bytewise_hint(generation_id, meta.generation)}"
        )
    if meta.next is not None and meta.next_lease != lease:
        if not leases.supersedes(lease, meta.next_lease, opened_holds):
            leases.require_opened_under(meta, lease, "start")
        # a fenced-out writer's generation: nothing of it may survive, whatever id it has
        meta = drop_open_generation(txn, tables, meta)
    if meta.next == generation_id:
        return meta
    if meta.next is not None:
        if not (abort_outdated and generation_id > meta.next):
            raise OutdatedGeneration(f"generation {text_form(meta.next)} is open: commit or abort it first")
        meta = drop_open_generation(txn, tables, meta)
    seq = meta.last_seq + 1
    meta = meta.with_(next=bytes(generation_id), next_seq=seq, last_seq=seq, next_count=0, next_lease=lease)
    register_generation(txn, tables, meta, meta.next, seq)  # type: ignore[arg-type]
    save_meta(txn, tables, meta)
    return meta


def commit_generation(
    txn: lmdb.Transaction,
    tables: Tables,
    meta: CollectionMeta,
    generation_id: bytes,
    updates: Sequence[ReaderUpdate],
    lease: LeaseToken | None = None,
    now_ms: int | None = None,
    metadata: dict[str, str] | None = None,
) -> CollectionMeta:
    _require_manual(meta)
    if meta.next is None or generation_id != meta.next:
        raise GenerationMismatch(_not_open(generation_id, meta))
    leases.require_opened_under(meta, lease, "commit")
    moves = readers.apply_updates(txn, tables, meta, updates)
    lineage.record(txn, tables, meta, moves)  # the open generation's moves, in the same transaction
    assert meta.next_seq is not None
    history.record(txn, tables, meta, meta.next_seq, now_ms, metadata, meta.next_keys)
    digests.record_commit(txn, tables, meta, meta.next_seq)
    meta = meta.with_(
        generation=meta.next,
        generation_seq=meta.next_seq,
        next=None,
        next_seq=None,
        next_count=0,
        next_lease=None,
    )
    save_meta(txn, tables, meta)
    return meta


_NUMBERED = re.compile(rb"(.*?)(\d+)")


def bytewise_hint(generation_id: bytes, current: bytes) -> str:
    """A hint when ``generation_id`` counts above ``current`` as a number but sorts below it bytewise
    (``g10`` after ``g3``): ids are compared as bytes, so their numbers need zero-padding."""
    asked, now = _NUMBERED.fullmatch(generation_id), _NUMBERED.fullmatch(current)
    if asked is None or now is None or asked.group(1) != now.group(1):
        return ""
    if int(asked.group(2)) <= int(now.group(2)):
        return ""
    width = max(len(asked.group(2)), len(now.group(2))) + 1
    example = text_form(asked.group(1) + asked.group(2).zfill(width))
    return (
        ": generation ids compare bytewise, not as numbers; zero-pad the numbers to one width "
        f"(e.g. {example}) so that they sort in order"
    )


def _not_open(generation_id: bytes, meta: CollectionMeta) -> str:
    if meta.next is None:
        return f"generation {text_form(generation_id)} is not open: no generation is open"
    return f"generation {text_form(generation_id)} is not the open generation {text_form(meta.next)}"


def abort_generation(
    txn: lmdb.Transaction,
    tables: Tables,
    meta: CollectionMeta,
    generation_id: bytes,
    lease: LeaseToken | None = None,
    opened_holds: bool = True,
) -> CollectionMeta:
    _require_manual(meta)
    if meta.next is None or generation_id != meta.next:
        raise GenerationMismatch(_not_open(generation_id, meta))
    if not leases.supersedes(lease, meta.next_lease, opened_holds):
        leases.require_opened_under(meta, lease, "abort")
    meta = drop_open_generation(txn, tables, meta)
    save_meta(txn, tables, meta)
    return meta


def commit_automatic(
    txn: lmdb.Transaction, tables: Tables, meta: CollectionMeta, now_ms: int | None = None
) -> CollectionMeta:
    """Commits a non-manual collection's open generation and opens the one after it."""
    assert meta.next is not None and meta.next_seq is not None
    history.record(txn, tables, meta, meta.next_seq, now_ms, changed=meta.next_keys)
    digests.record_commit(txn, tables, meta, meta.next_seq)
    seq = meta.next_seq + 1
    meta = meta.with_(
        generation=meta.next,
        generation_seq=meta.next_seq,
        next=non_manual_generation(seq),
        next_seq=seq,
        last_seq=seq,
        next_count=0,
    )
    register_generation(txn, tables, meta, meta.next, seq)  # type: ignore[arg-type]
    save_meta(txn, tables, meta)
    return meta


@dataclass(frozen=True, slots=True)
class _Batch:
    """A put's items, normalized: each key to its last value, and what one pass over them found."""

    latest: dict[bytes, bytes | None]
    flagged: set[bytes]  # keys written only if absent
    longest: int  # the longest key's length
    tombstones: bool  # whether a value is None


def _normalize(items: Iterable[PutItem], if_not_present: bool) -> _Batch:
    """Keys to their last value (the last item of a key wins, SPEC §1) and the keys written only if absent.

    The common shape, ``(key, value)`` pairs, goes through ``dict()`` at C speed; this is the bulk path.
    """
    items = items if isinstance(items, list) else list(items)
    flagged: set[bytes] = set()
    try:
        latest: dict[bytes, bytes | None] = dict(items)  # type: ignore[arg-type]
        if if_not_present:
            flagged = set(latest)
    except (ValueError, TypeError):
        if all(type(item) is tuple and len(item) == 3 for item in items):
            # (key, value, if_not_present) triples, as the HTTP front parses them: still C-speed loops
            try:
                latest = {key: value for key, value, _ in items}  # type: ignore[misc]
                last_flags = {key: flag for key, _, flag in items}  # type: ignore[misc]
            except TypeError as exc:
                raise InvalidRequest("a key must be bytes") from exc
            flagged = {key for key, flag in last_flags.items() if flag}
            return _validated(latest, flagged)
        latest = {}
        for item in items:
            if not isinstance(item, tuple | list) or len(item) not in (2, 3):
                raise InvalidRequest("an item is (key, value) or (key, value, if_not_present)") from None
            key, value = item[0], item[1]
            latest[key] = value
            if item[2] if len(item) == 3 else if_not_present:
                flagged.add(key)
            else:
                flagged.discard(key)
    return _validated(latest, flagged)


_FIRST = operator.itemgetter(0)  # a key: (key, value) pairs sort by their (distinct) keys alone
_NO_BATCH = _Batch({}, set(), 0, False)  # the fast path's: nothing left for the general path
_KEY_TYPES = frozenset({bytes})
_VALUE_TYPES = frozenset({bytes, type(None)})
_NONE_TYPE = type(None)


def _validated(latest: dict[bytes, bytes | None], flagged: set[bytes]) -> _Batch:
    # set(map(type, ...)) runs in C: validation must not cost the bulk path a Python loop per item; the
    # passes also tell what the bulk path needs (longest key, any tombstone), so nothing scans twice
    if not set(map(type, latest)) <= _KEY_TYPES:
        raise InvalidRequest("a key must be bytes")
    longest = max(map(len, latest)) if latest else 0
    if longest > layout.MAX_KEY_LENGTH:
        raise InvalidRequest("a key must be at most 2^24-1 bytes")
    value_types = set(map(type, latest.values()))
    if not value_types <= _VALUE_TYPES:
        raise InvalidRequest("a value must be bytes or None (tombstone)")
    return _Batch(latest, flagged, longest, _NONE_TYPE in value_types)


def _phantom_write(
    txn: lmdb.Transaction,
    tables: Tables,
    meta: CollectionMeta,
    phantom: int,
    generation_id: bytes,
    items: dict[bytes, bytes | None],
    flagged: set[bytes],
    skip_unchanged: bool,
) -> PutResult:
    point = ReadPoint(meta, generation_id, resolve_seq(txn, tables, meta, generation_id), phantom)
    prefix = layout.phantom_prefix(meta.cid_prefix, phantom)
    wrote = False
    found_gen = generation_id
    for key, value in items.items():
        form = layout.key_form(key)
        inp = key in flagged
        if inp or skip_unchanged:
            visible = point_version(txn, tables, point, form)
            current = layout.decode_value(visible[1]) if visible else None
            if inp and current is not None:
                assert visible is not None
                if len(items) == 1:
                    gen = visible[2]
                    found_gen = gen if isinstance(gen, bytes) else generation_of_seq(txn, tables, meta, gen)
                continue
            if skip_unchanged and current == value:
                continue
        raw = txn.get(prefix + form, db=tables.phantoms)
        entries = [e for e in msgpack.unpackb(raw) if e[0] != generation_id] if raw else []
        entries.append([generation_id, layout.encode_value(key, value)])
        entries.sort(key=lambda e: e[0])
        txn.put(prefix + form, msgpack.packb(entries, use_bin_type=True), db=tables.phantoms)
        wrote = True
    return PutResult(generation_id) if wrote else PutResult(found_gen, was_put=False)


def _put_rows(
    cursor: lmdb.Cursor,
    rows: Callable[[], Iterable[tuple[bytes | bytearray, bytes | bytearray]]],
    first_key: bytes,
    count: int,
    ascending: bool,
    overwrite: bool = True,
) -> int:
    """``putmulti`` of ``count`` rows (each call of ``rows``: a new pass over them), in LMDB's append mode
    when they ascend past the table's last key; returns how many it added (without ``overwrite``: the rows
    whose key was not there yet).

    That is a bulk load of sorted new keys into the newest collection: append mode skips the B-tree
    descent per row and fills pages whole. Both checks hold in this transaction (``ascending`` is
    the caller's): a row that is not past the last key would be skipped silently by append mode.
    """
    appended = 0
    if ascending and (not cursor.last() or cursor.key() < first_key):
        _, appended = cursor.putmulti(rows(), append=True, overwrite=overwrite)
        if appended == count:
            return count
        # cannot happen after the checks; the plain put rewrites the rows added (same values) and the rest
        # (without ``overwrite`` it leaves the rows added, which it does not count again)
    _, added = cursor.putmulti(rows(), overwrite=overwrite)
    return int(added) + (0 if overwrite else int(appended))


def _sorted_rows(meta: CollectionMeta, items: Iterable[PutItem], plain: bool) -> SortedRows | None:
    """The rows of a plain put (no phantom, no condition) of sorted short keys into the open generation,
    built at C speed (``layout.sorted_short_rows``), or None: the general path takes the items."""
    if not plain or meta.next_seq is None:
        return None
    return layout.sorted_short_rows(meta.cid, meta.next_seq, items)


def open_target(meta: CollectionMeta, generation_id: bytes | None, lease: LeaseToken | None) -> bytes:
    """The open generation a write (put, putMany, revert) goes into: the one ``generation_id`` names (a
    manual collection's writes must name it; a non-manual one's may leave it out).

    Raises:
        GenerationMismatch: no generation is open, or ``generation_id`` is not the open one.
        LeaseLost: a manual collection's open generation was started under another lease than ``lease``.
    """
    if (
        meta.next is None
        or meta.next_seq is None
        or (generation_id is not None and generation_id != meta.next)
    ):
        raise GenerationMismatch(
            "no generation is open: start one before writing"
            if meta.next is None
            else f"writes must name the open generation {text_form(meta.next)}, "
            f"not {text_form(generation_id)}"
        )
    if meta.manual and generation_id is None:
        raise GenerationMismatch("a manual collection's writes must name the open generation")
    if meta.manual:
        leases.require_opened_under(meta, lease, "write")
    return meta.next


def put_many(
    txn: lmdb.Transaction,
    tables: Tables,
    meta: CollectionMeta,
    items: Iterable[PutItem],
    *,
    generation_id: bytes | None,
    phantom_id: bytes | None,
    if_not_present: bool,
    skip_unchanged: bool,
    producer_id: str | None,
    seq_no: int | None,
    max_generation_records: int,
    lease: LeaseToken | None = None,
    now_ms: int | None = None,
) -> tuple[CollectionMeta, PutResult, bool]:
    """Writes items; returns (new meta, result, whether this was the open generation's first write).

    ``now_ms`` is the commit time recorded if the writes reach ``max_generation_records`` (None: the wall
    clock)."""
    # Sorted short keys, the shape of a bulk load, skip the normalization below: strictly ascending keys
    # cannot repeat, and their rows come out ascending, ready for append mode.
    fast = _sorted_rows(meta, items, phantom_id is None and not if_not_present and not skip_unchanged)
    batch = _normalize(items, if_not_present) if fast is None else _NO_BATCH
    latest, flagged = batch.latest, batch.flagged
    with_producer = producers.validate(producer_id, seq_no)
    if phantom_id is not None:
        if generation_id is None:
            raise InvalidRequest("a phantom write needs a generationId")
        validate_generation_id(generation_id)
        phantom = live_phantom(txn, tables, meta, phantom_id)
        if phantom is None:
            raise InvalidRequest("unknown or expired phantomId")
        if with_producer and not producers.admit(txn, tables, meta, producer_id, seq_no, None):  # type: ignore[arg-type]
            return meta, PutResult(generation_id, was_put=False, skipped=True), False
        result = _phantom_write(txn, tables, meta, phantom, generation_id, latest, flagged, skip_unchanged)
        return meta, result, False
    target = open_target(meta, generation_id, lease)
    seq = meta.next_seq
    assert seq is not None  # open_target checked it
    if with_producer and not producers.admit(txn, tables, meta, producer_id, seq_no, seq):  # type: ignore[arg-type]
        return meta, PutResult(target, was_put=False, skipped=True), False
    prefix = meta.cid_prefix
    run = layout.change_prefix(prefix, seq)
    found_gen = target
    if flagged or skip_unchanged:
        point = ReadPoint(meta, target, seq)
        kept: dict[bytes, bytes | None] = {}
        for key, value in latest.items():
            visible = point_version(txn, tables, point, layout.key_form(key))
            current = layout.decode_value(visible[1]) if visible else None
            if key in flagged and current is not None:
                assert visible is not None
                if len(latest) == 1:
                    found_gen = generation_of_seq(txn, tables, meta, visible[2])  # type: ignore[arg-type]
                continue
            if skip_unchanged and current == value:
                continue
            kept[key] = value
        latest = kept
    if fast is None and latest and batch.longest <= layout.LONG_KEY_PREFIX:
        # Any other batch of short keys, sorted, takes the compiled rows too (None: not built): sorting in
        # C costs less than building the rows as lists of bytes, and the rows then ascend.
        fast = layout.sorted_short_rows(meta.cid, seq, sorted(latest.items(), key=_FIRST))
    if fast is not None:
        count = len(fast)
        records = txn.cursor(db=tables.records)
        # past the table's last key, the ascending rows are all new: the digest sums them now (record_put)
        appends = not records.last() or records.key() < fast.first_record_key
        digests.record_put(txn, tables, meta, seq, fast if appends else None)
        _put_rows(records, fast.records, fast.first_record_key, count, True)
        rows = fast  # for the closure: mypy does not narrow ``fast`` inside it
        keys = _index_keys(
            txn,
            tables,
            run,
            count,
            fast.first_change_key,
            lambda: rows.chunks(layout.CHUNK_BYTES),
            fast.changes,
            True,
        )
        return _written(txn, tables, meta, target, count, keys, max_generation_records, now_ms)
    if not latest:
        return meta, PutResult(found_gen, was_put=False), False
    if batch.longest <= layout.LONG_KEY_PREFIX:  # of the items given: ``kept`` holds no longer key
        record_keys, stored, change_keys = layout.short_rows(meta.cid, seq, latest, batch.tombstones)
    else:
        record_keys, values, change_keys = [], [], []
        records_prefix, suffix = meta.records_prefix, layout.record_seq(seq)
        for key, value in latest.items():
            form = layout.key_form(key)
            record_keys.append(layout.record_head(records_prefix, form) + suffix)
            values.append(layout.seal(record_keys[-1], layout.encode_value(key, value)))
            change_keys.append(run + form)
        stored = functools.partial(iter, values)
    digests.record_put(txn, tables, meta, seq, None)
    # Both tables' rows come in the same order (that of the key forms): one check serves both.
    count = len(record_keys)
    ascending = count > 1 and layout.ascending(record_keys)
    _put_rows(
        txn.cursor(db=tables.records),
        lambda: zip(record_keys, stored(), strict=False),
        record_keys[0],
        count,
        ascending,
    )
    start = len(run)
    keys = _index_keys(
        txn,
        tables,
        run,
        count,
        change_keys[0] if ascending or count == 1 else min(change_keys),
        lambda: layout.chunk_rows(
            prefix, seq, [key[start:] for key in (change_keys if ascending else sorted(change_keys))]
        ),
        lambda: zip(change_keys, itertools.repeat(b"")),
        ascending,
    )
    return _written(txn, tables, meta, target, count, keys, max_generation_records, now_ms)


def _index_keys(
    txn: lmdb.Transaction,
    tables: Tables,
    run: bytes,
    count: int,
    first_key: bytes | bytearray,
    chunks: Callable[[], list[tuple[bytes, bytes]]],
    rows: Callable[[], Iterable[tuple[bytes | bytearray, bytes]]],
    ascending: bool,
) -> int:
    """Adds ``count`` distinct keys just written into the open generation to its run (``changes.py``):
    as chunks when they all lie above every key the run holds (a bulk load, a generation's first
    write: one B-tree insert per ~75 short keys), else as a ``changes`` row each (``rows``: each call a
    new pass; ``first_key``: the lowest of their keys). Returns how many of them the run did not hold yet."""
    last = changes.last_key(txn, tables, run)
    if last is None or first_key > last:
        packed = chunks()
        _put_rows(txn.cursor(db=tables.change_chunks), lambda: packed, packed[0][0], len(packed), True)
        return count
    if changes.has_chunks(txn, tables, run):
        # the chunks may hold some of them already: those get no row of their own (a key is in one form)
        keys = [bytes(key) for key, _ in rows()]
        start = len(run)
        held = changes.held_in_chunks(txn, tables, run, [key[start:] for key in keys])
        fresh = [key for key in keys if key[start:] not in held]
        if not fresh:
            return 0
        return _put_rows(
            txn.cursor(db=tables.changes),
            lambda: zip(fresh, itertools.repeat(b"")),
            min(fresh),
            len(fresh),
            ascending,
            overwrite=False,
        )
    return _put_rows(
        txn.cursor(db=tables.changes),
        rows,
        first_key if isinstance(first_key, bytes) else bytes(first_key),
        count,
        ascending,
        overwrite=False,  # a key already written into this generation keeps its row, and is not counted
    )


def _written(
    txn: lmdb.Transaction,
    tables: Tables,
    meta: CollectionMeta,
    target: bytes,
    count: int,
    keys: int,
    max_generation_records: int,
    now_ms: int | None,
) -> tuple[CollectionMeta, PutResult, bool]:
    """Counts ``count`` records written into the open generation ``target``, ``keys`` of them of keys it
    had not written yet (committing it when a non-manual one reaches ``max_generation_records``):
    put_many's answer."""
    first_write = meta.next_count == 0
    known = meta.next_keys
    meta = meta.with_(next_count=meta.next_count + count, next_keys=None if known is None else known + keys)
    if not meta.manual and meta.next_count >= max_generation_records:
        meta = commit_automatic(txn, tables, meta, now_ms)
        save_meta(txn, tables, meta)
        return meta, PutResult(target, records=count), False
    save_meta(txn, tables, meta)
    return meta, PutResult(target, records=count), first_write and not meta.manual
