"""The compiled accelerator (``diffstore/engine/_accel.c``) against its pure-Python twins: the same rows
for a bulk load of sorted keys, the same stores after any mix of writes, and the same diffs and diff pages.

Keys include long ones (beyond the 200-byte prefix, sharing it), keys with 00 bytes, the empty key;
writes include overwrites within a batch and within a generation, tombstones, conditional writes and
phantom writes (which the fast path must leave to the general one).
"""

from __future__ import annotations

import contextlib
import gc
import hashlib
import itertools
import sys
import tempfile
import tracemalloc
import weakref
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from unittest import mock

import hypothesis.strategies as st
import lmdb
import pytest
from hypothesis import event, given, settings

from diffstore import Store, StoreConfig
from diffstore.engine import digests, layout
from diffstore.engine.types import DiffItem, Record
from diffstore.errors import CorruptRecord, InvalidRequest
from diffstore.wire_columns import BinaryColumn

from .util import raw_state

pytestmark = pytest.mark.skipif(layout.ACCEL is None, reason="the compiled accelerator was not built")

LONG = b"L" * 200
POOL = [b"", b"\x00", b"\x00\xff", b"a", b"a\x00", b"a\x00\x00", b"a\x00\xff", b"a\xff", b"b"]
POOL += [b"k%02d" % i for i in range(24)]
POOL += [LONG, LONG + b"a", LONG + b"b", LONG + b"\x00", b"L" * 199 + b"\x00", b"L" * 201, b"M" * 300]

keys = st.sampled_from(POOL) | st.binary(max_size=6)
values = st.none() | st.binary(max_size=8)


def python_only() -> contextlib.AbstractContextManager[object]:
    """The engine without its accelerator: the pure-Python twins run."""
    return mock.patch.object(layout, "ACCEL", None)


# --- the rows of a bulk load --------------------------------------------------------------------------


@given(
    items=st.lists(st.tuples(keys, values), max_size=30),
    sort=st.booleans(),
    cid=st.integers(0, 2**32 - 1),
    seq=st.integers(0, 2**64 - 1),
)
def test_sorted_rows_are_the_general_rows(
    items: list[tuple[bytes, bytes | None]], sort: bool, cid: int, seq: int
) -> None:
    if sort:
        items = sorted(dict(items).items())
    got = layout.sorted_short_rows(cid, seq, items)
    user_keys = [key for key, _ in items]
    applies = (
        bool(items)
        and all(len(key) <= layout.LONG_KEY_PREFIX for key in user_keys)
        and all(a < b for a, b in zip(user_keys, user_keys[1:], strict=False))
    )
    assert (got is not None) == applies
    if got is not None:
        record_keys, stored, change_keys = layout.short_rows(cid, seq, dict(items))
        assert len(got) == len(items)
        records = [(bytes(key), bytes(value)) for key, value in got.records()]
        changes = [(bytes(key), bytes(value)) for key, value in got.changes()]
        assert records == list(zip(record_keys, stored(), strict=True))
        assert changes == [(key, b"") for key in change_keys]
        assert (got.first_record_key, got.first_change_key) == (record_keys[0], change_keys[0])
        forms = [layout.key_form(key) for key in user_keys]
        records_prefix, prefix = layout.records_prefix(cid), layout.cid_bytes(cid)
        assert [key for key, _ in records] == [layout.record_key(records_prefix, form, seq) for form in forms]
        # sealed (the checksum covers the row's key and value), and the plain value under it
        assert [value for _, value in records] == [
            layout.seal(key, layout.encode_value(k, v))
            for (key, _), (k, v) in zip(records, items, strict=True)
        ]
        assert [layout.unseal(key, value) for key, value in records] == [
            layout.encode_value(k, v) for k, v in items
        ]
        assert [key for key, _ in changes] == [layout.change_key(prefix, seq, form) for form in forms]
        for limit in (layout.CHUNK_BYTES, 1, 40):  # one form per chunk, a few, ~100
            assert got.chunks(limit) == _chunk_rows(prefix, seq, forms, limit)
        # the digests' sum of its records rows (digests.record_put), read without making them
        with python_only():
            pairs = [(form, raw) for form, (_, raw) in zip(forms, records, strict=True)]
            assert got.digest() == digests.pair_sums(pairs)
        # rows kept by the consumer are never filled anew (putmulti keeps none: the rows are then reused)
        kept = list(got.records())
        assert [(bytes(key), bytes(value)) for key, value in kept] == records
        keys_kept = [key for key, _ in got.changes()]
        assert [bytes(key) for key in keys_kept] == [key for key, _ in changes]


@settings(max_examples=200, deadline=None)
@given(forms=st.lists(st.binary(max_size=420), max_size=20), cut=st.integers(0, 50))
def test_chunk_values_unpack_the_same_compiled_and_in_python(forms: list[bytes], cut: int) -> None:
    raw = layout.pack_forms(forms)
    assert layout.unpack_forms(raw) == forms
    with python_only():
        assert layout.unpack_forms(raw) == forms
    if cut and len(raw) > cut:  # cut short: both refuse it, or both read the same shorter list
        results = []
        for context in (contextlib.nullcontext(), python_only()):
            with context:
                try:
                    results.append(layout.unpack_forms(raw[:-cut]))
                except ValueError:
                    results.append(None)
        assert results[0] == results[1]


def _chunk_rows(prefix: bytes, seq: int, forms: list[bytes], limit: int) -> list[tuple[bytes, bytes]]:
    with mock.patch.object(layout, "CHUNK_BYTES", limit):
        return layout.chunk_rows(prefix, seq, forms)


@pytest.mark.parametrize(
    "items",
    [
        [],
        [(b"a", b"1"), (b"a", b"2")],  # a repeated key: the last one wins, the general way
        [(b"b", b"1"), (b"a", b"2")],
        [[b"a", b"1"]],
        [(b"a", b"1", True)],
        [(bytearray(b"a"), b"1")],
        [(b"a", bytearray(b"1"))],
        [(b"a", 1)],
        [("a", b"1")],
        [(b"x" * 201, b"1")],
    ],
)
def test_other_shapes_take_the_general_path(items: list[object]) -> None:
    assert layout.sorted_short_rows(1, 1, items) is None
    assert layout.sorted_short_rows(1, 1, tuple(items)) is None


def test_a_batch_of_short_keys_takes_the_compiled_rows(tmp_path: Path) -> None:
    accel = layout.ACCEL
    assert accel is not None
    with Store.open(tmp_path / "s", StoreConfig(background=False)) as store:
        coll = store.create_collection("c", manual=True)
        coll.start_generation(b"1")
        real, answers = accel.sorted_short_rows, []

        def spy(*args: object) -> object:
            answers.append(real(*args))
            return answers[-1]

        with mock.patch.object(accel, "sorted_short_rows", spy):
            coll.put_many([(b"a", b"1"), (b"b", None), (b"c\x00", b"3")], generation_id=b"1")
            # unsorted, a key twice: the last item wins, then the rows of the sorted batch are compiled too
            coll.put_many([(b"b", b"1"), (b"a", b"2"), (b"b", b"0")], generation_id=b"1")
            coll.put_many([(b"d", b"4"), (b"x" * 201, b"5")], generation_id=b"1")  # a long key: no call
        # each put asks first as given (a sorted list: no dict), then the unsorted one asks again sorted
        assert [answer is not None for answer in answers] == [True, False, True, False]
        assert [bytes(key) for key, _ in answers[2].records()] == [
            layout.record_key(layout.records_prefix(1), layout.key_form(key), 1) for key in (b"a", b"b")
        ]
        coll.commit_generation(b"1")
        assert [(i.key, i.to_value) for i in coll.diff(b"", b"1")] == [
            (b"a", b"2"),
            (b"b", b"0"),
            (b"c\x00", b"3"),
            (b"d", b"4"),
            (b"x" * 201, b"5"),
        ]


