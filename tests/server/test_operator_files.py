"""The files an operator loads: ``docs/grafana/diffstore.json`` (a dashboard) and
``docs/prometheus/alerts.yml`` (alerting rules). Both parse, and every series they query is one that
``/metrics`` of ``diffstore serve`` (or of ``diffstore ingest --metrics-port``) exports, so a renamed series
breaks this test, not a dashboard.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from diffstore import jobmetrics
from diffstore.engine.types import StoreConfig
from diffstore.streams.ingest import CommitStats

from .conftest import Live, live_server
from .test_metrics import commit

REPO = Path(__file__).resolve().parents[2]
DASHBOARD = REPO / "docs" / "grafana" / "diffstore.json"
ALERTS = REPO / "docs" / "prometheus" / "alerts.yml"
_SERIES = re.compile(r"\b(?:diffstore|process|python)_[a-z_]+\b")
_SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count")}


def exported(text: str) -> dict[str, set[str]]:
    """Series name -> its label names, for every family of an exposition (samples or not)."""
    found: dict[str, set[str]] = {}
    for family in text_string_to_metric_families(text):
        for name in (family.name, *(family.name + s for s in _SUFFIXES.get(family.type, ()))):
            found.setdefault(name, set())
        for sample in family.samples:
            found.setdefault(sample.name, set()).update(sample.labels)
    return found


@pytest.fixture
def server_series(tmp_path: Path) -> Iterator[dict[str, set[str]]]:
    with live_server(tmp_path / "data", store_config=StoreConfig(commit_delay_ms=20)) as live:
        yield _series_of(live) | _replica_series(tmp_path / "replica")


def _series_of(live: Live) -> dict[str, set[str]]:
    live.ok("POST", "/collections/", {"collectionName": "src", "isManual": True})
    commit(live, "src", "g1", {"a": "1"})
    series = exported(live.http.get("/metrics").text)
    registry = jobmetrics.CollectorRegistry()  # what diffstore ingest --metrics-port serves, after a window
    jobmetrics.IngestMetrics(registry, "sub", "C").on_commit(
        CommitStats(b"1", 1, 1, 1, 0, 0.1, positions={}, shard_lag_s={0: 0.1})
    )
    series.update(exported(generate_latest(registry).decode()))
    return series


def _replica_series(data: Path) -> dict[str, set[str]]:
    """What a read replica's /metrics adds (a store that follows a primary, with a collection's state)."""
    from diffstore.engine.store import Store
    from diffstore.server.metrics import replica_collector

    with Store.open(data) as store:
        store.become_replica("http://127.0.0.1:1", "metrics")
        store.set_replica_lag("A", 2, 1)
        store.set_replica_status("A", "stalled", "cannot reach the primary", 1)
        registry = jobmetrics.CollectorRegistry()
        registry.register(replica_collector(store))
        return exported(generate_latest(registry).decode())


def queried(expressions: list[str]) -> set[str]:
    return {name for expr in expressions for name in _SERIES.findall(expr)}


def test_the_dashboard_parses_and_queries_only_exported_series(server_series: dict[str, set[str]]) -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    exprs = [target["expr"] for panel in dashboard["panels"] for target in panel["targets"]]
    titles = " / ".join(panel["title"] for panel in dashboard["panels"]).lower()
    for what in ("request", "latency", "commits", "records written", "reader lag", "long-poll", "ingest"):
        assert what in titles, what  # what the dashboard promises to show
    names = queried(exprs)
    assert names - server_series.keys() == set()
    assert {"diffstore_http_request_seconds_bucket", "diffstore_ingest_lag_seconds"} <= names
    assert {"subscription", "shard"} <= server_series["diffstore_ingest_lag_seconds"]
    assert "worker" in server_series["process_resident_memory_bytes"]  # the server's processes, by pid
    assert server_series["diffstore_build_info"] == {"version", "python"}


def test_the_alerting_rules_parse_and_query_only_exported_series(server_series: dict[str, set[str]]) -> None:
    rules = [rule for group in yaml.safe_load(ALERTS.read_text())["groups"] for rule in group["rules"]]
    assert {rule["alert"] for rule in rules} == {
        "DiffstoreReaderLagGrowing",
        "DiffstoreReaderLagOld",
        "DiffstoreAutoCommitFailing",
        "DiffstoreStorageNearlyFull",
        "DiffstoreWorkerRestarting",
        "DiffstoreReplicaLagging",
    }
    for rule in rules:
        assert rule["labels"]["severity"] in ("warning", "critical") and rule["annotations"]["summary"], rule
    names = queried([rule["expr"] for rule in rules])
    assert names - server_series.keys() == set()
    assert {"diffstore_store_map_size_bytes", "diffstore_reader_lag_seconds"} <= names
    assert {"diffstore_replica_state", "diffstore_replica_lag_seconds"} <= names
