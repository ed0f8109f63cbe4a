"""A full map (``StoreConfig.map_size``): the write is refused with storageFull; the store stays usable."""

from __future__ import annotations

from pathlib import Path

import pytest

from diffstore import Store, StoreConfig
from diffstore.errors import InvalidRequest, StorageError, StorageFull
from diffstore.sizes import parse_size
from tests.engine.conftest import StoreFactory
from tests.engine.util import raw_state

MAP = 1 << 20  # the smallest map: a few hundred pages


def _filled(store: Store) -> None:
    coll = store.create_collection("c", manual=True)
    coll.start_generation(b"g1")
    coll.put_many([(b"k%03d" % i, b"v" * 100) for i in range(100)], generation_id=b"g1")
    coll.commit_generation(b"g1")


def test_a_write_past_the_map_changes_nothing_and_smaller_writes_and_deletes_succeed(
    open_store: StoreFactory,
) -> None:
    store = open_store(map_size=MAP)
    _filled(store)
    coll = store.collection("c")
    coll.start_generation(b"g2")
    before = raw_state(store)
    with pytest.raises(StorageFull) as caught:
        coll.put_many([(b"big%04d" % i, b"x" * 2000) for i in range(1000)], generation_id=b"g2")
    assert caught.value.code == "storageFull"
    assert isinstance(caught.value, StorageError)
    assert "map is full" in caught.value.reason
    assert raw_state(store) == before
    assert [r.key for r in coll.query(generation_id=b"g1")] == [b"k%03d" % i for i in range(100)]
    coll.put_many([(b"small", b"s"), (b"k000", None)], generation_id=b"g2")
    coll.commit_generation(b"g2")
    assert coll.get(b"small") is not None
    assert coll.get(b"k000") is None
    store.delete_collection("c")
    assert store.collections() == []


def test_reopening_with_a_larger_map_admits_the_write(tmp_path: Path) -> None:
    items = [(b"big%04d" % i, b"x" * 2000) for i in range(1000)]
    with Store.open(tmp_path / "s", StoreConfig(map_size=MAP, background=False)) as store:
        _filled(store)
        coll = store.collection("c")
        coll.start_generation(b"g2")
        with pytest.raises(StorageFull):
            coll.put_many(items, generation_id=b"g2")
    with Store.open(tmp_path / "s", StoreConfig(map_size=parse_size("64MiB"), background=False)) as store:
        coll = store.collection("c")
        coll.put_many(items, generation_id=b"g2")
        coll.commit_generation(b"g2")
        assert sum(1 for _ in coll.query()) == 1100


@pytest.mark.parametrize("size", [0, MAP - 1, 1 << 63])
def test_a_map_size_out_of_bounds_is_refused(size: int) -> None:
    with pytest.raises(InvalidRequest):
        StoreConfig(map_size=size)


@pytest.mark.parametrize(
    ("text", "size"),
    [
        ("4096", 4096),
        ("64MiB", 64 << 20),
        ("1TiB", 1 << 40),
        ("1tb", 10**12),
        ("1.5G", 3 << 29),
        ("2 k", 2048),
    ],
)
def test_sizes_parse(text: str, size: int) -> None:
    assert parse_size(text) == size


@pytest.mark.parametrize("text", ["", "MiB", "-1", "1.5B", "12 parsecs", "1e9"])
def test_bad_sizes_are_refused(text: str) -> None:
    with pytest.raises(ValueError):
        parse_size(text)


@pytest.mark.parametrize("max_readers", [126, 2048])
def test_the_preallocated_lock_file_has_the_size_lmdb_gives_it(tmp_path: Path, max_readers: int) -> None:
    import lmdb

    from diffstore.engine.storage import open_environment

    plain = lmdb.open(str(tmp_path / "plain"), max_readers=max_readers)
    ours = open_environment(tmp_path / "ours", map_size=MAP, sync=True, max_dbs=1, max_readers=max_readers)
    try:
        size = (tmp_path / "plain" / "lock.mdb").stat().st_size
        assert (tmp_path / "ours" / "lock.mdb").stat().st_size == size
        assert (tmp_path / "ours" / "lock.mdb").stat().st_blocks * 512 >= size  # no holes: real blocks
    finally:
        plain.close()
        ours.close()
