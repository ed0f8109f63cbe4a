"""Run a producer of batches one step ahead of its consumer, in a thread.

A Spark task that pages through the HTTP API otherwise alternates: the server works while the task
waits, then the task decodes while the server idles. Fetching the next page while Spark consumes the
current one keeps both busy. The queue is bounded, so memory stays at ``depth`` batches.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator
from typing import TypeVar

T = TypeVar("T")

_DONE = object()


class _Failure:
    __slots__ = ("error",)

    def __init__(self, error: BaseException) -> None:
        self.error = error


def ahead(source: Iterator[T], depth: int = 2) -> Iterator[T]:
    """Yields what ``source`` yields, produced by a background thread up to ``depth`` items ahead.

    An exception raised by ``source`` is re-raised here, at the point the consumer reaches it. If the
    consumer stops early, the producer is told to stop at its next item.
    """
    items: queue.Queue[object] = queue.Queue(maxsize=depth)
    stop = threading.Event()

    def produce() -> None:
        try:
            for item in source:
                while not stop.is_set():
                    try:
                        items.put(item, timeout=0.1)
                        break
                    except queue.Full:
                        continue
                if stop.is_set():
                    return
            items.put(_DONE)
        except BaseException as exc:  # noqa: BLE001 - handed over to the consumer, which re-raises it
            items.put(_Failure(exc))

    thread = threading.Thread(target=produce, name="diffstore-prefetch", daemon=True)
    thread.start()
    try:
        while True:
            item = items.get()
            if item is _DONE:
                return
            if isinstance(item, _Failure):
                raise item.error
            yield item  # type: ignore[misc]
    finally:
        stop.set()
