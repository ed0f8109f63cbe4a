"""Checksums on records (sealed values, layout.py): every write seals, reads verify (``CorruptRecord``
naming the key, never the value), ``check`` reports each damaged row with its collection, key and
generation, and a store written before checksums opens, says how many rows predate them, and ``migrate``
seals them."""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from unittest import mock

import hypothesis.strategies as st
import pytest
from hypothesis import HealthCheck, given, settings

from diffstore import Store, StoreConfig
from diffstore.engine import check, layout, migrate
from diffstore.engine.tables import load_meta
from diffstore.errors import CorruptRecord
from tests.lived_in import live

SECRET = b"the-secret-value-%d"


def python_only(on: bool) -> contextlib.AbstractContextManager[object]:
    """The engine without its accelerator when ``on``: the pure-Python twins run."""
    return mock.patch.object(layout, "ACCEL", None) if on else contextlib.nullcontext()


def records_rows(store: Store) -> list[tuple[bytes, bytes]]:
    with store.env.begin() as txn:
        return [(bytes(k), bytes(v)) for k, v in txn.cursor(db=store.tables.records)]


def put_row(store: Store, key: bytes, value: bytes, delete: bytes | None = None) -> None:
    """Writes one records row underneath the engine (as a damaged disk would), ``delete`` removed first."""
    with store.env.begin(write=True) as txn:
        if delete is not None:
            txn.delete(delete, db=store.tables.records)
        txn.put(key, value, db=store.tables.records)


def flip(raw: bytes, at: int, bit: int) -> bytes:
    changed = bytearray(raw)
    changed[at] ^= 1 << bit
    return bytes(changed)


def simple(store: Store) -> None:
    """Collection A: keys k0..k9 over three generations (overwrites, a tombstone, a long key)."""
    a = store.create_collection("A")
    for n in (1, 2, 3):
        g = b"%d" % n
        a.start_generation(g)
        a.put_many([(b"k%d" % i, SECRET % (n * 10 + i)) for i in range(10)], generation_id=g)
        a.put(b"L" * 300, SECRET % n, generation_id=g)
        if n == 3:
            a.put(b"k5", None, generation_id=g)
        a.commit_generation(g)


def test_every_write_path_seals_and_a_new_store_is_marked_sealed(tmp_path: Path) -> None:
    for pure in (False, True):
        with python_only(pure), Store.open(tmp_path / f"s{pure}", StoreConfig(background=False)) as store:
            simple(store)  # sorted bulk rows (compiled when built), single puts, a long key, a tombstone
            a = store.collection("A")
            a.start_generation(b"4")
            a.put_many([(b"z", b"1"), (b"b", None), (b"a\x00", b"2")], generation_id=b"4")  # unsorted
            a.commit_generation(b"4")
            rows = records_rows(store)
            assert rows and all(layout.is_sealed(raw) for _, raw in rows)
            assert all(layout.unseal(key, raw) == layout.plain(raw) for key, raw in rows)
            with store.env.begin() as txn:
                assert txn.get(layout.SEALED_ROW, db=store.tables.collections) == b""
                report = check.check(txn, store.tables)
            assert report.ok and report.notes == [], report


@pytest.mark.parametrize("pure", [False, True], ids=["accelerator", "pure-python"])
def test_each_read_path_answers_corrupt_record_naming_the_key_never_the_value(
    tmp_path: Path, pure: bool
) -> None:
    with python_only(pure), Store.open(tmp_path / "s", StoreConfig(background=False)) as store:
        simple(store)
        a = store.collection("A")
        before = {r.key: r.value for r in a.query()}
        with store.env.begin() as txn:
            cid_prefix = load_meta(txn, store.tables, "A").records_prefix
        target = layout.record_key(cid_prefix, layout.key_form(b"k7"), 3)  # k7's visible version at 3
        raw = dict(records_rows(store))[target]
        put_row(store, target, flip(raw, len(raw) - 1, 0))  # one bit of the value
        reads = {
            "get": lambda: a.get(b"k7"),
            "get_many": lambda: a.get_many([b"k1", b"k7"]),
            "query": lambda: list(a.query()),
            "query_page": lambda: a.query_page(limit=100),
            "diff": lambda: list(a.diff(b"2", b"3")),
            "diff_from_start": lambda: list(a.diff(b"", b"3")),
        }
        for name, read in reads.items():
            with pytest.raises(CorruptRecord) as caught:
                read()
            message = str(caught.value)
            assert "k7" in message and "generation #3" in message and "checksum" in message, name
            assert b"the-secret" not in message.encode() and "secret" not in message, name
        # the other keys still read; the damaged row is the only one refused
        assert a.get(b"k6") is not None and a.get(b"k6").value == before[b"k6"]  # type: ignore[union-attr]
        assert a.get(b"k7", generation_id=b"2") is not None  # an older version, its own checksum holds
        put_row(store, target, raw)  # repaired: every read answers again
        assert {r.key: r.value for r in a.query()} == before


