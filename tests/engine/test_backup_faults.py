"""A backup paused midway (SIGSTOP, as a long GC or a stopped job would) while the store's writers commit
(issue 25: backups under each fault). The copy reads one read transaction; stopped with it open, the
writers go on (LMDB's writer never waits for a reader) and, resumed, the copy completes as of the instant
it started: equal to the source at its generations, and ``diffstore check`` passes on it. (kill -9 of a
backup: test_backup_crash.py; a link that stalls or is cut under ``backup --url``: tests/server.)"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from diffstore import Store, StoreConfig
from diffstore.engine import check, crashpoints, storage
from diffstore.errors import StorageError
from tests.engine.test_backup import acknowledged, snapshot_of, spawn_writer, stop
from tests.engine.test_compact import contents, fill
from tests.faults import kill9, paused, process_state
from tests.helpers import close_pipes, wait_until

DEADLINE_S = 120.0


def generation_of(path: Path, name: str) -> bytes:
    with Store.open(path, StoreConfig(background=False)) as store:
        return store.collection(name).generation_id


def test_a_backup_paused_midway_completes_as_of_its_start_while_writers_commit(tmp_path: Path) -> None:
    source, out = tmp_path / "src", tmp_path / "out"
    fill(source, 2, 20_000)  # several MiB: the copy is under way after its first MiB
    writer = spawn_writer(source, "w")
    backup = None
    try:
        acknowledged(writer, 2)
        backup = subprocess.Popen(
            [sys.executable, "-m", "diffstore", "backup", "--data", str(source), str(out)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, crashpoints.STOP_AT_ENV: "copy-midway"},  # it stops itself there
        )
        proc = backup
        wait_until(
            lambda: proc.poll() is not None or process_state(proc.pid) in "tT",
            DEADLINE_S,
            what="the backup to stop midway",
        )
        assert backup.poll() is None, backup.communicate()
        with paused(backup):  # held stopped; SIGCONT on the way out
            assert (out / storage.UNFINISHED_BACKUP).exists() and (out / storage.DATA_FILE).stat().st_size
            with pytest.raises(StorageError, match="unfinished backup"):
                Store.open(out)
            at_stop = int.from_bytes(generation_of(source, "w"), "big")
            acknowledged(writer, at_stop + 20)  # the writer commits on while the backup is stopped
        stdout, stderr = backup.communicate(timeout=DEADLINE_S)
        assert backup.returncode == 0 and "backed up a diffstore store into" in stdout, stderr
        last = acknowledged(writer, at_stop + 25)  # and after
    finally:
        if backup is not None and backup.poll() is None:
            kill9(backup)
        if backup is not None:
            close_pipes(backup)
        stop(writer)
    done = subprocess.run(
        [sys.executable, "-m", "diffstore", "check", "--data", str(out)],
        capture_output=True,
        text=True,
        timeout=DEADLINE_S,
    )
    assert done.returncode == 0 and "every invariant holds" in done.stdout, done.stdout + done.stderr
    assert check.check_directory(out).ok
    with Store.open(source, StoreConfig(background=False)) as live, Store.open(out) as copy:
        w = copy.collection("w")
        g = w.generation_id
        # the state of the copy's one read transaction, taken before the stop: older than the stop
        assert 0 < int.from_bytes(g, "big") <= at_stop < last
        assert int.from_bytes(live.collection("w").generation_id, "big") >= last  # the source kept them
        assert w.next_generation_id is None  # the generation open at the copy's instant is left out
        assert [(r.name, r.generation_id) for r in w.readers()] == [("pos", g)]
        assert snapshot_of(copy, "w", g) == snapshot_of(live, "w", g)
    assert {name: rows for name, rows in contents(out).items() if name in ("c0", "c1")} == {
        name: rows for name, rows in contents(source).items() if name in ("c0", "c1")
    }
