"""Prometheus metrics of ``diffstore serve``: HTTP requests, engine events, reader lag, long-poll waiters.

- HTTP: :class:`HttpMetrics`, the outermost ASGI middleware, counts every request (401s and 404s too) by
  route *template* (``/collections/{c}/get``, never the raw path, so collection names do not multiply the
  series; the slash twin of a route counts as the route), method and status, and times it.
- Engine events reach the metrics through the store's write listener (:mod:`diffstore.engine.events`):
  commits and records written by collection, GC versions removed, phantom records purged. The engine
  knows nothing of Prometheus.
- Reader lag and the store's size are read from the store when ``/metrics`` is scraped (one snapshot,
  :func:`diffstore.engine.overview.overview`): every worker process opens the same store, so any of them
  answers for all. Failing automatic commits come from the scraped process's ``Store.health()``.
- Long-poll waiters: each process sets its own count (on every scrape and every
  :data:`WAITERS_REFRESH_S`); with several processes the scrape shows the sum over the live ones.

Several worker processes (``serve --workers N``): prometheus_client's multiprocess mode. The supervisor
calls :func:`prepare_multiprocess` before it starts workers (a fresh directory in
``PROMETHEUS_MULTIPROC_DIR`` per server start), :func:`worker_exited` for each worker that stops and
:func:`cleanup_multiprocess` at the end; each worker inherits the directory and must not have
imported prometheus_client before (the mode is chosen at import: spawned workers have not). A scrape
then merges the files of every worker. Without the variable,
metrics live in the process, in a registry of their own per app (no global state).
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.metadata
import logging
import os
import platform
import re
import shutil
import tempfile
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import anyio.to_thread
from fastapi import APIRouter, Request, Response
from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    PlatformCollector,
    ProcessCollector,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from diffstore.engine import overview
from diffstore.server.longpoll import PARKED, REQUEST_STARTED
from diffstore.server.prometheus_adapter import observe_all
from diffstore.server.routing import declare
from diffstore.server.scopes import TokenScope

if TYPE_CHECKING:
    from starlette.routing import BaseRoute
    from starlette.types import ASGIApp, Message, Receive, Scope, Send

    from diffstore.engine.events import WriteEvent
    from diffstore.engine.store import Store
    from diffstore.server.longpoll import CommitHub
    from diffstore.server.synchronous import SynchronousReplication

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"
WAITERS_REFRESH_S = 0.5
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
UNMATCHED = "<unmatched>"
LONG_POLL_ROUTE = "/collections/{c}/generationId/stream"
_log = logging.getLogger("diffstore.server.metrics")
_FAST_PATH = re.compile(r"/collections/[^/]+/(.+?)/?")
_PID_FILE = re.compile(
    r"\w+_(\d+)\.db"
)  # prometheus_client's files: counter_<pid>.db, gauge_livesum_<pid>.db


def prepare_multiprocess(directory: str | None = None) -> str:
    """Makes a fresh, empty metrics directory and exports it for the worker processes started after.

    Call it in the supervisor before it starts the workers (each worker then runs in multiprocess mode).
    Returns the directory; :func:`cleanup_multiprocess` removes it.
    """
    path = directory or tempfile.mkdtemp(prefix="diffstore-metrics-")
    if os.path.isdir(path):
        shutil.rmtree(path)
    os.makedirs(path)
    os.environ[MULTIPROC_ENV] = path
    return path


def cleanup_multiprocess(path: str) -> None:
    """Removes the directory of :func:`prepare_multiprocess` once every worker has stopped."""
    os.environ.pop(MULTIPROC_ENV, None)
    shutil.rmtree(path, ignore_errors=True)


def worker_exited(pid: int) -> None:
    """Tells the metrics that a worker process is gone (its live gauges stop counting)."""
    if os.environ.get(MULTIPROC_ENV):
        from prometheus_client import multiprocess

        multiprocess.mark_process_dead(pid)  # type: ignore[no-untyped-call]


def _multiprocess() -> bool:
    """Whether this process's metrics live in the shared directory.

    prometheus_client picks its value storage when it is first imported: a directory exported later (in a
    process that had imported it already) cannot be used, and the metrics then stay in the process.
    """
    from prometheus_client import values

    shared = values.ValueClass is not values.MutexValue
    if os.environ.get(MULTIPROC_ENV) and not shared:
        _log.warning(
            "%s is set but prometheus_client was imported before: metrics stay in-process", MULTIPROC_ENV
        )
    return shared


class _StoreCollector(Collector):
    """Reader lag and store size, read from the store at scrape time."""

    def __init__(self, store: Store) -> None:
        self.store = store

    def collect(self) -> Iterator[Metric]:
        lag = GaugeMetricFamily(
            "diffstore_reader_lag_generations",
            "Committed generations of a reader's target collection after the reader's generation",
            labels=["collection", "reader", "target"],
        )
        lag_seconds = GaugeMetricFamily(
            "diffstore_reader_lag_seconds",
            "Seconds since the oldest generation of a reader's target that the reader has not read was "
            "committed (0: caught up; no sample when that generation's commit time is unknown)",
            labels=["collection", "reader", "target"],
        )
        now_ms = time.time_ns() // 1_000_000
        for state in overview.overview(self.store):
            for reader in state.readers:
                if reader.lag is None:
                    continue
                labels = [state.name, reader.name, reader.target]
                lag.add_metric(labels, reader.lag)
                if reader.lag == 0:
                    lag_seconds.add_metric(labels, 0.0)
                elif reader.unread_since_ms is not None:
                    lag_seconds.add_metric(labels, max(0, now_ms - reader.unread_since_ms) / 1000)
        yield lag
        yield lag_seconds
        yield GaugeMetricFamily(
            "diffstore_store_size_bytes",
            "Bytes of the store's data file in use",
            value=overview.size_bytes(self.store),
        )
        room = overview.space_of(self.store)
        yield GaugeMetricFamily(
            "diffstore_store_file_bytes", "Size of the store's data file on disk", value=room.file_bytes
        )
        yield GaugeMetricFamily(
            "diffstore_store_free_pages",
            "Pages of the store's data file holding no data: what 'diffstore compact' gives back to the disk",
            value=room.free_pages,
        )
        yield GaugeMetricFamily(
            "diffstore_store_page_bytes", "Size of one page of the store's data file", value=room.page_bytes
        )
        yield GaugeMetricFamily(
            "diffstore_store_map_size_bytes",
            "Upper bound of the store's data file (--map-size): writes past it answer 507 storageFull",
            value=overview.map_size_bytes(self.store),
        )
        # Automatic commits are retried by the process that took them: with several workers these two
        # describe the scraped process (a failure that persists shows in every process that retries it).
        health = self.store.health()
        failing = GaugeMetricFamily(
            "diffstore_auto_commit_failing_attempts",
            "Failed attempts of an automatic commit that is still being retried, by collection",
            labels=["collection"],
        )
        for failure in health.failing_auto_commits:
            failing.add_metric([failure.collection], failure.attempts)
        yield failing
        yield CounterMetricFamily(
            "diffstore_auto_commit_failures",
            "Failed attempts of automatic commits since this process opened the store",
            value=health.auto_commit_failures,
        )
        yield from _replica_metrics(self.store)
        yield from _ha_metrics(self.store)


REPLICA_STATES = ("copying", "following", "stalled")


class _ReplicaCollector(Collector):
    def __init__(self, store: Store) -> None:
        self.store = store

    def collect(self) -> Iterator[Metric]:
        yield from _replica_metrics(self.store)
        yield from _ha_metrics(self.store)


def replica_collector(store: Store) -> Collector:
    """A collector of a read replica's series alone (what ``/metrics`` adds on a replica)."""
    return _ReplicaCollector(store)


