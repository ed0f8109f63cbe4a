"""``check``'s scan of records and runs (engine/check_scan.py): the compiled loops against their Python twins
on any rows, sound or not; the same report with and without the accelerator; one read of each big table
with no look-up per row; progress as it reads."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any
from unittest import mock

import hypothesis.strategies as st
import lmdb
import pytest
from hypothesis import given, settings

from diffstore import Store, StoreConfig
from diffstore.engine import check, check_rows, check_scan, files, layout
from diffstore.engine.meta import CollectionMeta
from diffstore.engine.tables import Tables
from tests.lived_in import live

from .test_check import DAMAGE, build, damage

accelerated = pytest.mark.skipif(layout.ACCEL is None, reason="the compiled accelerator was not built")


def python_only() -> contextlib.AbstractContextManager[object]:
    return mock.patch.object(layout, "ACCEL", None)


# --- the loops against their twins, row by row --------------------------------------------------------

CIDS = [0, 1, 2, 300]  # 300 needs a 2-byte rcid; 2 is deleted; 5 (below) neither live nor deleted
USER_KEYS = [b"", b"a", b"a\x00", b"b", b"k1", b"k2", b"L" * 201, b"L" * 201 + b"x", b"M" * 300]


def _meta(cid: int) -> CollectionMeta:
    return CollectionMeta(f"c{cid}", cid, True, b"3", 3, b"5", 5, 5)


def _scope(sealed: bool = False) -> check_scan.Scope:
    # registered: 0, 1, 3 (current) and 5 (open); 2 and 4 are not (a record there is stray); 4 > current
    targets = {cid: check_scan.Target(_meta(cid), [0, 1, 3, 5]) for cid in (0, 1, 300)}
    return check_scan.Scope(targets, {2}, check_rows.RowSeals(sealed))


def _sealed(key: bytes, raw: bytes, how: int, at: int) -> bytes:
    """``raw`` as stored under ``key``: plain (0: written before checksums), sealed (1), sealed with one
    bit flipped at byte ``at`` (2; in the tag byte a lost seal bit among them), or a seal cut short (3)."""
    if how == 0:
        return raw
    stored = bytearray(layout.seal(key, raw))
    if how == 2:
        stored[at % len(stored)] ^= 1 << (at % 8)
    if how == 3:
        del stored[1 + at % 4 :]
    return bytes(stored)


def _value(key: bytes, kind: int, salt: bytes) -> bytes:
    if kind == 0:
        return layout.encode_value(key, None)
    if kind == 1:
        return layout.encode_value(key, salt)
    if kind == 2:
        return layout.encode_value(key, salt)[:3]  # cut inside a long key's header
    if kind == 3:
        return layout.encode_value(key[::-1] + b"?", salt)  # another key's: a long form that does not match
    return b"\x07" + salt  # an unknown tag


record_rows = st.lists(
    st.one_of(
        st.tuples(
            st.sampled_from([*CIDS, 5]),
            st.sampled_from(USER_KEYS),
            st.integers(0, 6) | st.just(2**40),
            st.integers(0, 4),
            st.binary(max_size=6),
            st.integers(0, 3),
            st.integers(0, 1000),
        ).map(
            lambda t: (
                key := layout.record_key(layout.records_prefix(t[0]), layout.key_form(t[1]), t[2]),
                _sealed(key, _value(t[1], t[3], t[4]), t[5], t[6]),
            )
        ),
        # any bytes: most are no records key; a leading-zero cid or seq is not one either
        st.tuples(st.binary(min_size=1, max_size=12), st.binary(max_size=4)),
        st.just((b"\x02\x00\x01k\x00\x00\x01\x00\x01", b"")),
        st.just((b"\x01\x01k\x00\x00\x02\x00\x03\x02", b"")),
    ),
    max_size=40,
)


def _chunk(forms: list[bytes]) -> bytes:
    return layout.pack_forms(forms)


run_rows = st.lists(
    st.one_of(
        st.tuples(
            st.sampled_from([*CIDS, 5]),
            st.sampled_from([0, 1, 2, 3, 5]),
            st.lists(st.sampled_from(USER_KEYS), min_size=1, max_size=4),
            st.integers(0, 3),
        ).map(
            lambda t: (
                layout.change_key(layout.cid_bytes(t[0]), t[1], layout.key_form(t[2][0])),
                [
                    _chunk(sorted({layout.key_form(k) for k in t[2]}))  # sound when its first is the least
                    if t[3] < 2
                    else _chunk([layout.key_form(k) for k in t[2]]),  # any order, repeats
                    b"\x00\x09short",  # does not unpack
                ][t[3] == 3],
            )
        ),
        st.tuples(st.binary(max_size=15), st.binary(max_size=4)),
    ),
    max_size=40,
)


def _outcome(scope: check_scan.Scope) -> list[Any]:
    """What a scan left in the targets that does not depend on its hash of a form: the counts, the
    digests' sums, and which buckets agree."""
    return [
        (
            cid,
            t.records,
            t.entries,
            t.delta,
            t.counted,
            [
                (t.records[i], t.record_sums[i]) == (t.entries[i], t.entry_sums[i])
                for i in range(len(t.records))
            ],
        )
        for cid, t in sorted(scope.targets.items())
    ]


