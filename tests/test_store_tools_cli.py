"""``diffstore backup``, ``check`` and ``compact`` as a user runs them: real subprocesses over real stores.
Every bad input is one line on stderr, a non-zero exit, and nothing changed."""

from __future__ import annotations

import os
import pty
import subprocess
import sys
import threading
from pathlib import Path

import lmdb
import msgpack

from diffstore import Store, StoreConfig
from diffstore.engine import layout, storage
from diffstore.engine.tables import load_meta

DEADLINE_S = 120.0


def cli(*argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "diffstore", *argv],
        capture_output=True,
        text=True,
        timeout=DEADLINE_S,
        env={**os.environ, **(env or {})},
    )


def one_line(done: subprocess.CompletedProcess[str], command: str) -> str:
    assert done.returncode != 0
    assert "Traceback" not in done.stderr
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith(f"diffstore {command}: "), lines[0]
    return lines[0]


def make_store(path: Path) -> None:
    with Store.open(path, StoreConfig(background=False)) as store:
        a = store.create_collection("A")
        a.start_generation(b"1")
        a.put_many([(b"k%d" % i, b"v%d" % i) for i in range(100)], generation_id=b"1")
        a.create_reader("me", None, b"1")
        a.commit_generation(b"1")


def files_of(path: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(path.iterdir()) if p.is_file()}


def test_backup_of_a_data_directory_opens_as_it_is(tmp_path: Path) -> None:
    make_store(tmp_path / "src")
    done = cli("backup", "--data", str(tmp_path / "src"), str(tmp_path / "out"))
    assert done.returncode == 0, done.stderr
    assert "1 collection;" in done.stdout
    assert sorted(os.listdir(tmp_path / "out")) == ["MANIFEST.json", storage.DATA_FILE]
    with Store.open(tmp_path / "out", StoreConfig(background=False)) as copy:
        a = copy.collection("A")
        assert a.generation_id == b"1" and len(list(a.query())) == 100
        assert [(r.name, r.generation_id) for r in a.readers()] == [("me", b"1")]


def test_backup_bad_input_is_one_line_and_changes_nothing(tmp_path: Path) -> None:
    make_store(tmp_path / "src")
    source = files_of(tmp_path / "src")
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep").write_text("mine")
    line = one_line(cli("backup", "--data", str(tmp_path / "src"), str(out)), "backup")
    assert "not empty" in line
    assert files_of(out) == {"keep": b"mine"}
    line = one_line(cli("backup", "--data", str(tmp_path / "nowhere"), str(tmp_path / "new")), "backup")
    assert "not a directory holding a store" in line
    assert not (tmp_path / "new").exists() and not (tmp_path / "nowhere").exists()
    assert files_of(tmp_path / "src")[storage.DATA_FILE] == source[storage.DATA_FILE]


def test_check_prints_each_problem_and_exits_1(tmp_path: Path) -> None:
    make_store(tmp_path / "s")
    done = cli("check", "--data", str(tmp_path / "s"))
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().endswith("tables)") and "every invariant holds" in done.stdout
    with Store.open(tmp_path / "s", StoreConfig(background=False)) as store, store.write() as scope:
        meta = load_meta(scope.txn, store.tables, "A")
        scope.txn.delete(layout.gen_key(meta.cid_prefix, meta.generation_seq), db=store.tables.gens)
        scope.txn.put(
            layout.change_key(meta.cid_prefix, 1, layout.key_form(b"zz")), b"", db=store.tables.changes
        )
    done = cli("check", "--data", str(tmp_path / "s"))
    assert done.returncode == 1 and "Traceback" not in done.stderr
    lines = done.stdout.strip().splitlines()
    assert lines[-1].endswith("tables)") and f": {len(lines) - 1} problems" in lines[-1], lines
    assert any("is not registered" in line for line in lines[:-1])
    assert any("index row key zz #1 has no record" in line for line in lines[:-1]), lines


