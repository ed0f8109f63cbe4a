"""Reads at a generation: point get, paged query, keys around a key, and split points."""

from __future__ import annotations

import bisect
import functools
import itertools
from collections.abc import Callable, Iterable

import lmdb

from diffstore.engine import layout
from diffstore.engine.cursors import CursorCodec, QueryCursor
from diffstore.engine.meta import CollectionMeta
from diffstore.engine.readers import readable_floor
from diffstore.engine.tables import (
    Tables,
    check_not_collected,
    generation_of_seq,
    require_known,
    resolve_seq,
    validate_generation_id,
)
from diffstore.engine.types import MAX_GET_MANY_KEYS, GetResult, KeysAround, QueryPage, Record
from diffstore.engine.visibility import (
    ReadPoint,
    compiled_records,
    in_key_order,
    live_phantom,
    lower_form,
    point_version,
    upper_form,
    visible_stream,
)
from diffstore.errors import CursorExpired, InvalidRequest, NoSuchCursor


def read_point(
    txn: lmdb.Transaction,
    tables: Tables,
    meta: CollectionMeta,
    generation_id: bytes | None,
    phantom_id: bytes | None,
) -> ReadPoint:
    """Resolves where a read looks; refuses generations below the GC horizon."""
    if generation_id is None:
        # the current generation is always readable (the floor never rises above it)
        phantom = live_phantom(txn, tables, meta, phantom_id)
        return ReadPoint(meta, meta.generation, meta.generation_seq, phantom)
    validate_generation_id(generation_id)
    if phantom_id is None:
        require_known(meta, generation_id)
    check_not_collected(meta, generation_id, readable_floor(txn, tables, meta))
    seq = resolve_seq(txn, tables, meta, generation_id)
    return ReadPoint(meta, bytes(generation_id), seq, live_phantom(txn, tables, meta, phantom_id))


class _GenerationNames:
    """Turns the seq or phantom generation of a version into a generation id, caching lookups.

    ``known`` is the cache itself, readable directly on hot paths; the current and the open generation
    are in it from the start (most versions read belong to them), so they cost no lookup.
    """

    def __init__(self, txn: lmdb.Transaction, tables: Tables, meta: CollectionMeta) -> None:
        self._txn, self._tables, self._meta = txn, tables, meta
        self.known: dict[int | bytes, bytes] = {meta.generation_seq: meta.generation}
        if meta.next is not None and meta.next_seq is not None:
            self.known[meta.next_seq] = meta.next

    def __call__(self, gen: int | bytes) -> bytes:
        name = self.known.get(gen)
        if name is None:
            if isinstance(gen, bytes):
                name = gen
            else:
                name = generation_of_seq(self._txn, self._tables, self._meta, gen)
            self.known[gen] = name
        return name


def get(txn: lmdb.Transaction, tables: Tables, point: ReadPoint, key: bytes) -> GetResult:
    if not isinstance(key, bytes) or len(key) > layout.MAX_KEY_LENGTH:
        raise InvalidRequest("a key must be bytes of at most 2^24-1")
    version = point_version(txn, tables, point, layout.key_form(key))
    if version is None:
        return GetResult(point.generation_id, None)
    value = layout.decode_value(version[1])
    if value is None:
        return GetResult(point.generation_id, None)
    generation_id = _GenerationNames(txn, tables, point.meta)(version[2])
    return GetResult(generation_id, Record(key, value, generation_id))


