"""A small round's lookups fetched ahead (:mod:`diffstore.spark.lookahead`): answers stay exact whatever
was guessed, and a runner stops guessing for an alias its job does not look up that way."""

from __future__ import annotations

import threading
from typing import Any

import pyarrow as pa
import pytest
from helpers_spark import commit_items, load_example_job, snapshot
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from diffstore import Store
from diffstore.client import Client
from diffstore.spark import Transform
from diffstore.spark.lookahead import Lookahead, LookaheadPolicy
from diffstore.spark.lookup import get_many
from diffstore.spark.plan import Pinned
from diffstore.wire_columns import BinaryColumn

KEYS = [b"k%02d" % i for i in range(24)] + [b"\x00", b"\xff\x00"]


def _collection(store: Store, name: str, present: dict[bytes, bytes]) -> bytes:
    if name not in {c.name for c in store.collections()}:
        store.create_collection(name, manual=True)
    before = {r.key for r in store.collection(name).query()}
    items: list[tuple[bytes, bytes | None]] = [(k, None) for k in sorted(before - present.keys())]
    return commit_items(store, name, items + sorted(present.items()))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    present=st.dictionaries(st.sampled_from(KEYS), st.binary(max_size=4), max_size=len(KEYS)),
    offered_a=st.lists(st.sets(st.sampled_from(KEYS), max_size=8), max_size=3),
    offered_c=st.sets(st.sampled_from(KEYS), max_size=8),
    wanted=st.sets(st.sampled_from(KEYS)),
)
def test_values_are_what_get_many_answers_whatever_was_offered(
    request: pytest.FixtureRequest,
    server_url: str,
    store: Store,
    names: dict[str, str],
    present: dict[bytes, bytes],
    offered_a: list[set[bytes]],
    offered_c: set[bytes],
    wanted: set[bytes],
) -> None:
    """Keys offered by two sources (one key twice), absent keys, keys never offered, the alias's own
    diff's keys (never fetched for it): the values are getMany's at the pinned generation, and ``taken``
    counts the wanted keys that were fetched ahead."""
    b = _collection(store, names["B"], present)
    _collection(store, names["B"], {})  # a later generation: the pinned one is read, not the newest
    client = Client(server_url)
    request.addfinalizer(client.close)
    handle = client.collection
    pinned = {"a": Pinned(names["A"], b""), "b": Pinned(names["B"], b), "c": Pinned(names["C"], b"")}
    asked: list[list[bytes]] = []

    def fetch(keys: list[bytes]) -> pa.Array:
        asked.append(keys)
        return get_many(handle(names["B"]), b, keys)

    lookahead = Lookahead(handle, pinned, ["b"])
    try:
        for page in offered_a:
            lookahead.offer("a", BinaryColumn.of(sorted(page)))
        lookahead.offer("c", BinaryColumn.of(sorted(offered_c)))
        lookahead.offer("b", BinaryColumn.of([b"k00"]))  # its own diff's keys: never fetched ahead for it
        ordered = sorted(wanted)
        values = lookahead.values("b", ordered, fetch)
    finally:
        lookahead.close()
    assert values.to_pylist() == [present.get(k) for k in ordered]
    ahead = set().union(*offered_a, offered_c)
    assert lookahead.taken.get("b", 0) == len(wanted & ahead)
    assert sorted(k for keys in asked for k in keys) == sorted(wanted - ahead)  # only the others fetched
    assert lookahead.fetched == ({"b"} if ahead else set())


def test_an_ahead_fetch_that_failed_is_fetched_again_when_asked(
    request: pytest.FixtureRequest, server_url: str, store: Store, names: dict[str, str]
) -> None:
    client = Client(server_url)
    request.addfinalizer(client.close)
    handle = client.collection
    # nothing is named so: the ahead fetch fails with noSuchCollection
    pinned = {"b": Pinned(names["B"], b"\x01"), "a": Pinned(names["A"], b"\x01")}
    asked: list[list[bytes]] = []

    def fetch(keys: list[bytes]) -> pa.Array:
        asked.append(keys)
        return pa.array([b"v-" + k for k in keys], pa.binary())

    lookahead = Lookahead(handle, pinned, ["b"])
    lookahead.offer("a", BinaryColumn.of([b"x", b"y"]))
    try:
        assert lookahead.values("b", [b"x", b"y"], fetch).to_pylist() == [b"v-x", b"v-y"]
    finally:
        lookahead.close()
    assert asked == [[b"x", b"y"]] and not lookahead.taken.get("b")


