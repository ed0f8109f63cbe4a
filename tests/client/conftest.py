"""A REAL uvicorn server on a free loopback port over a real Store in ``tmp_path`` (``server``), and clients
of it (``client``, in each wire format)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from diffstore.client import Client
from tests.helpers import LiveServer, running_server

DEADLINE_S = 10.0


@pytest.fixture
def server(tmp_path: Path) -> Iterator[LiveServer]:
    with running_server(tmp_path / "data") as live:
        yield live


@pytest.fixture(params=["msgpack", "json"])
def client(server: LiveServer, request: pytest.FixtureRequest) -> Iterator[Client]:
    with server.client(request.param) as c:
        yield c