def get_many(
    txn: lmdb.Transaction, tables: Tables, point: ReadPoint, keys: list[bytes]
) -> list[Record | None]:
    """The visible record of each of ``keys`` (``None`` when absent), in the order asked, duplicates
    included; one transaction, so every answer is of the same generation."""
    if not isinstance(keys, list) or len(keys) > MAX_GET_MANY_KEYS:
        raise InvalidRequest(f"keys must be a list of at most {MAX_GET_MANY_KEYS} keys")
    names = _GenerationNames(txn, tables, point.meta)
    found: list[Record | None] = []
    if point.phantom is None:
        return _get_many_base(txn, tables, point, keys, names)
    for key in keys:
        if not isinstance(key, bytes) or len(key) > layout.MAX_KEY_LENGTH:
            raise InvalidRequest("a key must be bytes of at most 2^24-1")
        version = point_version(txn, tables, point, layout.key_form(key))
        if version is None:
            found.append(None)
            continue
        value = layout.decode_value(version[1])
        found.append(None if value is None else Record(key, value, names(version[2])))
    return found


_new_record = functools.partial(tuple.__new__, Record)  # Record(...) without its Python-level __new__


def _get_many_base(
    txn: lmdb.Transaction, tables: Tables, point: ReadPoint, keys: list[bytes], names: _GenerationNames
) -> list[Record | None]:
    """:func:`get_many` without a phantom: :func:`~diffstore.engine.visibility.base_version` inlined, one
    records cursor for every key (a cursor per key and the layers of calls were most of a key's cost)."""
    found: list[Record | None] = []
    cursor = txn.cursor(db=tables.records)
    prefix = point.meta.records_prefix
    above = layout.record_seq(point.seq + 1) if point.seq >= 0 else b""
    if layout.ACCEL is not None and above:
        # the compiled twin of the loop below; None: a key it refuses, which the loop refuses in its place
        compiled = layout.ACCEL.get_many_scan(
            cursor, prefix, keys, above, Record, names.known, names, layout.key_form
        )
        if compiled is not None:
            return compiled
    key_form, max_length, read_seq, named = (
        layout.key_form,
        layout.MAX_KEY_LENGTH,
        layout.read_record_seq,
        names.known,
    )
    for key in keys:
        if not isinstance(key, bytes) or len(key) > max_length:
            raise InvalidRequest("a key must be bytes of at most 2^24-1")
        if not above:  # nothing committed at the read point
            found.append(None)
            continue
        head = prefix + key_form(key)  # layout.record_head, inlined
        if not (cursor.prev() if cursor.set_range(head + above) else cursor.last()):
            found.append(None)
            continue
        record_key, raw = cursor.item()
        if not record_key.startswith(head):  # heads are prefix-free: not a version of this key
            found.append(None)
            continue
        raw = layout.unseal(record_key, raw)
        value = raw[1:] if raw[:1] == b"\x01" else layout.decode_value(raw)
        if value is None:
            found.append(None)
            continue
        gen = read_seq(record_key[len(head) :])
        name = named.get(gen)
        found.append(_new_record((key, value, name if name is not None else names(gen))))
    return found


def check_limit(limit: int | None, default: int, maximum: int) -> int:
    if limit is None:
        return default
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= maximum:
        raise InvalidRequest(f"limit must be within 1..{maximum}")
    return limit