def test_check_names_collection_key_and_generation_of_a_damaged_row(tmp_path: Path) -> None:
    with Store.open(tmp_path / "s", StoreConfig(background=False)) as store:
        simple(store)
        with store.env.begin() as txn:
            cid_prefix = load_meta(txn, store.tables, "A").records_prefix
        target = layout.record_key(cid_prefix, layout.key_form(b"k2"), 2)
        raw = dict(records_rows(store))[target]
        put_row(store, target, flip(raw, 6, 3))
        with store.env.begin() as txn:
            report = check.check(txn, store.tables)
    # the damaged value also no longer sums to its generation's digest (digests.py)
    assert [str(p) for p in report.problems if p.table == "records"] == [
        "records: 'A': record key k2 #2 (2): its checksum fails (the key or the value was changed underneath)"
    ]


def test_a_plain_row_in_a_sealed_store_is_damage(tmp_path: Path) -> None:
    """A flipped tag bit can make a sealed value look like one written before checksums: in a store marked
    sealed, check reports it (reads cannot tell, and serve it as the old format would)."""
    with Store.open(tmp_path / "s", StoreConfig(background=False)) as store:
        simple(store)
        with store.env.begin() as txn:
            cid_prefix = load_meta(txn, store.tables, "A").records_prefix
        target = layout.record_key(cid_prefix, layout.key_form(b"k4"), 1)
        raw = dict(records_rows(store))[target]
        put_row(store, target, layout.plain(raw))
        with store.env.begin() as txn:
            report = check.check(txn, store.tables)
    assert [str(p) for p in report.problems] == [
        "records: 'A': record key k4 #1 (1): it carries no checksum, in a store whose every record is sealed"
    ]


def unseal_everything(store: Store) -> int:
    """Makes ``store`` look written before checksums: every records row plain, no sealed mark."""
    rows = records_rows(store)
    with store.env.begin(write=True) as txn:
        for key, raw in rows:
            txn.put(key, layout.plain(raw), db=store.tables.records)
        txn.delete(layout.SEALED_ROW, db=store.tables.collections)
    return len(rows)