# --- whole stores and their diffs -----------------------------------------------------------------------

batch = st.tuples(
    st.lists(st.tuples(keys, values), max_size=14),
    st.sampled_from(["sorted", "as given", "if absent", "skip unchanged", "phantom"]),
)
generation = st.lists(batch, min_size=0, max_size=4)


def apply(store: Store, history: list[list[tuple[list[tuple[bytes, bytes | None]], str]]]) -> list[bytes]:
    """Writes ``history`` (a manual generation per entry, a non-manual collection alongside); returns the
    generation ids committed."""
    manual = store.create_collection("m", manual=True)
    auto = store.create_collection("auto", manual=False)
    phantom = manual.start_phantom()
    ids = []
    for number, batches in enumerate(history, start=1):
        gen = b"g%03d" % number
        manual.start_generation(gen)
        for items, how in batches:
            kwargs: dict[str, object] = {"generation_id": gen}
            if how == "sorted":
                items = sorted(dict(items).items())
            elif how == "if absent":
                kwargs["if_not_present"] = True
            elif how == "skip unchanged":
                kwargs["skip_unchanged"] = True
            elif how == "phantom":
                kwargs["phantom_id"] = phantom
            manual.put_many(items, **kwargs)  # type: ignore[arg-type]
            auto.put_many(items)
        manual.commit_generation(gen)
        ids.append(gen)
    return ids


def rows(store: Store) -> dict[str, list[tuple[bytes, bytes]]]:
    """Every row of every table, but the times of phantom expiries and automatic commits (wall clock)."""
    state = raw_state(store)
    for timed in ("phantom_ttl", "due"):
        state[timed] = [(key, b"") for key, _ in state[timed]]
    # an open generation's pending digest delta is the accelerator's alone (digests.record_put): the
    # digests its commits store are compared
    state["digests"] = [(key, raw) for key, raw in state["digests"] if len(key) != 5]
    return state


def diffs(store: Store, ids: list[bytes], bounds: tuple[bytes | None, bytes | None]) -> Iterator[object]:
    """Every diff of the manual collection between two of its generations (and from the beginning), with
    and without intermediate values, whole and in pages of 2."""
    coll = store.collection("m")
    from_key, to_key = bounds
    ends = [b"", *ids]
    for i, start in enumerate(ends):
        for end in ends[i:]:
            for intermediate in (False, True):
                yield list(coll.diff(start, end, include_intermediate=intermediate))
                yield list(coll.diff(start, end, from_key=from_key, to_key=to_key))
                page = coll.diff_page(start, end, from_key=from_key, to_key=to_key, limit=2)
                pages = [page]
                while page.cursor is not None:
                    page = coll.diff_page(cursor=page.cursor)
                    pages.append(page)
                yield pages


@settings(max_examples=40, deadline=None)
@given(
    history=st.lists(generation, min_size=1, max_size=4),
    bounds=st.tuples(st.none() | keys, st.none() | keys),
)
def test_stores_and_diffs_are_the_same_without_the_accelerator(
    history: list[list[tuple[list[tuple[bytes, bytes | None]], str]]],
    bounds: tuple[bytes | None, bytes | None],
) -> None:
    with tempfile.TemporaryDirectory() as root:
        config = StoreConfig(background=False, max_generation_records=7, clock_ms=lambda: 1_000_000)
        with Store.open(Path(root) / "fast", config) as fast, Store.open(Path(root) / "slow", config) as slow:
            # the cursor secret differs between the stores: each store's pages are compared with its own
            ids = apply(fast, history)
            with python_only():
                assert apply(slow, history) == ids
            assert rows(fast) == rows(slow)
            compiled = list(diffs(fast, ids, bounds))
            with python_only():
                assert list(diffs(fast, ids, bounds)) == compiled
                assert len(list(diffs(slow, ids, bounds))) == len(compiled)


def queries(store: Store, ids: list[bytes], bounds: tuple[bytes | None, bytes | None]) -> Iterator[object]:
    """Every query of the manual collection at each of its generations (and the current one), whole and
    in pages of 1 and 3, within ``bounds`` and not, and with its phantom (the general path); and the
    records of every pooled key by one ``get_many``, checked against ``get`` of each."""
    coll = store.collection("m")
    from_key, to_key = bounds
    for at in [None, *ids]:
        many = coll.get_many(list(POOL), at).records  # one cursor for all keys: as the gets, one by one
        assert many == [coll.get(key, at) for key in POOL]
        yield many
        yield list(coll.query(at))
        yield list(coll.query(at, from_key=from_key, to_key=to_key))
        for limit in (1, 3):
            page = coll.query_page(at, from_key=from_key, to_key=to_key, limit=limit)
            pages = [page]
            while page.cursor is not None:
                page = coll.query_page(cursor=page.cursor)
                pages.append(page)
            yield [(p.generation_id, p.items, p.cursor is None) for p in pages]
    phantom = (1).to_bytes(8, "big")
    yield list(coll.query(ids[-1], phantom_id=phantom))
    many = coll.get_many(list(POOL), ids[-1], phantom).records
    assert many == [coll.get(key, ids[-1], phantom) for key in POOL]
    yield many


@settings(max_examples=40, deadline=None)
@given(
    history=st.lists(generation, min_size=1, max_size=4),
    bounds=st.tuples(st.none() | keys, st.none() | keys),
)
def test_queries_are_the_same_without_the_accelerator(
    history: list[list[tuple[list[tuple[bytes, bytes | None]], str]]],
    bounds: tuple[bytes | None, bytes | None],
) -> None:
    with tempfile.TemporaryDirectory() as root:
        config = StoreConfig(background=False, max_generation_records=7, clock_ms=lambda: 1_000_000)
        with Store.open(Path(root) / "s", config) as store:
            ids = apply(store, history)
            compiled = list(queries(store, ids, bounds))
            with python_only():
                assert list(queries(store, ids, bounds)) == compiled
            assert all(type(record) is Record for result in compiled[1:3] for record in result)  # type: ignore[attr-defined]


