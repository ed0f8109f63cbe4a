"""The open generation's pending digest delta (digests.record_put): a bulk load's rows are hashed while the
put has them, so its commit reads none of them back; any write of another kind, an abort or a commit ends
the delta, and every digest stays that of what a read there sees."""

from __future__ import annotations

import time
from pathlib import Path
from unittest import mock

import pytest

from diffstore import Store, StoreConfig
from diffstore.engine import backup, check, digests, layout
from diffstore.engine.meta import non_manual_generation
from tests.engine.test_digests import expected, load_meta_of
from tests.engine.util import run_background

pytestmark = pytest.mark.skipif(layout.ACCEL is None, reason="the compiled accelerator was not built")


def batch(low: int, high: int, salt: bytes = b"v") -> list[tuple[bytes, bytes | None]]:
    return [(b"k%05d" % i, None if i % 7 == 3 else salt + b"%d" % i) for i in range(low, high)]


def pending_row(store: Store, name: str) -> tuple[int, int, int, int] | None:
    meta = load_meta_of(store, name)
    with store.read() as txn:
        raw = txn.get(layout.digest_pending_key(meta.cid_prefix), db=store.tables.digests)
    return None if raw is None else layout.unpack_pending(bytes(raw))


def assert_digest_is_what_a_read_sees(store: Store, name: str, generation_id: bytes) -> None:
    got = store.collection(name).digest(generation_id)
    assert (got.records, got.digest) == expected(store, name, generation_id)


def test_a_bulk_load_in_appended_batches_commits_without_reading_its_rows_back(store: Store) -> None:
    a = store.create_collection("A")
    a.start_generation(b"1")
    for low in range(0, 300, 100):
        a.put_many(batch(low, low + 100), generation_id=b"1")
    meta = load_meta_of(store, "A")
    assert pending_row(store, "A") == (meta.next_seq, 300, 300 - 43, mock.ANY)  # 43 tombstones
    with (
        mock.patch.object(digests, "_first_load", side_effect=AssertionError("read back")),
        mock.patch.object(digests.changes, "forms", side_effect=AssertionError("read back")),
    ):
        a.commit_generation(b"1")
    assert pending_row(store, "A") is None
    assert_digest_is_what_a_read_sees(store, "A", b"1")
    assert a.digest(b"1").records == 257


@pytest.mark.parametrize(
    "second",
    [
        batch(150, 160, b"other"),  # overwrites keys the generation wrote: the general way
        batch(50, 60),  # new keys below the table's last: not appended
        [(b"k00010", b"again"), (b"zzz", b"new")],  # one overwrite and one new key
        [(b"k00001", None)],  # a tombstone over a live record of this generation
    ],
)
def test_a_write_that_does_not_append_ends_the_delta(
    store: Store, second: list[tuple[bytes, bytes | None]]
) -> None:
    a = store.create_collection("A")
    a.start_generation(b"1")
    a.put_many(batch(0, 100), generation_id=b"1")
    a.put_many(batch(100, 200), generation_id=b"1")
    assert pending_row(store, "A") is not None
    a.put_many(second, generation_id=b"1")
    assert pending_row(store, "A") is None
    a.put_many(batch(500, 510), generation_id=b"1")  # appends again: the delta stays ended
    assert pending_row(store, "A") is None
    a.commit_generation(b"1")
    assert_digest_is_what_a_read_sees(store, "A", b"1")


def test_an_abort_drops_the_delta_and_the_next_generation_starts_its_own(store: Store) -> None:
    a = store.create_collection("A")
    a.start_generation(b"1")
    a.put_many(batch(0, 100, b"aborted"), generation_id=b"1")
    assert pending_row(store, "A") is not None
    a.abort_generation(b"1")
    assert pending_row(store, "A") is None
    a.start_generation(b"2")
    a.put_many(batch(200, 300), generation_id=b"2")
    assert pending_row(store, "A")[1:3] == (100, 100 - 14)  # type: ignore[index]
    a.commit_generation(b"2")
    assert_digest_is_what_a_read_sees(store, "A", b"2")


def test_over_live_records_the_commit_subtracts_what_the_appended_rows_replaced(store: Store) -> None:
    a = store.create_collection("A")
    a.write_generation(b"1", batch(0, 100))
    a.start_generation(b"2")
    a.put_many(batch(50, 150, b"w"), generation_id=b"2")  # the same keys' newer versions, and new keys
    a.commit_generation(b"2")
    assert pending_row(store, "A") is None
    assert_digest_is_what_a_read_sees(store, "A", b"1")
    assert_digest_is_what_a_read_sees(store, "A", b"2")


def test_automatic_commits_at_the_threshold_take_the_delta(open_store) -> None:  # type: ignore[no-untyped-def]
    store = open_store(max_generation_records=250)
    auto = store.create_collection("auto", manual=False)
    for low in range(0, 1000, 100):
        auto.put_many(batch(low, low + 100))
    assert auto.generation_id == non_manual_generation(3)  # 300 writes each
    for n in range(1, 4):
        assert_digest_is_what_a_read_sees(store, "auto", non_manual_generation(n))


def test_check_reports_a_pending_row_of_no_open_generation_and_one_that_does_not_unpack(
    tmp_path: Path,
) -> None:
    path = tmp_path / "store"
    with Store.open(path, StoreConfig(background=False)) as store:
        a = store.create_collection("A")
        a.start_generation(b"1")
        a.put_many(batch(0, 10), generation_id=b"1")
        meta = load_meta_of(store, "A")
        key = layout.digest_pending_key(meta.cid_prefix)
    assert check.check_directory(path).ok
    with Store.open(path, StoreConfig(background=False)) as store, store.write() as scope:
        scope.txn.put(key, layout.pack_pending(meta.next_seq + 5, 10, 8, 1), db=store.tables.digests)
    problems = [str(p) for p in check.check_directory(path).problems]
    assert len(problems) == 1 and "pending digest row names" in problems[0], problems
    with Store.open(path, StoreConfig(background=False)) as store, store.write() as scope:
        scope.txn.put(key, b"short", db=store.tables.digests)
    problems = [str(p) for p in check.check_directory(path).problems]
    assert len(problems) == 1 and "does not unpack" in problems[0], problems


def test_a_backup_empties_open_generations_with_their_deltas(tmp_path: Path) -> None:
    source = tmp_path / "source"
    with Store.open(source, StoreConfig(background=False)) as store:
        auto = store.create_collection("auto", manual=False)
        auto.put_many(batch(0, 100, b"left"))
        m = store.create_collection("m")
        m.start_generation(b"1")
        m.put_many(batch(0, 100), generation_id=b"1")
        assert pending_row(store, "auto") is not None and pending_row(store, "m") is not None
    backup.backup_directory(source, tmp_path / "out")
    assert check.check_directory(tmp_path / "out").ok
    with Store.open(tmp_path / "out", StoreConfig(background=False)) as copy:
        assert pending_row(copy, "auto") is None and pending_row(copy, "m") is None
        auto = copy.collection("auto")
        auto.put_many(batch(200, 250))
        run_background(copy, now=time.monotonic() + 3600)  # its automatic commit is due
        assert auto.generation_id == non_manual_generation(1)
        assert_digest_is_what_a_read_sees(copy, "auto", auto.generation_id)
