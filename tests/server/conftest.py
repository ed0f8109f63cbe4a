"""A REAL uvicorn server in a thread, on a free loopback port, over a real Store in ``tmp_path``."""

from __future__ import annotations

import base64
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI

from diffstore.engine.store import Store
from diffstore.engine.types import StoreConfig
from diffstore.server import ServerConfig, create_app
from diffstore.server.serving import GracefulServer
from tests.helpers import ManualClock, serving


def es(data: bytes | str) -> dict[str, str]:
    """An EncodedString as a client would send it (utf8 text, or base64 for other bytes)."""
    raw = data.encode() if isinstance(data, str) else data
    try:
        return {"value": raw.decode("utf-8")}
    except UnicodeDecodeError:
        return {"value": base64.b64encode(raw).decode(), "encoding": "base64"}


def unes(obj: dict[str, str] | None) -> bytes | None:
    """Decodes an EncodedString of a response."""
    if obj is None:
        return None
    if obj.get("encoding") == "base64":
        return base64.b64decode(obj["value"])
    return obj["value"].encode()


@dataclass
class Live:
    """A running server: its base URL, the store under it, and a client bound to it."""

    url: str
    store: Store
    app: FastAPI
    server: GracefulServer
    http: httpx.Client

    def call(self, method: str, path: str, body: Any = None, **kwargs: Any) -> httpx.Response:
        if body is not None:
            kwargs["json"] = body
        return self.http.request(method, path, **kwargs)

    def ok(self, method: str, path: str, body: Any = None, **kwargs: Any) -> Any:
        """Calls and asserts a 200 JSON answer; returns the decoded body."""
        response = self.call(method, path, body, **kwargs)
        assert response.status_code == 200, (response.status_code, response.text)
        assert response.headers["content-type"] == "application/json; charset=utf-8"
        return response.json()

    def fail(self, method: str, path: str, body: Any = None, *, status: int, code: str, **kwargs: Any) -> Any:
        """Calls and asserts an error answer with ``status`` and ``code``; returns the decoded body."""
        response = self.call(method, path, body, **kwargs)
        assert response.status_code == status, (response.status_code, response.text)
        answer = response.json()
        assert answer["error"] == code, answer
        assert isinstance(answer["reason"], str) and answer["reason"]
        return answer


@contextmanager
def live_server(
    data_dir: Path, config: ServerConfig | None = None, store_config: StoreConfig | None = None
) -> Iterator[Live]:
    """Starts uvicorn on 127.0.0.1 with a free port; stops it and closes the store on exit."""
    store = Store.open(data_dir, store_config or StoreConfig(commit_delay_ms=20))
    config = config or ServerConfig()
    app = create_app(store, config)
    server = GracefulServer(app, config, log_level="warning", log_config=None, timeout_graceful_shutdown=5)
    headers = {"authorization": f"Bearer {config.token}"} if config.token else {}
    try:
        with serving(server) as url, httpx.Client(base_url=url, headers=headers, timeout=30) as http:
            yield Live(url, store, app, server, http)
    finally:
        store.close()


@pytest.fixture
def live(tmp_path: Path) -> Iterator[Live]:
    with live_server(tmp_path / "data") as running:
        yield running


@pytest.fixture
def clock() -> ManualClock:
    """The store's clock of :func:`served` (lease expiry, commit times), moved by the test."""
    return ManualClock(5_000_000)


@pytest.fixture
def served(tmp_path: Path, clock: ManualClock) -> Iterator[Live]:
    """A live server over a store on :func:`clock` holding one manual collection ``m``."""
    with live_server(tmp_path / "data", store_config=StoreConfig(clock_ms=clock)) as live:
        live.ok("POST", "/collections/", {"collectionName": "m", "isManual": True})
        yield live