def test_a_query_hands_over_at_a_long_key_and_pages_on(tmp_path: Path) -> None:
    """Short keys, then a group of long keys whose forms sort by hash, then short keys again; pages that
    end before, inside and after the group; versions above the read point and tombstones skipped."""
    with Store.open(tmp_path / "s", StoreConfig(background=False)) as store:
        coll = store.create_collection("c", manual=True)
        first = [(b"A%03d" % i, b"1") for i in range(20)] + [(LONG + b"%d" % i, b"l%d" % i) for i in range(9)]
        first += [(b"z\x00%d" % i, b"z") for i in range(5)]
        coll.start_generation(b"1")
        coll.put_many(first, generation_id=b"1")
        coll.commit_generation(b"1")
        coll.start_generation(b"2")
        coll.put_many([(b"A%03d" % i, None if i % 3 else b"2") for i in range(20)], generation_id=b"2")
        coll.commit_generation(b"2")
        expected = {b"1": sorted(first), b"2": sorted((k, v) for k, v in first if not k.startswith(b"A"))}
        expected[b"2"] = sorted(expected[b"2"] + [(b"A%03d" % i, b"2") for i in range(0, 20, 3)])
        accel = layout.ACCEL
        assert accel is not None
        handed: list[object] = []
        compiled_scan = accel.query_scan

        def scan(*args: object) -> object:
            answer = compiled_scan(*args)
            handed.append(answer[1])
            return answer

        for at, want in expected.items():
            for limit in (1, 4, 7, 25, 100):
                got = []
                with mock.patch.object(accel, "query_scan", scan):
                    page = coll.query_page(at, limit=limit)
                    got += page.items
                    while page.cursor is not None:
                        page = coll.query_page(cursor=page.cursor)
                        got += page.items
                assert [(r.key, r.value) for r in got] == want
                with python_only():
                    assert list(coll.query(at)) == got
                assert {r.generation_id for r in got} <= {b"1", b"2"}
        # every page ran compiled; those that reached the group handed it over
        long_forms = [h for h in handed if h is not None]
        assert long_forms and all(isinstance(h, bytes) and layout.is_long_form(h) for h in long_forms)
        assert None in handed  # and pages that ended before it did not


def test_a_sparse_diff_hands_over_to_the_keyed_way_and_back(tmp_path: Path) -> None:
    """Runs of unchanged keys longer than the scan's idle limit, long keys amid short ones, 00 bytes."""
    with Store.open(tmp_path / "s", StoreConfig(background=False)) as store:
        coll = store.create_collection("c", manual=True)
        base = [(b"k%04d" % i, b"v") for i in range(300)] + [(LONG + b"%d" % i, b"l") for i in range(5)]
        coll.start_generation(b"1")
        coll.put_many(base, generation_id=b"1")
        coll.commit_generation(b"1")
        changed = [(b"k%04d" % i, b"w") for i in (0, 1, 2, 50, 51, 120, 121, 122, 123, 299)]
        changed += [(b"k0100\x00x", b"new"), (LONG + b"3", None), (b"k0200", None)]
        coll.start_generation(b"2")
        coll.put_many(changed, generation_id=b"2")
        coll.commit_generation(b"2")
        compiled = list(coll.diff(b"1", b"2"))
        with python_only():
            assert list(coll.diff(b"1", b"2")) == compiled
        expected = sorted(DiffItem(key, dict(base).get(key), value) for key, value in changed)
        assert compiled == expected
        assert all(type(item) is DiffItem for item in compiled)


def test_the_compiled_loops_hold_no_memory_after_use(tmp_path: Path) -> None:
    """Every object they make is freed: a reference leaked per row or item would grow by megabytes here."""
    accel = layout.ACCEL
    assert accel is not None
    base = [(b"k%05d" % i, None if i % 7 == 0 else b"v%d" % i) for i in range(2000)]
    base += [(LONG + b"%d" % i, b"l") for i in range(30)] + [(b"z\x00%d" % i, b"0") for i in range(30)]
    base.sort()
    short = [item for item in base if len(item[0]) <= layout.LONG_KEY_PREFIX]
    with Store.open(tmp_path / "s", StoreConfig(background=False)) as store:
        coll = store.create_collection("c", manual=True)
        coll.start_generation(b"1")
        coll.put_many(base, generation_id=b"1")
        coll.commit_generation(b"1")
        coll.start_generation(b"2")
        coll.put_many([(key, b"w") for key, _ in base[::2]], generation_id=b"2")
        coll.commit_generation(b"2")
        coll.write_generation(b"3", [(key, b"x") for key, _ in base[::50]])  # sparse: the keyed way
        coll.start_generation(b"4")  # two interleaved batches: the run in both index forms (MergeForms)
        coll.put_many([(key, b"y") for key, _ in base[1::50]], generation_id=b"4")
        coll.put_many([(key, b"y") for key, _ in base[26::50]], generation_id=b"4")
        coll.commit_generation(b"4")
        merged = len(base[::50]) + len(base[1::50]) + len(base[26::50])

        def work() -> None:
            rows = accel.sorted_short_rows(short, b"\x00\x00\x00\x01", b"\x00" * 8, b"\x00" * 12)
            assert rows is not None
            assert sum(1 for _ in rows.records()) == sum(1 for _ in rows.changes()) == len(short)
            assert list(rows.records())  # rows kept: a new row per item
            assert (
                accel.sorted_short_rows([*base, (b"a", b"")], b"\x00\x00\x00\x01", b"\x00" * 8, b"\x00" * 12)
                is None
            )
            assert sum(1 for _ in coll.diff(b"1", b"2")) > 1000
            assert sum(1 for _ in coll.diff(b"2", b"3")) == len(base[::50])
            assert sum(1 for _ in coll.diff(b"2", b"4")) == merged  # two runs merged, one in both forms
            assert list(coll.diff(b"", b"2", from_key=b"k00100", to_key=b"k01000"))
            unfinished = coll.diff(b"", b"2")
            next(unfinished)
            unfinished.close()  # type: ignore[attr-defined]
            assert sum(1 for _ in coll.query(b"2")) > 1000  # pages that run into the long keys
            assert (
                sum(1 for record in coll.get_many([key for key, _ in base[:5000]]).records if record) > 1000
            )
            assert len(coll.query_page(b"1", from_key=b"k00100", to_key=b"k01000", limit=50).items) == 50

        for _ in range(3):
            work()
        gc.collect()
        tracemalloc.start()
        try:
            before = tracemalloc.get_traced_memory()[0]
            for _ in range(30):
                work()
            gc.collect()
            grown = tracemalloc.get_traced_memory()[0] - before
        finally:
            tracemalloc.stop()
        assert grown < 64 * 1024, grown


