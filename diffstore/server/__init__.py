"""The HTTP front of diffstore (SPEC §2-§3): ``create_app(store, config)`` and ``diffstore serve``."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from diffstore.server.config import ServerConfig

if TYPE_CHECKING:
    from diffstore.server.app import create_app

__all__ = ["ServerConfig", "create_app"]


def __getattr__(name: str) -> Any:
    # The app pulls in FastAPI; load it only when it is asked for, so CLI start-up stays quick.
    if name == "create_app":
        from diffstore.server.app import create_app

        return create_app
    raise AttributeError(name)
