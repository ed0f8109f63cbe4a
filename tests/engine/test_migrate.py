"""A store written in storage layout 1 (records keys cid(u32) | K | seq(u64)) is upgraded to the current
layout when it is opened: every row the same as if the store had been written in the new layout, check
clean, reads and diffs unchanged; a kill -9 in the middle of the upgrade leaves layout 1 whole, and the
next open upgrades it. Layout-1 stores are made by writing a store and turning its records back."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from diffstore import Store, StoreConfig
from diffstore.engine import check, crashpoints, layout, migrate
from diffstore.errors import StorageError
from tests.engine.util import raw_state, run_background

LONG = b"L" * 250  # a long key: its form holds a hash


def _open(path: Path) -> Store:
    return Store.open(path, StoreConfig(background=False))


def _fill(path: Path) -> None:
    """Two collections, several generations: updates, tombstones, long keys, a reader, an open generation."""
    with _open(path) as store:
        manual = store.create_collection("manual", manual=True)
        for g in range(1, 6):
            gen = b"g%02d" % g
            items: list[tuple[bytes, bytes | None]] = [
                (b"k%03d" % i, b"v%d.%d" % (i, g)) for i in range(g, 300, g)
            ]
            items += [(LONG + b"%d" % g, b"long%d" % g), (b"k%03d" % (g * 7), None)]
            manual.write_generation(gen, items, metadata={"g": str(g)})
        manual.create_reader("me", generation_id=b"g01")
        manual.start_generation(b"g06")
        manual.put_many([(b"open", b"1")], generation_id=b"g06")
        auto = store.create_collection("auto", manual=False)
        auto.put_many([(b"a%d" % i, b"x" * i) for i in range(50)])
        run_background(store, now=time.time() + 3600)  # its automatic commit, due
        auto.put_many([(b"a1", None), (b"b", b"")])
        run_background(store, now=time.time() + 7200)


def _reads(path: Path) -> dict[str, object]:
    """What users see: every generation's records, every diff between neighbours, the open generation."""
    seen: dict[str, object] = {}
    with _open(path) as store:
        manual = store.collection("manual")
        gens = [b""] + [b"g%02d" % g for g in range(1, 6)]
        for gen in gens[1:]:
            seen[f"manual@{gen!r}"] = [(r.key, r.value) for r in manual.query(generation_id=gen)]
        for older, newer in zip(gens, gens[1:], strict=False):
            seen[f"manual {older!r}..{newer!r}"] = list(
                manual.diff(from_generation_id=older, to_generation_id=newer)
            )
        found = manual.get_many([b"k002", LONG + b"3", b"nope"]).records
        seen["manual get"] = [r and r.value for r in found]
        seen["manual open"] = manual.next_generation_id
        auto = store.collection("auto")
        seen["auto"] = [(r.key, r.value) for r in auto.query()]
    return seen


def _to_layout_1(path: Path) -> int:
    """Rewrites the store's records keys in layout 1 and drops its layout row, as diffstore before the
    upgrade wrote them; how many rows."""
    with _open(path) as store:
        tables = store.tables
        with store.env.begin(write=True) as txn:
            rows = []
            for key, value in txn.cursor(db=tables.records):
                parsed = layout.parse_record_key(bytes(key))
                assert parsed is not None
                cid, form, seq = parsed
                rows.append((layout.record_key_of_layout_1(cid, form, seq), bytes(value)))
            txn.drop(tables.records, delete=False)
            txn.cursor(db=tables.records).putmulti(sorted(rows), append=True)
            assert txn.delete(layout.LAYOUT_ROW, db=tables.collections)
    return len(rows)


def _raw(path: Path) -> dict[str, list[tuple[bytes, bytes]]]:
    with _open(path) as store:
        return raw_state(store)


def _layout_version(path: Path) -> int:
    with _open(path) as store, store.env.begin() as txn:
        return migrate.layout_version(txn, store.tables)


def test_a_new_store_is_written_in_the_current_layout(tmp_path: Path) -> None:
    _fill(tmp_path / "s")
    assert _layout_version(tmp_path / "s") == layout.LAYOUT_VERSION == 2
    report = check.check_directory(tmp_path / "s")
    assert report.problems == []


def test_a_layout_1_store_is_upgraded_when_opened_row_for_row(tmp_path: Path) -> None:
    path = tmp_path / "s"
    _fill(path)
    written, seen = _raw(path), _reads(path)
    assert _to_layout_1(path) > 300
    # check does not upgrade: it says what to do, in one problem
    problems = check.check_directory(path).problems
    assert len(problems) == 1 and "storage layout 1, not 2: opening it" in problems[0].what
    with _open(path) as store:
        # the upgrade ran at open: every table as the new layout wrote it, the layout row included
        assert raw_state(store) == written
    assert check.check_directory(path).problems == []
    assert _reads(path) == seen
    with _open(path) as store:  # a second open has nothing to do
        assert migrate.upgrade(store.env, store.tables) == 0
        coll = store.collection("manual")  # and the store works on: the open generation commits
        coll.put_many([(b"k002", b"after")], generation_id=b"g06")
        coll.commit_generation(b"g06")
        assert coll.get(b"k002").value == b"after"  # type: ignore[union-attr]
        assert [i.key for i in coll.diff(from_generation_id=b"g05", to_generation_id=b"g06")] == [
            b"k002",
            b"open",
        ]
    assert check.check_directory(path).problems == []


def test_an_upgrade_killed_before_it_commits_leaves_layout_1_whole_and_the_next_open_upgrades(
    tmp_path: Path,
) -> None:
    path = tmp_path / "s"
    _fill(path)
    written = _raw(path)
    _to_layout_1(path)
    env = {**os.environ, crashpoints.CRASH_AT_ENV: "upgrade-written"}
    opener = "import sys; from diffstore import Store; Store.open(sys.argv[1]).close()"
    done = subprocess.run(
        [sys.executable, "-c", opener, str(path)], env=env, capture_output=True, timeout=120
    )
    assert done.returncode == -signal.SIGKILL, done.stderr
    assert "storage layout 1" in check.check_directory(path).problems[0].what  # nothing was committed
    assert _raw(path) == written  # this open upgraded it


def test_a_store_of_a_newer_layout_is_refused_and_left_as_it_is(tmp_path: Path) -> None:
    path = tmp_path / "s"
    _fill(path)
    with _open(path) as store, store.env.begin(write=True) as txn:
        txn.put(layout.LAYOUT_ROW, layout.u64(3), db=store.tables.collections)
    with pytest.raises(StorageError, match="storage layout 3, newer than this diffstore's \\(2\\)"):
        _open(path)
    problems = check.check_directory(path).problems
    assert len(problems) == 1 and "storage layout 3" in problems[0].what