def test_the_scan_refuses_what_is_not_a_records_iterator() -> None:
    accel = layout.ACCEL
    assert accel is not None
    args = (layout.record_seq(0), layout.record_seq(0), b"\xff", None, None, None, 8, DiffItem, ())
    # bytes under no records key: a damaged row, answered CorruptRecord (naming what it can of the key)
    with pytest.raises(CorruptRecord, match="its key is damaged"):
        list(accel.DiffScan(iter([(b"short", b"")]), *args))
    with pytest.raises(ValueError, match="not a records row"):
        list(accel.DiffScan(iter([[b"\x01" * 20, b""]]), *args))  # type: ignore[list-item]
    with pytest.raises(CorruptRecord):  # its last byte is not its seq's length
        list(accel.DiffScan(iter([(b"\x01\x01k\x00\x00\x01\x05\x02", b"")]), *args))
    with pytest.raises(TypeError):
        accel.DiffScan(iter([]), b"", b"", b"", "a str bound", None, None, 8, DiffItem, ())  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        accel.DiffScan(iter([]), b"", b"", b"", None, None, None, 8, dict, ())  # type: ignore[arg-type]
    known: dict[int, bytes] = {}
    query = (layout.record_seq(0), b"\xff", None, None, None, 8, Record, known, known.get)
    with pytest.raises(CorruptRecord):
        accel.query_scan(iter([(b"short", b"")]), *query)
    with pytest.raises(ValueError, match="not a records row"):
        accel.query_scan(iter([[b"\x01" * 20, b""]]), *query)  # type: ignore[list-item]
    for not_a_seq in (b"\x00" * 2, b"\x00" * 8, b"\x01\x05\x02", b"\x09" + b"\x00" * 9 + b"\x09"):
        with pytest.raises(TypeError):
            accel.query_scan(iter([]), not_a_seq, *query[1:])  # an encoded seq: m, m bytes, m
    with pytest.raises(TypeError):
        accel.query_scan(
            iter([]), layout.record_seq(0), b"\xff", "a str bound", None, None, 8, Record, known, known.get
        )
    with pytest.raises(TypeError):
        accel.query_scan(iter([]), *query[:6], dict, known, known.get)  # type: ignore[arg-type]


# --- reference counts, reuse of rows, the scan as a Python object ---------------------------------------

SCAN_ARGS = (layout.record_seq(0), layout.record_seq(2), b"\xff", None, None, None, 8, DiffItem, ())


NAMES = {2: b"g2"}
QUERY_ARGS = (layout.record_seq(2), b"\xff", None, None, None, 1000, Record, NAMES, NAMES.__getitem__)


def records_rows(count: int) -> list[tuple[bytes, bytes]]:
    """A records table's rows for ``count`` short keys, each written in seq 1 and again in seq 2."""
    rows = []
    for i in range(count):
        head = layout.record_head(layout.records_prefix(1), layout.key_form(b"k%03d" % i))
        rows += [
            (head + layout.record_seq(1), b"\x01old"),
            (head + layout.record_seq(2), b"\x01new%d" % i),
        ]
    return rows


def test_the_compiled_loops_leave_the_reference_counts_of_their_inputs_as_they_were() -> None:
    accel = layout.ACCEL
    assert accel is not None
    items = [(b"k%04d" % i, None if i % 5 == 0 else b"v%d" % i) for i in range(500)]
    prefix, suffix, change = (
        layout.records_prefix(7),
        layout.record_seq(1),
        layout.change_prefix(layout.cid_bytes(7), 0),
    )
    records = records_rows(300)
    watched = [
        items,
        prefix,
        suffix,
        change,
        records,
        DiffItem,
        *SCAN_ARGS[:3],
        *QUERY_ARGS[:2],
        Record,
        NAMES,
        NAMES[2],
    ]
    watched += [part for item in items for part in item if part is not None]  # None: shared by all
    watched += [part for row in records for part in row]
    before = [sys.getrefcount(thing) for thing in watched]
    for _ in range(50):
        rows = accel.sorted_short_rows(items, prefix, suffix, change)
        assert rows is not None
        for _ in rows.records():
            pass
        kept = list(rows.changes())
        assert len(kept) == len(items)
        del rows, kept
        scan = accel.DiffScan(iter(records), *SCAN_ARGS)
        assert len(list(scan)) == 300
        stopped = accel.DiffScan(iter(records), *SCAN_ARGS)
        next(stopped)
        del scan, stopped
        page, handed = accel.query_scan(iter(records), *QUERY_ARGS)
        assert len(page) == 300 and handed is None and page[0] == (b"k000", b"new0", b"g2")
        page, handed = accel.query_scan(
            iter(records), QUERY_ARGS[0], layout.records_prefix(1) + b"k100", *QUERY_ARGS[2:]
        )
        assert [record.value for record in page] == [b"new%d" % i for i in range(100)]
        del page
    assert [sys.getrefcount(thing) for thing in watched] == before


def test_a_row_is_filled_anew_only_when_nothing_else_holds_it_or_its_buffers() -> None:
    accel = layout.ACCEL
    assert accel is not None
    items = [(b"a", b"1"), (b"b", b"22"), (b"c", None), (b"d", b"4444")]
    rows = accel.sorted_short_rows(items, b"P", b"S", b"C")
    assert rows is not None
    expected = [(bytes(key), bytes(value)) for key, value in list(rows.records())]
    # let go of each row before asking for the next (putmulti's way, and map's): one tuple for all of them
    assert len(set(map(id, rows.records()))) == 1
    # keep a buffer of a row, or a view of it, but not the row: what is kept is never written again
    it = rows.records()
    key = next(it)[0]
    view = memoryview(next(it)[1])
    rest = [(bytes(k), bytes(v)) for k, v in it]
    assert bytes(key) == expected[0][0]
    assert bytes(view) == expected[1][1]
    assert rest == expected[2:]


def test_a_put_interrupted_by_a_full_map_leaves_the_rows_whole(tmp_path: Path) -> None:
    accel = layout.ACCEL
    assert accel is not None
    items = [(b"k%06d" % i, b"v" * 200) for i in range(20_000)]
    rows = accel.sorted_short_rows(items, b"\x00\x00\x00\x01", b"\x00" * 8, b"\x00" * 12)
    assert rows is not None
    env = lmdb.open(str(tmp_path / "small"), map_size=1 << 20)
    try:
        with pytest.raises(lmdb.MapFullError), env.begin(write=True) as txn:
            txn.cursor().putmulti(rows.records(), append=True)
        with env.begin(write=True) as txn:
            assert txn.stat()["entries"] == 0
            consumed, added = txn.cursor().putmulti(itertools.islice(rows.records(), 100), append=True)
            assert (consumed, added) == (100, 100)
            assert [bytes(k) for k, _ in txn.cursor()] == [
                bytes(k) for k, _ in itertools.islice(rows.records(), 100)
            ]
    finally:
        env.close()


class _Records:
    """A records iterator that calls back into the scan fed from it (as a finalizer or a thread could) when
    asked for its second row."""

    def __init__(self, rows: list[tuple[bytes, bytes]], action: str) -> None:
        self.rows = iter(rows)
        self.action = action
        self.asked = 0
        self.scan: object = None

    def __iter__(self) -> _Records:
        return self

    def __next__(self) -> tuple[bytes, bytes]:
        self.asked += 1
        if self.asked == 2 and self.action == "next":
            next(self.scan)  # type: ignore[call-overload]
        if self.asked == 2 and self.action == "init":
            # other bounds: before the fix, the scan went on comparing with the freed ones (ASan: a
            # heap-use-after-free in compare_bytes)
            self.scan.__init__(self, b"x" * 8, b"y" * 8, b"\xff" * 2, None, None, None, 8, DiffItem, ())  # type: ignore[misc]
        return next(self.rows)