def test_the_policy_stops_an_alias_fetched_for_and_not_taken(
    request: pytest.FixtureRequest, server_url: str, store: Store, names: dict[str, str]
) -> None:
    b = _collection(store, names["B"], {b"k": b"1"})
    client = Client(server_url)
    request.addfinalizer(client.close)
    handle = client.collection
    pinned = {"a": Pinned(names["A"], b""), "b": Pinned(names["B"], b), "c": Pinned(names["C"], b"")}
    policy = LookaheadPolicy()
    policy.learn(policy.start(handle, pinned, ["a", "b", "c"]))  # nothing fetched ahead: nothing learned
    lookahead = policy.start(handle, pinned, ["a", "b", "c"])
    lookahead.offer("c", BinaryColumn.of([b"k"]))  # for a and b
    try:
        nothing = lambda keys: pa.nulls(len(keys), pa.binary())  # noqa: E731
        assert lookahead.values("b", [b"k"], nothing).to_pylist() == [b"1"]
    finally:
        lookahead.close()
    policy.learn(lookahead)  # a: fetched ahead, not taken
    again = policy.start(handle, pinned, ["a", "b", "c"])
    again.offer("c", BinaryColumn.of([b"k"]))
    again.offer("a", BinaryColumn.of([b"k"]))
    again.close()
    assert again.fetched == {"b", "c"}


def test_a_runner_fetches_ahead_what_its_job_looks_up_and_stops_for_what_it_does_not(
    spark: Any, server_url: str, store: Store, names: dict[str, str]
) -> None:
    """The example job looks up B's amounts of A's changed users: fetched ahead and taken, every round.
    A job that never looks up: fetched ahead in its first round only. Results match a recomputation."""
    job = load_example_job()
    for name in names.values():
        store.create_collection(name, manual=True)
    commit_items(store, names["A"], [(b"u%d" % i, b"DE" if i % 2 else b"FR") for i in range(50)])
    commit_items(store, names["B"], [(b"u%d" % i, b"%d" % (i + 1)) for i in range(0, 50, 3)])
    sources = {"a": names["A"], "b": names["B"]}
    seen: list[dict[str, Any]] = []

    def on_event(event: str, details: dict[str, Any]) -> None:
        if event == "lookahead":
            seen.append(details)

    transform = Transform(spark, server_url, names["C"], sources, job.country_totals, on_event=on_event)
    try:
        transform.run()
        commit_items(store, names["A"], [(b"u%d" % i, b"JP") for i in range(0, 50, 5)] + [(b"u7", None)])
        transform.run()
    finally:
        transform.close()
    recomputed = job.recompute(snapshot(store, names["A"]), snapshot(store, names["B"]))
    assert snapshot(store, names["C"]) == recomputed
    # round 1: both changed; b's lookup asks for A's users not in B's diff, a's for B's not in A's (none)
    assert seen[0]["fetched"] == ["a", "b"] and seen[0]["taken"]["b"] == 50 - 17
    assert seen[1] == {"fetched": ["b"], "taken": {"b": 11}}  # a: stopped (nothing taken in round 1)

    seen.clear()
    other = {name: f"{value}_quiet" for name, value in names.items()}
    for name in other.values():
        store.create_collection(name, manual=True)

    def no_lookups(spark_: Any, diffs: dict[str, DataFrame], lookup: Any) -> DataFrame:
        return diffs["a"].select("key", F.col("toValue").alias("value"))

    commit_items(store, other["A"], [(b"x", b"1"), (b"y", b"2")])
    quiet_sources = {"a": other["A"], "b": other["B"]}
    quiet = Transform(spark, server_url, other["C"], quiet_sources, no_lookups, on_event=on_event)
    try:
        quiet.run()
        commit_items(store, other["A"], [(b"x", b"3")])
        quiet.run()
    finally:
        quiet.close()
    assert snapshot(store, other["C"]) == {b"x": b"3", b"y": b"2"}
    assert seen == [{"fetched": ["b"], "taken": {}}, {"fetched": [], "taken": {}}]


def test_a_round_does_not_wait_for_a_fetch_ahead_in_flight(
    request: pytest.FixtureRequest, server_url: str, store: Store, names: dict[str, str]
) -> None:
    """``close`` drops what was not sent and leaves a request in flight to its thread (over a stalled
    link it would hold the round until the client's timeout); ``values`` waits for a request in flight
    and fetches what was dropped."""
    b = _collection(store, names["B"], {b"k": b"1"})
    client = Client(server_url)
    request.addfinalizer(client.close)
    release = threading.Event()
    entered = threading.Event()

    def stalled(name: str) -> Any:
        entered.set()
        release.wait(60)
        return client.collection(name)

    pinned = {"a": Pinned(names["A"], b""), "b": Pinned(names["B"], b)}
    lookahead = Lookahead(stalled, pinned, ["b"])
    for page in range(4):  # 2 in flight (the pool's threads), 2 queued
        lookahead.offer("a", BinaryColumn.of([b"k%d" % page]))
    assert entered.wait(60)
    closer = threading.Thread(target=lookahead.close)
    closer.start()
    closer.join(60)
    try:
        assert not closer.is_alive()  # before: close waited for the stalled requests
    finally:
        release.set()
    asked: list[list[bytes]] = []

    def fetch(keys: list[bytes]) -> pa.Array:
        asked.append(keys)
        return pa.nulls(len(keys), pa.binary())

    wanted = [b"k", b"k0", b"k1", b"k2", b"k3"]
    assert lookahead.values("b", wanted, fetch).to_pylist() == [None] * 5  # fetch's answer for b"k"
    assert asked == [[b"k", b"k2", b"k3"]]  # k0, k1: fetched ahead (waited for); k2, k3: dropped by close
