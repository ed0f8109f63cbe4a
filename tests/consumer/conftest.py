"""What the consumer's tests share: the store a consumer runs on, embedded or over HTTP."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from diffstore.engine.store import Store
from diffstore.engine.types import StoreConfig
from tests.helpers import running_server

DEADLINE_S = 10.0


@pytest.fixture(params=["http", "engine"])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Any]:
    """The store the consumer runs on: an HTTP client of a live server, or an embedded Store."""
    if request.param == "http":
        with running_server(tmp_path / "data") as live, live.client() as client:
            yield client
    else:
        with Store.open(tmp_path / "engine", StoreConfig(commit_delay_ms=10)) as store:
            yield store
