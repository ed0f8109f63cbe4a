"""A consumer rides out an outage of its server (issue 54, item 1): ``Consumer.run`` waits with back-off
instead of raising, and the windows stay contiguous and checkpointed once.

Before the fix the first refused call ended ``run()`` with ``StorageError`` (a deployment had to wrap it in
a retry loop of its own, as ``test_consumer_link_faults`` still does). Here the server is SIGKILLed and
started again on the same port and data directory, or the consumer's link is cut (connections reset, new
ones refused) and restored, while a source moves.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from diffstore.backoff import RetryPolicy
from diffstore.client import Client
from diffstore.consumer import Consumer
from tests.faults import TcpProxy
from tests.helpers import wait_until
from tests.replica.conftest import Server

from .test_consumer import Recorder, commit

DEADLINE_S = 60.0  # generous: a restart of serve takes seconds on a loaded machine
OUTAGE_S = 3.0  # how long the server stays down: the length of the fault, not a wait for a condition


@pytest.fixture
def server(tmp_path: Path) -> Iterator[Server]:
    server = Server(tmp_path / "db").start()
    try:
        yield server
    finally:
        server.kill9()


def windows(recorder: Recorder) -> list[tuple[dict[str, bytes], dict[str, bytes]]]:
    """(from, to) of every window that ended, in delivery order."""
    found, start = [], None
    for event in list(recorder.events):
        if event[0] == "start_window":
            start = event[1]
        elif event[0] == "end_window":
            found.append((start, event[1]))
    return found


@pytest.mark.parametrize("fault", ["restart", "cut"])
def test_a_consumer_rides_out_an_outage_of_its_server(server: Server, fault: str) -> None:
    with server.client() as admin:
        admin.create_collection("A")
        admin.create_collection("B")
        commit(admin, "A", b"1", [(b"a1", b"x")])
        commit(admin, "B", b"1", [(b"b1", b"z")])
    with TcpProxy(server.url.removeprefix("http://")) as proxy, Client(f"http://{proxy.address}") as client:
        recorder = Recorder()
        changes: list[bool] = []
        consumer = Consumer(
            client,
            ["A", "B"],
            "checkpoints",
            recorder,
            page_limit=1,
            replay_delay_s=0,
            wait_timeout_ms=1000,
            outage=RetryPolicy(initial_s=0.05, max_s=0.5),
            on_outage=changes.append,
        )
        stop = threading.Event()
        errors: list[BaseException] = []

        def run() -> None:
            try:
                consumer.run(stop)
            except BaseException as exc:  # reported by the test thread
                errors.append(exc)

        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        try:
            wait_until(lambda: windows(recorder) or errors, DEADLINE_S, what="a first window")
            if fault == "restart":
                server.kill9()
                wait_until(lambda: consumer.outage_watch.waiting or errors, DEADLINE_S, what="the wait")
                time.sleep(OUTAGE_S)
                server.start()
            else:
                proxy.cut(refuse=True)
                wait_until(lambda: consumer.outage_watch.waiting or errors, DEADLINE_S, what="the wait")
            assert not errors, errors
            with server.client() as admin:
                commit(admin, "A", b"2", [(b"a1", b"x2"), (b"a2", b"y")])  # moves while the link is down
            proxy.accept()
            final = {"A": b"2", "B": b"1"}
            wait_until(
                lambda: errors or (windows(recorder) and windows(recorder)[-1][1] == final),
                DEADLINE_S,
                what="the window of the outage",
            )
            assert not errors, errors
            assert not consumer.outage_watch.waiting and changes == [True, False]
        finally:
            stop.set()
            thread.join(DEADLINE_S)
            consumer.close()
        assert not thread.is_alive() and not errors, errors
    seen = windows(recorder)
    # contiguous: each window starts where the one before ended, or again where that one started when
    # the outage took its checkpoint's answer (at-least-once windows; the checkpoint moves once)
    assert seen[0][0] == {"A": b"", "B": b""}
    for (before, ended), (started, _) in zip(seen, seen[1:], strict=False):
        assert started in (ended, before)
    # the last window carries A's net change from where it started (the first window again, when the
    # outage took the first checkpoint's answer)
    events = list(recorder.events)
    last = events[max(i for i, e in enumerate(events) if e[0] == "start_window") :]
    start = last[0][1]
    a1 = (b"a1", None, b"x2") if start["A"] == b"" else (b"a1", b"x", b"x2")
    assert [e[2:] for e in last if e[:2] == ("data", "A")] == [a1, (b"a2", None, b"y")]
    with server.client() as admin:
        stored = {r.name: r.generation_id for r in admin.collection("checkpoints").readers()}
    assert sorted(stored.values()) == [b"1", b"2"]
