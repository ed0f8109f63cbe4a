"""``compact`` (engine/compact.py) on real stores: it gives free pages back, keeps every record, and refuses
while any other process -- or any program holding LMDB's lock -- has the store open."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from diffstore import Store, StoreConfig
from diffstore.engine import check, compact, layout, space, storage
from diffstore.errors import InvalidRequest, StorageError
from tests.engine.test_backup import spawn_writer, stop
from tests.helpers import close_pipes

DEADLINE_S = 60.0


def fill(path: Path, collections: int, keys: int) -> None:
    with Store.open(path, StoreConfig(background=False)) as store:
        for c in range(collections):
            col = store.create_collection(f"c{c}")
            col.start_generation(b"1")
            col.put_many([(b"k%06d" % i, b"v" * 200) for i in range(keys)], generation_id=b"1")
            col.commit_generation(b"1")


def contents(path: Path) -> dict[str, list[tuple[bytes, bytes | None]]]:
    with Store.open(path, StoreConfig(background=False)) as store:
        return {
            info.name: [(r.key, r.value) for r in store.collection(info.name).query()]
            for info in store.collections()
        }


def test_compaction_gives_the_free_pages_back_and_keeps_every_record(tmp_path: Path) -> None:
    path = tmp_path / "s"
    fill(path, 5, 2000)
    with Store.open(path, StoreConfig(background=False)) as store:
        for c in range(4):
            store.delete_collection(f"c{c}")
        while store.run_background_once():  # the purge of the deleted collections, to the end
            pass
        before_space = space.measure(
            store.env, [getattr(store.tables, t.decode()) for t in layout.TABLES], path
        )
    kept = contents(path)
    assert before_space.free_pages > before_space.used_pages  # most of the file is free
    result = compact.compact(path)
    assert result.after_bytes < result.before_bytes / 2
    assert result.after_bytes <= before_space.used_bytes * 1.05
    assert contents(path) == kept and len(kept["c4"]) == 2000
    assert check.check_directory(path).ok
    assert not (path / compact.COMPACTING_FILE).exists()
    with Store.open(path, StoreConfig(background=False)) as store:  # and it takes writes again
        c = store.collection("c4")
        c.start_generation(b"2")
        c.put(b"new", b"yes", generation_id=b"2")
        c.commit_generation(b"2")
        assert c.get(b"new").value == b"yes"


def test_compaction_refuses_while_a_store_is_open_here_or_in_another_process(tmp_path: Path) -> None:
    path = tmp_path / "s"
    fill(path, 1, 10)
    with (
        Store.open(path, StoreConfig(background=False)),
        pytest.raises(StorageError, match="open in another process"),
    ):
        compact.compact(path)
    writer = spawn_writer(path, "w")
    try:
        with pytest.raises(StorageError, match="open in another process"):
            compact.compact(path)
    finally:
        stop(writer)
    assert not (path / compact.COMPACTING_FILE).exists()
    assert contents(path)["c0"] == [(b"k%06d" % i, b"v" * 200) for i in range(10)]


def test_compaction_refuses_while_another_program_holds_lmdbs_lock(tmp_path: Path) -> None:
    path = tmp_path / "s"
    fill(path, 1, 10)
    # a program that is not diffstore (no directory lock): only LMDB's own lock says it is there
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import lmdb, sys; env = lmdb.open(sys.argv[1], max_dbs=32, max_readers=2048);"
            " print('open', flush=True); sys.stdin.read()",
            str(path),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "open"
        with pytest.raises(StorageError, match="holds LMDB's lock"):
            compact.compact(path)
    finally:
        assert holder.stdin is not None
        holder.stdin.close()
        holder.wait(timeout=DEADLINE_S)
        close_pipes(holder)
    compact.compact(path)  # once it is gone


def test_a_store_refuses_to_open_while_a_compaction_holds_it(tmp_path: Path) -> None:
    path = tmp_path / "s"
    fill(path, 1, 10)
    lock = storage.DirectoryLock(path, exclusive=True)
    try:
        with pytest.raises(StorageError, match="being compacted"):
            Store.open(path)
    finally:
        lock.release()
    assert contents(path)["c0"]


def test_compaction_bad_input_changes_nothing(tmp_path: Path) -> None:
    with pytest.raises(InvalidRequest, match="not a directory holding a store"):
        compact.compact(tmp_path / "nowhere")
    assert not (tmp_path / "nowhere").exists()
    (tmp_path / "empty").mkdir()
    with pytest.raises(InvalidRequest, match="no data.mdb"):
        compact.compact(tmp_path / "empty")
    assert os.listdir(tmp_path / "empty") == []
