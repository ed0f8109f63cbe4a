"""``check`` (engine/check.py): a sound store passes, live or not; each kind of damage, written by hand
through the layout module into a real store, is reported as its own problem."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import lmdb
import msgpack
import pytest

from diffstore import Store, StoreConfig
from diffstore.engine import check, cursor_spill, layout
from diffstore.engine.meta import non_manual_generation
from diffstore.engine.tables import Tables, load_meta, save_meta
from diffstore.engine.types import Reader, ReplicaGeneration
from diffstore.errors import StorageError

Damage = Callable[[lmdb.Transaction, Tables], None]


def build(path: Path) -> None:
    """A store using every table: records (short and long keys, tombstones), readers of both kinds of
    target, lineage, commit rows, leases, producers, a phantom, an open generation, GC, a deleted
    collection, long cursors (spilled page tokens)."""
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
        for n in (1, 2):  # tokens too long for a URL, as a page after a big key makes them
            cursor_spill.shorten(store, f"t{n}" * cursor_spill.INLINE_TOKEN_MAX)


def build_replica(path: Path, promote: bool = False) -> None:
    """A replica's store: a manual and an automatic collection applied from a primary (and promoted)."""
    g = non_manual_generation
    with Store.open(path, StoreConfig(background=False)) as store:
        store.become_replica("http://primary:8080", "r1")
        steps = [
            ReplicaGeneration("M", True, None, b"", []),
            ReplicaGeneration("M", True, b"", b"1", [(b"k", b"v"), (b"j", None)], (Reader("r", "M", None),)),
            ReplicaGeneration("M", True, b"1", b"2", [(b"k", b"w")], lag_generations=1, unapplied_since_ms=5),
            ReplicaGeneration("X", False, None, g(0), []),
            ReplicaGeneration("X", False, g(0), g(1), [(b"a", b"1")]),
        ]
        for step in steps:
            assert store.apply_replica_generation(step)
        if promote:
            store.promote_replica()


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
    txn.put(
        layout.record_key(load_meta(txn, tables, "A").records_prefix, layout.key_form(b"stray"), 77),
        layout.encode_value(b"stray", b"v"),
        db=tables.records,
    )


def _index_row_without_record(txn: lmdb.Transaction, tables: Tables) -> None:
    prefix, seq = _meta(txn, tables, "A")
    txn.put(layout.change_key(prefix, seq, layout.key_form(b"nothing")), b"", db=tables.changes)


def _current_chunk(txn: lmdb.Transaction, tables: Tables) -> tuple[bytes, list[bytes]]:
    """The run of A's current generation and the forms of its chunk of k0..k9 (written by one put_many)."""
    prefix, seq = _meta(txn, tables, "A")
    run = layout.change_prefix(prefix, seq)
    raw = txn.get(run + layout.key_form(b"k0"), db=tables.change_chunks)
    assert raw is not None
    return run, layout.unpack_forms(raw)


def _chunk_entry_without_record(txn: lmdb.Transaction, tables: Tables) -> None:
    run, _ = _current_chunk(txn, tables)
    form = layout.key_form(b"zzz")
    txn.put(run + form, layout.pack_forms([form]), db=tables.change_chunks)


def _record_missing_from_its_chunk(txn: lmdb.Transaction, tables: Tables) -> None:
    run, forms = _current_chunk(txn, tables)
    kept = [form for form in forms if form != layout.key_form(b"k5")]
    txn.put(run + kept[0], layout.pack_forms(kept), db=tables.change_chunks)


def _overlapping_chunks(txn: lmdb.Transaction, tables: Tables) -> None:
    run, _ = _current_chunk(txn, tables)
    form = layout.key_form(b"k7")
    txn.put(run + form, layout.pack_forms([form]), db=tables.change_chunks)


def _key_in_both_forms(txn: lmdb.Transaction, tables: Tables) -> None:
    run, _ = _current_chunk(txn, tables)
    txn.put(run + layout.key_form(b"k6"), b"", db=tables.changes)


def _chunk_that_does_not_unpack(txn: lmdb.Transaction, tables: Tables) -> None:
    run, _ = _current_chunk(txn, tables)
    txn.put(run + layout.key_form(b"zzzz"), b"\x00\x09zzzz", db=tables.change_chunks)


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


def _open_keys_wrong(txn: lmdb.Transaction, tables: Tables) -> None:
    save_meta(txn, tables, load_meta(txn, tables, "B").with_(next_keys=5))


def _row_of_no_collection(txn: lmdb.Transaction, tables: Tables) -> None:
    txn.put(layout.gen_key(layout.cid_bytes(9999), 0), b"", db=tables.gens)


def _automatic_commit_not_due(txn: lmdb.Transaction, tables: Tables) -> None:
    txn.delete(layout.auto_commit_due_key("auto"), db=tables.due)


