"""Digests per generation (engine/digests.py): kept by every commit from its changes alone, equal to the
digest of what a read at that generation sees, equal on a replica, re-derived and compared by ``check``."""

from __future__ import annotations

import random
import subprocess
import sys
import time
from pathlib import Path

import hypothesis.strategies as st
import lmdb
import pytest
from hypothesis import HealthCheck, given, settings

from diffstore import Store, StoreConfig
from diffstore.engine import check, digests, layout
from diffstore.engine.meta import non_manual_generation
from diffstore.engine.tables import load_meta
from diffstore.engine.types import ReplicaGeneration
from diffstore.errors import GenerationCollected, InvalidRequest
from tests.engine.conftest import StoreFactory
from tests.engine.util import run_background

LONG = b"L" * 300


def expected(store: Store, name: str, generation_id: bytes) -> tuple[int, bytes]:
    """The digest of what a query at ``generation_id`` sees, computed from scratch."""
    total, count = 0, 0
    for record in store.collection(name).query(generation_id=generation_id):
        key, value = record.key, record.value
        total += layout.record_digest(layout.key_form(key), layout.encode_value(key, value))
        count += 1
    return count, (total % digests.MOD).to_bytes(16, "big")


def lived_in(store: Store) -> list[bytes]:
    """A manual collection with overwrites, tombstones, long keys, an aborted generation and GC; returns its
    committed generation ids."""
    a = store.create_collection("A")
    a.create_reader("self", None, None)
    gens = [b""]
    for n in range(1, 7):
        g = b"%02d" % n
        a.start_generation(g)
        a.put_many([(b"k%d" % i, b"v%d-%d" % (n, i)) for i in range(n, n + 8)], generation_id=g)
        a.put(LONG + b"%d" % (n % 3), b"long%d" % n, generation_id=g)
        a.put(b"k%d" % (n + 2), None, generation_id=g)  # a tombstone of a key written just before
        a.put(b"k%d" % (n + 2), b"back", generation_id=g) if n % 2 else None
        a.put(b"gone%d" % (n - 1), None, generation_id=g)  # deletes a key that does not exist
        a.commit_generation(g, update_readers=[("self", g)] if n == 3 else ())
        gens.append(g)
        a.start_generation(g + b"x")
        a.put(b"aborted", b"never", generation_id=g + b"x")
        a.abort_generation(g + b"x")
    run_background(store)  # GC up to the reader at 03
    return gens


def test_every_commit_stores_the_digest_of_what_a_read_there_sees(store: Store) -> None:
    gens = lived_in(store)
    a = store.collection("A")
    assert load_meta_of(store, "A").gc_horizon == b"03"
    for g in gens[3:]:  # reads below the GC horizon answer 410; their digests stay
        got = a.digest(g)
        assert (got.records, got.digest) == expected(store, "A", g), g
    assert a.digest().generation_id == b"06" and a.digest().digest == a.digest(b"06").digest
    assert a.digest(b"").records == 0 and a.digest(b"").digest == bytes(16)
    assert a.digest(b"01").records == 9  # collected, still known: 8 keys, a long one, one tombstone
    listed, more = a.digests(limit=3)
    assert [d.generation_id for d in listed] == [b"06", b"05", b"04"] and more
    assert [d.digest for d in listed] == [a.digest(g).digest for g in (b"06", b"05", b"04")]


def load_meta_of(store: Store, name: str):  # type: ignore[no-untyped-def]
    with store.read() as txn:
        return load_meta(txn, store.tables, name)


def test_the_digest_does_not_depend_on_order_or_history(store: Store) -> None:
    one = store.create_collection("one")
    one.start_generation(b"1")
    one.put_many([(b"a", b"1"), (b"b", b"2"), (b"c", b"3")], generation_id=b"1")
    one.commit_generation(b"1")
    two = store.create_collection("two", manual=False)
    for items in (
        [(b"c", b"x"), (b"b", b"2")],
        [(b"c", b"3"), (b"a", b"1"), (b"z", b"gone")],
        [(b"z", None)],
    ):
        two.put_many(items)
        run_background(store, now=time.monotonic() + 3600)  # its automatic commit is due
    assert two.generation_id == non_manual_generation(3)
    assert one.digest().digest == two.digest().digest and two.digest().records == 3
    assert two.digest(non_manual_generation(1)) != two.digest()


def test_an_uncommitted_generation_has_no_digest(store: Store) -> None:
    a = store.create_collection("A")
    a.start_generation(b"1")
    a.put(b"k", b"v", generation_id=b"1")
    with pytest.raises(InvalidRequest, match="not committed"):
        a.digest(b"1")
    assert a.digest(b"").generation_id == b"" and a.digest(b"").records == 0