def query_page(
    txn: lmdb.Transaction,
    tables: Tables,
    meta: CollectionMeta,
    *,
    generation_id: bytes | None,
    phantom_id: bytes | None,
    from_key: bytes | None,
    to_key: bytes | None,
    limit: int | None,
    cursor: str | None,
    cursors: CursorCodec,
    default_limit: int,
    max_limit: int,
) -> QueryPage:
    """One page of the records visible at a generation, in key order, within [from_key, to_key)."""
    if cursor is not None:
        state = cursors.decode(cursor, QueryCursor, max_limit)
        assert isinstance(state, QueryCursor)
        if state.cid != meta.cid:
            raise NoSuchCursor("the cursor belongs to another collection")
        floor = readable_floor(txn, tables, meta)
        if floor is not None and state.generation_id < floor:
            raise CursorExpired("the cursor's generation was garbage-collected")
        if not pinned_seq_exists(txn, tables, meta, state.seq):
            raise CursorExpired("the cursor's generation was aborted")
        point = ReadPoint(
            meta, state.generation_id, state.seq, live_phantom(txn, tables, meta, state.phantom_id)
        )
        from_key, to_key, after, limit = state.from_key, state.to_key, state.after_key, state.limit
        phantom_id = state.phantom_id
    else:
        limit = check_limit(limit, default_limit, max_limit)
        point = read_point(txn, tables, meta, generation_id, phantom_id)
        after = None
    lower = lower_form(after if after is not None else from_key)
    upper = upper_form(to_key)
    names = _GenerationNames(txn, tables, meta)
    named = names.known
    items: list[Record] = []
    more = False
    compiled = compiled_records(
        txn, tables, point, lower, upper, (from_key, to_key, after), limit + 1, Record, names, named
    )
    if compiled is not None:
        items, handed = compiled
        if len(items) > limit:
            more = True
            del items[limit:]
        if more or handed is None:
            return QueryPage(
                point.generation_id,
                items,
                _token(cursors, meta, point, phantom_id, to_key, limit, items, more),
            )
        lower = handed  # a long key: its group is put in key order below
    stream = in_key_order(visible_stream(txn, tables, point, lower, upper))
    bounded = after is not None or from_key is not None or to_key is not None
    for key, raw, gen in stream:
        if bounded:
            if (after is not None and key <= after) or (from_key is not None and key < from_key):
                continue
            if to_key is not None and key >= to_key:
                break
        if not raw:
            continue  # the tombstone of a short key
        value = raw[1:] if raw[0] == 1 else layout.decode_value(raw)
        if value is None:
            continue
        if len(items) == limit:
            more = True
            break
        name = named.get(gen)
        if name is None:
            name = names(gen)
        items.append(_new_record((key, value, name)))
    return QueryPage(
        point.generation_id, items, _token(cursors, meta, point, phantom_id, to_key, limit, items, more)
    )


def _token(
    cursors: CursorCodec,
    meta: CollectionMeta,
    point: ReadPoint,
    phantom_id: bytes | None,
    to_key: bytes | None,
    limit: int,
    items: list[Record],
    more: bool,
) -> str | None:
    """The cursor of the page after ``items`` (None: this page is the last)."""
    if not more:
        return None
    # no from_key: the resume key is above it (a token carrying fewer keys stays shorter)
    return cursors.encode(
        QueryCursor(meta.cid, point.generation_id, point.seq, phantom_id, None, to_key, limit, items[-1].key)
    )


def pinned_seq_exists(txn: lmdb.Transaction, tables: Tables, meta: CollectionMeta, seq: int) -> bool:
    """Whether a cursor's pinned seq still means what it meant: committed, or still the open generation.

    An aborted open generation is unregistered and its seq never reused, so its cursors see it gone.
    """
    if seq == -1:
        return True
    if seq > meta.generation_seq and seq != meta.next_seq:
        return False
    return txn.get(layout.gen_key(meta.cid_prefix, seq), db=tables.gens) is not None


def keys_around(
    txn: lmdb.Transaction,
    tables: Tables,
    point: ReadPoint,
    key: bytes,
    limit: int,
    require_key_existence: bool,
) -> KeysAround:
    """Up to ``limit`` visible keys on each side of ``key`` (``left`` descending)."""
    limit = check_limit(limit, limit, 1000)
    found = get(txn, tables, point, key).record is not None
    if require_key_existence and not found:
        return KeysAround(point.generation_id, [], [], False, False, False)

    def side(reverse: bool) -> tuple[list[bytes], bool]:
        form = layout.key_form(key)
        if reverse:
            upper = layout.next_prefix(layout.long_group(form)) if layout.is_long_form(form) else form
            stream = visible_stream(txn, tables, point, b"", upper, reverse=True)
        else:
            stream = visible_stream(txn, tables, point, lower_form(key), None)
        keys = (
            k
            for k, raw, _ in in_key_order(stream, reverse=reverse)
            if layout.decode_value(raw) is not None and (k < key if reverse else k > key)
        )
        taken = list(itertools.islice(keys, limit + 1))
        return taken[:limit], len(taken) > limit

    left, more_left = side(True)
    right, more_right = side(False)
    return KeysAround(point.generation_id, left, right, more_left, more_right, found)