def test_the_scan_refuses_to_run_inside_itself() -> None:
    accel = layout.ACCEL
    assert accel is not None
    reentrant = _Records(records_rows(20), "next")
    scan = accel.DiffScan(reentrant, *SCAN_ARGS)
    reentrant.scan = scan
    with pytest.raises(ValueError, match="already executing"):  # before: the inner call took items
        list(scan)
    assert len(list(accel.DiffScan(iter(records_rows(20)), *SCAN_ARGS))) == 20


def test_the_scan_is_initialised_once() -> None:
    accel = layout.ACCEL
    assert accel is not None
    again = _Records(records_rows(20), "init")
    # bounds made here, held by the scan alone
    scan = accel.DiffScan(
        again, bytes(8), bytes(7) + b"\x02", bytes([255]) * 3, None, None, None, 8, DiffItem, ()
    )
    again.scan = scan
    with pytest.raises(TypeError, match="already initialised"):
        list(scan)


def test_an_uninitialised_scan_raises_rather_than_ending_at_once() -> None:
    accel = layout.ACCEL
    assert accel is not None
    scan = accel.DiffScan.__new__(accel.DiffScan)  # before: iterated as empty, an empty diff
    with pytest.raises(TypeError, match="not initialised"):
        next(scan)
    with pytest.raises(TypeError, match="not initialised"):
        list(scan)
    assert scan.handed is None


def test_a_scan_in_a_reference_cycle_is_collected() -> None:
    accel = layout.ACCEL
    assert accel is not None

    def make() -> tuple[Any, Any]:
        return _fed(_Records(records_rows(5), ""), accel.DiffScan, *SCAN_ARGS)

    assert_collected_in_a_cycle(make, "scan")


def _fed(feeder: Any, iterator: Callable[..., Any], *args: Any) -> tuple[Any, Any]:
    return feeder, iterator(feeder, *args)


def assert_collected_in_a_cycle(make: Callable[[], tuple[Any, Any]], attribute: str = "target") -> None:
    """``make()`` gives a feeder and the compiled iterator fed from it; once the feeder holds the iterator
    in ``attribute`` (a reference cycle) and both are dropped, the garbage collector frees them."""
    feeder, fed = make()
    setattr(feeder, attribute, fed)
    gone = weakref.ref(feeder)
    next(fed)
    del feeder, fed
    gc.collect()
    assert gone() is None


# --- a build of another version of the source --------------------------------------------------------------


def test_a_build_of_other_source_is_not_used(tmp_path: Path) -> None:
    accel = layout.ACCEL
    assert accel is not None
    source = Path(layout.__file__).with_name("_accel.c")
    assert layout._current(accel, source)
    pulled = tmp_path / "_accel.c"
    pulled.write_bytes(source.read_bytes() + b"/* a change from a pull */\n")
    with pytest.warns(RuntimeWarning, match="make install"):
        assert not layout._current(accel, pulled)
    assert layout._current(accel, tmp_path / "absent.c")  # an installed wheel: no source beside it


column_rows = st.lists(
    st.none()
    | st.tuples(st.none() | st.binary(max_size=5), st.none() | st.binary(max_size=5), st.just(b"g")),
    max_size=30,
)


@given(column_rows, st.integers(1, 3))
def test_packed_columns_are_the_columns_of_each_field(
    rows: list[tuple[bytes | None, ...] | None], fields: int
) -> None:
    packed = layout.ACCEL.pack_columns(rows, fields)
    for field, (offsets, data, present) in enumerate(packed):
        column = BinaryColumn.of([None if row is None else row[field] for row in rows])
        assert (offsets, data, present) == (column.offsets, column.data, column.present)


def test_packing_columns_of_named_tuples_and_an_empty_page() -> None:
    rows = [Record(b"a", b"1", b"g"), Record(b"bc", b"", b"g")]
    (keys, values) = [BinaryColumn(2, *column) for column in layout.ACCEL.pack_columns(rows, 2)]
    assert keys.to_list() == [b"a", b"bc"] and values.to_list() == [b"1", b""] and values.present is None
    empty = layout.ACCEL.pack_columns([], 1)
    assert empty == ((b"\x00" * 8, b"", None),)


@pytest.mark.parametrize(
    ("rows", "fields", "error"),
    [
        ((b"a",), 1, TypeError),  # not a list
        ([b"a"], 1, TypeError),  # a row that is not a tuple
        ([(b"a",)], 2, TypeError),  # too few fields
        ([(b"a", "text")], 2, TypeError),  # neither bytes nor None
        ([(b"a",)], 0, ValueError),
        ([(b"a",) * 9], 9, ValueError),
    ],
)
def test_packing_refuses_what_is_not_rows_of_bytes(rows: object, fields: int, error: type[Exception]) -> None:
    refs = sys.getrefcount(rows)
    with pytest.raises(error):
        layout.ACCEL.pack_columns(rows, fields)
    assert sys.getrefcount(rows) == refs


def test_packing_columns_holds_no_memory_after_use() -> None:
    rows = [(b"k%05d" % i, None if i % 3 else b"v" * (i % 50)) for i in range(5_000)]
    layout.ACCEL.pack_columns(rows, 2)
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for _ in range(20):
            layout.ACCEL.pack_columns(rows, 2)
        gc.collect()
        assert tracemalloc.get_traced_memory()[0] - before < 64 * 1024
    finally:
        tracemalloc.stop()


# --- the keyed way (KeyedScan) ------------------------------------------------------------------------------

KEYED_POOL = [b"k%02d" % i for i in range(10)] + [b"k05\x00", b"k05\x00\x00", b"k05\xff", b""]
KEYED_POOL += [b"k05" + b"z" * 200, b"k05" + b"z" * 201, LONG + b"\x00", b"L" * 199 + b"\x00"]


def keyed_table(tmp_path: Path, writes: list[list[tuple[bytes, bytes | None]]]) -> lmdb.Environment:
    """A records table as the engine lays it out, for collection 1: ``writes[s]`` written in seq ``s + 1``
    (None: a tombstone)."""
    env = lmdb.open(str(tmp_path / "keyed"), max_dbs=1, map_size=1 << 26)
    records = env.open_db(b"records")
    with env.begin(write=True) as txn:
        for seq, items in enumerate(writes, start=1):
            for key, value in items:
                row_key = layout.record_key(layout.records_prefix(1), layout.key_form(key), seq)
                txn.put(row_key, layout.encode_value(key, value), db=records)
    return env


def keyed_run(
    env: lmdb.Environment,
    forms: list[bytes],
    span: tuple[int, int],
    bounds: tuple[bytes | None, bytes | None, bytes | None],
    stretch: int | None,
) -> tuple[list[DiffItem], bytes | None]:
    """diff._keyed_items over ``forms``, as the engine runs it: its items and the form it returned."""
    from diffstore.engine import diff

    from_seq = layout.record_seq(span[0]) if span[0] >= 0 else b""
    to_bound = layout.record_seq(span[1] + 1)
    with env.begin() as txn:
        cursor = txn.cursor(db=env.open_db(b"records", txn=txn))
        run = diff._keyed_items(
            cursor, layout.records_prefix(1), iter(forms), to_bound, from_seq, bounds, False, stretch
        )
        items: list[DiffItem] = []
        while True:
            try:
                items.append(next(run))
            except StopIteration as stop:
                return items, stop.value


