"""No client can stall the store through ``GET /backup`` (issue 54, items 2-4): a real server, a real socket
whose client stops reading after the headers.

- writes answer while the backup is stalled: a failing one (409) and then others, of another collection;
- a stream that stalls past ``backup_stall_timeout_s`` is ended: its copy process goes, its reader slot is
  freed, the client's connection is dropped, and ``/metrics`` counts it;
- past ``backup_max_concurrent`` streams (every process of the data directory together) the answer is 503
  ``overloaded`` with ``Retry-After``, and nothing changes.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from diffstore import Store, StoreConfig
from diffstore.engine import check, crashpoints, slots
from diffstore.server import ServerConfig
from diffstore.server.routes.backup import SLOT_KIND, Stall
from tests.faults import kill9, paused
from tests.helpers import close_pipes, free_port, wait_until
from tests.server.conftest import Live, live_server
from tests.server.test_cli import DRIVER, wait_healthy

DEADLINE_S = 60.0
VALUE_BYTES = 1000
KEYS = 30_000  # a 30 MB copy: far more than the pipe, the sockets' buffers and a chunk in flight hold


def fill(live: Live) -> None:
    """A committed 30 MB collection ``big``; a collection with history (``hist``: generations collected
    under a reader that moved on); a deleted collection; a manual collection ``m`` with no open generation
    and an automatic collection ``auto``."""
    big = live.store.create_collection("big")
    big.start_generation(b"1")
    big.put_many([(b"k%06d" % i, os.urandom(VALUE_BYTES)) for i in range(KEYS)], generation_id=b"1")
    big.commit_generation(b"1")
    hist = live.store.create_collection("hist", manual=True)
    hist.create_reader("r", None, None)
    for g in range(1, 6):
        gen = b"%d" % g
        hist.start_generation(gen)
        hist.put_many([(b"h%03d" % i, gen) for i in range(100)], generation_id=gen)
        hist.commit_generation(gen, update_readers=[("r", gen)])
    live.store.create_collection("gone", manual=False).put(b"x", b"y")
    live.store.delete_collection("gone")
    live.ok("POST", "/collections/", {"collectionName": "m", "isManual": True})
    live.ok("POST", "/collections/", {"collectionName": "auto", "isManual": False})


def copy_processes(parent: int | None = None, data: Path | None = None) -> list[int]:
    """The copy processes (``diffstore.engine.copier``) that ``parent`` (default: this test process)
    started; with ``parent=0`` those copying the store in ``data``, whoever their parent is now."""
    parent = os.getpid() if parent is None else parent
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmdline = f.read()
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue  # gone meanwhile
        if b"diffstore.engine.copier" not in cmdline or (
            data is not None and os.fsencode(data) not in cmdline
        ):
            continue
        if parent in (0, ppid):
            found.append(int(entry))
    return found


@contextmanager
def stalled_client(url: str) -> Iterator[socket.socket]:
    """A ``GET /backup`` whose client reads the answer's head and then stops reading (a small receive
    buffer, so that the server's side fills soon)."""
    host, port = url.removeprefix("http://").split(":")
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.settimeout(DEADLINE_S)
    try:
        sock.connect((host, int(port)))
        sock.sendall(b"GET /backup HTTP/1.1\r\nHost: test\r\n\r\n")
        head = b""
        while b"\r\n\r\n" not in head:
            got = sock.recv(4096)
            assert got, head
            head += got
        assert head.startswith(b"HTTP/1.1 200"), head
        yield sock
    finally:
        sock.close()


def read_until_dropped(sock: socket.socket) -> bytes:
    """What the server sends until it ends the connection (a reset or a close)."""
    body = b""
    try:
        while got := sock.recv(1 << 20):
            body += got
    except ConnectionResetError:
        pass
    return body


def metric(live: Live, name: str) -> float:
    for line in live.call("GET", "/metrics").text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError(f"{name} is not in /metrics")


