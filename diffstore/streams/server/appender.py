"""Group commit of Append calls: concurrent appends share one LMDB transaction (one fsync), written on a
dedicated thread so that the event loop keeps serving while the disk syncs.

While a group is being written, new appends gather into the next group; a client that awaits each append
before sending the next keeps its own order, and the batch ids of one group follow the order of arrival.
"""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor

from .errors import StreamServerError
from .store import AppendItem, StreamStore


class GroupAppender:
    """Coalesces the Append calls that arrive while a write is in progress."""

    def __init__(self, store: StreamStore) -> None:
        self._store = store
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="hstream-append")
        self._pending: list[tuple[AppendItem, asyncio.Future[int]]] = []
        self._writing = False

    async def append(self, item: AppendItem) -> int:
        """Stores one batch and returns its batch id (raises the item's ResourceNotFound, or StorageError)."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[int] = loop.create_future()
        self._pending.append((item, future))
        if not self._writing:
            self._writing = True
            loop.create_task(self._drain())
        return await future

    async def _drain(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            while self._pending:
                group, self._pending = self._pending, []
                try:
                    results = await loop.run_in_executor(
                        self._executor, self._store.append_many, [item for item, _ in group]
                    )
                except Exception as exc:  # StorageError: every call of the group fails with it
                    for _, future in group:
                        if not future.done():
                            future.set_exception(exc)
                    continue
                for (_, future), result in zip(group, results, strict=True):
                    if future.done():
                        continue
                    if isinstance(result, StreamServerError):
                        future.set_exception(result)
                    else:
                        future.set_result(result)
        finally:
            self._writing = False

    def close(self) -> None:
        """Waits for the write in progress and stops the writer thread."""
        self._executor.shutdown(wait=True)
