"""``GET /backup``: streams one consistent committed state of the store (SPEC §8), behind the token.

The body is LMDB's compacting copy of the store's data file, as it comes out of one read transaction
(``engine/backup.py``), sent as it is made: a thread writes it into a pipe, the response reads the pipe a
chunk at a time, so neither side holds the copy in memory and the writer of the store never waits for it.
``diffstore backup --url`` writes the body into OUT and settles it there (open generations and phantoms
left out), exactly as a backup from the data directory.

Headers: ``X-Diffstore-Backup: lmdb-compact`` (what the body is) and
``X-Diffstore-Backup-Expected-Bytes`` (about its length, for progress; the copy's exact length is only
known at its end, so the body is chunked). A copy that fails midway ends the response without its final
chunk: the client sees a cut-off body, never a short one that looks whole.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import threading
from collections.abc import AsyncIterator

import anyio
from fastapi import APIRouter, Request
from fastapi.responses import StreamingResponse

from diffstore.engine import backup
from diffstore.engine.store import Store

router = APIRouter(tags=["backup"])

FORMAT = "lmdb-compact"
FORMAT_HEADER = "X-Diffstore-Backup"
EXPECTED_BYTES_HEADER = "X-Diffstore-Backup-Expected-Bytes"
_CHUNK = 1 << 20
_PIPE_BYTES = 1 << 20


@router.get(
    "/backup",
    summary="Stream one consistent committed state of the store (see diffstore backup --url)",
    response_class=StreamingResponse,
    responses={
        200: {
            "description": "LMDB's compacting copy of the store, chunked",
            "content": {"application/octet-stream": {"schema": {"type": "string", "format": "binary"}}},
        }
    },
)
async def get_backup(request: Request) -> StreamingResponse:
    store: Store = request.app.state.store
    expected = await anyio.to_thread.run_sync(backup.expected_bytes, store)
    reading, writing = os.pipe()
    with contextlib.suppress(OSError):  # past the system's pipe limit the default size works too
        fcntl.fcntl(writing, fcntl.F_SETPIPE_SZ, _PIPE_BYTES)  # fewer, larger hand-offs
    failures: list[BaseException] = []

    def copy() -> None:
        try:
            backup.stream_to(store, writing)  # closes ``writing``
        except BaseException as exc:  # a failed copy must end the body cut off, not whole-looking
            failures.append(exc)

    worker = threading.Thread(target=copy, name="diffstore-backup-stream", daemon=True)
    worker.start()

    async def body() -> AsyncIterator[bytes]:
        try:
            while True:
                chunk = await anyio.to_thread.run_sync(os.read, reading, _CHUNK)
                if not chunk:
                    break
                yield chunk
            await anyio.to_thread.run_sync(worker.join)
            if failures:
                raise failures[0]
        finally:
            # the client went away (or it is over): the copy's next write fails, its read transaction ends
            os.close(reading)
            with anyio.CancelScope(shield=True):
                await anyio.to_thread.run_sync(worker.join)

    headers = {FORMAT_HEADER: FORMAT, EXPECTED_BYTES_HEADER: str(expected)}
    return StreamingResponse(body(), media_type="application/octet-stream", headers=headers)


router.add_api_route("/backup/", get_backup, methods=["GET"], include_in_schema=False)  # the slash twin
