"""The A+B→C transform end to end: real Spark, real uvicorn server, real LMDB store."""

from __future__ import annotations

import random
import threading
from typing import Any

import httpx
import pytest
from helpers_spark import commit_items, initial_load, load_example_job, random_changes, snapshot
from pyspark.sql import functions as F

from diffstore import Store, shell
from diffstore.backoff import RetryPolicy
from diffstore.client import Client
from diffstore.spark import Transform, TransformError
from tests.faults import TcpProxy
from tests.helpers import wait_until

THREAD_DEADLINE_S = 240.0


def _setup(store: Store, names: dict[str, str], rng: random.Random, users: int) -> None:
    for name in names.values():
        store.create_collection(name, manual=True)
    a, b = initial_load(rng, users)
    commit_items(store, names["A"], a)
    commit_items(store, names["B"], b)


def _transform(spark: Any, url: str, names: dict[str, str], fn: Any = None, **kw: Any) -> Transform:
    job = load_example_job()
    sources = {"a": names["A"], "b": names["B"]}
    return Transform(spark, url, names["C"], sources, fn or job.country_totals, partitions=2, **kw)


def _expected(store: Store, names: dict[str, str]) -> dict[bytes, bytes]:
    return load_example_job().recompute(snapshot(store, names["A"]), snapshot(store, names["B"]))


def _readers(store: Store, name: str) -> dict[str, bytes | None]:
    return {r.name: r.generation_id for r in store.collection(name).readers()}


def _metadata(url: str, name: str) -> list[dict[str, str] | None]:
    """The commit metadata of every generation of ``name``, oldest first, from ``GET /generations`` (checked
    against the client's ``history()``)."""
    body = httpx.get(f"{url}/collections/{name}/generations").json()
    with Client(url) as client:
        infos, more = client.collection(name).history()
    assert not more and [i.metadata for i in infos] == [item["metadata"] for item in body["items"]]
    # the empty generation the collection was created at has no commit, so no metadata
    return [i.metadata for i in reversed(infos) if i.generation_id]


def _ids(*generations: bytes) -> str:
    return "..".join(shell.quote_empty(shell.show(g)) for g in generations)


def test_rounds_of_updates_and_deletes_match_a_recomputation(spark, server_url, store, names) -> None:
    rng = random.Random(5)
    users = 400
    _setup(store, names, rng, users)
    a1, b1 = (store.collection(names[n]).generation_id for n in "AB")
    # diffs over 100 changes are read by Spark tasks (the first round; A's 120 changes next to B's smaller
    # diff in the second); the watcher below runs with the default, so its round is a small one
    transform = _transform(spark, server_url, names, local_diff_max_rows=100)
    try:
        first = transform.run()
        assert len(first) == 1 and first[0].rows_written
        assert snapshot(store, names["C"]) == _expected(store, names)
        a, b = random_changes(rng, users, 120)
        commit_items(store, names["A"], a)
        commit_items(store, names["B"], b)
        assert len(transform.run()) == 1
        assert snapshot(store, names["C"]) == _expected(store, names)
        assert transform.run() == []  # caught up: no new round, no new generation
    finally:
        transform.close()
    a2, b2 = (store.collection(names[n]).generation_id for n in "AB")
    # each round's commit says which job, which round and what it read of each source (issue 28)
    job = "spark_a_plus_b_job:country_totals"
    assert _metadata(server_url, names["C"]) == [
        {"job": job, "round": "1", "source.a": _ids(b"", a1), "source.b": _ids(b"", b1)},
        {"job": job, "round": "2", "source.a": _ids(a1, a2), "source.b": _ids(b1, b2)},
    ]

    # watch mode: the runner idles on long polls and wakes up when a source moves
    caught_up, stop = threading.Event(), threading.Event()
    rounds: list[Any] = []

    def on_event(event: str, details: dict[str, Any]) -> None:
        if event == "caught_up":
            caught_up.set()
        if event == "committed":
            rounds.append(details["stats"])
        if event == "caught_up" and rounds:
            stop.set()

    watcher = _transform(spark, server_url, names, on_event=on_event, poll_timeout_ms=500)
    thread = threading.Thread(target=lambda: watcher.run(watch=True, should_stop=stop.is_set), daemon=True)
    try:
        thread.start()
        assert caught_up.wait(THREAD_DEADLINE_S)
        a, _ = random_changes(rng, users, 120)
        commit_items(store, names["A"], a)  # one source only, so that exactly one round follows
        thread.join(THREAD_DEADLINE_S)
        assert not thread.is_alive() and len(rounds) == 1
    finally:
        stop.set()
        watcher.close()
    assert snapshot(store, names["C"]) == _expected(store, names)
    a3 = store.collection(names["A"]).generation_id
    # a new runner numbers its round after the last commit's (an empty diff of b reads nothing: b2..b2)
    assert rounds[0].number == 3 and _metadata(server_url, names["C"])[2:] == [
        {"job": job, "round": "3", "source.a": _ids(a2, a3), "source.b": _ids(b2, b2)}
    ]
    readers = _readers(store, names["C"])
    assert readers["from_a"] == store.collection(names["A"]).generation_id
    assert readers["from_b"] == store.collection(names["B"]).generation_id