def test_a_store_older_than_checksums_opens_check_counts_its_rows_and_migrate_seals_them(
    tmp_path: Path,
) -> None:
    path = tmp_path / "store"
    with Store.open(path, StoreConfig(background=False)) as store:
        simple(store)
        want = {r.key: r.value for r in store.collection("A").query()}
        old = unseal_everything(store)
    with Store.open(path, StoreConfig(background=False)) as store:  # opens as it is: no rewrite
        a = store.collection("A")
        assert {r.key: r.value for r in a.query()} == want
        assert not any(layout.is_sealed(raw) for _, raw in records_rows(store))
        a.start_generation(b"4")
        a.put(b"new", b"sealed", generation_id=b"4")
        a.commit_generation(b"4")
    report = check.check_directory(path)
    assert report.ok and report.notes == [
        f"{old} records rows predate checksums (written by an older diffstore): reads cannot verify them;"
        " diffstore migrate (or compact) seals them"
    ], report
    done = subprocess.run(
        [sys.executable, "-m", "diffstore", "migrate", "--data", str(path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert f", {old} records given a checksum" in done.stdout, done.stdout
    report = check.check_directory(path)
    assert report.ok and report.notes == [], report
    with Store.open(path, StoreConfig(background=False)) as store:
        rows = records_rows(store)
        assert all(layout.is_sealed(raw) for _, raw in rows)
        assert {r.key: r.value for r in store.collection("A").query(generation_id=b"3")} == want
        assert migrate.seal_records(store.env, store.tables) == 0  # marked: nothing left to do


def test_compact_seals_an_older_store_before_its_copy(tmp_path: Path) -> None:
    path = tmp_path / "store"
    with Store.open(path, StoreConfig(background=False)) as store:
        simple(store)
        want = {r.key: r.value for r in store.collection("A").query()}
        old = unseal_everything(store)
    done = subprocess.run(
        [sys.executable, "-m", "diffstore", "compact", "--data", str(path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"; {old} records given a checksum" in done.stdout, done.stdout
    report = check.check_directory(path)
    assert report.ok and report.notes == [], report
    with Store.open(path, StoreConfig(background=False)) as store:
        assert all(layout.is_sealed(raw) for _, raw in records_rows(store))
        assert {r.key: r.value for r in store.collection("A").query()} == want


def test_sealing_goes_in_batches_and_resumes_where_a_batch_ended(tmp_path: Path) -> None:
    with Store.open(tmp_path / "s", StoreConfig(background=False)) as store:
        simple(store)
        old = unseal_everything(store)
        assert migrate.seal_records(store.env, store.tables, batch=3) == old
        assert all(layout.is_sealed(raw) for _, raw in records_rows(store))
        with store.env.begin() as txn:
            assert txn.get(layout.SEALED_ROW, db=store.tables.collections) == b""
            assert check.check(txn, store.tables).ok


# --- a lived-in store: one bit flipped in each position class, or a row deleted ---------------------


@pytest.fixture(scope="module")
def lived_in_copy(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Store]:
    """A copy of a lived-in store (tests/lived_in.py), open: each example damages a row, checks, repairs."""
    source = tmp_path_factory.mktemp("lived") / "store"
    with Store.open(source, StoreConfig(background=False)) as store:
        live(store, key_bytes=1 << 12)
    copy = source.parent / "copy"
    shutil.copytree(source, copy)
    with Store.open(copy, StoreConfig(background=False)) as store:
        yield store


CLASSES = ["key", "generation", "tag", "checksum", "value", "deleted"]


def _span(key: bytes, raw: bytes, where: str) -> tuple[bytes, int, int] | None:
    """(which bytes, from, to) a position class covers in a records row (None: the row has none)."""
    start, end = 1 + key[0], len(key) - 2 - key[-1]  # K lies between the rcid and the rseq
    spans = {
        "key": (key, start, end),
        "generation": (key, end, len(key)),
        "tag": (raw, 0, 1),
        "checksum": (raw, 1, 5),
        "value": (raw, 5, len(raw)),
    }
    found = spans[where]
    return found if found[2] > found[1] else None


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    pick=st.integers(0, 10**9),
    where=st.sampled_from(CLASSES),
    position=st.integers(0, 10**9),
    pure=st.booleans(),
)
def test_check_and_reads_catch_a_flipped_bit_in_each_position_class_or_a_deleted_row(
    lived_in_copy: Store, pick: int, where: str, position: int, pure: bool
) -> None:
    store = lived_in_copy
    names = {}
    with store.env.begin() as txn:
        for info in store.collections():
            meta = load_meta(txn, store.tables, info.name)
            names[meta.cid] = meta.name
    rows = [(k, v) for k, v in records_rows(store) if (layout.parse_record_key(k) or (0,))[0] in names]
    assert len(rows) > 40
    key, raw = rows[pick % len(rows)]
    name = names[layout.parse_record_key(key)[0]]  # type: ignore[index]
    span = None if where == "deleted" else _span(key, raw, where)
    if where != "deleted" and span is None:
        where, span = "tag", _span(key, raw, "tag")  # a row without value bytes: its tag
    if span is None:
        damaged_key, damaged_raw = None, None
    else:
        data, start, end = span
        at = start + position % (end - start)
        changed = flip(data, at, position % 8)
        damaged_key, damaged_raw = (changed, raw) if data is key else (key, changed)
    replaced = None  # a row the damaged key landed on (k1 and k3 differ in one bit): restored after
    try:
        with store.env.begin(write=True) as txn:
            txn.delete(key, db=store.tables.records)
            if damaged_key is not None:
                replaced = txn.get(damaged_key, db=store.tables.records)
                replaced = None if replaced is None else bytes(replaced)
                txn.put(damaged_key, damaged_raw, db=store.tables.records)
        with store.env.begin() as txn:
            report = check.check(txn, store.tables)
        assert not report.ok, (where, name)
        if where in ("tag", "checksum", "value"):  # the row's own checksum: named with its key
            assert any(name in str(p) and "checksum" in str(p) for p in report.problems), report.problems
        lost_seal = where == "tag" and damaged_raw is not None and 1 <= damaged_raw[0] <= 3
        if where != "deleted" and not lost_seal:  # a lost seal bit looks like an old row: check's to report
            with python_only(pure), pytest.raises(CorruptRecord):  # every row a full query passes is verified
                list(store.collection(name).query())
    finally:
        with store.env.begin(write=True) as txn:
            if damaged_key is not None:
                txn.delete(damaged_key, db=store.tables.records)
                if replaced is not None:
                    txn.put(damaged_key, replaced, db=store.tables.records)
            txn.put(key, raw, db=store.tables.records)
    with store.env.begin() as txn:
        assert check.check(txn, store.tables).ok


def test_the_lived_in_copy_is_sound_and_sealed(lived_in_copy: Store) -> None:
    rows = records_rows(lived_in_copy)
    assert rows and all(layout.is_sealed(raw) for _, raw in rows)
    with lived_in_copy.env.begin() as txn:
        report = check.check(txn, lived_in_copy.tables)
    assert report.ok and report.notes == [], report


def test_unseal_refuses_malformed_sealed_values() -> None:
    key = layout.record_key(layout.records_prefix(1), layout.key_form(b"k"), 1)
    for bad in (b"\x11", b"\x10\x00\x00\x00", b"\x10\x00\x00\x00\x00\x00", b"\x14" + b"\x00" * 8):
        assert layout.seal_fails(key, bad)
        with pytest.raises(CorruptRecord, match="key k "):
            layout.unseal(key, bad)
    with pytest.raises(CorruptRecord, match="its key is damaged"):
        layout.unseal(b"\xff", b"\x10\x00\x00\x00\x00")
