"""The running HTTP server over an embedded store, with a graceful shutdown (``diffstore serve``).

On SIGTERM/SIGINT uvicorn stops accepting connections; :class:`GracefulServer` first answers every open
long-poll (they would otherwise hold the shutdown for up to ``timeoutMs``), then waits for running
requests, runs the app's shutdown, and only then is the store closed.

The server speaks HTTP/1.1 through uvicorn's httptools protocol over a
:class:`~diffstore.server.transport.CoalescingTransport` (one socket write per response).
"""

from __future__ import annotations

import contextlib
import gc
import socket
import sys
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import uvicorn
from fastapi import FastAPI

from diffstore.server.app import create_app
from diffstore.server.config import ServerConfig
from diffstore.server.transport import CoalescingHttpToolsProtocol

if TYPE_CHECKING:
    from diffstore.engine.store import Store

SWITCH_INTERVAL_S = 0.0005


class GracefulServer(uvicorn.Server):
    """A uvicorn server that answers the app's open long-polls as soon as shutdown begins."""

    def __init__(self, app: FastAPI, config: ServerConfig, **uvicorn_options: Any) -> None:
        options: dict[str, Any] = {
            "host": config.host,
            "port": config.port,
            "timeout_graceful_shutdown": config.shutdown_timeout_s,
            "lifespan": "on",
            "log_level": "info",
            "access_log": config.access_log,
            "http": CoalescingHttpToolsProtocol,
        }
        options.update(uvicorn_options)
        super().__init__(uvicorn.Config(app, **options))
        self.fastapi_app = app
        self.received_signals: list[int] = []

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        self.fastapi_app.state.hub.close()
        await super().shutdown(sockets)

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        """As uvicorn's, minus re-raising the signal afterwards: the caller still has a store to close."""
        with super().capture_signals():
            yield
            self.received_signals = list(self._captured_signals)
            self._captured_signals.clear()


def serve(config: ServerConfig) -> int:
    """Opens the store, serves until a signal, closes the store. Returns the exit code."""
    from diffstore.engine.store import Store  # the engine is imported only when a server really starts
    from diffstore.engine.types import StoreConfig

    store_config = StoreConfig(
        commit_delay_ms=config.commit_delay_ms, sync=config.sync, map_size=config.map_size
    )
    with Store.open(config.data_dir, store_config) as store:
        serve_store(store, config)
    return 0


def serve_store(store: Store, config: ServerConfig) -> None:
    """Serves an open store until a signal (the caller closes it), with the process tuned for a server."""
    # Engine calls run in worker threads; with the default 5 ms switch interval a worker that finishes
    # while the event loop is busy waits up to 5 ms for the GIL, which caps a loaded server's point reads.
    sys.setswitchinterval(SWITCH_INTERVAL_S)
    server = GracefulServer(create_app(store, config), config)
    # Everything imported so far lives as long as the process: keep it out of the collector's full
    # passes, which otherwise walk FastAPI's and pydantic's whole heap and stall the event loop.
    gc.collect()
    gc.freeze()
    server.run()