def test_writes_answer_while_a_backup_is_stalled_by_a_client_that_stopped_reading(tmp_path: Path) -> None:
    # the stall timeout off: the stall lasts as long as the test needs
    with live_server(tmp_path / "s", ServerConfig(backup_stall_timeout_s=0)) as live:
        fill(live)
        with stalled_client(live.url):  # answered: the copy is under way (its first bytes were read)
            # a write that fails (its transaction is aborted): answered, not held behind the copy
            live.fail(
                "POST", "/collections/m/generation/commit", {"generationId": {"value": "9"}},
                status=409, code="generationMismatch",
            )  # fmt: skip
            # ... and the writes after it, of other collections
            live.ok("POST", "/collections/m/generation/start", {"generationId": {"value": "1"}})
            live.ok(
                "POST", "/collections/m/putMany",
                {"items": [{"key": {"value": "a"}, "value": {"value": "1"}}], "generationId": {"value": "1"}},
            )  # fmt: skip
            live.ok("POST", "/collections/m/generation/commit", {"generationId": {"value": "1"}})
            live.ok(
                "POST", "/collections/auto/put", {"item": {"key": {"value": "x"}, "value": {"value": "y"}}}
            )
            assert copy_processes(), "the backup ended: the writes were not tested beside a stalled one"
            assert metric(live, "diffstore_backup_streams") == 1
        assert live.ok("GET", "/collections/m")["generationId"] == {"value": "1"}
        answer = live.ok("POST", "/collections/m/get", {"key": {"value": "a"}})
        assert answer["item"]["value"] == {"value": "1"}
        # the client gone, its copy ends and its slot is free: a whole backup streams
        wait_until(lambda: not copy_processes(), DEADLINE_S, what="the copy process to end")
        wait_until(lambda: metric(live, "diffstore_backup_streams") == 0, DEADLINE_S, what="the stream's end")
        assert len(live.http.get("/backup").content) > KEYS * VALUE_BYTES


def test_a_stalled_backup_stream_is_ended_and_counted(tmp_path: Path) -> None:
    config = ServerConfig(backup_stall_timeout_s=2, backup_stall_min_bytes=1)  # any progress counts
    with live_server(tmp_path / "s", config) as live:
        fill(live)
        assert metric(live, "diffstore_backup_streams_stalled_total") == 0
        with stalled_client(live.url) as sock:
            pids = wait_until(copy_processes, DEADLINE_S, what="the backup's copy process")
            wait_until(
                lambda: metric(live, "diffstore_backup_streams_stalled_total") == 1,
                DEADLINE_S,
                what="the stalled stream to be ended",
            )
            wait_until(lambda: not copy_processes(), DEADLINE_S, what="the copy process to end")
            # its reader slot is free: its read transaction no longer pins the store's pages
            assert not any(
                line.split()[0] == str(pids[0]) for line in live.store.env.readers().splitlines()[1:]
            )
            # the client's connection is dropped: what it reads ends, cut off (no last chunk)
            body = read_until_dropped(sock)  # a socket timeout (DEADLINE_S) if it never is
            assert not body.endswith(b"0\r\n\r\n")
        wait_until(lambda: metric(live, "diffstore_backup_streams") == 0, DEADLINE_S, what="the stream's end")
        assert live.ok("GET", "/collections/m")["isManual"]  # the server never stopped serving
        # a client that reads is not cut off: a whole backup streams
        assert len(live.http.get("/backup").content) > KEYS * VALUE_BYTES
        assert metric(live, "diffstore_backup_streams_stalled_total") == 1


def test_backups_past_the_cap_are_refused_with_503_overloaded(tmp_path: Path) -> None:
    config = ServerConfig(backup_max_concurrent=1, backup_stall_timeout_s=0)
    with live_server(tmp_path / "s", config) as live:
        fill(live)
        live.ok("POST", "/collections/m/generation/start", {"generationId": {"value": "1"}})
        before = (live.ok("GET", "/collections/m"), live.ok("GET", "/collections/"))
        with stalled_client(live.url):
            response = live.call("GET", "/backup")
            assert response.status_code == 503, response.text
            assert response.headers["retry-after"] == "1"
            answer = response.json()
            assert answer["error"] == "overloaded" and "--backup-max-concurrent" in answer["reason"]
            assert metric(live, "diffstore_backup_streams_refused_total") == 1
            assert metric(live, "diffstore_backup_streams") == 1
            # diffstore backup --url says so in one line and writes nothing
            out = tmp_path / "out"
            done = subprocess.run(
                [sys.executable, "-m", "diffstore", "backup", "--url", live.url, str(out)],
                capture_output=True, text=True, timeout=DEADLINE_S,
            )  # fmt: skip
            lines = done.stderr.splitlines()
            assert done.returncode == 1 and len(lines) == 1 and "(overloaded)" in lines[0], done.stderr
            assert lines[0].startswith("diffstore backup: ") and not out.exists()
        assert (live.ok("GET", "/collections/m"), live.ok("GET", "/collections/")) == before
        # once the first stream is gone, the next one streams
        wait_until(lambda: not copy_processes(), DEADLINE_S, what="the copy process to end")
        wait_until(lambda: metric(live, "diffstore_backup_streams") == 0, DEADLINE_S, what="the stream's end")
        assert len(live.http.get("/backup").content) > KEYS * VALUE_BYTES


