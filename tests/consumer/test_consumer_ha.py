"""Consumers with ``lease_ttl_ms``: one active, the others standby, takeover, fencing; real processes too.

Every wait is on a condition with a deadline; nothing asserts a duration.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from diffstore.consumer import Consumer, Positions, WindowListener
from diffstore.consumer._loop import LEASE_NAME
from diffstore.engine.store import Store
from diffstore.engine.types import Reader, StoreConfig
from diffstore.errors import InvalidRequest
from tests.helpers import running_server, wait_until

from .conftest import DEADLINE_S

TTL_MS = 3000  # generous: a loaded machine must not delay renewals past it
REPO = Path(__file__).resolve().parents[2]


class Recorder(WindowListener):
    def __init__(self) -> None:
        self.events: list[tuple[Any, ...]] = []
        self.lock = threading.Lock()

    def record(self, *event: Any) -> None:
        with self.lock:
            self.events.append(event)

    def on_start_window(self, from_positions: Positions) -> None:
        self.record("start_window", from_positions["A"])

    def on_data_event(self, source: str, key: bytes, old: bytes | None, new: bytes | None) -> None:
        self.record("data", key, new)

    def on_end_window(self, to_positions: Positions) -> None:
        self.record("end_window", to_positions["A"])

    def on_rollback(self, from_positions: Positions, error: BaseException | None) -> None:
        self.record("rollback", from_positions["A"], type(error).__name__ if error else None)

    def windows(self) -> list[bytes]:
        return [e[1] for e in self.events if e[0] == "end_window"]


class ManualClock:
    """The store's clock, moved by hand (``StoreConfig.clock_ms``): leases expire only when told to."""

    def __init__(self) -> None:
        self.now_ms = 1_000_000

    def __call__(self) -> int:
        return self.now_ms


def commit(store: Any, generation: int, items: list[tuple[bytes, bytes | None]]) -> bytes:
    generation_id = generation.to_bytes(8, "big")
    source = store.collection("A")
    source.start_generation(generation_id)
    source.put_many(items, generation_id=generation_id)
    source.commit_generation(generation_id)
    return generation_id


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    clock = ManualClock()
    with Store.open(tmp_path / "engine", StoreConfig(commit_delay_ms=10, clock_ms=clock)) as opened:
        opened.create_collection("A", manual=True, initial_generation_id=bytes(8))
        opened.clock = clock  # type: ignore[attr-defined]
        yield opened


def leased(store: Any, listener: WindowListener, **options: Any) -> Consumer:
    options.setdefault("wait_timeout_ms", 100)
    options.setdefault("replay_delay_s", 0)
    options.setdefault("lease_ttl_ms", TTL_MS)
    return Consumer(store, ["A"], "checkpoints", listener, **options)


def test_one_consumer_is_active_and_a_standby_takes_over_from_its_checkpoint(store: Store) -> None:
    first, second = Recorder(), Recorder()
    active, standby = leased(store, first), leased(store, second, workers=2)
    stops = [threading.Event(), threading.Event()]
    threads = [
        threading.Thread(target=active.run, args=(stops[0],), daemon=True),
        threading.Thread(target=standby.run, args=(stops[1],), daemon=True),
    ]
    g1 = commit(store, 1, [(b"k1", b"1"), (b"k2", b"1")])
    threads[0].start()
    try:
        wait_until(lambda: first.windows() == [g1], what="the first consumer's window")
        threads[1].start()
        # refused once: its keeper scheduled the next try
        wait_until(lambda: standby._guard is not None and standby._guard.keeper._next > 0, what="standby")
        g2 = commit(store, 2, [(b"k1", b"2")])
        wait_until(lambda: first.windows() == [g1, g2], what="the active consumer's second window")
        assert second.events == []  # the standby delivered nothing
        stops[0].set()
        threads[0].join(DEADLINE_S)
        active.close()  # releases the lease: the standby takes over without waiting for the ttl
        g3 = commit(store, 3, [(b"k2", None)])
        wait_until(lambda: second.windows() == [g3], what="the standby's first window")
    finally:
        for stop in stops:
            stop.set()
        for thread in threads:
            thread.join(DEADLINE_S)
        active.close()
        standby.close()
    assert second.events == [("start_window", g2), ("data", b"k2", None), ("end_window", g3)]
    checkpoints = store.collection("checkpoints")
    assert checkpoints.readers() == [Reader("A", "A", g3)]
    assert int.from_bytes(checkpoints.generation_id[:8], "big") == 3  # one checkpoint per window


