"""``diffstore ingest``: one HStream subscription into one manual collection, exactly once (docs/streams.md).

    diffstore ingest --hstream hstream://127.0.0.1:6570 --subscription S --collection C \\
        (--data DIR [--map-size SIZE] | --url http://host:port) [--window-records N] [--window-ms M] \\
        [--mapper module:function] [--create-collection] [--lease-ttl-ms T] [--give-up-after-s S|never]

Any number of ingestors may run on one subscription and collection (docs/leases.md): one is active, the
others stand by and take over within T + 1 s once it dies (T = --lease-ttl-ms, default 10000; 0: no lease,
a single ingestor).

A diffstore or streams server that stops answering while it runs (a restart, a broken link) is waited for
with bounded back-off -- one log line when the wait starts, one when the server is back -- and ingestion
goes on exactly once from the positions stored in the collection; --give-up-after-s S exits 1 once a
server has not answered for S seconds (default: never). At start, a server that is not there is an error
(exit 2): a wrong address is more likely than a restart.

Progress on a terminal (records/s, lag); ``--log-commits`` prints one JSON line per committed window instead
(for scripts and tests). SIGTERM or Ctrl-C stops cleanly: the open window is committed and acked first.
"""

from __future__ import annotations

import argparse
import json
import logging
import signal
import sys
import threading
import time
from collections.abc import Callable
from types import FrameType
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.live import Live
from rich.markup import escape
from rich.table import Table

from diffstore import jobmetrics, logs, shell, tls
from diffstore.backoff import GIVE_UP_HELP, GIVE_UP_OPTION, RetryPolicy, give_up_argument
from diffstore.collection import Collection
from diffstore.engine.types import LeaseToken
from diffstore.errors import DiffstoreError
from diffstore.guides import guide
from diffstore.lease_keeper import DEFAULT_TTL_MS, default_owner
from diffstore.sizes import MAP_SIZE_HELP, size_argument
from diffstore.streams.commands import CONNECT_TIMEOUT_S, add_hstream_ca_argument, hstream_roots
from diffstore.streams.sinks import CollectionSink, EngineSink, HttpSink

if TYPE_CHECKING:
    from diffstore.streams.ingest import CommitStats

_log = logging.getLogger("diffstore.ingest")

# `ingest --help`: the module's docstring in plain text (no reST markup), laid out as it is printed
DESCRIPTION = """\
Consume one HStream subscription into one manual collection, exactly once.

  diffstore ingest --hstream hstream://127.0.0.1:6570 --subscription S --collection C \\
      (--data DIR [--map-size SIZE] | --url http://host:port) [--window-records N] [--window-ms M] \\
      [--mapper module:function] [--create-collection] [--lease-ttl-ms T]

Any number of ingestors may run on one subscription and collection: one is active, the others stand by
and take over within T + 1 s once it dies (T = --lease-ttl-ms, default 10000; 0: no lease, a single
ingestor).

Progress on a terminal (records/s, lag); --log-commits prints one JSON line per committed window instead
(for scripts and tests). SIGTERM or Ctrl-C stops cleanly: the open window is committed and acked first."""


