"""``diffstore ingest --metrics-port``: its Prometheus series move as windows commit; JSON logs parse."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
from ingest_helpers import produce
from prometheus_client.parser import text_string_to_metric_families

from diffstore.streams.client import StreamClient
from tests.helpers import close_pipes, free_port, wait_until

REPO = Path(__file__).resolve().parents[2]


def _samples(port: int) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    try:
        text = httpx.get(f"http://127.0.0.1:{port}/metrics").text
    except httpx.TransportError:
        return {}
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def test_ingest_serves_its_metrics_and_logs_json(stream_server: Any, tmp_path: Path) -> None:
    port = free_port()
    with StreamClient(stream_server.url) as client:
        client.create_stream("s", shard_count=2)
        client.create_subscription("sub", "s")
        command = [
            sys.executable, "-m", "diffstore.cli", "ingest", "--hstream", stream_server.url,
            "--subscription", "sub", "--collection", "C", "--data", str(tmp_path / "db"),
            "--create-collection", "--window-records", "30", "--window-ms", "20", "--metrics-port", str(port),
            "--log-format", "json", "--log-level", "debug",
        ]  # fmt: skip
        process = subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO
        )
        try:
            wait_until(lambda: _samples(port), 30, what="the metrics endpoint")
            produce(client, "s", [(f"k{i}", b"%d" % i) for i in range(100)])
            pipeline = frozenset({("subscription", "sub"), ("collection", "C")})
            done = wait_until(
                lambda: (s := _samples(port)).get(("diffstore_ingest_records_total", pipeline)) == 100 and s,
                60,
                what="the 100 records to be counted",
            )
            assert done[("diffstore_ingest_windows_total", pipeline)] >= 1
            assert ("diffstore_ingest_records_per_second", pipeline) in done
            lags = [labels for name, labels in done if name == "diffstore_ingest_lag_seconds"]
            assert {dict(labels)["shard"] for labels in lags}, done  # a lag series per shard that had records
            assert all(pipeline <= labels for labels in lags), lags
            process.terminate()
            assert process.wait(60) == 0
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()
    assert process.stderr is not None
    lines = [json.loads(line) for line in process.stderr.read().splitlines() if line.strip()]
    close_pipes(process)
    assert any(line["event"] == "window committed" and "records" in line for line in lines), lines
    assert lines[-1]["event"] == "ingest stopped" and lines[-1]["applied"] == 100
    assert all({"time", "level", "event"} <= line.keys() for line in lines)
