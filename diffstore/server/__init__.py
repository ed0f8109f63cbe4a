"""The HTTP front of diffstore (SPEC §2-§3): ``create_app(store, config)`` and ``diffstore serve``."""

from __future__ import annotations

from diffstore.server.app import create_app
from diffstore.server.config import ServerConfig

__all__ = ["ServerConfig", "create_app"]
