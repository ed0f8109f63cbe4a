"""The parallel consumer's partition bookkeeping, fed directly: no threads, no store, no clock."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from diffstore.consumer import DataEvent
from diffstore.consumer._partitions import Failure, PartitionMachine, Task, partition_of
from diffstore.errors import InvalidRequest

KEYS = [b"k%d" % i for i in range(8)]


def event(key: bytes, new: bytes = b"v", source: str = "A") -> DataEvent:
    return DataEvent(source, key, None, new)


@settings(max_examples=150, deadline=None)
@given(
    partitions=st.integers(1, 4),
    capacity=st.integers(1, 6),
    events=st.lists(st.tuples(st.sampled_from(KEYS), st.sampled_from(["A", "B"])), max_size=30),
    data=st.data(),
)
def test_any_schedule_keeps_per_key_order_and_one_task_per_partition(
    partitions: int, capacity: int, events: list[tuple[bytes, str]], data: st.DataObject
) -> None:
    """Workers take and finish tasks in any interleaving, some fail: the invariants of the module hold."""
    machine = PartitionMachine(partitions, capacity)
    to_submit = [DataEvent(source, key, None, b"%d" % i) for i, (key, source) in enumerate(events)]
    submitted: list[Task] = []
    in_flight: dict[int, Task] = {}
    finished: list[Task] = []
    failed_at: int | None = None  # how many tasks had been handed out when the window failed
    handed_out = 0
    while to_submit or not machine.settled:
        # the first move always makes progress (a submit, a finish, or a take of a partition with queued
        # tasks): hypothesis falls back to the simplest choice, index 0, when it stops drawing at random,
        # and a no-op first would loop forever
        moves = []
        if to_submit and machine.has_room:
            moves.append("submit")
        moves += [f"done{p}" for p in in_flight]
        started = {t.seq for t in finished} | {t.seq for t in in_flight.values()}
        waiting = set() if failed_at is not None else {t.partition for t in submitted if t.seq not in started}
        moves += [
            f"take{p}" for p in sorted(range(partitions), key=lambda p: p in in_flight or p not in waiting)
        ]
        move = data.draw(st.sampled_from(moves))
        if move == "submit":
            task = machine.submit(to_submit.pop(0))
            if failed_at is not None:
                assert task is None  # a failed window queues nothing more
            else:
                assert task is not None and task.partition == partition_of(task.event.key, partitions)
                submitted.append(task)
        elif move.startswith("take"):
            partition = int(move[4:])
            task = machine.take(partition)
            if partition in in_flight or failed_at is not None:
                assert task is None  # one task per partition at a time; nothing after a failure
            if task is not None:
                assert task.partition == partition
                in_flight[partition] = task
                handed_out += 1
        else:
            task = in_flight.pop(int(move[4:]))
            fail = data.draw(st.booleans()) and data.draw(st.booleans())
            machine.done(task, accepted=not fail, error=ValueError(task.seq) if fail else None)
            finished.append(task)
            if fail and failed_at is None:
                failed_at = handed_out
                assert machine.failure == Failure(task, task_error(machine))
        assert machine.in_flight == len(in_flight)
        if not machine.has_room:
            assert len(submitted) - len(finished) >= capacity or failed_at is not None
    # per key: the finished tasks are a prefix of the submitted ones, in submission order
    for key in KEYS:
        done_seqs = [t.seq for t in finished if t.event.key == key]
        submitted_seqs = [t.seq for t in submitted if t.event.key == key]
        assert done_seqs == submitted_seqs[: len(done_seqs)]
    if failed_at is None:
        assert [t.seq for t in sorted(finished, key=lambda t: t.seq)] == [t.seq for t in submitted]
        assert machine.failure is None
    else:
        assert len(finished) == handed_out  # only what was in flight at the failure finished after it
    machine.reset()
    assert machine.failure is None and machine.settled


def task_error(machine: PartitionMachine) -> BaseException | None:
    assert machine.failure is not None
    return machine.failure.error


def test_a_failure_drops_every_queued_task_and_waits_for_those_in_flight() -> None:
    machine = PartitionMachine(2, 10)
    keys = {partition_of(k, 2): k for k in KEYS}
    first = machine.submit(event(keys[0]))
    second = machine.submit(event(keys[1]))
    machine.submit(event(keys[0], b"later"))
    machine.submit(event(keys[1], b"later"))
    assert first is not None and second is not None
    assert machine.take(0) is first and machine.take(1) is second
    error = RuntimeError("partition 0 failed")
    machine.done(first, accepted=False, error=error)
    assert machine.failure == Failure(first, error)
    assert not machine.settled  # partition 1's callback is still running
    with pytest.raises(RuntimeError):
        machine.reset()
    assert machine.take(0) is None  # its queued task was dropped
    machine.done(second, accepted=True)
    assert machine.settled and machine.take(1) is None
    assert machine.submit(event(keys[1])) is None
    machine.reset()
    assert machine.failure is None
    assert machine.submit(event(keys[1])) == Task(1, 0, event(keys[1]))  # the replay starts afresh


def test_a_callback_answering_false_fails_the_window_without_an_error() -> None:
    machine = PartitionMachine(1, 1)
    task = machine.submit(event(b"k"))
    assert task is not None and not machine.has_room
    with pytest.raises(RuntimeError):
        machine.submit(event(b"j"))
    assert machine.take(0) is task
    machine.done(task, accepted=False)
    assert machine.failure == Failure(task, None)


def test_cancel_fails_the_window_for_the_driver_and_keeps_the_first_failure() -> None:
    machine = PartitionMachine(2, 4)
    task = machine.submit(event(b"k"))
    assert task is not None
    machine.cancel(OSError("fetch failed"))
    assert machine.settled and machine.take(task.partition) is None
    first = machine.failure
    machine.cancel(ValueError("later"))
    assert machine.failure is first


def test_partitions_are_stable_and_spread_and_bad_sizes_are_refused() -> None:
    assert partition_of(b"user:1", 4) == partition_of(b"user:1", 4)
    assert {partition_of(b"%d" % i, 4) for i in range(100)} == {0, 1, 2, 3}
    with pytest.raises(InvalidRequest):
        PartitionMachine(0, 1)
    with pytest.raises(InvalidRequest):
        PartitionMachine(1, 0)
    machine = PartitionMachine(1, 1)
    with pytest.raises(RuntimeError):
        machine.done(Task(0, 0, event(b"k")), accepted=True)
