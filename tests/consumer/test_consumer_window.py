"""The consumer's window state machine, fed outcomes directly: no store, no sockets, no clock."""

from __future__ import annotations

import pytest

from diffstore.consumer import (
    DataEvent,
    EndSource,
    EndWindow,
    Rollback,
    StartSource,
    StartWindow,
    WindowMachine,
)
from diffstore.consumer._window import (
    Deliver,
    FetchPage,
    LoadCheckpoint,
    ProtocolViolation,
    ReadHeads,
    WaitForChange,
    WriteCheckpoint,
)
from diffstore.engine.types import DiffItem, DiffPage
from diffstore.errors import InvalidRequest, StorageError


def accept_until_checkpoint(machine: WindowMachine, pages: dict[tuple[str, str | None], DiffPage]) -> list:
    """Accepts every event and answers fetches from ``pages``; returns the events up to the checkpoint."""
    events = []
    while True:
        action = machine.next_action()
        if isinstance(action, Deliver):
            events.append(action.event)
            machine.delivered(True)
        elif isinstance(action, FetchPage):
            machine.page_received(pages[(action.source, action.cursor)])
        else:
            return events + [action]


def test_a_window_delivers_sources_in_order_then_asks_for_the_checkpoint() -> None:
    machine = WindowMachine(["A", "B"])
    assert machine.next_action() == LoadCheckpoint()
    machine.checkpoint_loaded({"A": None, "B": b"1"})
    assert machine.next_action() == ReadHeads()
    machine.heads_read({"A": b"2", "B": b"3"})
    pages = {
        ("A", None): DiffPage(b"", b"2", [DiffItem(b"a1", None, b"x")], "c1"),
        ("A", "c1"): DiffPage(b"", b"2", [DiffItem(b"a2", b"y", None)], None),
        ("B", None): DiffPage(b"1", b"3", [DiffItem(b"b1", b"p", b"q")], None),
    }
    events = accept_until_checkpoint(machine, pages)
    assert events == [
        StartWindow({"A": b"", "B": b"1"}),
        StartSource("A"),
        DataEvent("A", b"a1", None, b"x"),
        DataEvent("A", b"a2", b"y", None),
        EndSource("A"),
        StartSource("B"),
        DataEvent("B", b"b1", b"p", b"q"),
        EndSource("B"),
        EndWindow({"A": b"2", "B": b"3"}),
        WriteCheckpoint({"A": None, "B": b"1"}, {"A": b"2", "B": b"3"}),
    ]
    machine.checkpoint_written()
    assert machine.next_action() == ReadHeads()
    machine.heads_read({"A": b"2", "B": b"3"})
    assert machine.next_action() == WaitForChange({"A": b"2", "B": b"3"})


def test_a_source_without_news_is_not_fetched_and_a_split_range_ends_the_window_early() -> None:
    machine = WindowMachine(["A", "B"])
    machine.checkpoint_loaded({"A": b"5", "B": b"1"})
    machine.heads_read({"A": b"5", "B": b"9"})
    pages = {("B", None): DiffPage(b"1", b"4", [DiffItem(b"k", None, b"v")], None)}
    events = accept_until_checkpoint(machine, pages)
    assert events[-2:] == [
        EndWindow({"A": b"5", "B": b"4"}),
        WriteCheckpoint({"A": b"5", "B": b"1"}, {"A": b"5", "B": b"4"}),
    ]
    machine.checkpoint_written()
    machine.heads_read({"A": b"5", "B": b"9"})
    assert machine.next_action() == Deliver(StartWindow({"A": b"5", "B": b"4"}))


@pytest.mark.parametrize("reject_at", range(6))
def test_a_rejected_event_rolls_back_and_replays_the_same_window(reject_at: int) -> None:
    machine = WindowMachine(["A"])
    machine.checkpoint_loaded({"A": b"1"})
    machine.heads_read({"A": b"3"})
    pages = {
        ("A", None): DiffPage(b"1", b"3", [DiffItem(b"k1", None, b"1"), DiffItem(b"k2", None, b"2")], None)
    }
    first: list = []
    error = ValueError("boom")
    while len(first) <= reject_at:
        action = machine.next_action()
        if isinstance(action, FetchPage):
            machine.page_received(pages[(action.source, action.cursor)])
            continue
        first.append(action.event)
        machine.delivered(len(first) <= reject_at, None if len(first) <= reject_at else error)
    assert machine.next_action() == Deliver(Rollback({"A": b"1"}, error))
    machine.delivered(True)
    assert machine.consecutive_rollbacks == 1
    replay = accept_until_checkpoint(machine, pages)
    assert replay[: len(first)] == first
    assert replay[-1] == WriteCheckpoint({"A": b"1"}, {"A": b"3"})
    machine.checkpoint_written()
    assert machine.consecutive_rollbacks == 0


def test_an_io_failure_rolls_back_and_reloads_the_checkpoint() -> None:
    machine = WindowMachine(["A"])
    machine.checkpoint_loaded({"A": None})
    machine.heads_read({"A": b"3"})
    machine.delivered(True)  # StartWindow
    machine.delivered(True)  # StartSource
    assert isinstance(machine.next_action(), FetchPage)
    error = StorageError("down")
    machine.failed(error)
    assert machine.next_action() == Deliver(Rollback({"A": b""}, error))
    machine.delivered(True)
    assert machine.next_action() == LoadCheckpoint()


def test_a_rejected_checkpoint_reloads_it() -> None:
    machine = WindowMachine(["A"])
    machine.checkpoint_loaded({"A": None})
    machine.heads_read({"A": b"3"})
    events = accept_until_checkpoint(machine, {("A", None): DiffPage(b"", b"3", [], None)})
    assert isinstance(events[-1], WriteCheckpoint)
    machine.checkpoint_rejected()
    assert machine.next_action() == LoadCheckpoint()


def test_outcomes_out_of_turn_and_bad_sources_are_refused() -> None:
    machine = WindowMachine(["A"])
    with pytest.raises(ProtocolViolation):
        machine.heads_read({"A": b""})
    with pytest.raises(ProtocolViolation):
        machine.checkpoint_written()
    with pytest.raises(InvalidRequest):
        WindowMachine(["A", "A"])
    with pytest.raises(InvalidRequest):
        WindowMachine([])


def test_an_abandoned_window_rolls_back_and_reloads_but_only_inside_a_window() -> None:
    machine = WindowMachine(["A"])
    machine.checkpoint_loaded({"A": None})
    machine.heads_read({"A": b"3"})
    interrupt = KeyboardInterrupt()
    machine.abandon(interrupt)  # StartWindow not delivered yet: nothing to roll back
    assert machine.next_action() == Deliver(StartWindow({"A": b""}))
    machine.delivered(True)
    machine.delivered(True)  # StartSource
    assert isinstance(machine.next_action(), FetchPage)
    machine.abandon(interrupt)
    assert machine.next_action() == Deliver(Rollback({"A": b""}, interrupt))
    machine.abandon(interrupt)  # already rolling back
    machine.delivered(True)
    assert machine.next_action() == LoadCheckpoint()
