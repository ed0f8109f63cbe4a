"""``GET /overview/changes`` long polls: many waiters cost no work while nothing changes, and a commit of
another process, or a write that sends no notice, wakes them all.

A real uvicorn over a real store, real processes that write to the same data directory, raw sockets as
the waiting consoles (one connection each)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from diffstore.engine import overview
from diffstore.engine.store import Store
from tests.helpers import wait_until

from .conftest import Live, live_server
from .test_cli import server_rx_queue
from .test_wake_loop import DEADLINE_S, ROOT, answer, commit_elsewhere

WAITERS = 50
IDLE_S = 1.0  # a window in which nothing is written: no check of the version should run in it
# another process creates a collection: a write that commits nothing, so it sends no commit notice
CREATE = (
    "import sys; from diffstore import Store\n"
    "with Store.open(sys.argv[1]) as store:\n"
    "    store.create_collection('made-elsewhere')\n"
)


@pytest.fixture
def digests(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts the computations of the overview's version (the real function still runs)."""
    counted = [0]
    real: Callable[[Store], str] = overview.version

    def counting(store: Store) -> str:
        counted[0] += 1
        return real(store)

    monkeypatch.setattr(overview, "version", counting)
    return counted


@pytest.fixture
def live(tmp_path: Path) -> Iterator[Live]:
    with live_server(tmp_path / "data") as running:
        yield running


def changes_poll(live: Live, since: str) -> socket.socket:
    port = int(live.url.rsplit(":", 1)[1])
    poll = socket.create_connection(("127.0.0.1", port), timeout=DEADLINE_S)
    request = f"GET /overview/changes?since={since}&timeoutMs=60000 HTTP/1.1\r\n"
    poll.sendall(request.encode() + b"Host: x\r\nConnection: close\r\n\r\n")
    return poll


def all_read(live: Live, polls: list[socket.socket]) -> bool:
    """The server has read every poll's request."""
    port = int(live.url.rsplit(":", 1)[1])
    return all(server_rx_queue(port, poll.getsockname()[1]) == 0 for poll in polls)


def version_of(reply: bytes) -> str:
    head, _, body = reply.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 "), reply
    return str(json.loads(body)["version"])


def test_waiting_polls_cost_no_check_and_a_commit_of_another_process_wakes_them(
    live: Live, digests: list[int], tmp_path: Path
) -> None:
    live.ok("POST", "/collections/", {"collectionName": "m", "isManual": True})
    since = live.ok("GET", "/overview/changes")["version"]
    polls = [changes_poll(live, since) for _ in range(WAITERS)]
    try:
        wait_until(lambda: all_read(live, polls), timeout=DEADLINE_S, what="the server to read every poll")
        before = digests[0]
        time.sleep(IDLE_S)  # the idle window being measured, not a wait for a condition
        # the old route computed a digest per waiter every 200 ms (about 250 here): now none, or the
        # checks the polls' arrival started (one, and one more after it), whatever the number of waiters
        assert digests[0] - before <= 2
        assert live.app.state.overview_watch.waiting() == WAITERS
        commit_elsewhere(tmp_path / "data", "m", "1")
        versions = {version_of(answer(poll)) for poll in polls}
    finally:
        for poll in polls:
            poll.close()
    assert len(versions) == 1 and since not in versions
    assert versions == {live.ok("GET", "/overview/changes")["version"]}


def test_a_write_of_another_process_that_sends_no_notice_wakes_the_polls(live: Live, tmp_path: Path) -> None:
    """A collection created by another process (no commit, so no commit notice) is seen all the same."""
    since = live.ok("GET", "/overview/changes")["version"]
    polls = [changes_poll(live, since) for _ in range(3)]
    try:
        wait_until(lambda: all_read(live, polls), timeout=DEADLINE_S, what="the server to read every poll")
        made = subprocess.run(
            [sys.executable, "-c", CREATE, str(tmp_path / "data")],
            capture_output=True,
            text=True,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
            timeout=DEADLINE_S,
        )
        assert made.returncode == 0, made.stderr
        versions = {version_of(answer(poll)) for poll in polls}
    finally:
        for poll in polls:
            poll.close()
    assert len(versions) == 1 and since not in versions


def test_a_poll_given_an_old_version_answers_at_once_even_with_no_time_to_wait(live: Live) -> None:
    since = live.ok("GET", "/overview/changes")["version"]
    live.ok("POST", "/collections/", {"collectionName": "m", "isManual": True})
    got = live.ok("GET", "/overview/changes", params={"since": since, "timeoutMs": 0})["version"]
    assert got != since
    assert live.ok("GET", "/overview/changes", params={"since": got, "timeoutMs": 0})["version"] == got