def splits(txn: lmdb.Transaction, tables: Tables, point: ReadPoint, count: int) -> list[bytes]:
    """Up to ``count - 1`` ascending keys cutting the keys visible at ``point`` into near-equal ranges
    (:func:`even_cuts`: one pass over them)."""
    check_split_count(count)
    meta = point.meta
    cacheable = point.phantom is None and point.seq <= meta.generation_seq  # committed: never changes
    key = (meta.cid, point.seq, count) if cacheable else None
    return cached_cuts(tables, key, lambda: _cut_visible_keys(txn, tables, point, count))


def check_split_count(count: int) -> None:
    if isinstance(count, bool) or not isinstance(count, int) or not 2 <= count <= 1024:
        raise InvalidRequest("count must be within 2..1024")


def cached_cuts(tables: Tables, key: tuple[int, ...] | None, cut: Callable[[], list[bytes]]) -> list[bytes]:
    """The cuts kept under ``key`` in the store's cache, else ``cut()`` (kept, unless ``key`` is None:
    cuts of something that may still change)."""
    cache = tables.splits_cache
    if key is not None and key in cache:
        return list(cache[key])
    cuts = cut()
    if key is not None:
        if len(cache) >= _SPLITS_CACHE_SIZE:
            cache.clear()
        cache[key] = list(cuts)
    return cuts


_SPLITS_CACHE_SIZE = 256


def _cut_visible_keys(txn: lmdb.Transaction, tables: Tables, point: ReadPoint, count: int) -> list[bytes]:
    visible = (
        key
        for key, raw, _ in in_key_order(visible_stream(txn, tables, point))
        if raw and raw[0] != 2  # else a tombstone: not a visible key
    )
    return even_cuts(visible, count)


def even_form_cuts(forms: Iterable[bytes], count: int) -> list[bytes]:
    """:func:`even_cuts` of the keys of ascending key ``forms`` (their :func:`~layout.cut_key_of_form`).

    The forms are cut, and only the cuts turned into keys: cuts are picked by position alone, and forms
    ascend as their keys do (those of a long group all become the prefix it shares, so equal neighbours
    are dropped after, as :func:`even_cuts` drops them). 1M forms: 0.2 s instead of 1.4 s."""
    cuts: list[bytes] = []
    for key in map(layout.cut_key_of_form, even_cuts(forms, count)):
        if not cuts or key > cuts[-1]:
            cuts.append(key)
    return cuts


def even_cuts(keys: Iterable[bytes], count: int) -> list[bytes]:
    """Up to ``count - 1`` of ascending ``keys`` that cut them into near-equal ranges, in one pass.

    Every ``stride``-th key is kept with its position, the stride doubling whenever the sample reaches
    ``8 * count`` keys: memory stays within that whatever the number of keys, and each cut is the sampled
    key nearest its ideal position."""
    stride, seen = 1, 0
    sample: list[tuple[int, bytes]] = []
    for key in keys:
        if seen % stride == 0:
            sample.append((seen, key))
            if len(sample) >= 8 * count:
                stride *= 2
                sample = [entry for entry in sample if entry[0] % stride == 0]
        seen += 1
    if seen < 2:
        return []
    positions = [position for position, _ in sample]
    cuts: list[bytes] = []
    for i in range(1, count):
        ideal = i * seen / count
        at = bisect.bisect_left(positions, ideal)
        if at == len(positions) or (at > 0 and ideal - positions[at - 1] < positions[at] - ideal):
            at -= 1
        key = sample[at][1]
        if at > 0 and (not cuts or key > cuts[-1]):
            cuts.append(key)
    return cuts
