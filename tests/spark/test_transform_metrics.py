"""The transform's Prometheus series (``diffstore transform --metrics-port``) move with its rounds."""

from __future__ import annotations

import random
from typing import Any

import httpx
from helpers_spark import commit_items, initial_load, load_example_job, random_changes
from prometheus_client import CollectorRegistry

from diffstore import Store, jobmetrics
from diffstore.spark import Transform


def test_rounds_and_round_seconds_are_counted(spark: Any, server_url: str, store: Store, names: Any) -> None:
    rng = random.Random(9)
    for name in names.values():
        store.create_collection(name, manual=True)
    a, b = initial_load(rng, 50)
    commit_items(store, names["A"], a)
    commit_items(store, names["B"], b)
    registry = CollectorRegistry()
    metrics = jobmetrics.TransformMetrics(registry)
    sources = {"a": names["A"], "b": names["B"]}
    transform = Transform(
        spark, server_url, names["C"], sources, load_example_job().country_totals, partitions=2,
        on_event=metrics.on_event,
    )  # fmt: skip
    server = jobmetrics.MetricsServer(registry, 0)
    try:
        assert registry.get_sample_value("diffstore_transform_rounds_total") == 0
        transform.run()
        assert registry.get_sample_value("diffstore_transform_rounds_total") == 1
        assert registry.get_sample_value("diffstore_transform_round_seconds_count") == 1
        read_a = registry.get_sample_value("diffstore_transform_rows_read_total", {"source": "a"})
        assert read_a is not None and read_a > 0
        written = registry.get_sample_value("diffstore_transform_rows_written_total")
        assert written is not None and written > 0
        changes, _ = random_changes(rng, 50, 10)
        commit_items(store, names["A"], changes)
        transform.run()
        assert registry.get_sample_value("diffstore_transform_rounds_total") == 2
        text = httpx.get(f"http://127.0.0.1:{server.port}/metrics").text
        assert "diffstore_transform_rounds_total 2.0" in text
        assert "diffstore_transform_round_seconds_bucket" in text
    finally:
        transform.close()
        server.stop()
