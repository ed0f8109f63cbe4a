"""``lookup``'s fetch of a chunk of keys: right values, and work that stays near the number of keys."""

from __future__ import annotations

import random
from typing import Any

import httpx
from helpers_spark import commit_items

from diffstore import Store
from diffstore.client import Client
from diffstore.spark.lookup import fetch as fetch_values
from diffstore.spark.lookup import get_many


def _key(i: int) -> bytes:
    return b"k%06d" % i


def fetch(handle: Any, generation_id: bytes, keys: list[bytes]) -> dict[bytes, bytes]:
    """The keys :func:`~diffstore.spark.lookup.fetch` found, with their values."""
    import pyarrow as pa

    values = fetch_values(handle, generation_id, pa.array(keys, pa.binary())).to_pylist()
    assert len(values) == len(keys)
    return {key: value for key, value in zip(keys, values, strict=True) if value is not None}


def test_fetch_dense_sparse_and_absent_keys_in_few_requests(
    server_url: str, store: Store, names: Any
) -> None:
    name = names["A"]
    store.create_collection(name, manual=True)
    first = commit_items(store, name, [(_key(i), b"v%d" % i) for i in range(0, 40_000, 2)])  # even keys
    later = commit_items(store, name, [(_key(4), b"new"), (_key(6), None)])
    requests: list[str] = []

    def count(request: httpx.Request) -> None:
        requests.append(request.url.path)

    with httpx.Client(event_hooks={"request": [count]}) as http, Client(server_url, http=http) as client:
        handle = client.collection(name)
        cases = {
            "dense": [_key(i) for i in range(100, 1_100)],  # 500 present, 500 absent (odd)
            "sparse": [_key(i) for i in range(0, 40_000, 400)],  # one present key per 200 records
            "very sparse": [_key(i) for i in (3, 10_000, 20_001, 39_998)],
        }
        for label, keys in cases.items():
            requests.clear()
            found = fetch(handle, first, keys)
            assert found == {k: b"v%d" % int(k[1:]) for k in keys if int(k[1:]) % 2 == 0}, label
            assert len(requests) <= 8, (label, len(requests))  # sparse keys: one getMany for the rest
            assert any(path.endswith("/getMany") for path in requests) == (label != "dense"), label
        assert fetch(handle, later, [_key(4), _key(6), _key(8)]) == {_key(4): b"new", _key(8): b"v8"}
        assert fetch(handle, first, [_key(5)]) == {}
        # more keys than one getMany takes: several requests, one answer
        requests.clear()
        wanted = [_key(i) for i in range(0, 25_000)]
        values = get_many(handle, later, wanted).to_pylist()
        assert values == [
            b"new" if k == _key(4) else b"v%d" % int(k[1:]) if int(k[1:]) % 2 == 0 and k != _key(6) else None
            for k in wanted
        ]
        assert requests.count(requests[0]) == 3 and requests[0].endswith("/getMany")


def test_a_small_round_with_many_lookup_keys_fetches_them_in_slices(
    spark: Any, server_url: str, store: Store, names: Any
) -> None:
    from helpers_spark import initial_load, load_example_job, random_changes, snapshot

    from diffstore.spark import Transform
    from diffstore.spark.small_rounds import FETCH_SLICE_MIN

    rng = random.Random(11)
    users = 3_000
    for name in names.values():
        store.create_collection(name, manual=True)
    a, b = initial_load(rng, users)
    commit_items(store, names["A"], a)
    commit_items(store, names["B"], b)
    job = load_example_job()
    sources = {"a": names["A"], "b": names["B"]}
    transform = Transform(spark, server_url, names["C"], sources, job.country_totals)
    try:
        assert len(transform.run()) == 1
        # A only: B's value of every changed user is looked up, from the driver (a small round)
        changed, _ = random_changes(rng, users, 6_000)
        assert len(changed) > 2 * FETCH_SLICE_MIN
        commit_items(store, names["A"], changed)
        (stats,) = transform.run()
        assert 2 * FETCH_SLICE_MIN < (stats.rows_read["a"] or 0) <= 5_000 and stats.rows_read["b"] == 0
    finally:
        transform.close()
    expected = job.recompute(snapshot(store, names["A"]), snapshot(store, names["B"]))
    assert snapshot(store, names["C"]) == expected