def test_check_names_damage_of_the_history_cursor_and_replica_tables(tmp_path: Path) -> None:
    make_store(tmp_path / "s")
    with Store.open(tmp_path / "s", StoreConfig(background=False)) as store, store.write() as scope:
        meta = load_meta(scope.txn, store.tables, "A")
        row = layout.pack_commit(1, 99, None)
        scope.txn.put(layout.commit_key(meta.cid_prefix, meta.generation_seq), row, db=store.tables.commits)
        scope.txn.put(layout.cursor_age_key(3), b"\0" * 16, db=store.tables.cursors)
        scope.txn.put(layout.replica_lag_key("A"), msgpack.packb([0, None]), db=store.tables.replica)
    done = cli("check", "--data", str(tmp_path / "s"))
    assert done.returncode == 1 and "Traceback" not in done.stderr
    *found, summary = done.stdout.strip().splitlines()
    # 117 rows: the collections table holds the store's sealed mark (layout.SEALED_ROW) too
    assert summary.endswith(f": {len(found)} problems (117 rows in 19 tables)"), summary
    assert found == [
        "commits: 'A': the commit of generation 1 (#1) counts 99 changed keys, its index holds 100",
        "cursors: the age row #3 names no stored cursor",
        "cursors: 0 long cursors and 1 age rows are stored without a totals row",
        "replica: replica rows are stored, but no primary that they follow",
    ]


def test_check_shows_a_progress_bar_of_rows_on_a_terminal(tmp_path: Path) -> None:
    """On a terminal (stderr), rows read of every row (before: a spinner); stdout keeps the outcome."""
    make_store(tmp_path / "s")
    master, terminal = pty.openpty()
    seen: list[bytes] = []

    def read() -> None:  # all the while: a full terminal would block the bar
        while True:
            try:
                chunk = os.read(master, 65536)
            except OSError:  # the last end closed
                return
            if not chunk:
                return
            seen.append(chunk)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        done = subprocess.run(
            [sys.executable, "-m", "diffstore", "check", "--data", str(tmp_path / "s")],
            stdout=subprocess.PIPE,
            stderr=terminal,
            text=True,
            timeout=DEADLINE_S,
            env={**os.environ, "TERM": "xterm", "COLUMNS": "160"},
        )
    finally:
        os.close(terminal)
        reader.join(DEADLINE_S)
        os.close(master)
    # 115: the store's rows and its sealed mark (layout.SEALED_ROW)
    assert done.returncode == 0 and "every invariant holds (115 rows in 19 tables)" in done.stdout
    shown = b"".join(seen)
    assert b"checking" in shown and b"115/115" in shown and b"rows" in shown, shown


def test_check_bad_input_is_one_line(tmp_path: Path) -> None:
    line = one_line(cli("check", "--data", str(tmp_path / "nowhere")), "check")
    assert "not a directory holding a store" in line and not (tmp_path / "nowhere").exists()
    (tmp_path / "empty").mkdir()
    line = one_line(cli("check", "--data", str(tmp_path / "empty")), "check")
    assert "no data.mdb" in line and os.listdir(tmp_path / "empty") == []


def test_a_data_file_that_is_no_store_is_one_line_and_changes_nothing(tmp_path: Path) -> None:
    garbage = tmp_path / "garbage"
    garbage.mkdir()
    (garbage / storage.DATA_FILE).write_bytes(b"not an LMDB file" * 1000)
    other = tmp_path / "other"
    env = lmdb.open(str(other), max_dbs=4)  # an LMDB environment of someone else's
    with env.begin(write=True) as txn:
        txn.put(b"hello", b"world")
    env.close()
    for path, expected in ((garbage, "cannot open the store"), (other, "is not a store")):
        data = (path / storage.DATA_FILE).read_bytes()
        for argv in (
            ("backup", "--data", str(path), str(tmp_path / "out")),
            ("check", "--data", str(path)),
            ("compact", "--data", str(path)),
        ):
            line = one_line(cli(*argv), argv[0])
            assert expected in line, line
        assert (path / storage.DATA_FILE).read_bytes() == data
        assert not (tmp_path / "out").exists()