def test_a_consumer_whose_lease_was_taken_cannot_checkpoint(store: Store) -> None:
    g1 = commit(store, 1, [(b"k", b"1")])
    stolen = threading.Event()

    class Paused(Recorder):
        def on_end_window(self, to_positions: Positions) -> None:
            super().on_end_window(to_positions)
            # the consumer pauses past its ttl; another owner takes the lease meanwhile
            store.clock.now_ms += 10 * TTL_MS  # type: ignore[attr-defined]
            store.collection("checkpoints").acquire_lease(LEASE_NAME, "thief", 60_000)
            stolen.set()

    recorder = Paused()
    consumer = leased(store, recorder)
    stop = threading.Event()
    thread = threading.Thread(target=consumer.run, args=(stop,), daemon=True)
    thread.start()
    try:
        wait_until(stolen.is_set, what="the lease stolen inside the window")
        wait_until(
            lambda: consumer._guard is not None and consumer._guard.token is None, what="standby again"
        )
    finally:
        stop.set()
        thread.join(DEADLINE_S)
        consumer.close()
    assert not thread.is_alive()
    assert recorder.windows() == [g1]  # delivered once, then never again: it is standby
    checkpoints = store.collection("checkpoints")
    assert checkpoints.readers() == [Reader("A", "A", None)]  # the fenced checkpoint changed nothing
    assert [lease.owner for lease in checkpoints.leases()] == ["thief"]


def test_losing_the_lease_inside_a_window_rolls_it_back(store: Store) -> None:
    commit(store, 1, [(b"k%d" % i, b"1") for i in range(5)])

    class LosesItMidWindow(Recorder):
        def on_data_event(self, source: str, key: bytes, old: bytes | None, new: bytes | None) -> None:
            super().on_data_event(source, key, old, new)
            if key == b"k2":
                store.clock.now_ms += 10 * TTL_MS  # type: ignore[attr-defined]
                store.collection("checkpoints").acquire_lease(LEASE_NAME, "thief", 60_000)
                wait_until(lambda: consumer._guard is not None and consumer._guard.token is None, what="loss")

    recorder = LosesItMidWindow()
    consumer = leased(store, recorder)
    assert consumer.run_pending() == 0
    consumer.close()
    assert recorder.events[-1] == ("rollback", b"", "LeaseLost")
    assert ("end_window", b"\0" * 7 + b"\1") not in recorder.events
    assert store.collection("checkpoints").readers() == [Reader("A", "A", None)]


def test_run_pending_of_a_standby_returns_after_one_ttl(store: Store) -> None:
    commit(store, 1, [(b"k", b"1")])
    store.create_collection("checkpoints", manual=True, initial_generation_id=bytes(8))
    store.collection("checkpoints").acquire_lease(LEASE_NAME, "someone else", 60_000)
    recorder = Recorder()
    consumer = leased(store, recorder)
    assert consumer.run_pending() == 0
    consumer.close()
    assert recorder.events == []


def test_a_bad_ttl_is_refused(store: Store) -> None:
    with pytest.raises(InvalidRequest):
        leased(store, Recorder(), lease_ttl_ms=0)


# ------------------------------------------------------------------------- two processes, one kill -9

