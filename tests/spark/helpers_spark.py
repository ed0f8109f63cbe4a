"""Helpers of the Spark suite: loading manual source collections, the example job, reference answers."""

from __future__ import annotations

import importlib.util
import random
import sys
from pathlib import Path
from types import ModuleType

from diffstore import Store

_JOB_PATH = Path(__file__).resolve().parents[2] / "examples" / "spark_a_plus_b" / "job.py"


def load_example_job() -> ModuleType:
    """The example's job module (Spark SQL only, so workers never need to import it)."""
    if "spark_a_plus_b_job" in sys.modules:
        return sys.modules["spark_a_plus_b_job"]
    spec = importlib.util.spec_from_file_location("spark_a_plus_b_job", _JOB_PATH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["spark_a_plus_b_job"] = module
    spec.loader.exec_module(module)
    return module


def commit_items(store: Store, name: str, items: list[tuple[bytes, bytes | None]]) -> bytes:
    """Writes ``items`` into a new generation of manual collection ``name`` and commits it."""
    collection = store.collection(name)
    base = collection.generation_id
    counter = int.from_bytes(base.ljust(8, b"\0")[:8], "big") + 1
    generation = counter.to_bytes(8, "big")
    collection.start_generation(generation)
    collection.put_many(items, generation_id=generation)
    collection.commit_generation(generation)
    return generation


def snapshot(store: Store, name: str) -> dict[bytes, bytes]:
    return {record.key: record.value for record in store.collection(name).query()}


COUNTRIES = [b"DE", b"FR", b"JP", b"US", b"\xc3\xa9t\xc3\xa9", b"BR"]


def user_key(i: int) -> bytes:
    # non-ASCII bytes in keys on purpose: they must survive every hop
    return b"u\xff" + i.to_bytes(4, "big")


def initial_load(rng: random.Random, users: int) -> tuple[list[tuple[bytes, bytes | None]], ...]:
    a = [(user_key(i), rng.choice(COUNTRIES)) for i in range(users)]
    b = [(user_key(i), str(rng.randint(1, 1000)).encode()) for i in range(users) if rng.random() < 0.9]
    return a, b


def random_changes(
    rng: random.Random, users: int, count: int
) -> tuple[list[tuple[bytes, bytes | None]], list[tuple[bytes, bytes | None]]]:
    """Updates, deletes and inserts for A and B (keys may be new or absent)."""
    a: dict[bytes, bytes | None] = {}
    b: dict[bytes, bytes | None] = {}
    for _ in range(count):
        user = user_key(rng.randrange(users + users // 5))
        roll = rng.random()
        if roll < 0.35:
            a[user] = rng.choice(COUNTRIES)
        elif roll < 0.45:
            a[user] = None
        elif roll < 0.85:
            b[user] = str(rng.randint(1, 1000)).encode()
        else:
            b[user] = None
    return sorted(a.items()), sorted(b.items())
