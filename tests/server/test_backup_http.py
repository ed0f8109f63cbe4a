"""``GET /backup`` and ``diffstore backup --url``: a real server over a store that another process keeps
committing to; the backup is one committed state, check passes on it, and a server on it serves. Bad
URLs and tokens are one line with nothing written. A link that delays, stalls and is cut midway
(tests.faults.TcpProxy) ends the backup in one line with OUT refused, the source unchanged, and a retry
whole."""

from __future__ import annotations

import http.server
import os
import shutil
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from diffstore import Store, StoreConfig
from diffstore.engine import check, crashpoints, storage
from diffstore.errors import StorageError
from diffstore.server import ServerConfig
from tests.engine.test_backup import acknowledged, snapshot_of, spawn_writer, stop
from tests.engine.test_backup_crash import assert_refused
from tests.faults import TcpProxy
from tests.helpers import wait_until
from tests.server.conftest import live_server

DEADLINE_S = 120.0
TOKEN = "s3cret"


def cli(*argv: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "DIFFSTORE_TOKEN"}
    return subprocess.run(
        [sys.executable, "-m", "diffstore", *argv],
        capture_output=True,
        text=True,
        timeout=DEADLINE_S,
        env=env,
    )


def one_line(done: subprocess.CompletedProcess[str]) -> str:
    assert done.returncode != 0 and "Traceback" not in done.stderr, done.stderr
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("diffstore backup: "), done.stderr
    return lines[0]


def test_a_backup_over_http_while_another_process_commits(tmp_path: Path) -> None:
    source = tmp_path / "source"
    writer = spawn_writer(source, "w")
    try:
        acknowledged(writer, 3)
        with live_server(source, ServerConfig(token=TOKEN)) as live:
            live.ok("POST", "/collections/", {"collectionName": "A", "isManual": True})
            token = tmp_path / "token"  # from a file: --token works too, with a warning on stderr
            token.write_text(TOKEN + "\n")
            done = cli("backup", "--url", live.url, "--token-from-file", str(token), str(tmp_path / "out"))
            assert done.returncode == 0, done.stderr
            assert "into" in done.stdout and done.stderr == ""
            acknowledged(writer, 3)  # it went on meanwhile
    finally:
        stop(writer)
    out = tmp_path / "out"
    assert sorted(os.listdir(out)) == ["MANIFEST.json", storage.DATA_FILE]
    assert check.check_directory(out).ok
    with Store.open(source, StoreConfig(background=False)) as live_store, Store.open(out) as copy:
        w = copy.collection("w")
        g = w.generation_id
        assert w.next_generation_id is None
        assert [(r.name, r.generation_id) for r in w.readers()] == [("pos", g)]
        assert snapshot_of(copy, "w", g) == snapshot_of(live_store, "w", g)
        assert {c.name for c in copy.collections()} == {"w", "auto-w", "A"}
    with live_server(out) as served:  # a server on the backup serves it
        answer = served.ok("POST", "/collections/w/get", {"key": {"value": "last"}})
        assert answer["item"] is not None


def test_a_client_that_goes_away_ends_the_copy(tmp_path: Path) -> None:
    with live_server(tmp_path / "s") as live:
        c = live.store.create_collection("A")
        c.start_generation(b"1")
        c.put_many([(b"k%06d" % i, os.urandom(500)) for i in range(20_000)], generation_id=b"1")
        c.commit_generation(b"1")
        with live.http.stream("GET", "/backup") as response:
            assert response.status_code == 200
            assert response.headers["x-diffstore-backup"] == "lmdb-compact"
            assert int(response.headers["x-diffstore-backup-expected-bytes"]) > 10_000_000
            next(response.iter_bytes(65536))

        def copying() -> bool:
            return any(t.name == "diffstore-backup-stream" for t in threading.enumerate())

        wait_until(lambda: not copying(), DEADLINE_S, what="the copy to stop")
        # a whole one still works afterwards
        assert len(live.http.get("/backup").content) > 10_000_000


