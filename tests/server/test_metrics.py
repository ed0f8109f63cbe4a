"""``GET /metrics`` of a real server: every named series appears, and moves when its event happens."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from diffstore.engine.types import StoreConfig
from diffstore.server import ServerConfig
from tests.helpers import ManualClock, wait_until

from .conftest import Live, es, live_server

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def scrape(live: Live) -> Samples:
    response = live.http.get("/metrics")
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/plain")
    samples: Samples = {}
    for family in text_string_to_metric_families(response.text):
        for sample in family.samples:
            samples[(sample.name, frozenset(sample.labels.items()))] = sample.value
    return samples


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, frozenset(labels.items())), 0.0)


@pytest.fixture
def manual(tmp_path: Path) -> Iterator[Live]:
    with live_server(
        tmp_path / "data", store_config=StoreConfig(commit_delay_ms=20, gc_interval_ms=20)
    ) as live:
        live.ok("POST", "/collections/", {"collectionName": "src", "isManual": True})
        live.ok("POST", "/collections/", {"collectionName": "dst", "isManual": True})
        yield live


def commit(live: Live, collection: str, generation: str, items: dict[str, str]) -> None:
    live.ok("POST", f"/collections/{collection}/generation/start", {"generationId": es(generation)})
    if items:
        body = {
            "generationId": es(generation),
            "items": [{"key": es(k), "value": es(v)} for k, v in items.items()],
        }
        live.ok("POST", f"/collections/{collection}/putMany", body)
    live.ok("POST", f"/collections/{collection}/generation/commit", {"generationId": es(generation)})


def test_every_named_series_appears(manual: Live) -> None:
    commit(manual, "src", "g1", {"a": "1"})
    manual.ok("POST", "/collections/dst/readers/", {"readerName": "r", "collectionName": "src"})
    text = manual.http.get("/metrics").text
    for name in (
        "diffstore_http_requests_total",
        "diffstore_http_request_seconds_bucket",
        "diffstore_commits_total",
        "diffstore_records_written_total",
        "diffstore_reader_lag_generations",
        "diffstore_reader_lag_seconds",
        "diffstore_longpoll_waiters",
        "diffstore_gc_versions_removed_total",
        "diffstore_phantom_records_purged_total",
        "diffstore_store_size_bytes",
    ):
        assert f"# TYPE {name.removesuffix('_bucket')} " in text, name
        assert f"\n{name}" in text, name
    assert value(scrape(manual), "diffstore_store_size_bytes") > 0


def test_requests_count_by_route_template(manual: Live) -> None:
    before = scrape(manual)
    commit(manual, "src", "g1", {"a": "1"})
    manual.ok("POST", "/collections/src/get", {"key": es("a")})  # the fast lane
    manual.ok("POST", "/collections/src/get/", {"key": es("a")})  # its slash twin
    manual.fail("POST", "/collections/nope/get", {"key": es("a")}, status=404, code="noSuchCollection")
    manual.ok("GET", "/collections/src/readers/")
    after = scrape(manual)
    get = {"route": "/collections/{c}/get", "method": "POST"}
    assert (
        value(after, "diffstore_http_requests_total", **get, status="200")
        - value(before, "diffstore_http_requests_total", **get, status="200")
        == 2
    )
    assert value(after, "diffstore_http_requests_total", **get, status="404") == 1
    readers = {"route": "/collections/{c}/readers", "method": "GET", "status": "200"}
    assert value(after, "diffstore_http_requests_total", **readers) == 1
    put = {"route": "/collections/{c}/putMany", "method": "POST"}
    assert value(after, "diffstore_http_request_seconds_count", **put) == 1
    assert value(after, "diffstore_http_request_seconds_bucket", **put, le="+Inf") == 1
    # no raw path ever becomes a label
    assert not any("src" in dict(labels).get("route", "") for _, labels in after)


def test_commits_and_records_written(manual: Live) -> None:
    commit(manual, "src", "g1", {"a": "1", "b": "2", "c": "3"})
    samples = scrape(manual)
    assert value(samples, "diffstore_commits_total", collection="src") == 1
    assert value(samples, "diffstore_records_written_total", collection="src") == 3
    commit(manual, "src", "g2", {"a": "9"})
    samples = scrape(manual)
    assert value(samples, "diffstore_commits_total", collection="src") == 2
    assert value(samples, "diffstore_records_written_total", collection="src") == 4
    assert value(samples, "diffstore_commits_total", collection="dst") == 0


def test_the_series_of_a_deleted_collection_go_with_it(manual: Live) -> None:
    """Create/delete cycles leave no series behind (they used to pile up, two per collection)."""
    for cycle in range(20):
        name = f"tmp{cycle}"
        manual.ok("POST", "/collections/", {"collectionName": name, "isManual": True})
        commit(manual, name, "g1", {"k": "v"})
        manual.ok("DELETE", f"/collections/{name}")
    commit(manual, "src", "g1", {"a": "1"})
    per_collection = {
        (name, labels["collection"])
        for (name, labels_items), _ in scrape(manual).items()
        for labels in [dict(labels_items)]
        if "collection" in labels and name.endswith("_total")
    }
    assert per_collection == {
        ("diffstore_commits_total", "src"),
        ("diffstore_records_written_total", "src"),
    }
    metrics = manual.app.state.metrics
    assert {labels for labels, _ in metrics.commits._metrics.items()} == {("src",)}  # nothing kept inside


def test_auto_commits_count_too(tmp_path: Path) -> None:
    with live_server(tmp_path / "data") as live:
        live.ok("POST", "/collections/", {"collectionName": "auto", "isManual": False})
        live.ok("POST", "/collections/auto/put", {"item": {"key": es("k"), "value": es("v")}})
        wait_until(
            lambda: value(scrape(live), "diffstore_commits_total", collection="auto") == 1,
            timeout=10,
            what="the background commit to be counted",
        )
        assert value(scrape(live), "diffstore_records_written_total", collection="auto") == 1


def test_reader_lag_counts_committed_generations(manual: Live) -> None:
    commit(manual, "src", "g1", {"a": "1"})
    manual.ok(
        "POST",
        "/collections/dst/readers/",
        {"readerName": "r", "collectionName": "src", "generationId": es("g1")},
    )
    lag = {"collection": "dst", "reader": "r", "target": "src"}
    assert value(scrape(manual), "diffstore_reader_lag_generations", **lag) == 0
    commit(manual, "src", "g2", {"a": "2"})
    # an aborted generation is not a generation the reader is behind
    manual.ok("POST", "/collections/src/generation/start", {"generationId": es("g3")})
    manual.ok("POST", "/collections/src/generation/abort", {"generationId": es("g3")})
    commit(manual, "src", "g4", {"a": "4"})
    assert value(scrape(manual), "diffstore_reader_lag_generations", **lag) == 2
    manual.ok("PUT", "/collections/dst/readers/r", {"generationId": es("g4")})
    assert value(scrape(manual), "diffstore_reader_lag_generations", **lag) == 0


def test_reader_lag_seconds_is_the_age_of_the_oldest_unread_commit(tmp_path: Path) -> None:
    clock = ManualClock(time.time_ns() // 1_000_000)
    hour_ms = 3_600_000
    with live_server(tmp_path / "data", store_config=StoreConfig(clock_ms=clock)) as live:
        live.ok("POST", "/collections/", {"collectionName": "src", "isManual": True})
        live.ok("POST", "/collections/", {"collectionName": "dst", "isManual": True})
        reader = {"readerName": "r", "collectionName": "src", "generationId": es("g1")}
        clock.now_ms -= 10 * hour_ms
        commit(live, "src", "g1", {"a": "1"})
        live.ok("POST", "/collections/dst/readers/", reader)
        live.ok("POST", "/collections/src/readers/", {"readerName": "self", "generationId": None})
        lag = {"collection": "dst", "reader": "r", "target": "src"}
        assert value(scrape(live), "diffstore_reader_lag_seconds", **lag) == 0  # caught up
        commit(live, "src", "g2", {"a": "2"})  # committed 10 h ago
        clock.now_ms += 9 * hour_ms
        commit(live, "src", "g3", {"a": "3"})  # 1 h ago
        samples = scrape(live)
        assert 10 * 3600 <= value(samples, "diffstore_reader_lag_seconds", **lag) < 11 * 3600
        assert value(samples, "diffstore_reader_lag_generations", **lag) == 2
        # a self-reader: its target is its own collection; from the beginning, the oldest unread is g1
        own = {"collection": "src", "reader": "self", "target": "src"}
        assert 10 * 3600 <= value(samples, "diffstore_reader_lag_seconds", **own) < 11 * 3600
        live.ok("PUT", "/collections/dst/readers/r", {"generationId": es("g2")})
        assert 3600 <= value(scrape(live), "diffstore_reader_lag_seconds", **lag) < 2 * 3600
        # generations committed before commit times were recorded: the age is unknown, so no sample
        # (a position never scraped: a known age is kept per position, commit rows are never rewritten)
        live.ok("POST", "/collections/", {"collectionName": "old", "isManual": True})
        commit(live, "old", "o1", {"a": "1"})
        live.ok("POST", "/collections/dst/readers/", {"readerName": "o", "collectionName": "old"})
        with live.store.write() as scope:
            scope.txn.drop(live.store.tables.commits, delete=False)
        samples = scrape(live)
        old = {"collection": "dst", "reader": "o", "target": "old"}
        assert ("diffstore_reader_lag_seconds", frozenset(old.items())) not in samples
        assert value(samples, "diffstore_reader_lag_generations", **old) == 1
        assert 3600 <= value(samples, "diffstore_reader_lag_seconds", **lag) < 2 * 3600  # kept


def test_longpoll_waiters_gauge(manual: Live) -> None:
    commit(manual, "src", "g1", {"a": "1"})
    answers: list[int] = []

    def poll() -> None:
        with httpx.Client(base_url=manual.url, timeout=60) as http:
            answers.append(
                http.get("/collections/src/generationId/stream", params={"generationId": "g1"}).status_code
            )

    thread = threading.Thread(target=poll)
    thread.start()
    try:
        wait_until(
            lambda: value(scrape(manual), "diffstore_longpoll_waiters") == 1,
            timeout=10,
            what="the waiter to show",
        )
        commit(manual, "src", "g2", {"a": "2"})
        wait_until(lambda: answers == [200], timeout=10, what="the long poll to be answered")
        wait_until(
            lambda: value(scrape(manual), "diffstore_longpoll_waiters") == 0,
            timeout=10,
            what="the waiter to go",
        )
    finally:
        thread.join(timeout=30)
    route = {"route": "/collections/{c}/generationId/stream", "method": "GET", "status": "200"}
    assert value(scrape(manual), "diffstore_http_requests_total", **route) == 1


def test_gc_counter_moves_when_versions_are_collected(manual: Live) -> None:
    for n in range(1, 4):
        commit(manual, "src", f"g{n}", {"k": str(n)})
    assert value(scrape(manual), "diffstore_gc_versions_removed_total") == 0
    manual.ok(
        "POST",
        "/collections/dst/readers/",
        {"readerName": "r", "collectionName": "src", "generationId": es("g3")},
    )
    wait_until(
        lambda: value(scrape(manual), "diffstore_gc_versions_removed_total") == 2,
        timeout=10,
        what="GC to remove the two superseded versions of k",
    )


def test_phantom_purge_counter(manual: Live) -> None:
    commit(manual, "src", "g1", {})
    collection = manual.store.collection("src")
    phantom = collection.start_phantom(ttl_seconds=0.05)
    collection.put_many([(b"p1", b"x"), (b"p2", b"y")], generation_id=b"g1", phantom_id=phantom)
    wait_until(
        lambda: value(scrape(manual), "diffstore_phantom_records_purged_total") >= 2,
        timeout=10,
        what="the expired phantom's records to be purged",
    )
    # phantom records are not records written into a generation
    assert value(scrape(manual), "diffstore_records_written_total", collection="src") == 0


def test_metrics_are_behind_the_token(tmp_path: Path) -> None:
    with live_server(tmp_path / "data", ServerConfig(token="tok")) as live:
        refused = httpx.get(f"{live.url}/metrics")
        assert refused.status_code == 401
        assert refused.json()["error"] == "unauthorized"
        samples = scrape(live)
        # the refusal itself was counted, under the route it asked for
        assert (
            value(samples, "diffstore_http_requests_total", route="/metrics", method="GET", status="401") == 1
        )


def test_request_metrics_can_be_switched_off(tmp_path: Path) -> None:
    with live_server(tmp_path / "data", ServerConfig(metrics=False)) as live:
        live.ok("POST", "/collections/", {"collectionName": "m", "isManual": True})
        commit(live, "m", "g1", {"a": "1"})
        samples = scrape(live)
        assert not any(name == "diffstore_http_requests_total" for name, _ in samples)
        assert value(samples, "diffstore_commits_total", collection="m") == 1