WORKER = textwrap.dedent(
    """
    import os, sys, time
    from diffstore.client import Client
    from diffstore.consumer import Consumer, WindowListener

    url, log_path, hold_path = sys.argv[1:4]
    pid = str(os.getpid())
    log = open(log_path, "a")

    def say(*parts):
        log.write(" ".join(parts) + "\\n")
        log.flush()  # one write() per line: a kill -9 loses nothing written

    class Copier(WindowListener):
        def __init__(self, client):
            self.out = client.collection("O")

        def on_start_window(self, from_positions):
            say("start", pid, from_positions["A"].hex() or "-")

        def on_data_event(self, source, key, old, new):
            if os.path.exists(hold_path):
                say("holding", pid)
                while os.path.exists(hold_path):
                    time.sleep(0.01)
            self.out.put(key, new)

        def on_end_window(self, to_positions):
            say("end", pid, to_positions["A"].hex())

    with Client(url) as client:
        consumer = Consumer(
            client, ["A"], "cp", Copier(client), lease_ttl_ms=int(sys.argv[4]), workers=2, wait_timeout_ms=500
        )
        say("ready", pid)
        consumer.run()
    """
)


def test_two_consumer_processes_kill_9_of_the_active_one(tmp_path: Path) -> None:
    script, log, hold = tmp_path / "worker.py", tmp_path / "log", tmp_path / "hold"
    script.write_text(WORKER)
    log.touch()
    hold.touch()  # the active consumer blocks inside its first window until killed

    def lines() -> list[list[str]]:
        return [line.split() for line in log.read_text().splitlines()]

    with running_server(tmp_path / "data") as live, live.client() as client:
        client.create_collection("A", manual=True, initial_generation_id=bytes(8))
        client.create_collection("O", manual=False)
        g1 = commit(client, 1, [(b"k%02d" % i, b"v1-%d" % i) for i in range(30)])
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        argv = [sys.executable, str(script), live.url, str(log), str(hold), str(TTL_MS)]
        procs = [subprocess.Popen(argv, env=env) for _ in range(2)]
        try:
            wait_until(
                lambda: len([w for w in lines() if w[0] == "ready"]) == 2, timeout=60, what="both ready"
            )
            wait_until(
                lambda: any(w[0] == "holding" for w in lines()), what="the active one inside its window"
            )
            active = next(w[1] for w in lines() if w[0] == "holding")
            victim = next(p for p in procs if str(p.pid) == active)
            survivor = next(p for p in procs if p is not victim)
            assert {w[1] for w in lines() if w[0] != "ready"} == {active}  # the standby did nothing
            victim.send_signal(signal.SIGKILL)
            victim.wait(DEADLINE_S)
            killed_at = len(lines())
            hold.unlink()
            checkpoint = client.collection("cp")
            wait_until(
                lambda: checkpoint.readers() == [Reader("A", "A", g1)], what="the survivor's first window"
            )
            g2 = commit(client, 2, [(b"k%02d" % i, None if i % 3 else b"v2") for i in range(0, 30, 2)])
            wait_until(
                lambda: checkpoint.readers() == [Reader("A", "A", g2)], what="the survivor's second window"
            )
            output = client.collection("O")
            expected = {r.key: r.value for r in client.collection("A").query()}
            wait_until(lambda: {r.key: r.value for r in output.query()} == expected, what="O equal to A")
        finally:
            for proc in procs:
                if proc.poll() is None:
                    proc.send_signal(signal.SIGKILL)
                    proc.wait(DEADLINE_S)
        after = [w for w in lines()[killed_at:] if w[0] in ("start", "end")]
        assert {w[1] for w in after} == {str(survivor.pid)}
        # the survivor's windows: from the stored checkpoint (nothing: the victim checkpointed nothing),
        # contiguous, each checkpointed exactly once
        assert after == [
            ["start", str(survivor.pid), "-"],
            ["end", str(survivor.pid), g1.hex()],
            ["start", str(survivor.pid), g1.hex()],
            ["end", str(survivor.pid), g2.hex()],
        ]
        assert int.from_bytes(checkpoint.generation_id[:8], "big") == 2