def _scan(
    rows: dict[bytes, bytes], runs: dict[bytes, bytes], chunks: dict[bytes, bytes], sealed: bool
) -> tuple[Any, ...]:
    """The scan's loops over sorted rows as check_scan.scan runs them: the rows read, the rows handed back
    (with the plain rows counted) and the buckets."""
    scope = _scope(sealed)
    accel = layout.ACCEL
    buffers = {cid: t.accumulator() for cid, t in scope.targets.items()}
    shapes = [
        (cid, t.meta.generation_seq, t.meta.next_seq or -1, b"".join(map(layout.u64, t.seqs)), buffers[cid])
        for cid, t in scope.targets.items()
    ]
    ticks: list[int] = []
    found: list[Any] = []
    for table, chunked in ((runs, False), (chunks, True)):
        items = iter(sorted(table.items()))
        if accel is None:
            found.append(check_scan._runs(items, chunked, scope, ticks.append))
        else:
            found.append(accel.check_runs(items, chunked, shapes, scope.dropped, ticks.append, 3))
    items = iter(sorted(rows.items()))
    if accel is None:
        found.append(check_scan._records(items, scope, ticks.append))
    else:
        found.append(accel.check_records(items, shapes, scope.dropped, sealed, ticks.append, 3))
    for cid, buffer in buffers.items():
        scope.targets[cid].take(buffer)
    return found, _outcome(scope)


@accelerated
@settings(max_examples=300, deadline=None)
@given(records=record_rows, runs=run_rows, chunks=run_rows, sealed=st.booleans())
def test_the_compiled_scan_hands_back_and_counts_what_its_twin_does(
    records: list[tuple[bytes, bytes]],
    runs: list[tuple[bytes, bytes]],
    chunks: list[tuple[bytes, bytes]],
    sealed: bool,
) -> None:
    """Rows sealed, plain, or with a seal that fails or is cut short, in a sealed store or an older one."""
    with mock.patch.object(check_scan, "TICK", 3):
        compiled = _scan(dict(records), dict(runs), dict(chunks), sealed)
        with python_only():
            twin = _scan(dict(records), dict(runs), dict(chunks), sealed)
    assert compiled == twin


# --- whole checks ----------------------------------------------------------------------------------------


def test_a_damaged_store_gets_the_same_report_with_and_without_the_accelerator(tmp_path: Path) -> None:
    build(tmp_path / "s")
    for harm, _ in DAMAGE:
        damage(tmp_path / "s", harm)
    report = check.check_directory(tmp_path / "s")
    with python_only():
        twin = check.check_directory(tmp_path / "s")
    assert [str(p) for p in report.problems] == [str(p) for p in twin.problems]
    assert report.rows == twin.rows
    for _, expected in DAMAGE:
        assert any(expected in str(p) for p in report.problems), expected


