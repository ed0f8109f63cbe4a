"""Fixtures of the engine tests: real LMDB stores in ``tmp_path``, deterministic background work."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from diffstore import Store, StoreConfig

StoreFactory = Callable[..., Store]


@pytest.fixture
def open_store(tmp_path: Path) -> Iterator[StoreFactory]:
    """Opens stores in ``tmp_path/store`` (background off unless asked); closes them all at the end."""
    opened: list[Store] = []

    def factory(path: Path | None = None, **config: Any) -> Store:
        config.setdefault("background", False)
        store = Store.open(path or tmp_path / "store", config=StoreConfig(**config))
        opened.append(store)
        return store

    yield factory
    for store in opened:
        store.close()


@pytest.fixture
def store(open_store: StoreFactory) -> Store:
    return open_store()