def _replica_metrics(store: Store) -> Iterator[Metric]:
    """The store's replication term and fencing (any store), and a read replica's lag and applied
    generations (stored by its follower: every worker sees them)."""
    state = store.replica_state()
    yield GaugeMetricFamily(
        "diffstore_replication_term",
        "The store's replication term (0 until it takes part in a promotion; a promotion raises it)",
        value=state.term,
    )
    yield GaugeMetricFamily(
        "diffstore_fenced",
        "1 while the store stepped down for a newer primary (it refuses writes: 409 fenced), else 0",
        value=1.0 if state.fenced is not None else 0.0,
    )
    yield CounterMetricFamily(
        "diffstore_step_downs",
        "Times the store stepped down for a newer primary (told by it, or by a request's higher term), ever",
        value=state.step_downs,
    )
    if state.primary is None:
        return
    lag = GaugeMetricFamily(
        "diffstore_replica_lag_generations",
        "Generations of the primary a read replica has seen and not applied yet, by collection",
        labels=["collection"],
    )
    for entry in state.lags:
        lag.add_metric([entry.collection], entry.generations)
    yield lag
    now_ms = time.time_ns() // 1_000_000
    lag_seconds = GaugeMetricFamily(
        "diffstore_replica_lag_seconds",
        "How long the oldest generation of the primary a read replica has seen and not applied has waited",
        labels=["collection"],
    )
    states = GaugeMetricFamily(
        "diffstore_replica_state",
        "1 for the state each collection's follower is in (copying, following, stalled), else 0",
        labels=["collection", "state"],
    )
    in_state = GaugeMetricFamily(
        "diffstore_replica_state_seconds",
        "How long each collection's follower has been in its state",
        labels=["collection", "state"],
    )
    for entry in state.lags:
        since = entry.unapplied_since_ms
        lag_seconds.add_metric(
            [entry.collection], 0.0 if since is None else max(0.0, (now_ms - since) / 1000)
        )
        for name in REPLICA_STATES:
            states.add_metric([entry.collection, name], 1.0 if entry.state == name else 0.0)
        if entry.state_since_ms is not None:
            in_state.add_metric(
                [entry.collection, entry.state], max(0.0, (now_ms - entry.state_since_ms) / 1000)
            )
    yield lag_seconds
    yield states
    yield in_state
    yield CounterMetricFamily(
        "diffstore_replica_applied_generations",
        "Generations of the primary this replica applied, ever",
        value=state.applied,
    )