class _Counting:
    """A read transaction that counts the point look-ups made through it."""

    def __init__(self, txn: lmdb.Transaction) -> None:
        self._txn = txn
        self.gets = 0

    def get(self, *args: Any, **kwargs: Any) -> Any:
        self.gets += 1
        return self._txn.get(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._txn, name)


@pytest.mark.parametrize("compiled", [True, False], ids=["compiled", "python"])
def test_check_looks_up_no_row_per_record(tmp_path: Path, compiled: bool) -> None:
    """Records and their runs are matched by sums, not by a look-up per record (before: three per
    record and one per run entry)."""
    if compiled and layout.ACCEL is None:
        pytest.skip("the compiled accelerator was not built")
    with Store.open(tmp_path / "s", StoreConfig(background=False)) as store:
        coll = store.create_collection("A")
        coll.write_generation(b"1", [(b"k%05d" % i, b"v") for i in range(3000)])
        coll.write_generation(b"2", [(b"k%05d" % i, b"w") for i in range(0, 3000, 3)])
        coll.write_generation(b"3", [(b"k%05d" % i, None) for i in range(0, 3000, 7)])
    with files.open_existing(tmp_path / "s") as opened, contextlib.ExitStack() as stack:
        tables = Tables.open(opened.env)
        if not compiled:
            stack.enter_context(python_only())
        with opened.env.begin() as txn:
            counting = _Counting(txn)
            report = check.check(counting, tables)  # type: ignore[arg-type]
    assert report.ok, report.problems
    assert report.rows["records"] > 4000
    assert counting.gets < 50, counting.gets


def test_progress_reaches_every_row_of_every_table(tmp_path: Path) -> None:
    build(tmp_path / "s")
    seen: list[tuple[int, int]] = []
    with mock.patch.object(check_scan, "TICK", 4):
        report = check.check_directory(
            tmp_path / "s", progress=lambda done, total: seen.append((done, total))
        )
    assert report.ok, report.problems
    rows = sum(report.rows.values())
    assert len(seen) > len(report.rows)  # each table, and ticks inside the big ones
    assert all(total == rows for _, total in seen)
    assert [done for done, _ in seen] == sorted(done for done, _ in seen)
    assert seen[-1] == (rows, rows)


def test_a_bucket_that_differs_names_each_row_that_has_no_partner(tmp_path: Path) -> None:
    """Two damages in one generation, one on each side: both named (the sums only say the bucket differs)."""
    with Store.open(tmp_path / "s", StoreConfig(background=False)) as store:
        coll = store.create_collection("A")
        coll.write_generation(b"1", [(b"k%03d" % i, b"v") for i in range(200)])
        coll.write_generation(b"2", [(b"k%03d" % i, b"w") for i in range(0, 200, 2)])

    def harm(txn: lmdb.Transaction, tables: Tables) -> None:
        meta = CollectionMeta.unpack("A", bytes(txn.get(b"A", db=tables.collections)))
        seq = meta.generation_seq
        txn.delete(layout.record_key(meta.records_prefix, layout.key_form(b"k010"), seq), db=tables.records)
        txn.put(
            layout.record_key(meta.records_prefix, layout.key_form(b"k011"), seq), b"\x01w", db=tables.records
        )

    damage(tmp_path / "s", harm)
    for context in (contextlib.nullcontext(), python_only()):
        with context:
            found = [str(p) for p in check.check_directory(tmp_path / "s").problems]
        assert any("index entry key k010 #2 has no record" in line for line in found), found
        assert any("record key k011 #2 is missing from its generation's index" in line for line in found), (
            found
        )