def test_a_replica_stores_the_digests_of_its_primary(
    open_store: StoreFactory, tmp_path_factory: pytest.TempPathFactory
) -> None:
    primary = open_store()
    gens = lived_in(primary)
    replica = open_store(tmp_path_factory.mktemp("replica") / "store")
    replica.become_replica("http://primary", "r1")
    source = primary.collection("A")
    # the first copy from mid-history (the primary's state at 03, as a new follower copies it), then each
    state = [(r.key, r.value) for r in source.query(generation_id=b"03")]
    assert replica.apply_replica_generation(ReplicaGeneration("A", True, None, b"03", state, floor=True))
    previous = b"03"
    for g in gens[4:]:
        page = source.generation_records(g, limit=10_000)
        assert replica.apply_replica_generation(ReplicaGeneration("A", True, previous, g, page.records))
        previous = g
    copy = replica.collection("A")
    for g in gens[3:]:
        assert copy.digest(g) == source.digest(g), g
    assert check.check(*_txn(replica)).ok


def _txn(store: Store):  # type: ignore[no-untyped-def]
    return store.env.begin(), store.tables


def _digest_key(txn: lmdb.Transaction, store: Store, generation_id: bytes) -> bytes:
    meta = load_meta(txn, store.tables, "A")
    seq = layout.read_u64(txn.get(layout.gen_id_key(meta.cid_prefix, generation_id), db=store.tables.gen_ids))
    return layout.digest_key(meta.cid_prefix, seq)


def test_check_rederives_each_digest_and_names_the_generation_that_differs(tmp_path: Path) -> None:
    path = tmp_path / "store"
    with Store.open(path, StoreConfig(background=False)) as store:
        lived_in(store)
        with store.write() as scope:
            key = _digest_key(scope.txn, store, b"05")
            raw = bytearray(scope.txn.get(key, db=store.tables.digests))
            raw[-1] ^= 1
            scope.txn.put(key, bytes(raw), db=store.tables.digests)
    problems = [str(p) for p in check.check_directory(path).problems]
    assert len(problems) == 1 and "generation 05" in problems[0] and problems[0].startswith("digests:")


def test_check_reports_a_deleted_digest_row(tmp_path: Path) -> None:
    path = tmp_path / "store"
    with Store.open(path, StoreConfig(background=False)) as store:
        lived_in(store)
        with store.write() as scope:
            scope.txn.delete(_digest_key(scope.txn, store, b"05"), db=store.tables.digests)
    problems = [str(p) for p in check.check_directory(path).problems]
    assert problems == [problems[0]] and "05" in problems[0] and "has no digest row" in problems[0]


def test_check_reports_a_deleted_first_digest_row_and_start_row(tmp_path: Path) -> None:
    path = tmp_path / "store"
    with Store.open(path, StoreConfig(background=False)) as store:
        lived_in(store)
        with store.write() as scope:
            scope.txn.delete(_digest_key(scope.txn, store, b""), db=store.tables.digests)
        problems = [str(p) for p in check.check(store.env.begin(), store.tables).problems]
        assert problems == ["digests: 'A': committed generation \"\" (#0) has no digest row"], problems
        with store.write() as scope:
            meta = load_meta(scope.txn, store.tables, "A")
            scope.txn.delete(layout.digest_start_key(meta.cid_prefix), db=store.tables.digests)
        problems = [str(p) for p in check.check(store.env.begin(), store.tables).problems]
        assert problems == ["digests: 'A': 6 digest rows without the row that says where they start"], (
            problems
        )


def test_a_store_older_than_digests_opens_says_so_and_fill_computes_them(tmp_path: Path) -> None:
    path = tmp_path / "store"
    with Store.open(path, StoreConfig(background=False)) as store:
        gens = lived_in(store)
        with store.write() as scope:  # as a store written before digests existed
            scope.txn.drop(store.tables.digests, delete=False)
        a = store.collection("A")
        assert a.digest().digest is None and a.digest().records is None
        a.start_generation(b"07")
        a.put(b"k", b"new", generation_id=b"07")
        a.commit_generation(b"07")
        assert a.digest().digest is None  # unknown stays unknown: no O(collection) work in a commit
    report = check.check_directory(path)
    assert report.ok and report.notes == [
        "'A': 8 committed generations predate digests (diffstore migrate computes them)"
    ]
    with Store.open(path, StoreConfig(background=False)) as store:
        assert digests.fill_all(store.env, store.tables) == {"A": 5}  # 03 (the GC floor) and above
    with Store.open(path, StoreConfig(background=False)) as store:
        a = store.collection("A")
        for g in [*gens[3:], b"07"]:
            assert (a.digest(g).records, a.digest(g).digest) == expected(store, "A", g)
        assert a.digest(b"02").digest is None
    assert check.check_directory(path).ok


