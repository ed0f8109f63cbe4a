"""The consumer with ``workers`` > 1 over a real store: per-key order, overlap, barrier, rollback and replay.

Concurrency is asserted through events (who entered and left a callback when), never through timing.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from diffstore.consumer import Consumer, Positions, WindowListener
from diffstore.consumer._partitions import partition_of
from diffstore.engine.store import Store
from diffstore.engine.types import Reader, StoreConfig
from diffstore.errors import InvalidRequest, NoSuchCollection
from tests.helpers import wait_until

from .conftest import DEADLINE_S

WORKERS = 4


class Recorder(WindowListener):
    """Records every callback; data callbacks record when they enter and when they leave."""

    def __init__(self) -> None:
        self.events: list[tuple[Any, ...]] = []
        self.lock = threading.Lock()
        self.active = 0
        self.threads: dict[bytes, set[str]] = {}

    def record(self, *event: Any) -> None:
        with self.lock:
            self.events.append(event)

    def on_start_window(self, from_positions: Positions) -> None:
        self.record("start_window", dict(from_positions))

    def on_start_source(self, source: str) -> None:
        self.record("start_source", source)

    def on_data_event(self, source: str, key: bytes, old: bytes | None, new: bytes | None) -> bool | None:
        with self.lock:
            self.active += 1
            self.threads.setdefault(key, set()).add(threading.current_thread().name)
            self.events.append(("enter", source, key))
        try:
            return self.handle(source, key, old, new)
        finally:
            with self.lock:
                self.active -= 1
                self.events.append(("data", source, key, old, new))

    def handle(self, source: str, key: bytes, old: bytes | None, new: bytes | None) -> bool | None:
        return None

    def on_end_source(self, source: str) -> None:
        self.record("end_source", source, self.active)

    def on_end_window(self, to_positions: Positions) -> None:
        self.record("end_window", dict(to_positions))

    def on_rollback(self, from_positions: Positions, error: BaseException | None) -> None:
        self.record("rollback", dict(from_positions), type(error).__name__ if error else None, self.active)

    def data(self) -> list[tuple[Any, ...]]:
        return [e for e in self.events if e[0] == "data"]

    def frame(self) -> list[tuple[Any, ...]]:
        """The events other than data callbacks, in order."""
        return [e for e in self.events if e[0] not in ("data", "enter")]


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    with Store.open(tmp_path / "engine", StoreConfig(commit_delay_ms=10)) as opened:
        yield opened


def commit(backend: Any, name: str, generation_id: bytes, items: list[tuple[bytes, bytes | None]]) -> None:
    collection = backend.collection(name)
    collection.start_generation(generation_id)
    collection.put_many(items, generation_id=generation_id)
    collection.commit_generation(generation_id)


def consumer(
    backend: Any, listener: WindowListener, checkpoint: str = "checkpoints", **options: Any
) -> Consumer:
    options.setdefault("replay_delay_s", 0)
    options.setdefault("workers", WORKERS)
    return Consumer(backend, ["A", "B"], checkpoint, listener, page_limit=7, **options)


def keys_in_partitions(count: int) -> list[bytes]:
    """One key per partition 0..count-1 of ``WORKERS``."""
    found: dict[int, bytes] = {}
    for i in range(1000):
        found.setdefault(partition_of(b"key%d" % i, WORKERS), b"key%d" % i)
    return [found[p] for p in range(count)]


def checkpoint_state(backend: Any) -> tuple[bytes, list[Reader]]:
    checkpoints = backend.collection("checkpoints")
    return checkpoints.generation_id, checkpoints.readers()


def test_parallel_windows_deliver_what_the_serial_consumer_delivers(backend: Any) -> None:
    backend.create_collection("A")
    backend.create_collection("B")
    serial, parallel = Recorder(), Recorder()
    serial_consumer = consumer(backend, serial, "serial", workers=1)
    parallel_consumer = consumer(backend, parallel)
    # 300 keys: more than the pool's capacity, over many pages; the same keys in both sources
    rounds = [
        ("A", b"1", [(b"%03d" % i, b"a1") for i in range(300)]),
        ("B", b"1", [(b"%03d" % i, b"b1") for i in range(0, 300, 3)]),
        ("A", b"2", [(b"%03d" % i, None if i % 2 else b"a2") for i in range(0, 300, 5)]),
    ]
    for name, generation_id, items in rounds:
        commit(backend, name, generation_id, items)
        assert serial_consumer.run_pending() == 1
        assert parallel_consumer.run_pending() == 1
    assert parallel.frame() == [e if e[0] != "end_source" else (*e[:2], 0) for e in serial.frame()]
    assert Counter(parallel.data()) == Counter(serial.data())
    by_key: dict[bytes, list[tuple[Any, ...]]] = {}
    for event in parallel.data():
        by_key.setdefault(event[2], []).append(event)
    serial_by_key: dict[bytes, list[tuple[Any, ...]]] = {}
    for event in serial.data():
        serial_by_key.setdefault(event[2], []).append(event)
    # per key: the same events in the same order (A before B, window after window)
    assert by_key == serial_by_key
    # each key on its partition's worker thread, every time
    assert parallel.threads == {k: {f"diffstore-consumer-{partition_of(k, WORKERS)}"} for k in by_key}
    assert backend.collection("checkpoints").readers() == backend.collection("serial").readers()
    serial_consumer.close()
    parallel_consumer.close()


def test_callbacks_for_keys_of_different_partitions_overlap(store: Store) -> None:
    store.create_collection("A")
    store.create_collection("B")
    first, second = keys_in_partitions(2)
    meet = threading.Barrier(2, timeout=DEADLINE_S)

    class Meeting(Recorder):
        def handle(self, source: str, key: bytes, old: bytes | None, new: bytes | None) -> None:
            if key in (first, second):
                meet.wait()  # passes only when both callbacks run at the same time

    commit(store, "A", b"1", [(first, b"1"), (second, b"2")])
    recorder = Meeting()
    parallel = consumer(store, recorder)
    assert parallel.run_pending() == 1
    order = [e[:3] for e in recorder.events if e[0] in ("enter", "data")]
    # both entered before either left
    assert set(order[:2]) == {("enter", "A", first), ("enter", "A", second)}
    assert "rollback" not in [e[0] for e in recorder.events]
    parallel.close()


def test_the_checkpoint_waits_until_every_partition_finished(store: Store) -> None:
    store.create_collection("A")
    store.create_collection("B")
    slow = keys_in_partitions(1)[0]
    candidates = [b"other%d" % i for i in range(40)]
    others = [k for k in candidates if partition_of(k, WORKERS) != partition_of(slow, WORKERS)]
    release = threading.Event()

    class SlowKey(Recorder):
        def handle(self, source: str, key: bytes, old: bytes | None, new: bytes | None) -> None:
            if key == slow:
                assert release.wait(DEADLINE_S)

    commit(store, "A", b"1", [(slow, b"s")] + [(k, b"o") for k in others])
    recorder = SlowKey()
    parallel = consumer(store, recorder)
    ran: list[int] = []
    thread = threading.Thread(target=lambda: ran.append(parallel.run_pending()), daemon=True)
    thread.start()
    try:
        wait_until(
            lambda: (
                {e[2] for e in recorder.data()} == set(others) and ("enter", "A", slow) in recorder.events
            ),
            what="every other key done while the slow one runs",
        )
        assert ("end_source", "A", 0) not in recorder.events and recorder.active == 1
        assert checkpoint_state(store)[1] == [Reader("A", "A", None), Reader("B", "B", None)]
    finally:
        release.set()
        thread.join(DEADLINE_S)
    assert ran == [1]
    frame = recorder.frame()
    assert frame[frame.index(("start_source", "A")) + 1] == ("end_source", "A", 0)
    slow_done = recorder.events.index(("data", "A", slow, None, b"s"))
    assert slow_done < recorder.events.index(("end_source", "A", 0))
    assert checkpoint_state(store) == (
        (1).to_bytes(8, "big"),
        [Reader("A", "A", b"1"), Reader("B", "B", None)],
    )
    parallel.close()


@pytest.mark.parametrize("how", ["raise", "false"])
def test_a_failure_in_one_partition_rolls_back_and_replays_the_whole_window(backend: Any, how: str) -> None:
    backend.create_collection("A")
    backend.create_collection("B")
    failing = keys_in_partitions(3)[2]
    items = [(b"k%02d" % i, b"v%d" % i) for i in range(40)] + [(failing, b"f")]
    commit(backend, "A", b"1", items)
    commit(backend, "B", b"1", [(b"b", b"1")])

    class FailsOnce(Recorder):
        failed = False

        def handle(self, source: str, key: bytes, old: bytes | None, new: bytes | None) -> bool | None:
            if key == failing and not self.failed:
                self.failed = True
                if how == "raise":
                    raise RuntimeError("partition 2 failed")
                return False
            return None

    recorder = FailsOnce()
    parallel = consumer(backend, recorder)
    assert parallel.run_pending() == 1
    frame = recorder.frame()
    start = {"A": b"", "B": b""}
    rollback = ("rollback", start, "RuntimeError" if how == "raise" else None, 0)  # no callback in flight
    assert frame == [
        ("start_window", start),
        ("start_source", "A"),
        rollback,
        ("start_window", start),
        ("start_source", "A"),
        ("end_source", "A", 0),
        ("start_source", "B"),
        ("end_source", "B", 0),
        ("end_window", {"A": b"1", "B": b"1"}),
    ]
    at = recorder.events.index(rollback)
    first = [e for e in recorder.events[:at] if e[0] == "data"]
    replay = [e for e in recorder.events[at:] if e[0] == "data"]
    expected = {("data", "A", k, None, v) for k, v in items} | {("data", "B", b"b", None, b"1")}
    assert Counter(replay) == Counter(expected)  # the replay delivers every change of the window, once
    assert set(first) <= expected
    # checkpointed once: the checkpoint collection's first generation
    assert checkpoint_state(backend) == (
        (1).to_bytes(8, "big"),
        [Reader("A", "A", b"1"), Reader("B", "B", b"1")],
    )
    assert parallel.run_pending() == 0
    parallel.close()


def test_an_exit_in_a_worker_propagates_and_the_window_is_replayed_next_run(store: Store) -> None:
    store.create_collection("A")
    store.create_collection("B")
    commit(store, "A", b"1", [(b"k%d" % i, b"v") for i in range(20)])

    class ExitsOnce(Recorder):
        exited = False

        def handle(self, source: str, key: bytes, old: bytes | None, new: bytes | None) -> None:
            if key == b"k7" and not self.exited:
                self.exited = True
                raise SystemExit("the worker's callback exits")

    recorder = ExitsOnce()
    parallel = consumer(store, recorder)
    with pytest.raises(SystemExit):
        parallel.run_pending()
    assert [t.name for t in threading.enumerate() if t.name.startswith("diffstore-consumer-")] == []
    assert checkpoint_state(store)[1] == [Reader("A", "A", None), Reader("B", "B", None)]
    recorder.events.clear()
    assert parallel.run_pending() == 1
    assert recorder.frame()[0] == ("rollback", {"A": b"", "B": b""}, "SystemExit", 0)
    assert Counter(e[2] for e in recorder.data()) == Counter(b"k%d" % i for i in range(20))
    assert checkpoint_state(store)[1] == [Reader("A", "A", b"1"), Reader("B", "B", None)]
    parallel.close()


def test_an_interruption_inside_a_window_replays_it_whole(store: Store) -> None:
    """Stopped while fetching a page (not in a callback), the pool drops its queue: the window restarts."""
    store.create_collection("A")
    store.create_collection("B")
    commit(store, "A", b"1", [(b"k%02d" % i, b"v") for i in range(30)])

    class Interrupt(BaseException):
        pass

    recorder = Recorder()
    parallel = consumer(store, recorder)
    fetches = 0
    real_collection = parallel._collection

    def interrupting_collection(name: str) -> Any:
        collection = real_collection(name)
        if name != "A":
            return collection

        class Interrupting:
            def __getattr__(self, attribute: str) -> Any:
                return getattr(collection, attribute)

            def diff_page(self, *args: Any, **kwargs: Any) -> Any:
                nonlocal fetches
                fetches += 1
                if fetches == 3:  # the third page: two pages of events were handed to the workers
                    raise Interrupt()
                return collection.diff_page(*args, **kwargs)

        return Interrupting()

    parallel._collection = interrupting_collection  # type: ignore[method-assign]
    with pytest.raises(Interrupt):
        parallel.run_pending()
    delivered_before = {e[2] for e in recorder.data()}
    assert len(delivered_before) <= 14  # two pages handed over; what was still queued was dropped
    recorder.events.clear()
    assert parallel.run_pending() == 1
    assert recorder.frame()[0] == ("rollback", {"A": b"", "B": b""}, "Interrupt", 0)
    assert Counter(e[2] for e in recorder.data()) == Counter(b"k%02d" % i for i in range(30))
    parallel.close()


def test_a_store_error_in_a_parallel_window_rolls_back_after_the_callbacks_in_flight(store: Store) -> None:
    store.create_collection("A")
    store.create_collection("B")
    commit(store, "A", b"1", [(b"k%d" % i, b"v") for i in range(10)])
    commit(store, "B", b"1", [(b"b", b"v")])

    class DeletesB(Recorder):
        def on_start_source(self, source: str) -> None:
            if source == "B":
                store.delete_collection("B")
            super().on_start_source(source)

    recorder = DeletesB()
    parallel = consumer(store, recorder)
    with pytest.raises(NoSuchCollection):
        parallel.run_pending()
    assert recorder.frame()[-1] == ("rollback", {"A": b"", "B": b""}, "NoSuchCollection", 0)
    parallel.close()


def test_workers_must_be_positive(store: Store) -> None:
    with pytest.raises(InvalidRequest):
        consumer(store, Recorder(), workers=0)