def test_a_failing_task_leaves_the_target_untouched(spark, server_url, store, names) -> None:
    rng = random.Random(6)
    _setup(store, names, rng, 200)
    job = load_example_job()

    def failing(spark_: Any, diffs: Any, lookup: Any) -> Any:
        out = job.country_totals(spark_, diffs, lookup)
        # raise_error runs inside the write tasks, after other tasks may have written records
        boom = F.when(F.col("key") == F.lit(b"JP"), F.raise_error(F.lit("boom"))).otherwise(F.col("value"))
        return out.select("key", boom.cast("binary").alias("value"))

    c = store.collection(names["C"])
    c.create_reader("from_a", names["A"], None)
    c.create_reader("from_b", names["B"], None)
    commit_items(store, names["C"], [(b"XX", b"17")])  # C holds a record and a committed generation
    before = (c.generation_id, _readers(store, names["C"]), snapshot(store, names["C"]))
    broken = _transform(spark, server_url, names, failing, max_attempts=1)
    try:
        with pytest.raises(TransformError):
            broken.run()
    finally:
        broken.close()
    c = store.collection(names["C"])
    assert c.next_generation_id is None
    assert before == (c.generation_id, _readers(store, names["C"]), snapshot(store, names["C"]))

    good = _transform(spark, server_url, names)
    try:
        assert len(good.run()) == 1
    finally:
        good.close()
    expected = _expected(store, names)
    expected[b"XX"] = b"17"
    assert snapshot(store, names["C"]) == expected


def test_racing_transforms_commit_once_per_round(spark, server_url, store, names) -> None:
    rng = random.Random(7)
    _setup(store, names, rng, 200)
    other_committed = threading.Event()
    commits: dict[str, int] = {"slow": 0, "fast": 0}
    conflicts: list[str] = []

    def slow_events(event: str, details: dict[str, Any]) -> None:
        if event == "planned" and not other_committed.is_set():
            # hold the slow runner between reading the readers and opening its generation until the fast
            # one has committed: its commit then carries stale compare-and-set expectations
            assert other_committed.wait(THREAD_DEADLINE_S)
        if event == "failed":
            conflicts.append(details["error"])
        if event == "committed":
            commits["slow"] += 1

    def fast_events(event: str, details: dict[str, Any]) -> None:
        if event == "committed":
            commits["fast"] += 1
            other_committed.set()

    slow = _transform(spark, server_url, names, on_event=slow_events)
    fast = _transform(spark, server_url, names, on_event=fast_events)
    results: dict[str, Any] = {}
    thread = threading.Thread(target=lambda: results.update(slow=slow.run()), daemon=True)
    try:
        thread.start()
        results["fast"] = fast.run()
        thread.join(THREAD_DEADLINE_S)
        assert not thread.is_alive()
    finally:
        slow.close()
        fast.close()
    assert commits == {"slow": 0, "fast": 1}
    assert results["slow"] == [] and len(results["fast"]) == 1
    assert conflicts and all(("BadVersion" in c or "Outdated" in c) for c in conflicts)
    assert snapshot(store, names["C"]) == _expected(store, names)


def test_a_watching_runner_rides_out_a_cut_link_to_its_server(spark, server_url, store, names) -> None:
    """Issue 54 item 1: ``transform --watch`` retried an unreachable server every second (event ``failed``
    each time); it now waits by the shared back-off policy, says once that it waits and once that the
    server is back, and the round that follows applies what the sources did meanwhile exactly once."""
    rng = random.Random(54)
    users = 100
    _setup(store, names, rng, users)
    changes: list[bool] = []
    caught_up, stop = threading.Event(), threading.Event()
    failures: list[str] = []

    def on_event(event: str, details: dict[str, Any]) -> None:
        if event == "caught_up":
            caught_up.set()
        if event == "failed":
            failures.append(details["error"])

    with TcpProxy(server_url.removeprefix("http://")) as proxy:
        watcher = _transform(
            spark,
            f"http://{proxy.address}",
            names,
            on_event=on_event,
            poll_timeout_ms=500,
            outage=RetryPolicy(initial_s=0.05, max_s=0.5),
            on_outage=changes.append,
        )
        errors: list[BaseException] = []

        def run() -> None:
            try:
                watcher.run(watch=True, should_stop=stop.is_set)
            except BaseException as exc:  # reported by the test thread
                errors.append(exc)

        thread = threading.Thread(target=run, daemon=True)
        try:
            thread.start()
            assert caught_up.wait(THREAD_DEADLINE_S), errors
            proxy.cut(refuse=True)
            wait_until(lambda: watcher.outage_watch.waiting or errors, THREAD_DEADLINE_S, what="the wait")
            a, _ = random_changes(rng, users, 50)
            commit_items(store, names["A"], a)  # the source moves while the runner cannot reach the server
            caught_up.clear()
            proxy.accept()
            wait_until(
                lambda: (
                    errors or (caught_up.is_set() and snapshot(store, names["C"]) == _expected(store, names))
                ),
                THREAD_DEADLINE_S,
                what="the round after the outage",
            )
        finally:
            stop.set()
            thread.join(THREAD_DEADLINE_S)
            watcher.close()
    assert not thread.is_alive() and not errors, errors
    assert changes == [True, False] and not failures  # one outage, no retry reported as a failed round
    assert _readers(store, names["C"])["from_a"] == store.collection(names["A"]).generation_id