@settings(max_examples=150, deadline=None)
@given(
    writes=st.lists(
        st.lists(
            st.tuples(st.sampled_from(KEYED_POOL), st.none() | st.binary(max_size=2)), min_size=1, max_size=12
        ),
        min_size=1,
        max_size=4,
    ),
    unwritten=st.lists(st.sampled_from([b"k", b"k00\x00", b"k99", b"k05" + b"y" * 200]), max_size=3),
    span=st.integers(-1, 3).flatmap(lambda start: st.tuples(st.just(start), st.integers(start + 1, 4))),
    bounds=st.tuples(st.none() | st.sampled_from(KEYED_POOL), st.none() | st.sampled_from(KEYED_POOL)),
    after=st.none() | st.sampled_from(KEYED_POOL),
    stretch=st.none() | st.integers(0, 6),
)
def test_the_keyed_way_is_the_same_without_the_accelerator(
    tmp_path_factory: pytest.TempPathFactory,
    writes: list[list[tuple[bytes, bytes | None]]],
    unwritten: list[bytes],
    span: tuple[int, int],
    bounds: tuple[bytes | None, bytes | None],
    after: bytes | None,
    stretch: int | None,
) -> None:
    """The same items and the same form handed back, for the key forms of every key written, in order (as
    the changes index names them), with keys never written among them, long keys amid short ones, any
    range, bounds and stretch."""
    env = keyed_table(tmp_path_factory.mktemp("k"), [list(dict(items).items()) for items in writes])
    try:
        named = {key for items in writes for key, _ in items} | set(unwritten)
        forms = sorted(layout.key_form(key) for key in named)
        compiled = keyed_run(env, forms, span, (*bounds, after), stretch)
        with python_only():
            assert keyed_run(env, forms, span, (*bounds, after), stretch) == compiled
        assert all(type(item) is DiffItem for item in compiled[0])
        event("items" if compiled[0] else "no item")
        event("handed back" if compiled[1] else "to the end")
    finally:
        env.close()


def _keyed(
    cursor: object,
    forms: object,
    *,
    stretch: int = -1,
    to_key: bytes | None = None,
    item_type: object = DiffItem,
    bound: object = None,
) -> object:
    """A KeyedScan of collection 1's changes in (seq 1, seq 2], ``bound`` its from_key."""
    accel = layout.ACCEL
    assert accel is not None
    to_bound, from_seq = layout.record_seq(3), layout.record_seq(1)
    prefix = layout.records_prefix(1)
    # deliberately any type: the refusals are tested through here
    args: tuple[Any, ...] = (
        cursor,
        prefix,
        forms,
        from_seq,
        to_bound,
        bound,
        to_key,
        None,
        stretch,
        item_type,
        (),
    )
    return accel.KeyedScan(*args)


def test_the_keyed_way_hands_a_long_key_to_the_python_loop_and_keeps_its_stretch(tmp_path: Path) -> None:
    short = [b"a", b"b", b"c"]
    long = b"c" + b"z" * 200  # between c and d
    env = keyed_table(tmp_path, [[(k, b"1") for k in [*short, long]], [(k, b"2") for k in [*short, long]]])
    try:
        forms = sorted(layout.key_form(k) for k in [*short, long, b"d"])
        assert layout.is_long_form(forms[3]) and forms[4] == layout.key_form(b"d")
        # a, b, c by KeyedScan, the long key by the Python loop with what is left of the stretch (1),
        # then d: the stretch is spent, so d is handed back
        items, resume = keyed_run(env, forms, (1, 2), (None, None, None), 4)
        assert [item.key for item in items] == [*short, long]
        assert resume == layout.key_form(b"d")
        with env.begin() as txn:
            cursor = txn.cursor(db=env.open_db(b"records", txn=txn))
            keyed: Any = _keyed(cursor, iter(forms), stretch=5)
            assert [item.key for item in keyed] == short
            assert keyed.long_form == forms[3] and keyed.resume is None and keyed.left == 2
            keyed = _keyed(cursor, iter(forms), stretch=2)
            assert [item.key for item in keyed] == short[:2]
            assert keyed.long_form is None and keyed.resume == forms[2] and keyed.left == 0
            keyed = _keyed(cursor, iter(forms), to_key=b"b")
            assert [item.key for item in keyed] == [b"a"]  # then to_key: the end
            assert keyed.long_form is None and keyed.resume is None and keyed.left is None
    finally:
        env.close()


def test_the_keyed_way_refuses_what_is_not_a_key_form_or_a_records_row(tmp_path: Path) -> None:
    env = keyed_table(tmp_path, [[(b"a", b"1")], [(b"a", b"2")]])
    accel = layout.ACCEL
    assert accel is not None
    try:
        with env.begin(write=True) as txn:
            db = env.open_db(b"records", txn=txn)
            cursor = txn.cursor(db=db)
            for not_a_form in ("text", b"", b"a", b"a\x00", b"a\x00\x02\x00\x00", b"a\x00\x00b"):
                with pytest.raises(ValueError, match="not a key form"):
                    list(_keyed(cursor, iter([not_a_form])))  # type: ignore[call-overload]
            with pytest.raises(TypeError):
                _keyed(cursor, iter([]), item_type=dict)
            with pytest.raises(TypeError):
                _keyed(cursor, iter([]), bound="a str bound")
            with pytest.raises(TypeError):
                _keyed(cursor, [layout.key_form(b"a")])  # a list, not an iterator
            with pytest.raises(AttributeError):
                _keyed(object(), iter([]))
            # a long key's stored value under a short key's form
            head = layout.record_head(layout.records_prefix(1), layout.key_form(b"b"))
            txn.put(head + layout.record_seq(2), layout.encode_value(LONG + b"x", b"v"), db=db)
            with pytest.raises(ValueError, match="long key's value"):
                list(_keyed(cursor, iter([layout.key_form(b"b")])))  # type: ignore[call-overload]
            txn.put(layout.records_prefix(1) + b"c\x00\x00", b"\x01v", db=db)  # no seq
            with pytest.raises(CorruptRecord):
                list(_keyed(cursor, iter([layout.key_form(b"c")])))  # type: ignore[call-overload]
            txn.abort()
    finally:
        env.close()


class _Feeding:
    """Forms that, asked for their second one, call back into the iterator fed from them (``target``):
    ``next`` takes an item of it, ``init`` runs its ``__init__`` again with ``again``, ``raise`` raises."""

    def __init__(self, forms: list[Any], action: str = "", again: tuple[Any, ...] = ()) -> None:
        self.forms = iter(forms)
        self.action = action
        self.again = again
        self.asked = 0
        self.target: Any = None

    def __iter__(self) -> _Feeding:
        return self

    def __next__(self) -> Any:
        self.asked += 1
        if self.asked == 2 and self.action == "next":
            next(self.target)
        if self.asked == 2 and self.action == "init":
            self.target.__init__(*self.again)
        if self.asked == 2 and self.action == "raise":
            raise KeyError("from the forms")
        return next(self.forms)


KEYED_AGAIN = (None, b"x", iter(()), b"", b"\x01\x01\x01", None, None, None, -1, DiffItem, ())
"""Arguments of a second ``KeyedScan.__init__``."""