def _commit_row_missing(txn: lmdb.Transaction, tables: Tables) -> None:
    prefix, seq = _meta(txn, tables, "B")
    txn.delete(layout.commit_key(prefix, seq - 1), db=tables.commits)


def _commit_row_of_open_generation(txn: lmdb.Transaction, tables: Tables) -> None:
    meta = load_meta(txn, tables, "B")
    assert meta.next_seq is not None
    txn.put(
        layout.commit_key(meta.cid_prefix, meta.next_seq), layout.pack_commit(1, 1, None), db=tables.commits
    )


def _commit_row_of_aborted_generation(txn: lmdb.Transaction, tables: Tables) -> None:
    prefix, _ = _meta(txn, tables, "B")
    txn.put(layout.commit_key(prefix, 55), layout.pack_commit(1, 0, None), db=tables.commits)


def _commit_counts_wrong(txn: lmdb.Transaction, tables: Tables) -> None:
    prefix, seq = _meta(txn, tables, "B")
    txn.put(layout.commit_key(prefix, seq), layout.pack_commit(1, 5, {"by": "me"}), db=tables.commits)


def _cursor_without_age_row(txn: lmdb.Transaction, tables: Tables) -> None:
    txn.delete(layout.cursor_age_key(0), db=tables.cursors)


def _cursor_totals_wrong(txn: lmdb.Transaction, tables: Tables) -> None:
    txn.put(layout.CURSOR_TOTALS, layout.pack_cursor_totals(7, 1, 2), db=tables.cursors)


def _cursor_under_another_digest(txn: lmdb.Transaction, tables: Tables) -> None:
    digest = cursor_spill.digest("t1" * cursor_spill.INLINE_TOKEN_MAX)
    txn.put(layout.cursor_entry_key(digest), layout.pack_cursor_entry(0, b"t9" * 1024), db=tables.cursors)


def _record_key_of_layout_1(txn: lmdb.Transaction, tables: Tables) -> None:
    meta = load_meta(txn, tables, "A")  # its last byte is no seq's length
    key = layout.record_key_of_layout_1(meta.cid, layout.key_form(b"old"), meta.generation_seq)
    txn.put(key, b"\x01v", db=tables.records)


def _layout_row_of_another_version(txn: lmdb.Transaction, tables: Tables) -> None:
    txn.put(layout.LAYOUT_ROW, layout.u64(2) + b"\x00", db=tables.collections)


DAMAGE: list[tuple[Damage, str]] = [
    (_record_of_unknown_generation, "records: 'A': a record of unregistered generation #77"),
    (_record_key_of_layout_1, "is not a records key (rcid | K | rseq)"),
    (_index_row_without_record, "has no record"),
    (_chunk_entry_without_record, "change_chunks: 'A': index entry key zzz #3 has no record"),
    (_record_missing_from_its_chunk, "changes: 'A': record key k5 #3 is missing from its generation's index"),
    (_overlapping_chunks, "change_chunks: 'A': chunk key k7 #3 overlaps the one before"),
    (_key_in_both_forms, "change_chunks: 'A': key k6 #3 is in a chunk and has a changes row too"),
    (_chunk_that_does_not_unpack, "change_chunks: 'A': chunk key zzzz #3 does not hold ascending forms"),
    (_unregistered_current_generation, "its current generation 3 is not registered"),
    (_reader_without_reverse_row, "reader 'from_a': its reverse index row is missing"),
    (_reader_of_nothing, "targets 'ghost', neither a collection"),
    (_gc_position_of_unknown_generation, "the GC position is at generation #999"),
    (_lineage_of_open_generation, "moves of reader 'from_a' at #"),
    (_broken_lease, "lease 'owner' is inconsistent"),
    (_short_producer_row, "producer 'p' holds 7 bytes"),
    (_phantom_without_expiry, "without expiry"),
    (_open_count_wrong, "the open generation counts 0 writes but holds 1 keys"),
    (_open_keys_wrong, "'B': the open generation counts 5 keys but holds 1"),
    (_row_of_no_collection, "collection #9999, which is neither live nor deleted"),
    (_commit_row_missing, "commits: 'B': committed generation 2 (#2) has no commit row"),
    (_commit_row_of_open_generation, "commits: 'B': commit row 000000020000000000000004 names no committed"),
    (
        _commit_row_of_aborted_generation,
        "commits: 'B': commit row 000000020000000000000037 names no committed",
    ),
    (
        _commit_counts_wrong,
        "commits: 'B': the commit of generation 3 (#3) counts 5 changed keys, its index holds 1",
    ),
    (_cursor_without_age_row, "cursors: the long cursor #0 has no age row: it would never expire"),
    (_cursor_totals_wrong, "cursors: the totals count 7 long cursors of 1 bytes, the table holds 2 of"),
    (_cursor_under_another_digest, "cursors: the long cursor #0 is not stored under its own digest"),
    # last: opening the store again (to damage it) writes the due row back
    (_automatic_commit_not_due, "'auto': its open generation has writes but no automatic commit is due"),
]