def test_the_cap_counts_the_streams_of_every_process_of_the_data_directory(tmp_path: Path) -> None:
    with live_server(tmp_path / "s", ServerConfig(backup_max_concurrent=1)) as live:
        # another process (another worker of the same server) holds the one slot
        holder = subprocess.Popen(
            [
                sys.executable, "-c",
                "import sys; from pathlib import Path; from diffstore.engine import slots;"
                f" held = slots.take(Path(sys.argv[1]), {SLOT_KIND!r}, 1);"
                " print(held is not None, flush=True); sys.stdin.read()",
                str(live.store.path),
            ],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        try:
            assert holder.stdout is not None and holder.stdout.readline() == "True\n"
            live.fail("GET", "/backup", status=503, code="overloaded")
        finally:
            assert holder.stdin is not None
            holder.stdin.close()
            holder.wait(DEADLINE_S)
            close_pipes(holder)
        assert live.call("GET", "/backup").status_code == 200  # its slot went with it


def test_slots_are_exclusive_within_one_process_too(tmp_path: Path) -> None:
    first, second = slots.take(tmp_path, "k", 2), slots.take(tmp_path, "k", 2)
    assert first is not None and second is not None and {first.index, second.index} == {0, 1}
    assert slots.take(tmp_path, "k", 2) is None
    second.release()
    third = slots.take(tmp_path, "k", 2)
    assert third is not None and third.index == 1
    first.release()
    third.release()


def test_a_stall_is_fewer_bytes_than_the_minimum_over_the_last_interval() -> None:
    stall = Stall(10.0, 1000, started=0.0)
    assert not stall.stalled(0, 5.0)  # not yet an interval old
    assert not stall.stalled(5000, 9.0)
    assert not stall.stalled(5000, 12.0)  # 5000 bytes since 0 (the last sample at least 10 s old)
    assert not stall.stalled(5500, 18.0)  # 5500 - 0 (at 5.0, still the sample 10 s before)
    assert stall.stalled(5900, 20.0)  # 5900 - 5000 (at 9.0): 900 in the last 10 s
    steady = Stall(10.0, 1000, started=0.0)
    assert not any(steady.stalled(200 * t, float(t)) for t in range(1, 60))  # 2000 per 10 s: never


FILL_READERS = """
import sys, lmdb
from pathlib import Path
from diffstore.engine import storage
path = Path(sys.argv[1])
env = lmdb.open(str(path), map_size=1 << 40, max_dbs=64, max_readers=storage.existing_max_readers(path, 126))
held = []
try:
    while True:
        held.append(env.begin())
except lmdb.ReadersFullError:
    pass
print(len(held), flush=True)
sys.stdin.read()
"""


def test_a_backup_while_lmdbs_reader_table_is_full_is_503_overloaded(tmp_path: Path) -> None:
    with live_server(tmp_path / "s") as live:
        live.ok("POST", "/collections/", {"collectionName": "m", "isManual": True})
        # another process takes every reader slot of the store (reads of a crowd of processes)
        filler = subprocess.Popen(
            [sys.executable, "-c", FILL_READERS, str(live.store.path)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        try:
            assert filler.stdout is not None and int(filler.stdout.readline()) > 0
            response = live.call("GET", "/backup")
            assert response.status_code == 503, response.text
            assert response.headers["retry-after"] == "1"
            assert response.json()["error"] == "overloaded" and "reader table" in response.json()["reason"]
        finally:
            assert filler.stdin is not None
            filler.stdin.close()
            filler.wait(DEADLINE_S)
            close_pipes(filler)
        # their reads ended: the slots are free, a backup streams, and the store is as it was
        assert live.call("GET", "/backup").status_code == 200
        assert live.ok("GET", "/collections/m")["isManual"]
        wait_until(lambda: metric(live, "diffstore_backup_streams") == 0, DEADLINE_S, what="the stream's end")


def not_a_reader(live: Live, pid: int) -> bool:
    """Whether LMDB's reader table of the store holds no slot of process ``pid``."""
    return not any(line.split()[0] == str(pid) for line in live.store.env.readers().splitlines()[1:])


def test_a_copy_process_stopped_midway_is_ended_by_the_stall_timeout(tmp_path: Path) -> None:
    config = ServerConfig(backup_stall_timeout_s=2, backup_stall_min_bytes=1)  # any progress counts
    with live_server(tmp_path / "s", config) as live:
        fill(live)
        with live.http.stream("GET", "/backup") as response:
            assert response.status_code == 200
            chunks = response.iter_bytes(65536)
            next(chunks)
            [pid] = wait_until(copy_processes, DEADLINE_S, what="the backup's copy process")
            with paused(pid), pytest.raises(httpx.TransportError):  # SIGCONT on the way out, if alive
                for _ in chunks:  # the client reads on; the copy gives nothing more, then is ended
                    pass
        wait_until(lambda: not copy_processes(), DEADLINE_S, what="the stopped copy process to be killed")
        wait_until(lambda: not_a_reader(live, pid), DEADLINE_S, what="its reader slot to be freed")
        assert metric(live, "diffstore_backup_streams_stalled_total") == 1
        live.ok("POST", "/collections/m/generation/start", {"generationId": {"value": "1"}})  # writes go on
        wait_until(lambda: metric(live, "diffstore_backup_streams") == 0, DEADLINE_S, what="the stream's end")
        assert len(live.http.get("/backup").content) > KEYS * VALUE_BYTES


def test_a_copy_process_killed_midway_cuts_the_body_off(tmp_path: Path) -> None:
    with live_server(tmp_path / "s") as live:
        fill(live)
        with live.http.stream("GET", "/backup") as response:
            assert response.status_code == 200
            chunks = response.iter_bytes(65536)
            next(chunks)
            [pid] = wait_until(copy_processes, DEADLINE_S, what="the backup's copy process")
            kill9(pid)
            with pytest.raises(httpx.TransportError):  # cut off, never a short body that looks whole
                for _ in chunks:
                    pass
        wait_until(
            lambda: not_a_reader(live, pid), DEADLINE_S, what="the killed copy's reader slot to be freed"
        )
        wait_until(lambda: metric(live, "diffstore_backup_streams") == 0, DEADLINE_S, what="the stream's end")
        out = tmp_path / "out"  # the next backup is whole: it checks, and holds the history as it is
        done = subprocess.run(
            [sys.executable, "-m", "diffstore", "backup", "--url", live.url, str(out)],
            capture_output=True, text=True, timeout=DEADLINE_S,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
    assert check.check_directory(out).ok
    with Store.open(out, StoreConfig(background=False)) as copy:
        assert {c.name for c in copy.collections()} == {"big", "hist", "m", "auto"}
        hist = copy.collection("hist")
        assert [(r.name, r.generation_id) for r in hist.readers()] == [("r", b"5")]
        assert {r.value for r in hist.query()} == {b"5"}


def parent_of(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[1])


def test_a_server_killed_during_a_stalled_backup_leaves_no_copy_behind(tmp_path: Path) -> None:
    data = tmp_path / "data"
    with Store.open(data, StoreConfig(background=False)) as store:
        big = store.create_collection("big", manual=True)
        big.start_generation(b"1")
        big.put_many([(b"k%06d" % i, os.urandom(VALUE_BYTES)) for i in range(KEYS)], generation_id=b"1")
        big.commit_generation(b"1")
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    server = subprocess.Popen(
        [sys.executable, "-c", DRIVER, "serve", "--data", str(data), "--port", str(port), "--workers", "2"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        wait_healthy(url, "diffstore serve to start")
        with stalled_client(url):
            [pid] = wait_until(lambda: copy_processes(0, data), DEADLINE_S, what="the copy process")
            worker = parent_of(pid)
            assert worker != server.pid  # a worker process streams it
            # writes that fail and writes that do not, on new connections (any worker): all answered
            for _ in range(4):
                with httpx.Client(base_url=url, timeout=DEADLINE_S) as http:
                    gen = {"generationId": {"value": "9"}}
                    assert http.post("/collections/big/generation/commit", json=gen).status_code == 409
                    assert http.post("/collections/big/generation/start", json=gen).status_code == 200
                    assert http.post("/collections/big/generation/abort", json=gen).status_code == 200
            assert pid in copy_processes(0, data)  # all beside the stalled backup
            kill9(worker)  # the process serving the backup dies (its supervisor starts another)
            # its end of the pipe is gone: the copy's next write fails, and it ends
            wait_until(
                lambda: pid not in copy_processes(0, data), DEADLINE_S, what="the orphaned copy to end"
            )
        wait_healthy(url, "the server to serve again")
        with httpx.Client(base_url=url, timeout=DEADLINE_S) as http:
            response = http.get("/backup")  # whichever worker answers, a whole backup
            assert response.status_code == 200 and len(response.content) > KEYS * VALUE_BYTES
        assert check.check_directory(data).ok
    finally:
        kill9(server, group=True)


def test_a_copy_that_hangs_before_its_first_bytes_is_503_overloaded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = ServerConfig(backup_stall_timeout_s=2, backup_stall_min_bytes=1)
    with live_server(tmp_path / "s", config) as live:
        live.ok("POST", "/collections/", {"collectionName": "m", "isManual": True})
        monkeypatch.setenv(crashpoints.STOP_AT_ENV, "copier-opened")  # the copy process stops itself there
        live.fail("GET", "/backup", status=503, code="overloaded")
        wait_until(lambda: not copy_processes(), DEADLINE_S, what="the stopped copy process to be killed")
        monkeypatch.delenv(crashpoints.STOP_AT_ENV)
        wait_until(lambda: metric(live, "diffstore_backup_streams") == 0, DEADLINE_S, what="its slot")
        assert live.call("GET", "/backup").status_code == 200
        assert live.ok("GET", "/collections/m")["isManual"]