@pytest.mark.parametrize("compiled", [True, False], ids=["compiled", "python"])
def test_digests_rederived_over_many_batches_and_values_larger_than_one_agree(
    tmp_path: Path, compiled: bool
) -> None:
    """The compiled scan hashes in batches (4,096 versions, 1 MB) beside its loop: versions across many
    batches, overwritten and deleted, and values larger than a batch, give the digests each commit stored."""
    if compiled and layout.ACCEL is None:
        pytest.skip("the compiled accelerator was not built")
    big = bytes(range(256)) * 9000  # 2.3 MB
    with Store.open(tmp_path / "s", StoreConfig(background=False)) as store:
        coll = store.create_collection("A")
        coll.write_generation(b"1", [(b"k%05d" % i, b"v%d" % i) for i in range(12_000)])
        coll.write_generation(b"2", [(b"k%05d" % i, big + b"%d" % i) for i in range(0, 12_000, 4000)])
        coll.write_generation(b"3", [(b"k%05d" % i, None if i % 2 else b"w") for i in range(0, 12_000, 3)])
        coll.write_generation(b"4", [(b"k%05d" % i, big) for i in range(1, 12_000, 5000)])
    with contextlib.ExitStack() as stack:
        if not compiled:
            stack.enter_context(python_only())
        report = check.check_directory(tmp_path / "s")
    assert report.ok, report.problems
    assert report.rows["records"] == 12_000 + 3 + 4000 + 3
    with Store.open(tmp_path / "s", StoreConfig(background=False)) as store, store.write() as scope:
        meta = CollectionMeta.unpack("A", bytes(scope.txn.get(b"A", db=store.tables.collections)))
        form = layout.key_form(b"k04000")
        # one byte of a big value flipped (through the layout, below the engine): its checksum fails, and
        # generation 2's digest and those above it no longer match their records
        key = layout.record_key(meta.records_prefix, form, meta.generation_seq - 2)
        raw = bytearray(scope.txn.get(key, db=store.tables.records))
        raw[1_500_000] ^= 1
        scope.txn.put(key, bytes(raw), db=store.tables.records)
    with contextlib.ExitStack() as stack:
        if not compiled:
            stack.enter_context(python_only())
        found = [str(p) for p in check.check_directory(tmp_path / "s").problems]
    assert found[0] == (
        "records: 'A': record key k04000 #2 (2): its checksum fails"
        " (the key or the value was changed underneath)"
    ), found
    assert len(found) == 4 and all("the digest of generation" in line for line in found[1:]), found


def test_a_lived_in_store_gets_the_same_report_with_and_without_the_accelerator(tmp_path: Path) -> None:
    """History collected by GC, moved readers, deleted and re-created collections, an open generation,
    phantoms, 1 MiB keys: sound with either loop; with a 1 MiB key's version and a run entry removed, each
    names the same problems."""
    with Store.open(tmp_path / "s", StoreConfig(background=False)) as store:
        life = live(store)
    report = check.check_directory(tmp_path / "s")
    assert report.ok, report.problems
    with python_only():
        assert check.check_directory(tmp_path / "s").rows == report.rows

    def harm(txn: lmdb.Transaction, tables: Tables) -> None:
        meta = CollectionMeta.unpack(life.BIG, bytes(txn.get(life.BIG.encode(), db=tables.collections)))
        cursor = txn.cursor(db=tables.records)
        assert cursor.set_range(meta.records_prefix)
        while not layout.is_long_form(layout.record_form(bytes(cursor.key()))):
            assert cursor.next()
        cursor.delete()  # the version of a long key
        meta = CollectionMeta.unpack(life.SOURCE, bytes(txn.get(life.SOURCE.encode(), db=tables.collections)))
        chunks = txn.cursor(db=tables.change_chunks)
        run = layout.change_prefix(meta.cid_prefix, meta.generation_seq)
        assert chunks.set_range(run) and bytes(chunks.key()).startswith(run)
        chunks.delete()  # a run's chunk

    damage(tmp_path / "s", harm)
    found = [str(p) for p in check.check_directory(tmp_path / "s").problems]
    with python_only():
        assert [str(p) for p in check.check_directory(tmp_path / "s").problems] == found
    assert any("has no record" in line for line in found), found
    assert any("is missing from its generation's index" in line for line in found), found


# --- seals, verified in the same pass (check_rows.py) -------------------------------------------------------


