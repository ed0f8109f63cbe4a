"""``check`` (engine/check.py): a sound store passes, live or not; each kind of damage, written by hand
through the layout module into a real store, is reported as its own problem."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import lmdb
import msgpack
import pytest

from diffstore import Store, StoreConfig
from diffstore.engine import check, layout
from diffstore.engine.tables import Tables, load_meta, save_meta

Damage = Callable[[lmdb.Transaction, Tables], None]


def build(path: Path) -> None:
    """A store using every table: records (short and long keys, tombstones), readers of both kinds of
    target, lineage, leases, producers, a phantom, an open generation, GC, a deleted collection."""
    with Store.open(path, StoreConfig(background=False)) as store:
        a = store.create_collection("A")
        b = store.create_collection("B")
        a.create_reader("self", None, None)
        b.create_reader("from_a", "A", None)
        b.create_reader("stream", "hstream://s/0", None)
        for n in (1, 2, 3):
            g = b"%d" % n
            a.start_generation(g)
            a.put_many([(b"k%d" % i, b"v%d-%d" % (n, i)) for i in range(10)], generation_id=g)
            a.put(b"L" * 300 + b"%d" % n, b"long", generation_id=g)
            a.put(b"k0", None, generation_id=g)
            a.commit_generation(g, update_readers=[("self", g)])
            b.start_generation(g)
            b.put(b"x", g, generation_id=g, producer_id="p", seq_no=n)
            b.commit_generation(g, update_readers=[("from_a", g), ("stream", b"\0" * 12)])
        b.start_generation(b"4")
        b.put(b"open", b"yes", generation_id=b"4")
        b.acquire_lease("owner", "me", 10_000)
        b.start_phantom()
        gone = store.create_collection("gone")
        gone.start_generation(b"1")
        gone.put(b"k", b"v", generation_id=b"1")
        gone.commit_generation(b"1")
        for _ in range(5):
            store.run_background_once()  # GC of A up to its reader
        store.delete_collection("gone")  # its rows wait for the purge
        auto = store.create_collection("auto", manual=False)
        auto.put(b"k", b"v")  # its automatic commit is due, not done: nothing runs it here


def damage(path: Path, harm: Damage) -> None:
    with Store.open(path, StoreConfig(background=False)) as store, store.write() as scope:
        harm(scope.txn, store.tables)


def problems(path: Path) -> list[str]:
    return [str(p) for p in check.check_directory(path).problems]


def test_a_sound_store_passes(tmp_path: Path) -> None:
    build(tmp_path / "s")
    report = check.check_directory(tmp_path / "s")
    assert report.ok, report.problems
    assert report.rows["records"] > 10 and report.rows["lineage"] > 0 and report.rows["dropped"] == 1


def _meta(txn: lmdb.Transaction, tables: Tables, name: str) -> tuple[bytes, int]:
    meta = load_meta(txn, tables, name)
    return meta.cid_prefix, meta.generation_seq


def _record_of_unknown_generation(txn: lmdb.Transaction, tables: Tables) -> None:
    prefix, _ = _meta(txn, tables, "A")
    txn.put(
        layout.record_key(prefix, layout.key_form(b"stray"), 77),
        layout.encode_value(b"stray", b"v"),
        db=tables.records,
    )


def _index_row_without_record(txn: lmdb.Transaction, tables: Tables) -> None:
    prefix, seq = _meta(txn, tables, "A")
    txn.put(layout.change_key(prefix, seq, layout.key_form(b"nothing")), b"", db=tables.changes)


def _unregistered_current_generation(txn: lmdb.Transaction, tables: Tables) -> None:
    prefix, seq = _meta(txn, tables, "A")
    txn.delete(layout.gen_key(prefix, seq), db=tables.gens)


def _reader_without_reverse_row(txn: lmdb.Transaction, tables: Tables) -> None:
    meta = load_meta(txn, tables, "B")
    txn.delete(layout.target_key("A", meta.cid_prefix, "from_a"), db=tables.targets)


def _reader_of_nothing(txn: lmdb.Transaction, tables: Tables) -> None:
    meta = load_meta(txn, tables, "B")
    row = msgpack.packb(["ghost", None], use_bin_type=True)
    txn.put(layout.reader_key(meta.cid_prefix, "ghostly"), row, db=tables.readers)
    txn.put(
        layout.target_key("ghost", meta.cid_prefix, "ghostly"),
        msgpack.packb(["ghostly", None]),
        db=tables.targets,
    )


def _gc_position_of_unknown_generation(txn: lmdb.Transaction, tables: Tables) -> None:
    prefix, _ = _meta(txn, tables, "A")
    txn.put(layout.gc_position_key(prefix), layout.gc_position(999, b""), db=tables.due)


def _lineage_of_open_generation(txn: lmdb.Transaction, tables: Tables) -> None:
    meta = load_meta(txn, tables, "B")
    assert meta.next_seq is not None
    row = msgpack.packb(["A", None, None, b"1"], use_bin_type=True)
    txn.put(layout.lineage_key(meta.cid_prefix, meta.next_seq, "from_a"), row, db=tables.lineage)


def _broken_lease(txn: lmdb.Transaction, tables: Tables) -> None:
    meta = load_meta(txn, tables, "B")
    txn.put(
        layout.lease_key(meta.cid_prefix, "owner"), layout.pack_lease(None, 3, 12345, 10), db=tables.leases
    )


def _short_producer_row(txn: lmdb.Transaction, tables: Tables) -> None:
    meta = load_meta(txn, tables, "B")
    txn.put(layout.producer_key(meta.cid_prefix, "p"), b"\0" * 7, db=tables.producers)


def _phantom_without_expiry(txn: lmdb.Transaction, tables: Tables) -> None:
    prefix, _ = _meta(txn, tables, "B")
    txn.put(
        layout.phantom_prefix(prefix, 424242) + layout.key_form(b"k"), msgpack.packb([]), db=tables.phantoms
    )


def _open_count_wrong(txn: lmdb.Transaction, tables: Tables) -> None:
    save_meta(txn, tables, load_meta(txn, tables, "B").with_(next_count=0))


def _row_of_no_collection(txn: lmdb.Transaction, tables: Tables) -> None:
    txn.put(layout.gen_key(layout.cid_bytes(9999), 0), b"", db=tables.gens)


def _automatic_commit_not_due(txn: lmdb.Transaction, tables: Tables) -> None:
    txn.delete(layout.auto_commit_due_key("auto"), db=tables.due)


DAMAGE: list[tuple[Damage, str]] = [
    (_record_of_unknown_generation, "records: 'A': a record of unregistered generation #77"),
    (_index_row_without_record, "has no record"),
    (_unregistered_current_generation, "its current generation 3 is not registered"),
    (_reader_without_reverse_row, "reader 'from_a': its reverse index row is missing"),
    (_reader_of_nothing, "targets 'ghost', neither a collection"),
    (_gc_position_of_unknown_generation, "the GC position is at generation #999"),
    (_lineage_of_open_generation, "moves of reader 'from_a' at #"),
    (_broken_lease, "lease 'owner' is inconsistent"),
    (_short_producer_row, "producer 'p' holds 7 bytes"),
    (_phantom_without_expiry, "without expiry"),
    (_open_count_wrong, "the open generation counts 0 writes but holds 1 keys"),
    (_row_of_no_collection, "collection #9999, which is neither live nor deleted"),
    (_automatic_commit_not_due, "'auto': its open generation has writes but no automatic commit is due"),
]


@pytest.mark.parametrize(("harm", "expected"), DAMAGE, ids=[harm.__name__.strip("_") for harm, _ in DAMAGE])
def test_each_kind_of_damage_is_reported(tmp_path: Path, harm: Damage, expected: str) -> None:
    build(tmp_path / "s")
    damage(tmp_path / "s", harm)
    found = problems(tmp_path / "s")
    assert any(expected in line for line in found), found


def test_several_kinds_of_damage_at_once_are_each_reported(tmp_path: Path) -> None:
    build(tmp_path / "s")
    for harm, _ in DAMAGE:
        damage(tmp_path / "s", harm)
    found = problems(tmp_path / "s")
    for _, expected in DAMAGE:
        assert any(expected in line for line in found), (expected, found)