def add_ingest_command(subparsers: Any) -> None:
    """Registers ``ingest`` on the ``diffstore`` command's sub-parsers."""
    parser = subparsers.add_parser(
        "ingest",
        help="consume an HStream subscription into a manual collection, exactly once",
        description=DESCRIPTION,
        epilog=f"Exactly once, windows, ordering:\n  {guide('streams.md')}\nSeveral ingestors, leases:\n  "
        f"{guide('leases.md')}",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--hstream", required=True, metavar="URL", help="hstream://host[:port] or hstreams://"
    )
    add_hstream_ca_argument(parser)
    parser.add_argument("--subscription", required=True, help="subscription id to consume")
    parser.add_argument("--collection", required=True, help="target manual collection")
    target = parser.add_mutually_exclusive_group(required=True)
    target.add_argument("--data", metavar="DIR", help="an embedded store directory")
    target.add_argument(
        "--url",
        type=shell.http_urls,
        help="a remote diffstore server (http://host:port or https://), or several servers of one cluster"
        " comma-separated (their leader is followed across a fail-over)",
    )
    server = parser.add_argument_group("with --url")
    tls.add_client_token_arguments(
        server,
        "bearer token of a server started with --token (env DIFFSTORE_TOKEN; other users of the machine"
        " can read a command line: prefer the environment or --token-from-file)",
    )
    tls.add_client_arguments(server)
    parser.add_argument("--map-size", type=size_argument, default=None, help=f"with --data: {MAP_SIZE_HELP}")
    parser.add_argument("--window-records", type=int, default=10_000, help="records per generation (max)")
    parser.add_argument("--window-ms", type=float, default=500.0, help="age at which a window commits")
    parser.add_argument("--mapper", metavar="MODULE:FUNCTION", help="record → (key, value) pairs")
    parser.add_argument("--create-collection", action="store_true", help="create C (manual) if missing")
    parser.add_argument(
        "--recovery-hold-ms",
        type=float,
        default=None,
        help="how long after an owner change the server may still resend records that were in flight "
        "elsewhere (default: automatic, as the streams guide below says)",
    )
    parser.add_argument(
        "--lease-ttl-ms",
        type=int,
        default=DEFAULT_TTL_MS,
        metavar="T",
        help="ttl of the lease that makes one of several ingestors active; a standby takes over within"
        f" T + 1 s of the active one's death (default {DEFAULT_TTL_MS}; 0: no lease, a single ingestor)",
    )
    parser.add_argument(
        "--lease-owner", metavar="NAME", help="this ingestor's name in the lease (default: host:pid:random)"
    )
    parser.add_argument("--log-commits", action="store_true", help="one JSON line per commit on stdout")
    parser.add_argument(
        GIVE_UP_OPTION, type=give_up_argument, default=None, metavar="S|never", help=GIVE_UP_HELP
    )
    logs.add_arguments(parser)
    jobmetrics.add_arguments(parser)
    parser.set_defaults(func=run_ingest)


PROBE_TIMEOUT_S = 10.0
"""How long the start-up check waits for the stream server."""


def _check_subscription(url: str, subscription: str, roots: bytes | None = None) -> None:
    """Fails before anything is opened or created (``--create-collection``) when the stream side cannot work:
    a malformed ``--hstream`` (ValueError), a server that does not answer or a missing subscription
    (StreamError)."""
    from diffstore.streams.client import StreamClient, StreamClientConfig

    with StreamClient(StreamClientConfig(url, timeout_s=PROBE_TIMEOUT_S, root_certificates=roots)) as probe:
        probe.check_reachable(CONNECT_TIMEOUT_S)  # a server that is not there: said within 2 s, not 10
        probe.get_subscription(subscription)


def _open_sink(args: argparse.Namespace) -> CollectionSink:
    if args.map_size is not None and not args.data:
        raise ValueError("--map-size is an option of the embedded store: use it with --data")
    if args.data:
        return EngineSink.open(
            args.data, args.collection, create=args.create_collection, map_size=args.map_size
        )
    return HttpSink.open(
        args.url,
        args.collection,
        create=args.create_collection,
        token=args.token or None,
        **tls.client_kwargs(args),
    )


RATE_WINDOW_S = 5.0
"""The records/s of the live table and of the metrics: applied over the last this many seconds."""