def test_the_keyed_scan_is_a_well_behaved_python_object(tmp_path: Path) -> None:
    """Not re-entered, initialised once, an error when not initialised, collected in a cycle, and leaving
    the reference counts of its inputs as they were."""
    keys = [b"k%03d" % i for i in range(50)]
    env = keyed_table(tmp_path, [[(k, b"1") for k in keys], [(k, b"2") for k in keys]])
    forms = [layout.key_form(k) for k in keys]
    accel = layout.ACCEL
    assert accel is not None
    try:
        with env.begin() as txn:
            cursor = txn.cursor(db=env.open_db(b"records", txn=txn))
            for action, error, match in (
                ("next", ValueError, "already executing"),
                ("init", TypeError, "already"),
            ):
                feeding = _Feeding(forms, action, KEYED_AGAIN)
                keyed = _keyed(cursor, feeding)
                feeding.target = keyed
                with pytest.raises(error, match=match):
                    list(keyed)  # type: ignore[call-overload]
            unborn = accel.KeyedScan.__new__(accel.KeyedScan)
            with pytest.raises(TypeError, match="not initialised"):
                next(unborn)
            assert unborn.long_form is None and unborn.resume is None and unborn.left is None
            assert_collected_in_a_cycle(lambda: _fed(_Feeding(forms), lambda f: _keyed(cursor, f)))
            watched = [*forms, DiffItem, cursor]
            before = [sys.getrefcount(thing) for thing in watched]
            for _ in range(30):
                assert len(list(_keyed(cursor, iter(forms)))) == 50  # type: ignore[call-overload]
                stopped = _keyed(cursor, iter(forms))
                next(stopped)  # type: ignore[call-overload]
                del stopped
            assert [sys.getrefcount(thing) for thing in watched] == before
    finally:
        env.close()


# --- get_many_scan -----------------------------------------------------------------------------------------


def test_get_many_refuses_a_bad_key_in_its_place_compiled_and_in_python(tmp_path: Path) -> None:
    with Store.open(tmp_path / "s", StoreConfig(background=False)) as store:
        coll = store.create_collection("c", manual=True)
        coll.write_generation(b"1", [(b"a", b"1"), (LONG + b"x", b"2")])
        for keys in ([b"a", "a str", b"b"], [b"a", b"x" * (layout.MAX_KEY_LENGTH + 1)], [b"a", None]):
            for mode in (contextlib.nullcontext(), python_only()):
                with mode, pytest.raises(InvalidRequest, match="a key must be bytes"):
                    coll.get_many(keys)  # type: ignore[arg-type]
        keys = [LONG + b"x", b"a", b"absent", LONG + b"y", b"a"]  # duplicates, absent keys, long ones
        compiled = coll.get_many(keys)
        with python_only():
            assert coll.get_many(keys) == compiled

        class Keys(list[bytes]):
            pass

        assert coll.get_many(Keys(keys)) == compiled  # a list of another class is a list too
        assert [record and record.value for record in compiled.records] == [b"2", b"1", None, None, b"1"]
        assert all(type(record) is Record for record in compiled.records if record is not None)


def test_get_many_scan_refuses_bad_arguments_and_values_of_no_known_form(tmp_path: Path) -> None:
    accel = layout.ACCEL
    assert accel is not None
    env = keyed_table(tmp_path, [[(b"a", b"1")]])
    known: dict[int, bytes] = {1: b"g1"}
    above = layout.record_seq(2)
    prefix = layout.records_prefix(1)
    try:
        with env.begin(write=True) as txn:
            db = env.open_db(b"records", txn=txn)
            cursor = txn.cursor(db=db)
            ok: tuple[Any, ...] = (cursor, prefix, [b"a"], above, Record, known, known.get, layout.key_form)
            assert accel.get_many_scan(*ok) == [(b"a", b"1", b"g1")]
            keys = [b"a", b"absent", LONG + b"x"]
            watched = [*keys, keys, *ok]
            before = [sys.getrefcount(thing) for thing in watched]
            for _ in range(30):
                assert accel.get_many_scan(ok[0], prefix, keys, *ok[3:]) == [(b"a", b"1", b"g1"), None, None]
            assert [sys.getrefcount(thing) for thing in watched] == before
            for at, bad in ((2, (b"a",)), (3, b""), (3, b"\x01\x05"), (4, dict), (5, {}.items()), (6, None)):
                with pytest.raises(TypeError, match="bad arguments"):
                    accel.get_many_scan(*ok[:at], bad, *ok[at + 1 :])
            with pytest.raises(TypeError, match="bad arguments"):
                accel.get_many_scan(ok[0], b"\x01", *ok[2:])  # no records prefix
            with pytest.raises(AttributeError):
                accel.get_many_scan(object(), *ok[1:])
            with pytest.raises(ValueError, match="not a key form"):
                accel.get_many_scan(*ok[:2], [LONG + b"x"], *ok[3:7], lambda key: "a str")
            head = layout.record_head(prefix, layout.key_form(b"b"))
            # a tag of no form (plain or sealed): a damaged row
            txn.put(head + layout.record_seq(1), b"\x04v", db=db)
            with pytest.raises(CorruptRecord, match="key b "):
                accel.get_many_scan(*ok[:2], [b"b"], *ok[3:])
            txn.put(head + layout.record_seq(1), b"\x03\x00\x00\x09short", db=db)
            with pytest.raises(ValueError, match="not a stored value"):
                accel.get_many_scan(*ok[:2], [b"b"], *ok[3:])
            txn.abort()
    finally:
        env.close()


# --- MergeForms --------------------------------------------------------------------------------------------

ascending_runs = st.lists(st.sets(keys, max_size=12).map(sorted), max_size=10)


@given(runs=ascending_runs)
def test_merged_forms_are_the_distinct_forms_in_order_compiled_and_in_python(runs: list[list[bytes]]) -> None:
    from diffstore.engine.changes import merge_forms

    expected = sorted(set().union(*runs))
    compiled = list(merge_forms([iter(run) for run in runs]))  # up to 8 runs compiled, more by heapq
    with python_only():
        in_python = list(merge_forms([iter(run) for run in runs]))
    accel = layout.ACCEL
    assert accel is not None
    assert compiled == in_python == expected == list(accel.MergeForms([iter(run) for run in runs]))