HA_ROLES = ("leader", "replica", "candidate", "fenced")


def _ha_metrics(store: Store) -> Iterator[Metric]:
    """A fail-over member's role, term, fail-overs and discarded generations (stored by the member)."""
    record = store.ha_record()
    if record is None:
        return
    role = GaugeMetricFamily(
        "diffstore_ha_role",
        "1 for this fail-over member's role (leader, replica, candidate, fenced)",
        labels=["role"],
    )
    for name in HA_ROLES:
        role.add_metric([name], 1.0 if record.role == name else 0.0)
    yield role
    yield GaugeMetricFamily("diffstore_ha_term", "The cluster's term this member knows", value=record.term)
    yield CounterMetricFamily(
        "diffstore_ha_failovers",
        "Times this member took the lead from another member",
        value=record.failovers,
    )
    yield CounterMetricFamily(
        "diffstore_ha_discarded_generations",
        "Generations of its own this member discarded on rejoining (the new leader never saw them)",
        value=record.discarded,
    )
class _SynchronousCollector(Collector):
    """``serve --synchronous N``: how many replicas confirm writes now, and how many are required."""

    def __init__(self, synchronous: SynchronousReplication) -> None:
        self.synchronous = synchronous

    def collect(self) -> Iterator[Metric]:
        if not self.synchronous.enabled:
            return
        standings = self.synchronous.standings()
        yield GaugeMetricFamily(
            "diffstore_synchronous_replicas",
            "Replicas that confirm writes now (caught up in every collection, or moved a hold within the"
            " synchronous timeout)",
            value=sum(standing.in_sync for standing in standings),
        )
        yield GaugeMetricFamily(
            "diffstore_synchronous_replicas_required",
            "Replicas a write waits for (serve --synchronous N)",
            value=self.synchronous.required,
        )


PER_COLLECTION = frozenset({"diffstore_commits", "diffstore_records_written"})
"""Metrics labelled by collection, whose series go with the collection (:meth:`ServerMetrics.on_delete`)."""