@pytest.mark.parametrize(("harm", "expected"), DAMAGE, ids=[harm.__name__.strip("_") for harm, _ in DAMAGE])
def test_each_kind_of_damage_is_reported(tmp_path: Path, harm: Damage, expected: str) -> None:
    build(tmp_path / "s")
    damage(tmp_path / "s", harm)
    found = problems(tmp_path / "s")
    assert any(expected in line for line in found), found


def test_a_damaged_layout_row_is_reported_and_the_store_then_refuses_to_open(tmp_path: Path) -> None:
    build(tmp_path / "s")
    damage(tmp_path / "s", _layout_row_of_another_version)
    assert "collections: the layout version row is 000000000000000200, not 2" in problems(tmp_path / "s")
    with pytest.raises(StorageError, match="layout version row is damaged"):
        Store.open(tmp_path / "s", StoreConfig(background=False))


def test_several_kinds_of_damage_at_once_are_each_reported(tmp_path: Path) -> None:
    build(tmp_path / "s")
    for harm, _ in DAMAGE:
        damage(tmp_path / "s", harm)
    found = problems(tmp_path / "s")
    for _, expected in DAMAGE:
        assert any(expected in line for line in found), (expected, found)


@pytest.mark.parametrize("promote", [False, True], ids=["following", "promoted"])
def test_a_sound_replica_passes(tmp_path: Path, promote: bool) -> None:
    build_replica(tmp_path / "r", promote)
    report = check.check_directory(tmp_path / "r")
    assert report.ok, report.problems
    # promoted: the lag rows went, the term came
    assert report.rows["replica"] == 5 and report.rows["commits"] == 4


def _lag_of_no_collection(txn: lmdb.Transaction, tables: Tables) -> None:
    txn.put(layout.replica_lag_key("ghost"), msgpack.packb([0, None]), db=tables.replica)


def _lag_missing(txn: lmdb.Transaction, tables: Tables) -> None:
    txn.delete(layout.replica_lag_key("X"), db=tables.replica)


def _lag_malformed(txn: lmdb.Transaction, tables: Tables) -> None:
    txn.put(layout.replica_lag_key("M"), msgpack.packb(["far", None]), db=tables.replica)


def _state_malformed(txn: lmdb.Transaction, tables: Tables) -> None:
    txn.put(layout.replica_lag_key("M"), msgpack.packb([0, None, "asleep", None, 1]), db=tables.replica)


def _position_not_applied(txn: lmdb.Transaction, tables: Tables) -> None:
    prefix, seq = _meta(txn, tables, "M")
    txn.delete(layout.commit_key(prefix, seq), db=tables.commits)


def _applied_count_too_low(txn: lmdb.Transaction, tables: Tables) -> None:
    txn.put(layout.REPLICA_APPLIED, layout.u64(1), db=tables.replica)


def _no_primary(txn: lmdb.Transaction, tables: Tables) -> None:
    txn.delete(layout.REPLICA_PRIMARY, db=tables.replica)


def _primary_not_a_url(txn: lmdb.Transaction, tables: Tables) -> None:
    txn.put(layout.REPLICA_PRIMARY, b"primary", db=tables.replica)


def _lag_after_promotion(txn: lmdb.Transaction, tables: Tables) -> None:
    txn.put(layout.REPLICA_PROMOTED, layout.u64(1), db=tables.replica)


REPLICA_DAMAGE: list[tuple[Damage, str]] = [
    (_lag_of_no_collection, "replica: the lag of 'ghost', which is no collection of this replica"),
    (_lag_missing, "replica: 'X': no lag row"),
    (_lag_malformed, "replica: the lag of 'M' is not [generations, ms or None] (and its state)"),
    (_state_malformed, "replica: the lag of 'M' is not [generations, ms or None] (and its state)"),
    (_position_not_applied, "replica: 'M': the replica's position 2 (#2) is no applied generation"),
    (_applied_count_too_low, "replica: the applied count 1 is below the 4 generations applied"),
    (_no_primary, "replica: replica rows are stored, but no primary that they follow"),
    (_primary_not_a_url, "replica: the primary b'primary' is not a URL"),
    (_lag_after_promotion, "replica: a promoted store keeps the lag of 'M'"),
]


@pytest.mark.parametrize(
    ("harm", "expected"), REPLICA_DAMAGE, ids=[harm.__name__.strip("_") for harm, _ in REPLICA_DAMAGE]
)
def test_each_kind_of_replica_damage_is_reported(tmp_path: Path, harm: Damage, expected: str) -> None:
    build_replica(tmp_path / "r")
    damage(tmp_path / "r", harm)
    found = problems(tmp_path / "r")
    assert any(expected in line for line in found), found
