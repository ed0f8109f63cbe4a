"""The embedded HStream-compatible server (``diffstore streams serve``): SPEC §4 over gRPC, persisted in
its own LMDB environment.

Modules: ``config`` (:class:`StreamServerConfig`), ``keys`` (LMDB key layout),
``store`` (LMDB), ``subscription`` (the pure delivery state machine), ``runtime`` (a subscription's live
loop), ``codec`` (checking appended batches, re-encoding for partial resends), ``errors`` (the one mapping
of errors to gRPC statuses), ``servicer`` (the RPCs), ``app`` (running it).
"""

from __future__ import annotations

from .app import ServerThread, StreamServer, serve
from .config import DEFAULT_PORT, StreamServerConfig

__all__ = ["DEFAULT_PORT", "StreamServerConfig", "ServerThread", "StreamServer", "serve"]
