"""The Databus-style consumer over the HTTP client and over an embedded engine Store."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from diffstore.consumer import Consumer, ConsumerStalled, Positions, WindowListener
from diffstore.engine.types import Reader
from diffstore.errors import NoSuchCollection
from tests.helpers import wait_until

from .conftest import DEADLINE_S


class Recorder(WindowListener):
    """Records every callback; fails once on a chosen event when asked to."""

    def __init__(self, fail_on: tuple[Any, ...] | None = None, how: str = "raise") -> None:
        self.events: list[tuple[Any, ...]] = []
        self.fail_on = fail_on
        self.how = how
        self.lock = threading.Lock()

    def _record(self, event: tuple[Any, ...]) -> bool:
        with self.lock:
            self.events.append(event)
        if event == self.fail_on:
            self.fail_on = None
            if self.how == "raise":
                raise RuntimeError("listener failed")
            if self.how == "crash":
                raise SystemExit("the process dies")
            return False
        return True

    def on_start_window(self, from_positions: Positions) -> bool:
        return self._record(("start_window", dict(from_positions)))

    def on_start_source(self, source: str) -> bool:
        return self._record(("start_source", source))

    def on_data_event(self, source: str, key: bytes, old: bytes | None, new: bytes | None) -> bool:
        return self._record(("data", source, key, old, new))

    def on_end_source(self, source: str) -> bool:
        return self._record(("end_source", source))

    def on_end_window(self, to_positions: Positions) -> bool:
        return self._record(("end_window", dict(to_positions)))

    def on_rollback(self, from_positions: Positions, error: BaseException | None) -> None:
        self.events.append(("rollback", dict(from_positions), type(error).__name__ if error else None))


def window(
    start: dict[str, bytes],
    data: dict[str, list[tuple[bytes, bytes | None, bytes | None]]],
    end: dict[str, bytes],
) -> list:
    events: list[tuple[Any, ...]] = [("start_window", start)]
    for source in ("A", "B"):
        events.append(("start_source", source))
        events.extend(("data", source, *item) for item in data.get(source, []))
        events.append(("end_source", source))
    return events + [("end_window", end)]


def commit(backend: Any, name: str, generation_id: bytes, items: list[tuple[bytes, bytes | None]]) -> None:
    collection = backend.collection(name)
    collection.start_generation(generation_id)
    collection.put_many(items, generation_id=generation_id)
    collection.commit_generation(generation_id)


def make_consumer(backend: Any, listener: WindowListener, **options: Any) -> Consumer:
    options.setdefault("replay_delay_s", 0)
    return Consumer(backend, ["A", "B"], "checkpoints", listener, page_limit=1, **options)


@pytest.fixture
def sources(backend: Any) -> Any:
    backend.create_collection("A")
    backend.create_collection("B")
    commit(backend, "A", b"1", [(b"a1", b"x"), (b"a2", b"y")])
    commit(backend, "B", b"1", [(b"b1", b"z")])
    return backend


FIRST = window(
    {"A": b"", "B": b""},
    {"A": [(b"a1", None, b"x"), (b"a2", None, b"y")], "B": [(b"b1", None, b"z")]},
    {"A": b"1", "B": b"1"},
)


def test_windows_in_order_across_two_sources(sources: Any) -> None:
    recorder = Recorder()
    consumer = make_consumer(sources, recorder)
    assert consumer.run_pending() == 1
    assert recorder.events == FIRST
    checkpoint = sources.collection("checkpoints")
    assert checkpoint.readers() == [Reader("A", "A", b"1"), Reader("B", "B", b"1")]
    commit(sources, "A", b"2", [(b"a1", b"x2"), (b"a2", None)])
    recorder.events.clear()
    assert consumer.run_pending() == 1
    assert recorder.events == window(
        {"A": b"1", "B": b"1"}, {"A": [(b"a1", b"x", b"x2"), (b"a2", b"y", None)]}, {"A": b"2", "B": b"1"}
    )
    assert consumer.run_pending() == 0
    consumer.close()


@pytest.mark.parametrize(
    ("fail_on", "how"),
    [(("data", "A", b"a2", None, b"y"), "raise"), (("end_window", {"A": b"1", "B": b"1"}), "false")],
)
def test_a_failing_callback_rolls_back_and_replays_the_window(sources: Any, fail_on: tuple, how: str) -> None:
    recorder = Recorder(fail_on, how)
    consumer = make_consumer(sources, recorder)
    assert consumer.run_pending() == 1
    failed_at = FIRST.index(fail_on) + 1
    error = "RuntimeError" if how == "raise" else None
    assert recorder.events == FIRST[:failed_at] + [("rollback", {"A": b"", "B": b""}, error)] + FIRST
    assert sources.collection("checkpoints").readers() == [Reader("A", "A", b"1"), Reader("B", "B", b"1")]
    consumer.close()


def test_a_restart_resumes_from_the_checkpoint(sources: Any) -> None:
    first = make_consumer(sources, Recorder())
    assert first.run_pending() == 1
    first.close()
    commit(sources, "B", b"2", [(b"b2", b"w")])
    crashing = Recorder(("end_window", {"A": b"1", "B": b"2"}), "crash")
    with pytest.raises(SystemExit):
        make_consumer(sources, crashing).run_pending()  # delivered, never checkpointed
    recorder = Recorder()
    restarted = make_consumer(sources, recorder)
    assert restarted.run_pending() == 1
    assert recorder.events == window(
        {"A": b"1", "B": b"1"}, {"B": [(b"b2", None, b"w")]}, {"A": b"1", "B": b"2"}
    )
    restarted.close()


def test_a_second_consumer_on_the_same_checkpoint_loses_the_compare_and_set(sources: Any) -> None:
    winner = make_consumer(sources, Recorder())

    class RaceInsideTheWindow(Recorder):
        def on_end_window(self, to_positions: Positions) -> bool:
            assert winner.run_pending() == 1  # the other consumer checkpoints this very window first
            return super().on_end_window(to_positions)

    loser_listener = RaceInsideTheWindow()
    loser = make_consumer(sources, loser_listener)
    assert loser.run_pending() == 0
    assert loser_listener.events == FIRST
    assert sources.collection("checkpoints").readers() == [Reader("A", "A", b"1"), Reader("B", "B", b"1")]
    winner.close()
    loser.close()


def test_a_caught_up_consumer_waits_for_commits(sources: Any) -> None:
    recorder = Recorder()
    consumer = make_consumer(sources, recorder, wait_timeout_ms=200)
    stop = threading.Event()
    thread = threading.Thread(target=consumer.run, args=(stop,), daemon=True)
    thread.start()
    try:
        wait_until(lambda: recorder.events[-1:] == [FIRST[-1]], what="the first window")
        commit(sources, "B", b"2", [(b"b1", None)])
        wait_until(
            lambda: recorder.events[-1:] == [("end_window", {"A": b"1", "B": b"2"})],
            what="the second window",
        )
    finally:
        stop.set()
        thread.join(DEADLINE_S)
    assert not thread.is_alive()
    consumer.close()


def test_a_window_that_keeps_failing_stalls_the_consumer(sources: Any) -> None:
    class AlwaysFailing(Recorder):
        def on_end_source(self, source: str) -> bool:
            raise RuntimeError("broken listener")

    consumer = make_consumer(sources, AlwaysFailing(), max_rollbacks=3)
    with pytest.raises(ConsumerStalled) as stalled:
        consumer.run_pending()
    assert isinstance(stalled.value.__cause__, RuntimeError)
    assert sources.collection("checkpoints").readers() == [Reader("A", "A", None), Reader("B", "B", None)]
    consumer.close()


def test_a_store_error_inside_a_window_rolls_back_and_propagates(sources: Any) -> None:
    class DeletesB(Recorder):
        def on_start_source(self, source: str) -> bool:
            if source == "B":
                sources.delete_collection("B")
            return super().on_start_source(source)

    recorder = DeletesB()
    consumer = make_consumer(sources, recorder)
    with pytest.raises(NoSuchCollection):
        consumer.run_pending()
    assert recorder.events[-2:] == [
        ("start_source", "B"),
        ("rollback", {"A": b"", "B": b""}, "NoSuchCollection"),
    ]
    assert Reader("A", "A", None) in sources.collection("checkpoints").readers()
    consumer.close()
