"""Parallel delivery of one window's data events, partitioned by key: pure bookkeeping (no threads, no I/O).

A consumer with ``workers=N`` hands each :class:`~diffstore.consumer.DataEvent` to :class:`PartitionMachine`
instead of calling the listener itself; N worker threads (in :mod:`diffstore.consumer._pool`) ask the
machine for their partition's next task and report its outcome. The machine decides everything that
matters for correctness, so it is tested without threads:

Invariants:
    * **Partitioning**: a key always maps to the same partition, ``crc32(key) % N`` (stable across
      processes and runs, unlike ``hash``), whatever its source -- so one key's events are always handled
      by the same worker, one after the other.
    * **Per-key order**: a partition's tasks are handed out in submission order, one at a time: its next
      task is handed out only after the previous one was reported done. Callbacks for one key never
      overlap and run in the order the window delivers them; callbacks for keys of different partitions
      may run at the same time.
    * **Barrier**: the driver calls the window's other callbacks (``on_end_source``, ``on_end_window``) and
      writes the checkpoint only when the machine is :attr:`~PartitionMachine.settled` -- nothing queued,
      nothing in flight -- and :attr:`~PartitionMachine.failure` is ``None``.
    * **Failure means replay**: the first task that raises or answers ``False`` fails the whole window:
      every queued task of every partition is dropped (never handed out), tasks in flight finish, and once
      settled the driver rolls the window back (the same window is then replayed from its ``from``). Only
      the first failure is kept. :meth:`cancel` drops the queue the same way when the driver itself must
      roll back (a fetch failed).
    * **Bounded memory**: :attr:`has_room` is False while ``capacity`` tasks are queued or in flight; the
      driver waits before submitting more (a fetch of the next diff page waits with it).
"""

from __future__ import annotations

import zlib
from collections import deque
from dataclasses import dataclass

from diffstore.consumer._window import DataEvent
from diffstore.errors import InvalidRequest


@dataclass(frozen=True, slots=True)
class Task:
    """One data event handed to the worker of ``partition``; ``seq`` counts submissions since the reset."""

    partition: int
    seq: int
    event: DataEvent


@dataclass(frozen=True, slots=True)
class Failure:
    """Why a window must be rolled back: the callback's exception, or ``None`` when it answered ``False``."""

    task: Task | None
    error: BaseException | None


def partition_of(key: bytes, partitions: int) -> int:
    """The partition of ``key`` among ``partitions`` (``crc32``: stable across processes)."""
    return zlib.crc32(key) % partitions


class PartitionMachine:
    """Queues, per-key order, the barrier and the failure decision of a parallel window (see the module doc).

    Args:
        partitions: how many workers (>= 1).
        capacity: how many tasks may be queued or in flight at once (>= 1).
    """

    def __init__(self, partitions: int, capacity: int) -> None:
        if partitions < 1 or capacity < 1:
            raise InvalidRequest("partitions and capacity must be positive")
        self.partitions = partitions
        self.capacity = capacity
        self._queues: list[deque[Task]] = [deque() for _ in range(partitions)]
        self._in_flight: list[Task | None] = [None] * partitions
        self._pending = 0
        self._seq = 0
        self.failure: Failure | None = None

    @property
    def has_room(self) -> bool:
        return self._pending < self.capacity

    @property
    def settled(self) -> bool:
        """Nothing queued and nothing in flight: the barrier is reached."""
        return self._pending == 0

    @property
    def in_flight(self) -> int:
        return sum(task is not None for task in self._in_flight)

    def submit(self, event: DataEvent) -> Task | None:
        """Queues ``event`` on its key's partition.

        Returns:
            The queued task; ``None`` when the window already failed (the event is dropped: the window
            will be replayed).

        Raises:
            RuntimeError: no room (the driver must wait for :attr:`has_room`).
        """
        if self.failure is not None:
            return None
        if not self.has_room:
            raise RuntimeError("submit without room")
        task = Task(partition_of(event.key, self.partitions), self._seq, event)
        self._seq += 1
        self._queues[task.partition].append(task)
        self._pending += 1
        return task

    def take(self, partition: int) -> Task | None:
        """The next task of ``partition``; ``None`` when its queue is empty or its last task is in flight."""
        if self._in_flight[partition] is not None or not self._queues[partition]:
            return None
        task = self._queues[partition].popleft()
        self._in_flight[partition] = task
        return task

    def done(self, task: Task, accepted: bool, error: BaseException | None = None) -> None:
        """``task``'s callback returned (``accepted`` False: it answered ``False`` or raised ``error``)."""
        if self._in_flight[task.partition] is not task:
            raise RuntimeError(f"task {task.seq} is not in flight on partition {task.partition}")
        self._in_flight[task.partition] = None
        self._pending -= 1
        if not accepted and self.failure is None:
            self.failure = Failure(task, error)
            self._drop_queued()

    def cancel(self, error: BaseException | None = None) -> None:
        """The driver rolls the window back: drop every queued task (tasks in flight still finish)."""
        if self.failure is None:
            self.failure = Failure(None, error)
        self._drop_queued()

    def reset(self) -> None:
        """Ready for the next window (or its replay); only once settled."""
        if not self.settled:
            raise RuntimeError("reset before the partitions settled")
        self.failure = None
        self._seq = 0

    def _drop_queued(self) -> None:
        for queue in self._queues:
            self._pending -= len(queue)
            queue.clear()