def test_migrate_computes_the_digests_an_older_store_lacks(tmp_path: Path) -> None:
    path = tmp_path / "store"
    with Store.open(path, StoreConfig(background=False)) as store:
        lived_in(store)
        want = store.collection("A").digest(b"05")
        with store.write() as scope:
            scope.txn.drop(store.tables.digests, delete=False)
    done = subprocess.run(
        [sys.executable, "-m", "diffstore", "migrate", "--data", str(path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0 and "4 digests computed (A 4)" in done.stdout, done.stdout + done.stderr
    with Store.open(path, StoreConfig(background=False)) as store:
        assert store.collection("A").digest(b"05") == want


KEYS = [b"", b"a", b"a\x00", b"b", LONG + b"1", LONG + b"2", LONG]
VALUES = [b"", b"1", b"2", None]
OPS = st.lists(
    st.one_of(
        st.tuples(
            st.just("commit"), st.lists(st.tuples(st.sampled_from(KEYS), st.sampled_from(VALUES)), max_size=6)
        ),
        st.tuples(
            st.just("abort"), st.lists(st.tuples(st.sampled_from(KEYS), st.sampled_from(VALUES)), max_size=3)
        ),
        st.tuples(
            st.just("auto"), st.lists(st.tuples(st.sampled_from(KEYS), st.sampled_from(VALUES)), max_size=6)
        ),
        st.tuples(st.just("gc"), st.just([])),
        st.tuples(st.just("revert"), st.just([])),
    ),
    max_size=12,
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=OPS)
def test_digests_follow_any_history(
    tmp_path_factory: pytest.TempPathFactory, ops: list[tuple[str, list]]
) -> None:
    """Random histories (overwrites, tombstones, long keys, aborts, automatic commits at the threshold, GC,
    reverts): every generation's digest is that of what a read there sees, and ``check`` agrees."""
    path = tmp_path_factory.mktemp("digests") / "store"
    with Store.open(path, StoreConfig(background=False, max_generation_records=4)) as store:
        m = store.create_collection("m")
        n = store.create_collection("n", manual=False)
        m.create_reader("r", None, None)
        committed = [b""]
        for step, (op, items) in enumerate(ops):
            g = b"%03d" % step
            if op == "commit":
                m.write_generation(g, items)
                committed.append(g)
            elif op == "abort":
                m.start_generation(g)
                m.put_many(items, generation_id=g)
                m.abort_generation(g)
            elif op == "auto":
                n.put_many(items)  # commits itself at 4 writes; the rest when due
                run_background(store, now=time.monotonic() + 3600)
            elif op == "gc":
                m.update_reader("r", committed[-1])
                run_background(store)
            elif len(committed) > 1:
                m.start_generation(g)
                try:
                    m.revert(committed[-2], generation_id=g)
                except GenerationCollected:
                    m.abort_generation(g)
                    continue
                m.commit_generation(g)
                committed.append(g)
        floor = load_meta_of(store, "m").gc_horizon or b""
        for g in committed:
            if g >= floor:
                got = m.digest(g)
                assert (got.records, got.digest) == expected(store, "m", g), g
        for g in n.generations(limit=1000)[0]:
            got = n.digest(g)
            assert (got.records, got.digest) == expected(store, "n", g), g
        with store.env.begin() as txn:
            assert check.check(txn, store.tables).ok


def test_check_catches_a_flipped_bit_in_any_record_key_or_value(store: Store) -> None:
    """Each row of ``records`` in a lived-in store (GC done, tombstones, long keys), one bit flipped at a
    random position of its value and then of its key, each in a write transaction that is then thrown away:
    ``check`` reports every one (a value through the re-derived digests, a key through the index too)."""
    lived_in(store)
    rng = random.Random(49)
    with store.env.begin() as txn:
        rows = [(bytes(k), bytes(v)) for k, v in txn.cursor(db=store.tables.records)]
    assert len(rows) > 40
    missed = []
    for raw_key, raw_value in rows:
        for part in ("value", "key"):
            flipped = bytearray(raw_value if part == "value" else raw_key)
            if not flipped:
                continue  # a short key's tombstone has no value bytes to flip
            bit = rng.randrange(len(flipped) * 8)
            flipped[bit // 8] ^= 1 << (bit % 8)
            txn = store.env.begin(write=True)
            try:
                if part == "value":
                    txn.put(raw_key, bytes(flipped), db=store.tables.records)
                else:
                    txn.delete(raw_key, db=store.tables.records)
                    txn.put(bytes(flipped), raw_value, db=store.tables.records)
                if check.check(txn, store.tables).ok:
                    missed.append((part, raw_key, bit))
            finally:
                txn.abort()
    assert missed == []