class _Progress:
    """Records/s over the last few seconds and lag (commit time − publish time of the newest applied record).

    Both stay live between commits: the rate is taken up to now (it falls to 0 within
    :data:`RATE_WINDOW_S` of the last record), and once no window has committed for ``idle_after_s`` (no
    record came: a window commits ``window_ms`` after its first) the lag says the ingestor is caught up and
    since when. The live table asks :meth:`render` at each refresh, not only at each commit.
    """

    def __init__(
        self,
        console: Console,
        log_commits: bool,
        metrics: jobmetrics.IngestMetrics | None = None,
        idle_after_s: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.console = console
        self.log_commits = log_commits
        self.metrics = metrics
        self.idle_after_s = idle_after_s
        self.clock = clock
        self.started = clock()
        # (time, records applied by then), from the last one at or before the rate's window on
        self.samples: list[tuple[float, int]] = [(self.started, 0)]
        self.last: CommitStats | None = None
        self.last_at = self.started
        self.live: Live | None = None
        self._lock = threading.Lock()  # commits come from the ingestor's thread, refreshes from rich's
        if metrics is not None:
            metrics.follow_rate(self.rate)

    def rate(self, now: float | None = None) -> float:
        """Records applied per second over the last :data:`RATE_WINDOW_S` up to ``now``."""
        now = self.clock() if now is None else now
        with self._lock:
            cutoff = now - RATE_WINDOW_S
            while len(self.samples) > 1 and self.samples[1][0] <= cutoff:
                self.samples.pop(0)
            span = min(RATE_WINDOW_S, now - self.started)
            return (self.samples[-1][1] - self.samples[0][1]) / span if span > 0 else 0.0

    def render(self) -> Table:
        now = self.clock()
        table = Table(title="diffstore ingest", show_header=False)
        stats = self.last
        table.add_row("applied records", f"{stats.applied_total if stats else 0:,}")
        table.add_row("skipped (already applied)", f"{stats.skipped_total if stats else 0:,}")
        table.add_row("records/s", f"{self.rate(now):,.0f}")
        table.add_row("lag", self.lag_text(now))
        table.add_row("generation", shell.show(stats.generation_id) if stats else "-")
        return table

    def lag_text(self, now: float) -> str:
        idle_s = now - self.last_at
        if idle_s >= self.idle_after_s:
            return f"caught up (no new record for {idle_s:.0f} s)"
        return f"{self.last.lag_s:.2f} s" if self.last else "-"

    def on_commit(self, stats: CommitStats) -> None:
        now = self.clock()
        with self._lock:
            self.last, self.last_at = stats, now
            self.samples.append((now, stats.applied_total))
        if self.metrics is not None:
            self.metrics.on_commit(stats)
        _log.debug(
            "window committed",
            extra={
                "generation": shell.show(stats.generation_id),
                "records": stats.records,
                "lag_s": stats.lag_s,
            },
        )
        if self.log_commits:
            line = {
                "generation": shell.show(stats.generation_id),
                "records": stats.records,
                "items": stats.items,
                "applied": stats.applied_total,
                "skipped": stats.skipped_total,
                "lag_s": round(stats.lag_s, 3),
                "positions": {str(s): [p.batch_id, p.batch_index] for s, p in stats.positions.items()},
            }
            print(json.dumps(line), flush=True)
        elif self.live is not None:
            self.live.refresh()


def _lease_holder(collection: Collection, name: str) -> str | None:
    """Who holds the lease ``name`` now (None: nobody, or the store could not say)."""
    try:
        leases = collection.leases()
    except DiffstoreError:
        return None
    now_ms = int(time.time() * 1000)
    return next((lease.owner for lease in leases if lease.name == name and lease.held_at(now_ms)), None)


def _lease_ttl(value: int) -> int | None:
    if value < 0:
        raise ValueError("--lease-ttl-ms must be >= 0 (0: no lease)")
    return value or None


def run_ingest(args: argparse.Namespace) -> int:
    """Runs the ingestor until SIGTERM/SIGINT; returns the exit code."""
    # grpc (the 'streams' extra) is imported when ingest runs, so that `ingest --help` works without it
    from diffstore.streams.client import StreamClient, StreamClientConfig, StreamError
    from diffstore.streams.ingest import IngestConfig, Ingestor, lease_name, load_mapper

    console = logs.console()
    logs.configure_from(args)
    report = logs.Reporter(console, _log, args.log_format)
    try:
        mapper = load_mapper(args.mapper) if args.mapper else None
        config = IngestConfig(
            subscription_id=args.subscription,
            window_records=args.window_records,
            window_ms=args.window_ms,
            mapper=mapper,
            recovery_hold_ms=args.recovery_hold_ms,
            lease_ttl_ms=_lease_ttl(args.lease_ttl_ms),
            # named here (not by the keeper) so that the standby message can tell this ingestor's own lease
            lease_owner=args.lease_owner or default_owner(),
            outage=RetryPolicy(give_up_after_s=args.give_up_after_s),
        )
        roots = hstream_roots(args.hstream_ca_file)
        _check_subscription(args.hstream, args.subscription, roots)
        sink = _open_sink(args)
    except (ValueError, ImportError, AttributeError, DiffstoreError, StreamError) as exc:
        report.say(
            logging.ERROR,
            f"[red]diffstore ingest: {escape(str(exc))}[/red]",
            "ingest cannot start",
            error=str(exc),
        )
        return 2
    metrics, metrics_server, outages = None, None, None
    if args.metrics_port is not None:
        registry = jobmetrics.CollectorRegistry()
        metrics = jobmetrics.IngestMetrics(registry, args.subscription, args.collection)
        labels = {"subscription": args.subscription, "collection": args.collection}
        outages = jobmetrics.OutageMetrics(registry, "ingest", labels)
        metrics_server = jobmetrics.MetricsServer(registry, args.metrics_port, args.metrics_host)
    client = StreamClient(StreamClientConfig(args.hstream, root_certificates=roots))
    ingestor = Ingestor(client, sink, config, on_outage=None if outages is None else outages.on_outage)

    def stop(signum: int, frame: FrameType | None) -> None:
        ingestor.stop()

    previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGTERM, signal.SIGINT)}
    # a window commits window_ms after its first record: twice that without a commit is no record coming
    progress = _Progress(console, args.log_commits, metrics, idle_after_s=max(1.0, 2 * args.window_ms / 1000))

    # the lease is named as GET /collections/{c}/leases/ and docs/leases.md name it, in every message
    lease = lease_name(args.subscription)
    where = f"lease {lease!r} of collection {args.collection!r}"

    def on_state(state: str, token: LeaseToken | None) -> None:
        if token is None:
            holder = _lease_holder(sink.collection, lease)
            if holder is None or holder == config.lease_owner:  # nobody else: it takes the lease in a moment
                report.say(logging.INFO, f"ingest: acquiring {where}", "ingest acquiring", lease=lease)
            else:
                text = (
                    f"ingest: standby ({holder} holds {where}; this ingestor takes over when it stops or the "
                    "lease expires)"
                )
                report.say(logging.INFO, text, "ingest standby", holder=holder, lease=lease)
        else:
            text = f"ingest: active ({where}, version {token.version})"
            report.say(logging.INFO, text, "ingest active", lease=token.name, version=token.version)

    try:
        if not args.log_commits and console.is_terminal and args.log_format == "text":
            with Live(console=console, refresh_per_second=4, get_renderable=progress.render) as live:
                progress.live = live
                ingestor.run(progress.on_commit, on_state)
        else:
            ingestor.run(progress.on_commit, on_state)
    except (StreamError, DiffstoreError) as exc:
        report.say(
            logging.ERROR,
            f"[red]diffstore ingest stopped: {escape(str(exc))}[/red]",
            "ingest stopped",
            error=str(exc),
        )
        return 1
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        sink.close()
        client.close()
        if metrics_server is not None:
            metrics_server.stop()
    report.say(
        logging.INFO,
        f"ingest: stopped after {shell.counted(ingestor.applied_total, 'record', grouped=True)}",
        "ingest stopped",
        applied=ingestor.applied_total,
    )
    return 0


def main(argv: list[str] | None = None) -> int:
    """``python -m diffstore.streams.ingest_cli ...`` (same options as ``diffstore ingest``)."""
    parser = argparse.ArgumentParser(prog="diffstore")
    add_ingest_command(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["ingest", *(sys.argv[1:] if argv is None else argv)])
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