class _LiveCollectionsOnly(Collector):
    """The merged multiprocess metrics minus the per-collection series of deleted collections.

    A worker removes a deleted collection's series from its own metrics, but its shared file (and those
    of workers that have exited) keeps the values: the scrape leaves them out instead.
    """

    def __init__(self, merged: Collector, store: Store) -> None:
        self.merged = merged
        self.store = store

    def collect(self) -> Iterator[Metric]:
        live: set[str] | None = None
        for metric in self.merged.collect():
            if metric.name in PER_COLLECTION:
                if live is None:
                    live = {info.name for info in self.store.collections()}
                metric.samples = [
                    sample for sample in metric.samples if sample.labels.get("collection") in live
                ]
            yield metric


class _BuildInfo(Collector):
    """``diffstore_build_info{version,python}`` = 1: which diffstore answers (a dashboard's table, or a
    query joined on it)."""

    def collect(self) -> Iterator[Metric]:
        info = GaugeMetricFamily(
            "diffstore_build_info",
            "The diffstore version serving, and its Python",
            labels=["version", "python"],
        )
        info.add_metric([_version(), platform.python_version()], 1)
        yield info


def _version() -> str:
    try:
        return importlib.metadata.version("diffstore")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


class _WorkerProcesses(Collector):
    """prometheus_client's process metrics (CPU, memory, open files, start time) of every live process of
    the server, one series per process labelled ``worker`` (its pid).

    One process answers a scrape for all: in multiprocess mode the others are the pids that own files in
    the metrics directory and still run (a dead worker's files stay until the server stops).
    """

    def __init__(self, directory: str | None) -> None:
        self.directory = directory

    def pids(self) -> list[int]:
        if self.directory is None:
            return [os.getpid()]
        found = {int(m.group(1)) for name in os.listdir(self.directory) if (m := _PID_FILE.fullmatch(name))}
        return sorted(pid for pid in found | {os.getpid()} if os.path.exists(f"/proc/{pid}"))

    def collect(self) -> Iterator[Metric]:
        families: dict[str, Metric] = {}
        for pid in self.pids():
            collector = ProcessCollector(pid=lambda pid=pid: pid, registry=None)  # type: ignore[misc]
            for metric in collector.collect():
                family = families.get(metric.name)
                if family is None:
                    family = families[metric.name] = Metric(metric.name, metric.documentation, metric.type)
                for sample in metric.samples:
                    family.add_sample(sample.name, {**sample.labels, "worker": str(pid)}, sample.value)
        yield from families.values()


