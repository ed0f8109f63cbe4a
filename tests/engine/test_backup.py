"""Hot backups (engine/backup.py) of a store that several processes keep committing to, with real
subprocesses and real LMDB files: each backup is one committed state, equal to the source at its
generations."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from diffstore import Store, StoreConfig
from diffstore.engine import backup, check, copying, files, storage
from diffstore.errors import InvalidRequest, StorageError
from tests.helpers import close_pipes

WRITER = Path(__file__).with_name("backup_writer.py")
ROOT = Path(__file__).resolve().parents[2]
DEADLINE_S = 60.0


def spawn_writer(path: Path, name: str) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [sys.executable, str(WRITER), str(path), name],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "ready", proc.stderr.read() if proc.stderr else ""
    return proc


def acknowledged(proc: subprocess.Popen[str], at_least: int) -> int:
    """Reads the writer's lines until it has acknowledged ``at_least`` commits; the last one read."""
    assert proc.stdout is not None
    last = 0
    while last < at_least:
        line = proc.stdout.readline()
        assert line, "the writer stopped"
        last = int(line)
    return last


def stop(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        assert proc.stdin is not None
        proc.stdin.close()
        try:
            proc.wait(timeout=DEADLINE_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    close_pipes(proc)


def snapshot_of(store: Store, name: str, generation_id: bytes) -> list[tuple[bytes, bytes | None]]:
    return [(r.key, r.value) for r in store.collection(name).query(generation_id=generation_id)]


def test_backups_taken_while_processes_commit_equal_the_source_at_their_generations(tmp_path: Path) -> None:
    source = tmp_path / "source"
    writers = [spawn_writer(source, name) for name in ("one", "two")]
    try:
        for proc in writers:
            acknowledged(proc, 3)
        outs = []
        for i in range(3):
            out = tmp_path / f"backup-{i}"
            backup.backup_directory(source, out)
            outs.append(out)
            live_report = check.check_directory(source)  # beside the writers, in one read transaction
            assert live_report.ok, live_report.problems
            backup_report = check.check_directory(out)
            assert backup_report.ok, backup_report.problems
            for proc in writers:  # the writers went on meanwhile
                acknowledged(proc, 3 * (i + 2))
        for proc in writers:
            last = acknowledged(proc, 1)
        assert not (outs[0] / storage.UNFINISHED_BACKUP).exists()
    finally:
        for proc in writers:
            stop(proc)
    seen = []
    with Store.open(source, StoreConfig(background=False)) as live:
        for out in outs:
            with Store.open(out, StoreConfig(background=False)) as copy:
                assert {c.name for c in copy.collections()} == {"one", "two", "auto-one", "auto-two"}
                for name in ("one", "two"):
                    c = copy.collection(name)
                    g = c.generation_id
                    seen.append(g)
                    # nothing of an open generation: the manual collection has none
                    assert c.next_generation_id is None
                    # readers of that same instant: the writer moves `pos` with each commit
                    assert [(r.name, r.generation_id) for r in c.readers()] == [("pos", g)]
                    assert snapshot_of(copy, name, g) == snapshot_of(live, name, g)
                    assert c.get(b"last").value == g
                auto = copy.collection("auto-one")
                assert auto.next_generation_id is not None
                assert list(auto.query(generation_id=auto.next_generation_id)) == list(auto.query())
    assert len(set(seen)) > 1, "the backups were all of one state"
    assert last > 0


def test_a_backup_refuses_bad_input_and_changes_nothing(tmp_path: Path) -> None:
    source = tmp_path / "source"
    with Store.open(source, StoreConfig(background=False)) as store:
        store.create_collection("A")
    before = (source / storage.DATA_FILE).read_bytes()
    taken = tmp_path / "taken"
    taken.mkdir()
    (taken / "file").write_text("mine")
    with pytest.raises(InvalidRequest, match="not empty"):
        backup.backup_directory(source, taken)
    assert os.listdir(taken) == ["file"]
    plain = tmp_path / "plain"
    plain.write_text("a file")
    with pytest.raises(InvalidRequest, match="not a directory"):
        backup.backup_directory(source, plain)
    empty = tmp_path / "empty-dir"
    empty.mkdir()
    with pytest.raises(InvalidRequest, match="no data.mdb"):
        backup.backup_directory(empty, tmp_path / "out")
    assert os.listdir(empty) == [] and not (tmp_path / "out").exists()
    with pytest.raises(InvalidRequest, match="not a directory holding a store"):
        backup.backup_directory(tmp_path / "missing", tmp_path / "out")
    assert not (tmp_path / "missing").exists() and not (tmp_path / "out").exists()
    assert (source / storage.DATA_FILE).read_bytes() == before


def test_an_unfinished_backup_is_refused_by_every_opener(tmp_path: Path) -> None:
    out = tmp_path / "out"
    backup.claim_target(out)
    (out / storage.DATA_FILE).write_bytes(b"\0" * 100)
    with pytest.raises(StorageError, match="unfinished backup"):
        Store.open(out)
    with pytest.raises(StorageError, match="unfinished backup"), files.open_existing(out):
        pass
    with pytest.raises(StorageError, match="cut short"):
        backup.finish(out)
    assert (out / storage.UNFINISHED_BACKUP).exists()


def test_the_empty_open_generation_of_a_backup_forgets_its_producer_seq_nos(tmp_path: Path) -> None:
    source = tmp_path / "source"
    with Store.open(source, StoreConfig(background=False)) as store:
        auto = store.create_collection("auto", manual=False)
        auto.put(b"k", b"v", producer_id="p", seq_no=7)  # pending in the open generation
        m = store.create_collection("m")
        m.start_generation(b"1")
        m.put(b"k", b"v", generation_id=b"1", producer_id="p", seq_no=3)
        store.collection("auto").start_phantom()
    result = backup.backup_directory(source, tmp_path / "out")
    assert (result.open_generations_left_out, result.open_generations_emptied) == (1, 1)
    with Store.open(tmp_path / "out", StoreConfig(background=False)) as copy:
        auto = copy.collection("auto")
        assert auto.get(b"k", generation_id=auto.next_generation_id) is None
        assert auto.producer_last_seq_no("p") == 0
        assert auto.put(b"k", b"again", producer_id="p", seq_no=7).skipped is False
        m = copy.collection("m")
        assert (m.generation_id, m.next_generation_id, m.producer_last_seq_no("p")) == (b"", None, 0)
        m.start_generation(b"1")  # the writer starts again
    with Store.open(source, StoreConfig(background=False)) as store:  # the source kept its open work
        assert store.collection("auto").producer_last_seq_no("p") == 7
        assert store.collection("m").next_generation_id == b"1"


def test_a_paced_copy_is_lmdbs_compacting_copy_byte_for_byte(tmp_path: Path) -> None:
    source = tmp_path / "source"
    with Store.open(source, StoreConfig(background=False)) as store:
        c = store.create_collection("A")
        c.start_generation(b"1")
        c.put_many([(b"k%05d" % i, os.urandom(300)) for i in range(5000)], generation_id=b"1")
        c.commit_generation(b"1")
    seen: list[tuple[int, int]] = []
    with files.open_existing(source) as opened:
        plain = tmp_path / "plain"
        with open(plain, "wb") as f:
            opened.env.copyfd(f.fileno(), compact=True)
        paced = tmp_path / "paced"
        fd = os.open(paced, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
        try:
            written = copying.copy_to_file(
                opened.env, fd, 1, lambda done, total: seen.append((done, total)), 0.5
            )
        finally:
            os.close(fd)
    assert paced.read_bytes() == plain.read_bytes() and written == plain.stat().st_size
    assert seen[-1] == (written, written)
    with pytest.raises(ValueError, match="disk_share"):
        copying.copy_to_file(opened.env, 0, 1, None, 0)


def test_the_copy_speeds_up_while_writers_keep_their_share_and_slows_down_when_they_do_not() -> None:
    keep = 0.7
    up = copying.next_rate(50e6, with_copy=71, without=100, keep=keep)
    down = copying.next_rate(50e6, with_copy=69, without=100, keep=keep)
    assert down < 50e6 < up
    assert copying.next_rate(50e6, with_copy=0, without=0, keep=keep) > 50e6  # nobody committed: no cost seen
    rate = 50e6
    for _ in range(200):  # bounded both ways: never stopped, never unlimited
        rate = copying.next_rate(rate, with_copy=0, without=100, keep=keep)
    assert rate > 0
    low = rate
    for _ in range(200):
        rate = copying.next_rate(rate, with_copy=100, without=100, keep=keep)
    assert low < rate < float("inf")
