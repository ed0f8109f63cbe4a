"""``GET /backup``: streams one consistent committed state of the store (SPEC §8), behind the token.

The body is LMDB's compacting copy of the store's data file, as it comes out of one read transaction
(``engine/backup.py``), sent as it is made: a thread writes it into a pipe, the response reads the pipe a
chunk at a time, so neither side holds the copy in memory. The copy is made by a process of its own
(``engine/copier.py``): made in this process, it would hold py-lmdb's lock of the environment, which a
failing write's abort waits for, and every writer of the store would wait behind that write.
``diffstore backup --url`` writes the body into OUT and settles it there (open generations and phantoms
left out), exactly as a backup from the data directory.

Headers: ``X-Diffstore-Backup: lmdb-compact`` (what the body is) and
``X-Diffstore-Backup-Expected-Bytes`` (about its length, for progress; the copy's exact length is only
known at its end, so the body is chunked). A copy that fails midway ends the response without its final
chunk: the client sees a cut-off body, never a short one that looks whole. A copy that cannot start
(LMDB's reader table full, the store unreadable) is an error answer: the first chunk is read before the
answer starts.

No client can hold the store through a backup:

- a stream that sent fewer than ``backup_stall_min_bytes`` in the last ``backup_stall_timeout_s`` seconds
  (a client that stopped reading, or reads a trickle) is ended: its copy process is killed, which lets go
  of the pages its read transaction pins, and the connection is dropped (the client sees the body cut
  off); ``diffstore_backup_streams_stalled`` counts them;
- at most ``backup_max_concurrent`` streams run at once, every worker of the server together (slots of the
  data directory, ``engine/slots.py``); past it the answer is 503 ``overloaded`` with ``Retry-After``.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import fcntl
import logging
import os
import threading
import time
from collections.abc import AsyncIterator
from typing import Any

import anyio
from fastapi import APIRouter, Request
from fastapi.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from diffstore.engine import backup, slots
from diffstore.engine.store import Store
from diffstore.errors import Overloaded, StorageError
from diffstore.server.config import ServerConfig
from diffstore.server.longpoll import RAW_SEND
from diffstore.server.metrics import ServerMetrics
from diffstore.server.routing import declare
from diffstore.server.scopes import TokenScope
from diffstore.server.uvicorn_adapter import abort_connection

router = APIRouter(tags=["backup"])

FORMAT = "lmdb-compact"
FORMAT_HEADER = "X-Diffstore-Backup"
EXPECTED_BYTES_HEADER = "X-Diffstore-Backup-Expected-Bytes"
SLOT_KIND = "backup-stream"
START_S = 10.0  # what a copy's process may take to start, beyond the stall timeout, before its first bytes
_CHUNK = 1 << 20
_PIPE_BYTES = 1 << 20
_log = logging.getLogger("diffstore.server")


class _Copy:
    """One stream's copy: its process writes into a pipe from a thread; the response reads the pipe."""

    def __init__(self, store: Store, slot: slots.Slot) -> None:
        self.store = store
        self.slot = slot
        self.reading, self._writing = os.pipe()
        with contextlib.suppress(OSError):  # past the system's pipe limit the default size works too
            fcntl.fcntl(self._writing, fcntl.F_SETPIPE_SZ, _PIPE_BYTES)  # fewer, larger hand-offs
        self.stop = threading.Event()
        self.failures: list[BaseException] = []
        self.sent = 0  # bytes the client's connection took
        self.worker = threading.Thread(target=self._copy, name="diffstore-backup-stream", daemon=True)
        self._closed = False

    def _copy(self) -> None:
        try:
            backup.stream_to(self.store, self._writing, self.stop)  # closes ``_writing``
        except BaseException as exc:  # a failed copy must end the body cut off, not whole-looking
            self.failures.append(exc)

    async def read(self) -> bytes:
        """The next chunk of the copy; b"" at its end. Raises the copy's failure at its end."""
        chunk = await anyio.to_thread.run_sync(os.read, self.reading, _CHUNK)
        if not chunk:
            await anyio.to_thread.run_sync(self.worker.join)
            if self.failures:
                raise self.failures[0]
        return chunk

    async def close(self) -> None:
        """Ends the copy if it still runs (its next write fails; one that does not notice is killed),
        waits for it, and lets go of the slot. A later call is a no-op."""
        if self._closed:
            return
        self._closed = True
        if self.worker.ident is None:  # never started: the pipe's write end is still ours
            os.close(self._writing)
        os.close(self.reading)
        self.stop.set()
        with anyio.CancelScope(shield=True):
            if self.worker.ident:
                await anyio.to_thread.run_sync(self.worker.join)
        self.slot.release()