class ServerMetrics:
    """The metrics of one app over one store; :meth:`attach` starts listening, :meth:`detach` stops."""

    def __init__(self, store: Store, hub: CommitHub) -> None:
        self.store = store
        self.hub = hub
        self.multiprocess = _multiprocess()
        self.registry = CollectorRegistry()
        # In multiprocess mode the values live in the shared files: a scrape reads them through the
        # MultiProcessCollector, so the metric objects themselves must not be registered as well.
        own = None if self.multiprocess else self.registry
        if self.multiprocess:
            from prometheus_client import multiprocess

            merged = multiprocess.MultiProcessCollector(None)  # type: ignore[no-untyped-call]
            self.registry.register(_LiveCollectionsOnly(merged, store))
        self.registry.register(_StoreCollector(store))
        self.registry.register(_BuildInfo())
        self.registry.register(_WorkerProcesses(os.environ.get(MULTIPROC_ENV) if self.multiprocess else None))
        PlatformCollector(registry=self.registry)  # python_info{implementation,version}
        self.requests = Counter(
            "diffstore_http_requests",
            "HTTP requests by route template, method and status",
            ["route", "method", "status"],
            registry=own,
        )
        self.request_seconds = Histogram(
            "diffstore_http_request_seconds",
            "Time from a request's arrival to the end of its answer, by route template",
            ["route", "method"],
            registry=own,
        )
        self.commits = Counter("diffstore_commits", "Generations committed", ["collection"], registry=own)
        self.records_written = Counter(
            "diffstore_records_written", "Records written into generations", ["collection"], registry=own
        )
        self.gc_versions_removed = Counter(
            "diffstore_gc_versions_removed", "Superseded record versions removed by GC", registry=own
        )
        self.phantom_records_purged = Counter(
            "diffstore_phantom_records_purged", "Records of expired phantoms purged", registry=own
        )
        self.longpoll_waiters = Gauge(
            "diffstore_longpoll_waiters",
            "Open long polls (generationId/stream) waiting for a commit",
            registry=own,
            multiprocess_mode="livesum",
        )
        self.backup_streams = Gauge(
            "diffstore_backup_streams",
            "GET /backup streams running",
            registry=own,
            multiprocess_mode="livesum",
        )
        self.backup_streams_stalled = Counter(
            "diffstore_backup_streams_stalled",
            "GET /backup streams the server ended because their client stopped reading",
            registry=own,
        )
        self.backup_streams_refused = Counter(
            "diffstore_backup_streams_refused",
            "GET /backup requests answered 503 overloaded: the cap of concurrent backups was reached",
            registry=own,
        )
        self.audit = Counter(
            "diffstore_audit",
            "Audited requests (admin actions, writes outside a generation's data, refusals) by action,"
            " token name and outcome",
            ["action", "token", "outcome"],
            registry=own,
        )
        self.synchronous_wait_seconds = Histogram(
            "diffstore_synchronous_wait_seconds",
            "How long a write waited for its replicas to apply it (serve --synchronous N), time-outs too",
            registry=own,
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0),
        )
        self.corrupt_records = Counter(
            "diffstore_corrupt_records",
            "Reads answered 500 corruptRecord: a stored record whose checksum failed",
            registry=own,
        )
        # (route, method, status) -> the two labelled children: labels() costs more than the update itself
        self._children: dict[tuple[str, str, int], tuple[Any, Any]] = {}
        self._remove_listener: Any = None
        self._remove_delete_listener: Any = None
        self._refresher: asyncio.Task[None] | None = None

    def watch_synchronous(self, synchronous: SynchronousReplication) -> None:
        """Shows the synchronous replicas at scrape time (nothing when synchronous replication is off)."""
        self.registry.register(_SynchronousCollector(synchronous))

    def attach(self) -> None:
        """Listens to the store's writes and keeps the waiter gauge fresh (call on the event loop)."""
        self._remove_listener = self.store.add_write_listener(self.on_write)
        self._remove_delete_listener = self.store.add_delete_listener(self.on_delete)
        self.hub.on_answered = self.observe_long_polls
        self._refresher = asyncio.get_running_loop().create_task(self._refresh_waiters())

    def detach(self) -> None:
        if self._remove_listener is not None:
            self._remove_listener()
            self._remove_listener = None
        if self._remove_delete_listener is not None:
            self._remove_delete_listener()
            self._remove_delete_listener = None
        if self._refresher is not None:
            self._refresher.cancel()
            self._refresher = None
        if self.hub.on_answered == self.observe_long_polls:
            self.hub.on_answered = None

    def on_write(self, event: WriteEvent) -> None:
        for collection, _ in event.commits:
            self.commits.labels(collection).inc()
        for collection, count in event.records_written.items():
            self.records_written.labels(collection).inc(count)
        if event.gc_versions_removed:
            self.gc_versions_removed.inc(event.gc_versions_removed)
        if event.phantom_records_purged:
            self.phantom_records_purged.inc(event.phantom_records_purged)

    def on_delete(self, collection: str) -> None:
        """A collection was deleted (by any process): its series go too, so that creating and deleting
        collections does not pile up series (a re-created one starts from zero)."""
        for metric in (self.commits, self.records_written):
            with contextlib.suppress(KeyError):
                metric.remove(collection)

    async def _refresh_waiters(self) -> None:
        last = -1
        while True:
            waiting = self.hub.waiting()
            if waiting != last:
                self.longpoll_waiters.set(waiting)
                last = waiting
            await asyncio.sleep(WAITERS_REFRESH_S)

    def observe(self, route: str, method: str, status: int, seconds: float) -> None:
        requests, durations = self._labelled(route, method, status)
        requests.inc()
        durations.observe(seconds)

    def observe_many(self, route: str, method: str, status: int, seconds: list[float]) -> None:
        """As :meth:`observe` for each of ``seconds``, in one update per histogram bucket hit (a fan-out
        answers a thousand long polls at once; see :mod:`diffstore.server.prometheus_adapter`)."""
        if not seconds:
            return
        requests, durations = self._labelled(route, method, status)
        requests.inc(len(seconds))
        observe_all(durations, seconds)

    def observe_long_polls(self, status: int, seconds: list[float]) -> None:
        """The hub's answers to parked long polls (``CommitHub.on_answered``)."""
        try:
            self.observe_many(LONG_POLL_ROUTE, "GET", status, seconds)
        except Exception:  # counting must never break the fan-out
            _log.exception("counting long-poll answers failed")

    def count_audit(self, action: str, token: str, outcome: str) -> None:
        """One event of the audit trail (see :mod:`diffstore.server.audit`)."""
        self.audit.labels(action, token, outcome).inc()

    def _labelled(self, route: str, method: str, status: int) -> tuple[Any, Any]:
        key = (route, method, status)
        children = self._children.get(key)
        if children is None:
            children = (
                self.requests.labels(route, method, str(status)),
                self.request_seconds.labels(route, method),
            )
            self._children[key] = children
        return children

    def render(self) -> bytes:
        """The text exposition of every metric (reads the store: call it off the event loop)."""
        self.longpoll_waiters.set(self.hub.waiting())
        return generate_latest(self.registry)


