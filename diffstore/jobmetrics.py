"""Prometheus metrics of the long-running jobs, ``diffstore ingest`` and ``diffstore transform``.

Each job serves its own registry (no global state) on ``--metrics-port`` (``--metrics-host``, loopback by
default) while it runs: the same text format as the server's ``/metrics``.

- ingest: records applied and skipped, records/s (over the last seconds), lag per shard (seconds from the
  publish time of the newest record applied from that shard to its commit), windows committed.
- transform: rounds committed, round seconds (histogram), rows read per source and rows written, retries.
- both: ``diffstore_<job>_waiting{server}`` (1 while the job waits for a server that does not answer) and
  ``diffstore_<job>_outages_total{server}`` (outages it met), ``server`` = ``diffstore`` or ``streams``.

prometheus_client comes with the extras of these jobs ('streams', 'spark'), so it is imported when a job
builds its metrics, not with this module: the jobs' parsers add :func:`add_arguments` without it.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

__all__ = [
    "CollectorRegistry",
    "IngestMetrics",
    "MetricsServer",
    "OutageMetrics",
    "TransformMetrics",
    "add_arguments",
]

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

    from diffstore.streams.ingest import CommitStats


def __getattr__(name: str) -> Any:
    """``CollectorRegistry``, prometheus_client's, imported when a job first asks for it."""
    if name == "CollectorRegistry":
        from prometheus_client import CollectorRegistry

        return CollectorRegistry
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


ROUND_BUCKETS = (0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Adds ``--metrics-port`` and ``--metrics-host`` to a job's command."""
    parser.add_argument(
        "--metrics-port", type=int, default=None, help="serve Prometheus metrics on this port (default: off)"
    )
    parser.add_argument(
        "--metrics-host", default="127.0.0.1", help="address of the metrics (default loopback)"
    )


class MetricsServer:
    """``registry`` served over HTTP by a daemon thread (port 0: any free port, then in :attr:`port`)."""

    def __init__(self, registry: CollectorRegistry, port: int, host: str = "127.0.0.1") -> None:
        from prometheus_client import start_http_server

        self._server, self._thread = start_http_server(port, addr=host, registry=registry)
        self.port: int = self._server.server_port

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)


class IngestMetrics:
    """The series of one ingestor, each labelled with its ``subscription`` (and ``collection``), so that the
    ingestors of several pipelines scraped into one Prometheus stay apart."""

    def __init__(self, registry: CollectorRegistry, subscription: str = "", collection: str = "") -> None:
        from prometheus_client import Counter, Gauge

        names = ["subscription", "collection"]
        self.applied = Counter(
            "diffstore_ingest_records", "Records applied to the collection", names, registry=registry
        ).labels(subscription, collection)
        self.skipped = Counter(
            "diffstore_ingest_records_skipped",
            "Records delivered again and skipped (already applied)",
            names,
            registry=registry,
        ).labels(subscription, collection)
        self.windows = Counter(
            "diffstore_ingest_windows", "Windows committed as generations", names, registry=registry
        ).labels(subscription, collection)
        self.rate = Gauge(
            "diffstore_ingest_records_per_second",
            "Records applied per second over the last seconds",
            names,
            registry=registry,
        ).labels(subscription, collection)
        self._lag = Gauge(
            "diffstore_ingest_lag_seconds",
            "Seconds from the publish time of the newest record applied from a shard to its commit",
            [*names, "shard"],
            registry=registry,
        )
        self._names = (subscription, collection)
        self._applied_total = 0
        self._skipped_total = 0

    def follow_rate(self, records_per_second: Callable[[], float]) -> None:
        """Reads the rate at each scrape, so that it falls to 0 when no record comes (no commit sets it)."""
        self.rate.set_function(records_per_second)

    def on_commit(self, stats: CommitStats) -> None:
        self.windows.inc()
        self.applied.inc(stats.applied_total - self._applied_total)
        self.skipped.inc(stats.skipped_total - self._skipped_total)
        self._applied_total, self._skipped_total = stats.applied_total, stats.skipped_total
        for shard, lag in stats.shard_lag_s.items():
            self._lag.labels(*self._names, str(shard)).set(lag)


class OutageMetrics:
    """The outages of the servers a job needs (see :mod:`diffstore.outage`), labelled ``server`` and the
    job's own labels."""

    def __init__(self, registry: CollectorRegistry, job: str, labels: dict[str, str] | None = None) -> None:
        from prometheus_client import Counter, Gauge

        self._labels = dict(labels or {})
        names = [*self._labels, "server"]
        self._waiting = Gauge(
            f"diffstore_{job}_waiting",
            "1 while the job waits for a server that does not answer (retrying with back-off)",
            names,
            registry=registry,
        )
        self._outages = Counter(
            f"diffstore_{job}_outages",
            "Times a server the job needs stopped answering",
            names,
            registry=registry,
        )

    def on_outage(self, server: str, waiting: bool) -> None:
        values = [*self._labels.values(), server]
        self._waiting.labels(*values).set(1 if waiting else 0)
        if waiting:
            self._outages.labels(*values).inc()


class TransformMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        from prometheus_client import Counter, Histogram

        self.rounds = Counter("diffstore_transform_rounds", "Rounds committed", registry=registry)
        self.round_seconds = Histogram(
            "diffstore_transform_round_seconds",
            "Seconds of a committed round, from planning to commit",
            buckets=ROUND_BUCKETS,
            registry=registry,
        )
        self.rows_read = Counter(
            "diffstore_transform_rows_read", "Diff rows read from a source", ["source"], registry=registry
        )
        self.rows_written = Counter(
            "diffstore_transform_rows_written", "Rows written to the target", registry=registry
        )
        self.retries = Counter(
            "diffstore_transform_retries", "Rounds that failed and were retried", registry=registry
        )

    def on_event(self, name: str, details: dict[str, Any]) -> None:
        if name == "committed":
            stats = details["stats"]
            self.rounds.inc()
            self.round_seconds.observe(stats.seconds)
            for source, rows in stats.rows_read.items():
                if rows is not None:
                    self.rows_read.labels(source).inc(rows)
            if stats.rows_written is not None:
                self.rows_written.inc(stats.rows_written)
        elif name == "failed":
            self.retries.inc()