def test_the_merge_refuses_what_is_not_ascending_forms_and_is_a_well_behaved_python_object() -> None:
    accel = layout.ACCEL
    assert accel is not None
    merge = accel.MergeForms
    for bad, error, match in (
        ([[b"a", "b"]], TypeError, "must be bytes, not str"),
        ([[b"a", bytearray(b"b")]], TypeError, "must be bytes, not bytearray"),
        ([[b"a"], 5], TypeError, "not iterable"),
        (7, TypeError, "a sequence of iterables"),
    ):
        with pytest.raises(error, match=match):
            list(merge(bad))
    for action, error, match in (
        ("next", ValueError, "already executing"),
        ("init", TypeError, "already initialised"),
        ("raise", KeyError, "from the forms"),
    ):
        feeding = _Feeding([b"a", b"b", b"c"], action, ([iter([b"z"])],))
        merged = merge([feeding, iter([b"b"])])
        feeding.target = merged
        with pytest.raises(error, match=match):
            list(merged)
    unborn = merge.__new__(merge)
    with pytest.raises(TypeError, match="not initialised"):
        next(unborn)
    assert_collected_in_a_cycle(lambda: _fed(_Feeding([b"a", b"b"]), lambda f: merge([f])))
    forms = [b"f%03d" % i for i in range(40)]
    runs = [forms[::2], forms[::3], forms[1::2]]
    watched = [*forms, *runs]
    before = [sys.getrefcount(thing) for thing in watched]
    for _ in range(30):
        assert list(merge([iter(run) for run in runs])) == forms
        stopped = merge([iter(run) for run in runs])
        next(stopped)
        del stopped
    assert [sys.getrefcount(thing) for thing in watched] == before


# --- the digests' record hash (BLAKE2b-128 in C) -----------------------------------------------------

stored_values = (
    st.just(b"") | st.binary(max_size=300).map(lambda raw: b"\x01" + raw) | st.binary(max_size=300)
)


@settings(max_examples=300, deadline=None)
@given(pairs=st.lists(st.tuples(st.binary(max_size=300), stored_values), max_size=12))
def test_digest_pairs_are_the_sums_of_record_digest(pairs: list[tuple[bytes, bytes]]) -> None:
    with python_only():
        expected = digests.pair_sums(pairs)
    hashes = [layout.record_digest(form, raw) for form, raw in pairs]
    assert expected == (sum(1 for h in hashes if h), sum(hashes) % 2**128)
    assert digests.pair_sums(pairs) == expected


def test_the_record_hash_is_blake2b_at_every_block_boundary() -> None:
    # a record of n bytes ends in BLAKE2b's last block at n = 128k exactly, and one byte either side
    for length in [*range(0, 400), 1023, 1024, 1025, 100_000]:
        form, raw = bytes(range(7))[: length % 8], b"\x01" + bytes(i * 31 % 256 for i in range(length))
        full = hashlib.blake2b(form + raw, digest_size=16).digest()
        assert digests.pair_sums([(form, raw)]) == (1, int.from_bytes(full, "big")), length


@settings(max_examples=200, deadline=None)
@given(
    rows=st.lists(st.tuples(st.binary(max_size=6), st.integers(0, 3), stored_values), max_size=20),
    after=st.lists(st.tuples(st.binary(min_size=1, max_size=4), stored_values), max_size=3),
)
def test_digest_rows_sum_the_rows_of_one_seq_under_the_prefix_compiled_and_in_python(
    tmp_path_factory: pytest.TempPathFactory,
    rows: list[tuple[bytes, int, bytes]],
    after: list[tuple[bytes, bytes]],
) -> None:
    prefix, encoded = b"\x01\x07", layout.record_seq(2)
    table = {prefix + form + layout.record_seq(seq): raw for form, seq, raw in rows}
    table.update({b"\x01\x08" + tail: raw for tail, raw in after})  # the next collection: not summed
    table[b"\x01\x06" + layout.record_seq(2)] = b"\x01before"  # the one before: not summed either
    env = lmdb.open(str(tmp_path_factory.mktemp("rows")), map_size=1 << 24)
    with env.begin(write=True) as txn:
        for raw_key, raw in table.items():
            txn.put(raw_key, raw)
    wanted = [
        (k[len(prefix) : -len(encoded)], v)
        for k, v in table.items()
        if k.startswith(prefix) and k.endswith(encoded)
    ]
    with env.begin() as txn:
        compiled = digests._first_load(txn.cursor(), prefix, encoded)
        with python_only():
            assert digests._first_load(txn.cursor(), prefix, encoded) == compiled
    with python_only():
        assert compiled == digests.pair_sums(wanted)
    env.close()


def test_the_digest_sums_refuse_what_is_not_pairs_of_bytes_and_keep_reference_counts() -> None:
    accel = layout.ACCEL
    assert accel is not None
    for bad in ([(b"a", "b")], [(b"a",)], [b"ab"], [(b"a", b"b", b"c")]):
        with pytest.raises(TypeError):
            accel.digest_pairs(bad)
        with pytest.raises(TypeError):
            accel.digest_rows(iter([(b"\x01a\x01\x02\x01", b"\x01v"), *bad]), b"\x01", b"\x01\x02\x01")
    with pytest.raises(TypeError):
        accel.digest_pairs((b"a", b"b"))  # not a list
    with pytest.raises(ValueError, match="inside"):

        def failing() -> Iterator[tuple[bytes, bytes]]:
            yield b"\x01a\x01\x02\x01", b"\x01v"
            raise ValueError("inside")

        accel.digest_rows(failing(), b"\x01", b"\x01\x02\x01")
    pairs = [(b"k%d" % i, b"\x01" + b"v" * i) for i in range(50)]
    before = [(sys.getrefcount(f), sys.getrefcount(r)) for f, r in pairs]
    for _ in range(3):
        accel.digest_pairs(pairs)
        accel.digest_rows(iter(pairs), b"k", b"")
    assert [(sys.getrefcount(f), sys.getrefcount(r)) for f, r in pairs] == before


def test_a_commits_digest_sums_are_the_python_loops_and_refuse_what_is_not_a_form(tmp_path: Path) -> None:
    # (the digests a commit stores with and without the accelerator: test_stores_and_diffs_are_the_same...)
    env = lmdb.open(str(tmp_path / "t"), map_size=1 << 24)
    prefix = b"\x01\x07"
    rows = {
        prefix + b"a" + layout.record_seq(1): b"\x01old",
        prefix + b"a" + layout.record_seq(2): b"\x01new",
        prefix + b"b" + layout.record_seq(2): b"",  # a tombstone written
        prefix + b"c" + layout.record_seq(1): b"\x01gone",
        prefix + b"c" + layout.record_seq(2): b"",
        prefix + b"d" + layout.record_seq(2): b"\x01first",
    }
    with env.begin(write=True) as txn:
        for raw_key, raw in rows.items():
            txn.put(raw_key, raw)
    accel = layout.ACCEL
    assert accel is not None
    with env.begin() as txn:
        forms = [b"a", b"b", b"c", b"d", b"never"]
        got = accel.digest_changes(txn.cursor(), prefix, iter(forms), layout.record_seq(2), True)
        with python_only():
            added = digests.pair_sums([(b"a", b"\x01new"), (b"b", b""), (b"c", b""), (b"d", b"\x01first")])
            removed = digests.pair_sums([(b"a", b"\x01old"), (b"c", b"\x01gone")])
        assert got == (added, removed)
        assert accel.digest_changes(txn.cursor(), prefix, iter(forms), layout.record_seq(2), False) == (
            added,
            (0, 0),
        )
        with pytest.raises(TypeError):
            accel.digest_changes(txn.cursor(), prefix, iter([b"a", "b"]), layout.record_seq(2), True)
        with pytest.raises(TypeError):
            accel.digest_changes(txn.cursor(), "prefix", iter(forms), layout.record_seq(2), True)
    env.close()
