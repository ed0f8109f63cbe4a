"""engine.overview: reader lag counts committed generations (aborts leave no gap), and recent generations."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from diffstore.engine import overview
from diffstore.engine.store import Store
from diffstore.engine.types import StoreConfig


def _commit(store: Store, name: str, generation: bytes) -> None:
    collection = store.collection(name)
    collection.start_generation(generation)
    collection.put_many([(b"k", generation)], generation_id=generation)
    collection.commit_generation(generation)


def test_lag_counts_committed_generations(tmp_path: Path) -> None:
    with Store.open(tmp_path, StoreConfig(background=False)) as store:
        store.create_collection("a")
        store.create_collection("c")
        _commit(store, "a", b"g1")
        store.collection("c").create_reader("r", "a", b"g1")
        store.collection("c").create_reader("null", "a", None)
        store.collection("c").create_reader("pos", "hstream://s", b"x")
        store.collection("a").start_generation(b"g2")
        store.collection("a").abort_generation(b"g2")
        _commit(store, "a", b"g3")
        _commit(store, "a", b"g4")
        states = {s.name: s for s in overview.overview(store)}
        lags = {r.name: r.lag for r in states["c"].readers}
        # the initial generation "" is where a null reader stands: g1, g3 and g4 are ahead of it
        assert lags == {"r": 2, "null": 3, "pos": None}
        assert overview.recent_generations(store, "a", 10) == [b"g4", b"g3", b"g1", b""]
        assert overview.recent_generations(store, "c", 10) == [b""]
        assert overview.size_bytes(store) > 0


def test_repeated_overviews_count_each_generation_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """20 readers spread over the last 2,000 generations and one more that moves: the first overview walks
    the generations once for all of them (the largest lag, not the sum), another with nothing written walks
    nothing, and one after a commit only that commit and the moved reader's new distance. A scrape of
    /metrics or /overview used to walk every reader's whole lag each time (about 21,000 steps here)."""
    readers, behind = 20, 2_000
    walked = [0]
    real = overview._counts_above

    def counting(txn: Any, tables: Any, meta: Any, stops: set[int]) -> dict[int, int]:
        counts = real(txn, tables, meta, stops)
        walked[0] += max(counts.values(), default=0)  # the rows walked: down to the lowest stop
        return counts

    monkeypatch.setattr(overview, "_counts_above", counting)
    with Store.open(tmp_path, StoreConfig(background=False, sync=False)) as store:
        src = store.create_collection("src")
        owner = store.create_collection("c")
        for g in range(behind + 1):
            src.start_generation(b"%06d" % g)
            src.commit_generation(b"%06d" % g)
        for n in range(readers):
            owner.create_reader(f"r{n}", "src", b"%06d" % (n * behind // readers))
        owner.create_reader("moving", "src", b"%06d" % 0)
        expected = {f"r{n}": behind - n * behind // readers for n in range(readers)}

        def lags() -> dict[str, int | None]:
            states = {s.name: s for s in overview.overview(store)}
            return {r.name: r.lag for r in states["c"].readers}

        assert lags() == {**expected, "moving": behind}
        assert walked[0] == behind  # one walk for every reader
        walked[0] = 0
        assert lags() == {**expected, "moving": behind}  # nothing written since
        assert walked[0] == 0
        _commit(store, "src", b"%06d" % (behind + 1))
        owner.update_reader("moving", b"%06d" % (behind - 10))
        assert lags() == {**{name: lag + 1 for name, lag in expected.items()}, "moving": 11}
        assert walked[0] == 11  # down to the moved reader; the others add the one new generation