class Stall:
    """Whether a stream sent fewer than ``min_bytes`` in the last ``timeout_s`` seconds."""

    def __init__(self, timeout_s: float, min_bytes: int, started: float) -> None:
        self.timeout_s = timeout_s
        self.min_bytes = min_bytes
        self.tick_s = min(1.0, timeout_s / 4)
        self.samples: collections.deque[tuple[float, int]] = collections.deque([(started, 0)])

    def stalled(self, sent: int, now: float) -> bool:
        """Whether the stream, ``sent`` bytes in all at ``now``, stalled (call it every ``tick_s``)."""
        self.samples.append((now, sent))
        # keep the newest sample at least ``timeout_s`` old: the window's start
        while len(self.samples) > 1 and self.samples[1][0] <= now - self.timeout_s:
            self.samples.popleft()
        then, sent_then = self.samples[0]
        return then <= now - self.timeout_s and sent - sent_then < self.min_bytes


class _BackupResponse(StreamingResponse):
    """The copy as a chunked body, ended by the server when it stalls (see the module docstring)."""

    def __init__(
        self, copy: _Copy, first: bytes, headers: dict[str, str], config: ServerConfig, metrics: ServerMetrics
    ) -> None:
        self.copy = copy
        self.config = config
        self.metrics = metrics
        self.stalled = False
        super().__init__(self._body(first), media_type="application/octet-stream", headers=headers)

    async def _body(self, first: bytes) -> AsyncIterator[bytes]:
        chunk = first
        while chunk:
            yield chunk
            self.copy.sent += len(chunk)
            chunk = await self.copy.read()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        task = asyncio.current_task()
        assert task is not None
        watcher = None
        if self.config.backup_stall_timeout_s > 0:
            stall = Stall(
                self.config.backup_stall_timeout_s, self.config.backup_stall_min_bytes, time.monotonic()
            )
            watcher = asyncio.get_running_loop().create_task(self._watch(stall, scope, task))
        self.metrics.backup_streams.inc()
        try:
            await super().__call__(scope, receive, send)
        except BaseException:
            if not self.stalled:
                raise
            if isinstance(task, asyncio.Task) and task.cancelling():  # we cancelled it: it is over
                task.uncancel()
        finally:
            if watcher is not None:
                watcher.cancel()
            await self.copy.close()
            self.metrics.backup_streams.dec()

    async def _watch(self, stall: Stall, scope: Scope, task: asyncio.Task[Any]) -> None:
        while True:
            await asyncio.sleep(stall.tick_s)
            if stall.stalled(self.copy.sent, time.monotonic()):
                break
        self.stalled = True
        self.metrics.backup_streams_stalled.inc()
        _log.warning(
            "GET /backup: ended a stream that sent %d bytes in the last %gs (fewer than %d): its client"
            " stopped reading (or its copy did)",
            self.copy.sent - stall.samples[0][1],
            stall.timeout_s,
            stall.min_bytes,
        )
        self.copy.stop.set()  # the copy's process ends at once: the pages it pins are free again
        if not abort_connection(scope.get(RAW_SEND)):
            task.cancel()  # another server: end the response by cancelling it


@router.get(
    "/backup",
    summary="Stream one consistent committed state of the store (see diffstore backup --url)",
    openapi_extra={"x-diffstore-scope": "admin"},
    response_class=StreamingResponse,
    responses={
        200: {
            "description": "LMDB's compacting copy of the store, chunked",
            "content": {"application/octet-stream": {"schema": {"type": "string", "format": "binary"}}},
        },
        503: {
            "description": "overloaded: the cap of concurrent backups (--backup-max-concurrent) is reached"
        },
    },
)
@declare(TokenScope.ADMIN, audit="backup")
async def get_backup(request: Request) -> StreamingResponse:
    store: Store = request.app.state.store
    config: ServerConfig = request.app.state.config
    metrics: ServerMetrics = request.app.state.metrics
    cap = config.backup_max_concurrent
    slot = await anyio.to_thread.run_sync(slots.take, store.path, SLOT_KIND, cap)
    if slot is None:
        metrics.backup_streams_refused.inc()
        raise Overloaded(
            f"{cap} backup stream{'s' if cap > 1 else ''} already running (the server's"
            " --backup-max-concurrent): retry when one is done"
        )
    copy = _Copy(store, slot)
    try:
        expected = await anyio.to_thread.run_sync(backup.expected_bytes, store)
        copy.worker.start()
        # a copy that cannot start is an error answer, not a cut-off body; one that hangs before its first
        # bytes is stopped as a stream that stalls would be (allowing for a process start on a busy machine)
        deadline = None
        if config.backup_stall_timeout_s > 0:
            deadline = threading.Timer(START_S + config.backup_stall_timeout_s, copy.stop.set)
            deadline.daemon = True
            deadline.start()
        try:
            first = await copy.read()
        except StorageError as exc:
            if deadline is not None and copy.stop.is_set():
                raise Overloaded(
                    f"the backup's copy gave nothing within {START_S + config.backup_stall_timeout_s:g} s"
                    " (the server's --backup-stall-timeout-s, and time to start): retry later"
                ) from exc
            raise
        finally:
            if deadline is not None:
                deadline.cancel()
    except BaseException:
        await copy.close()
        raise
    headers = {FORMAT_HEADER: FORMAT, EXPECTED_BYTES_HEADER: str(expected)}
    return _BackupResponse(copy, first, headers, config, metrics)


router.add_api_route("/backup/", get_backup, methods=["GET"], include_in_schema=False)  # the slash twin
