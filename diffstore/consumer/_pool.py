"""The worker threads of a parallel consumer: they only move tasks of :class:`PartitionMachine` to callbacks.

One thread per partition; every decision (which task, in which order, when a window failed, when the
barrier is reached) is the machine's, made under one lock. Threads suit the callbacks this is for --
I/O-bound ones (an index update over the network, a database write) release the GIL while they wait; a
CPU-bound callback gains nothing from ``workers``.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from diffstore.consumer._partitions import Failure, PartitionMachine, Task
from diffstore.consumer._window import DataEvent

DataCallback = Callable[[DataEvent], "bool | None"]


class WorkerPool:
    """``workers`` threads delivering data events to ``callback``, partitioned by key.

    Args:
        workers: the number of partitions and threads.
        callback: called with each event on its partition's thread; raising or returning ``False``
            fails the window.
        capacity: tasks queued or in flight at most (the driver waits for room).
    """

    def __init__(self, workers: int, callback: DataCallback, capacity: int) -> None:
        self.machine = PartitionMachine(workers, capacity)
        self._callback = callback
        self._changed = threading.Condition()
        self._closing = False
        self._threads = [
            threading.Thread(target=self._work, args=(i,), name=f"diffstore-consumer-{i}", daemon=True)
            for i in range(workers)
        ]
        for thread in self._threads:
            thread.start()

    def submit(self, event: DataEvent) -> bool:
        """Queues ``event`` once there is room; False when the window already failed (nothing queued)."""
        with self._changed:
            while not self.machine.has_room and self.machine.failure is None:
                self._changed.wait()
            task = self.machine.submit(event)
            self._changed.notify_all()
        return task is not None

    def settle(self) -> Failure | None:
        """The barrier: waits until nothing is queued or in flight; the window's failure, if any."""
        with self._changed:
            while not self.machine.settled:
                self._changed.wait()
            return self.machine.failure

    def roll_back(self, error: BaseException | None) -> None:
        """Drops what is queued, waits for the callbacks in flight, and readies the pool for the replay."""
        with self._changed:
            self.machine.cancel(error)
            while not self.machine.settled:
                self._changed.wait()
            self.machine.reset()

    def close(self) -> None:
        """Drops what is queued, lets the callbacks in flight finish and stops the threads."""
        with self._changed:
            self.machine.cancel()
            self._closing = True
            self._changed.notify_all()
        for thread in self._threads:
            thread.join()

    def _work(self, partition: int) -> None:
        while True:
            with self._changed:
                task: Task | None = None
                while not self._closing and (task := self.machine.take(partition)) is None:
                    self._changed.wait()
                if task is None:
                    return
            try:
                accepted = self._callback(task.event) is not False
                error: BaseException | None = None
            except BaseException as exc:  # reported to the driver, which rolls back (and re-raises an exit)
                accepted, error = False, exc
            with self._changed:
                self.machine.done(task, accepted, error)
                self._changed.notify_all()
