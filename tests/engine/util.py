"""Helpers of the engine tests (fixtures are in conftest.py)."""

from __future__ import annotations

from typing import Any

from diffstore import Store
from diffstore.engine import layout
from diffstore.engine.collection import Collection


def raw_state(store: Store) -> dict[str, list[tuple[bytes, bytes]]]:
    """Every row of every table: comparing two of these proves that a call changed nothing."""
    tables = store.tables
    with store.env.begin() as txn:
        return {
            name: [(bytes(k), bytes(v)) for k, v in txn.cursor(db=getattr(tables, name))]
            for name in (table.decode() for table in layout.TABLES)
        }


def run_background(store: Store, now: float | None = None, limit: int = 10_000) -> int:
    """Runs background steps until none does anything; returns how many did something."""
    for steps in range(limit):
        if not store.run_background_once(now):
            return steps
    raise AssertionError("background work never finished")


def commit(
    coll: Collection,
    generation_id: bytes,
    items: list[tuple[bytes, bytes | None]],
    update_readers: list[Any] | None = None,
) -> None:
    """start + put_many + commit of one manual generation."""
    coll.start_generation(generation_id)
    if items:
        coll.put_many(items, generation_id=generation_id)
    coll.commit_generation(generation_id, update_readers=update_readers or [])


def as_dict(coll: Collection, **kwargs: Any) -> dict[bytes, bytes]:
    return {r.key: r.value for r in coll.query(**kwargs)}
