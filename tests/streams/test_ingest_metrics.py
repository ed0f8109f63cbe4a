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
from tests.faults import TcpProxy
from tests.helpers import close_pipes, free_port, running_server, wait_until

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


def test_an_outage_of_the_diffstore_server_shows_in_the_metrics_and_two_log_lines(
    stream_server: Any, tmp_path: Path
) -> None:
    """``diffstore_ingest_waiting{server="diffstore"}`` is 1 while the link to the server is cut and 0 once
    it is back, ``diffstore_ingest_outages_total`` counts the outage, and the JSON log has one record at
    each end."""
    port = free_port()
    with (
        running_server(tmp_path / "db") as live,
        TcpProxy(live.url.removeprefix("http://")) as proxy,
        StreamClient(stream_server.url) as client,
    ):
        client.create_stream("s", shard_count=1)
        client.create_subscription("sub", "s")
        command = [
            sys.executable, "-m", "diffstore.cli", "ingest", "--hstream", stream_server.url,
            "--subscription", "sub", "--collection", "C", "--url", f"http://{proxy.address}",
            "--create-collection", "--window-ms", "20", "--metrics-port", str(port), "--log-format", "json",
        ]  # fmt: skip
        process = subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO
        )
        try:
            wait_until(lambda: _samples(port), 30, what="the metrics endpoint")
            produce(client, "s", [(f"k{i}", b"%d" % i) for i in range(10)])
            pipeline = frozenset({("subscription", "sub"), ("collection", "C")})
            records = ("diffstore_ingest_records_total", pipeline)
            wait_until(lambda: _samples(port).get(records) == 10, 60, what="the first records")
            proxy.cut(refuse=True)
            produce(client, "s", [(f"k{i}", b"%d" % i) for i in range(10, 20)])  # a window it cannot write
            server = pipeline | {("server", "diffstore")}
            waiting = wait_until(
                lambda: (s := _samples(port)).get(("diffstore_ingest_waiting", server)) == 1 and s,
                60,
                what="the wait to show",
            )
            assert waiting[("diffstore_ingest_outages_total", server)] == 1
            proxy.accept()
            back = wait_until(
                lambda: (s := _samples(port)).get(("diffstore_ingest_waiting", server)) == 0 and s,
                60,
                what="the return to show",
            )
            assert back[("diffstore_ingest_outages_total", server)] == 1
            wait_until(lambda: _samples(port).get(records) == 20, 60, what="the records of the outage")
            process.terminate()
            assert process.wait(60) == 0
            assert process.stderr is not None
            events = [json.loads(line) for line in process.stderr.read().splitlines() if line.startswith("{")]
            outage = [e for e in events if e.get("server", "").startswith("the diffstore server")]
            assert [(e["level"], e["event"].split(";")[0]) for e in outage] == [
                ("warning", "the diffstore server does not answer"),
                ("info", outage[-1]["event"]),
            ]
            assert "is back after" in outage[-1]["event"] and outage[-1]["outage_s"] > 0
            assert live.store.collection("C").get(b"k19").value == b"19"  # type: ignore[union-attr]
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()
            close_pipes(process)
