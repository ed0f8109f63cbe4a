"""A backup or a compaction killed (``kill -9``) at any point: the source keeps everything acknowledged, a
cut-off backup is refused by every opener in one line, and a cut-off compaction leaves the old store or the
new one. Real subprocesses of the ``diffstore`` command; the points are named in engine/crashpoints.py,
and a kill in the middle of the copy is made by watching the copy grow."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from diffstore import Store, StoreConfig
from diffstore.engine import check, compact, crashpoints, storage
from diffstore.errors import StorageError
from tests.engine.test_backup import acknowledged, spawn_writer, stop
from tests.engine.test_compact import contents, fill
from tests.helpers import close_pipes, wait_until

DEADLINE_S = 120.0


def run(*argv: str, crash_at: str | None = None) -> subprocess.Popen[str]:
    env = {**os.environ}
    if crash_at is not None:
        env[crashpoints.CRASH_AT_ENV] = crash_at
    return subprocess.Popen(
        [sys.executable, "-m", "diffstore", *argv],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


def finish(proc: subprocess.Popen[str]) -> int:
    proc.wait(timeout=DEADLINE_S)
    close_pipes(proc)
    return proc.returncode


def cli(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "diffstore", *argv], capture_output=True, text=True, timeout=DEADLINE_S
    )


def assert_refused(out: Path) -> None:
    """A cut-off backup: check and serve refuse it in one line; opening it in code raises."""
    done = cli("check", "--data", str(out))
    lines = done.stderr.strip().splitlines()
    assert done.returncode != 0 and len(lines) == 1 and "unfinished backup" in lines[0], done.stderr
    done = cli("serve", "--data", str(out), "--port", "0", "--workers", "1")
    lines = done.stderr.strip().splitlines()
    assert done.returncode != 0 and "unfinished backup" in lines[-1] and "Traceback" not in done.stderr, (
        done.stderr
    )
    with pytest.raises(StorageError, match="unfinished backup"):
        Store.open(out)


@pytest.mark.parametrize("point", ["backup-claimed", "backup-copied", "backup-settled"])
def test_a_backup_killed_at_a_point_leaves_the_source_as_it_was_and_its_out_refused(
    tmp_path: Path, point: str
) -> None:
    source = tmp_path / "src"
    fill(source, 2, 500)
    before = (source / storage.DATA_FILE).read_bytes()
    out = tmp_path / "out"
    assert finish(run("backup", "--data", str(source), str(out), crash_at=point)) == -signal.SIGKILL
    assert (source / storage.DATA_FILE).read_bytes() == before
    assert_refused(out)
    assert check.check_directory(source).ok
    # and a new backup into a new directory works
    assert finish(run("backup", "--data", str(source), str(tmp_path / "again"))) == 0
    assert contents(tmp_path / "again") == contents(source)


def test_a_backup_killed_in_the_middle_of_its_copy_loses_nothing_acknowledged(tmp_path: Path) -> None:
    source = tmp_path / "src"
    fill(source, 4, 20_000)  # a copy that takes a while
    writer = spawn_writer(source, "w")
    try:
        acknowledged(writer, 2)
        out = tmp_path / "out"
        proc = run("backup", "--data", str(source), str(out))
        copy = out / storage.DATA_FILE
        wait_until(lambda: copy.exists() and copy.stat().st_size > 0 or proc.poll() is not None, DEADLINE_S)
        proc.send_signal(signal.SIGKILL)
        code = finish(proc)
        last = acknowledged(writer, 3)  # the writer went on
    finally:
        stop(writer)
    with Store.open(source, StoreConfig(background=False)) as store:
        w = store.collection("w")
        assert int.from_bytes(w.generation_id, "big") >= last  # nothing it acknowledged is lost
        assert [(r.name, r.generation_id) for r in w.readers()] == [("pos", w.generation_id)]
    assert check.check_directory(source).ok
    if code == -signal.SIGKILL:  # killed before it finished (the usual case): refused
        assert_refused(out)
    else:  # it won the race: then it is whole
        assert code == 0 and check.check_directory(out).ok


@pytest.mark.parametrize("point", ["compact-copied", "compact-renamed"])
def test_a_compaction_killed_at_a_point_leaves_a_whole_store(tmp_path: Path, point: str) -> None:
    path = tmp_path / "s"
    fill(path, 3, 2000)
    with Store.open(path, StoreConfig(background=False)) as store:
        store.delete_collection("c0")
        while store.run_background_once():
            pass
    kept = contents(path)
    before = (path / storage.DATA_FILE).stat().st_size
    assert finish(run("compact", "--data", str(path), crash_at=point)) == -signal.SIGKILL
    assert contents(path) == kept  # the old store or the new one, whole
    assert check.check_directory(path).ok
    after = (path / storage.DATA_FILE).stat().st_size
    assert (after == before) if point == "compact-copied" else (after < before)
    done = cli("compact", "--data", str(path))  # a later compaction clears what was left
    assert done.returncode == 0, done.stderr
    assert not (path / compact.COMPACTING_FILE).exists()
    assert contents(path) == kept


def test_a_compaction_killed_at_random_moments_never_loses_the_store(tmp_path: Path) -> None:
    path = tmp_path / "s"
    fill(path, 3, 10_000)
    with Store.open(path, StoreConfig(background=False)) as store:
        store.delete_collection("c0")
        while store.run_background_once():
            pass
    kept = contents(path)
    for attempt in range(4):
        kill_while_copying(
            run("compact", "--data", str(path)), path / compact.COMPACTING_FILE, attempt % 2 == 1
        )
        assert contents(path) == kept
    assert check.check_directory(path).ok


def kill_while_copying(proc: subprocess.Popen[str], temp: Path, wait_for_bytes: bool) -> None:
    """Kills a compaction once its copy exists (and, if asked, holds bytes), or once it is over."""
    wait_until(lambda: temp.exists() or proc.poll() is not None, DEADLINE_S)
    if wait_for_bytes:
        wait_until(
            lambda: not temp.exists() or temp.stat().st_size > 0 or proc.poll() is not None, DEADLINE_S
        )
    proc.send_signal(signal.SIGKILL)
    finish(proc)