@contextmanager
def other_server(status: int) -> Iterator[str]:
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (the standard library's name)
            self.send_response(status)
            self.send_header("content-type", "text/html")
            self.end_headers()
            self.wfile.write(b"<html>not diffstore</html>")

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def test_bad_urls_and_tokens_are_one_line_and_write_nothing(tmp_path: Path) -> None:
    out = tmp_path / "out"
    wrong, right = tmp_path / "wrong-token", tmp_path / "token"  # from files: --token would add a warning
    wrong.write_text("wrong\n")
    right.write_text(TOKEN)
    with live_server(tmp_path / "s", ServerConfig(token=TOKEN)) as live:
        line = one_line(cli("backup", "--url", live.url, "--token-from-file", str(wrong), str(out)))
        assert "unauthorized" in line and "--token" in line
        line = one_line(cli("backup", "--url", live.url, str(out)))
        assert "unauthorized" in line
        taken = tmp_path / "taken"
        taken.mkdir()
        (taken / "x").write_text("mine")
        line = one_line(cli("backup", "--url", live.url, "--token-from-file", str(right), str(taken)))
        assert "not empty" in line and os.listdir(taken) == ["x"]
    for status in (404, 200):
        with other_server(status) as url:
            line = one_line(cli("backup", "--url", url, str(out)))
            assert "is not a diffstore server" in line
    with other_server(200) as url:
        pass
    line = one_line(cli("backup", "--url", url, str(out)))  # nobody listens there any more
    assert "cannot reach a diffstore server" in line
    assert not out.exists()


def test_a_backup_over_http_killed_midway_leaves_out_refused(tmp_path: Path) -> None:
    with live_server(tmp_path / "s") as live:
        live.ok("POST", "/collections/", {"collectionName": "A", "isManual": True})
        for point in ("backup-claimed", "backup-copied"):
            out = tmp_path / point
            done = subprocess.run(
                [sys.executable, "-m", "diffstore", "backup", "--url", live.url, str(out)],
                capture_output=True,
                text=True,
                timeout=DEADLINE_S,
                env={**os.environ, crashpoints.CRASH_AT_ENV: point},
            )
            assert done.returncode == -signal.SIGKILL, done.stderr
            line = [entry for entry in cli("check", "--data", str(out)).stderr.splitlines() if entry.strip()]
            assert len(line) == 1 and "unfinished backup" in line[0], line
            with pytest.raises(StorageError, match="unfinished backup"):
                Store.open(out)
        assert live.ok("GET", "/collections/A")["isManual"]  # the server never noticed


def test_a_backup_over_a_link_that_delays_then_stalls_and_is_cut_fails_in_one_line_and_a_retry_works(
    tmp_path: Path,
) -> None:
    with live_server(tmp_path / "s") as live, TcpProxy(live.url.removeprefix("http://")) as proxy:
        c = live.store.create_collection("A")
        c.start_generation(b"1")
        c.put_many([(b"k%06d" % i, os.urandom(500)) for i in range(20_000)], generation_id=b"1")
        c.commit_generation(b"1")
        before = [(r.key, r.value) for r in c.query()]
        url = f"http://{proxy.address}"
        out = tmp_path / "out"
        proxy.delay(20)  # each 64 KiB waits 20 ms: the copy of ~10 MB takes seconds
        backup = subprocess.Popen(
            [sys.executable, "-m", "diffstore", "backup", "--url", url, str(out)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            copy = out / storage.DATA_FILE
            wait_until(
                lambda: backup.poll() is not None or copy.exists() and copy.stat().st_size >= 1 << 20,
                DEADLINE_S,
                what="a MiB of the backup through the slow link",
            )
            assert backup.poll() is None, "the backup ended before the link was cut"
            proxy.stall()  # the link hangs midway...
            wait_until(lambda: proxy.held > 0, DEADLINE_S, what="bytes held by the stalled link")
            assert backup.poll() is None  # ... and the backup waits on it
            proxy.cut()  # then it breaks (and refuses new connections)
            stdout, stderr = backup.communicate(timeout=DEADLINE_S)
        finally:
            if backup.poll() is None:
                backup.kill()
            backup.communicate()
        line = one_line(subprocess.CompletedProcess(backup.args, backup.returncode, stdout, stderr))
        assert "broke off" in line and "take the backup again" in line, line
        assert_refused(out)  # check, serve and Store.open refuse the half copy, in one line
        assert [(r.key, r.value) for r in c.query()] == before  # the source is unchanged...
        assert live.ok("GET", "/collections/A")["generationId"]  # ... and still served
        wait_until(
            lambda: not any(t.name == "diffstore-backup-stream" for t in threading.enumerate()),
            DEADLINE_S,
            what="the server's copy to end with its client gone",
        )
        proxy.accept()
        proxy.passing()
        shutil.rmtree(out)  # as the error says: delete it and take the backup again
        done = cli("backup", "--url", url, str(out))
        assert done.returncode == 0 and done.stderr == "", done.stderr
    assert check.check_directory(out).ok
    with Store.open(out) as restored:
        assert [(r.key, r.value) for r in restored.collection("A").query()] == before