def route_template(routes: list[BaseRoute], fast_lane: frozenset[tuple[str, str]], scope: Scope) -> str:
    """The route template a request was (or would have been) served by, without a trailing slash."""
    route = scope.get("route")
    path = getattr(route, "path", None)
    if path is None:
        match = _FAST_PATH.fullmatch(scope["path"])
        if match is not None and (scope["method"], match.group(1)) in fast_lane:
            path = "/collections/{c}/" + match.group(1)
    if path is None:
        from starlette.routing import Match

        # not routed (refused by the authentication, say): find the route it was meant for
        for candidate in routes:
            matched, _ = candidate.matches(scope)
            if matched is not Match.NONE:
                path = getattr(candidate, "path", None)
                break
    if path is None:
        return UNMATCHED
    return path.rstrip("/") or "/"


class HttpMetrics:
    """Counts and times every HTTP request (the outermost middleware, so refusals count too)."""

    def __init__(
        self, app: ASGIApp, metrics: ServerMetrics, routes: list[BaseRoute], fast_lane: frozenset[Any]
    ) -> None:
        self.app = app
        self.metrics = metrics
        self.routes = routes
        self.fast_lane = fast_lane

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = scope[REQUEST_STARTED] = time.perf_counter()
        # A long poll answered by the commit fan-out is written straight to the connection (see
        # longpoll), never through this ``send``: such an answer is a 200. A parked one is counted by
        # the hub when its answer goes out (ServerMetrics.observe_many), not here.
        status = 200

        async def counting_send(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, counting_send)
        except BaseException:
            status = 500
            raise
        finally:
            if not scope.get(PARKED):
                self._count(scope, status, time.perf_counter() - started)

    def _count(self, scope: Scope, status: int, seconds: float) -> None:
        try:
            self.metrics.observe(
                route_template(self.routes, self.fast_lane, scope), scope["method"], status, seconds
            )
        except Exception:  # counting must never turn an answered request into an error
            _log.exception("counting a request failed")


router = APIRouter(include_in_schema=False)


@router.get("/metrics")
@declare(TokenScope.READ)
async def metrics_text(request: Request) -> Response:
    """The Prometheus text exposition (behind the token like every route)."""
    server_metrics: ServerMetrics = request.app.state.metrics
    body = await anyio.to_thread.run_sync(server_metrics.render)
    return Response(body, media_type=CONTENT_TYPE)
