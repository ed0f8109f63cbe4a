"""engine.overview: reader lag counts committed generations (aborts leave no gap), and recent generations."""

from __future__ import annotations

from pathlib import Path

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