def _sealed_store(path: Path) -> dict[bytes, bytes]:
    """A sealed store of short and long keys, tombstones and overwrites over three generations; its
    records rows."""
    with Store.open(path, StoreConfig(background=False)) as store:
        coll = store.create_collection("A")
        coll.write_generation(
            b"g1", [(b"k%02d" % i, b"v%d" % i) for i in range(40)] + [(b"L" * 300, b"long")]
        )
        coll.write_generation(b"g2", [(b"k%02d" % i, None if i % 3 else b"w") for i in range(0, 40, 2)])
        coll.write_generation(b"g3", [(b"k05", b""), (b"L" * 300, b"longer")])
        with store.env.begin() as txn:
            return {bytes(k): bytes(v) for k, v in txn.cursor(db=store.tables.records)}


def _record(rows: dict[bytes, bytes], key: bytes, seq: int) -> bytes:
    return next(k for k in rows if layout.parse_record_key(k)[1:] == (layout.key_form(key), seq))  # type: ignore[index]


@pytest.mark.parametrize("compiled", [True, False], ids=["compiled", "python"])
def test_the_scan_names_each_damaged_seal_with_collection_key_and_generation(
    tmp_path: Path, compiled: bool
) -> None:
    """A value whose checksum fails, a key whose checksum fails (the row moved to another key), and a
    plain value in a sealed store: each named as RowSeals words it, by either loop; nothing else is (their
    values and digests are read plain)."""
    if compiled and layout.ACCEL is None:
        pytest.skip("the compiled accelerator was not built")
    rows = _sealed_store(tmp_path / "s")
    value_flip, plain_row, long_row = (
        _record(rows, b"k07", 1),
        _record(rows, b"k10", 2),
        _record(rows, b"k05", 3),
    )

    def harm(txn: lmdb.Transaction, tables: Tables) -> None:
        raw = bytearray(rows[value_flip])
        raw[-1] ^= 0x04  # in the value
        txn.put(value_flip, bytes(raw), db=tables.records)
        txn.put(plain_row, layout.plain(rows[plain_row]), db=tables.records)  # its seal bit lost
        raw = bytearray(rows[long_row])
        raw[2] ^= 0x80  # in the checksum itself
        txn.put(long_row, bytes(raw), db=tables.records)

    damage(tmp_path / "s", harm)
    with contextlib.ExitStack() as stack:
        if not compiled:
            stack.enter_context(python_only())
        report = check.check_directory(tmp_path / "s")
    fails = "its checksum fails (the key or the value was changed underneath)"
    records = [str(p) for p in report.problems if p.table == "records"]
    assert records == [
        f"records: 'A': record key k05 #3 (g3): {fails}",
        f"records: 'A': record key k07 #1 (g1): {fails}",
        "records: 'A': record key k10 #2 (g2): it carries no checksum, in a store whose every record is"
        " sealed",
    ], report.problems
    # k07's flipped value no longer sums to the digests from generation 1 on; k10's and k05's plain values
    # do (a seal is no part of the digest): no other problem
    others = [str(p) for p in report.problems if p.table != "records"]
    assert others and all("the digest of generation" in line for line in others), others
    assert report.notes == []


@pytest.mark.parametrize("compiled", [True, False], ids=["compiled", "python"])
def test_a_store_partly_sealed_checks_sound_and_counts_its_plain_rows(tmp_path: Path, compiled: bool) -> None:
    """A store older than checksums, half migrated (no sealed mark yet): plain and sealed rows of the same
    records hash alike, so every digest holds; the note counts the plain rows; the loops agree."""
    if compiled and layout.ACCEL is None:
        pytest.skip("the compiled accelerator was not built")
    rows = _sealed_store(tmp_path / "s")
    plain = sorted(rows)[::2]

    def harm(txn: lmdb.Transaction, tables: Tables) -> None:
        for key in plain:
            txn.put(key, layout.plain(rows[key]), db=tables.records)
        txn.delete(layout.SEALED_ROW, db=tables.collections)

    damage(tmp_path / "s", harm)
    with contextlib.ExitStack() as stack:
        if not compiled:
            stack.enter_context(python_only())
        report = check.check_directory(tmp_path / "s")
    assert report.ok, report.problems
    assert report.notes == [
        f"{len(plain)} records rows predate checksums (written by an older diffstore): reads cannot verify"
        " them; diffstore migrate (or compact) seals them"
    ]
