"""``diffstore transform``: run an A+B→C job (SPEC §6) on a Spark session, with progress.

The session is a local one (``--master local[N]``, the default), one on a cluster (``--master
spark://…``) or one of a Spark Connect server (``--remote sc://…``); the same runner serves all three.

pyspark is imported only when the command runs, so the ``diffstore`` command works without it.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from typing import Any

import orjson

from diffstore import jobmetrics, logs, shell, tls
from diffstore.backoff import GIVE_UP_HELP, GIVE_UP_OPTION, RetryPolicy, give_up_argument
from diffstore.client import DEFAULT_URL, Client, Collection
from diffstore.errors import CollectionExists, InvalidRequest, NoSuchCollection, NotManual
from diffstore.guides import guide
from diffstore.lease_keeper import DEFAULT_TTL_MS, LeaseConfig
from diffstore.wire import decode_es, encode_es

_log = logging.getLogger("diffstore.transform")


def add_commands(subparsers: Any) -> None:
    """Adds the ``transform`` sub-command to the ``diffstore`` parser."""
    parser = subparsers.add_parser(
        "transform",
        help="keep a manual collection equal to a Spark function of other collections (exactly once)",
        description="Runs rounds of the A+B→C transform until the target has caught up with its sources.",
    )
    parser.add_argument(
        "--url",
        default=os.environ.get("DIFFSTORE_URL", DEFAULT_URL),
        type=shell.http_urls,
        help="the diffstore server, or several servers of one cluster comma-separated (their leader is"
        f" followed across a fail-over) (env DIFFSTORE_URL; default {DEFAULT_URL})",
    )
    parser.add_argument(
        "--job", required=True, help="module:function with signature fn(spark, diffs, lookup)"
    )
    parser.add_argument("--target", required=True, help="the manual collection to maintain")
    parser.add_argument(
        "--source", action="append", required=True, metavar="ALIAS=COLLECTION", help="a source (repeatable)"
    )
    parser.add_argument("--watch", action="store_true", help="keep running and follow the sources")
    parser.add_argument(
        GIVE_UP_OPTION,
        type=give_up_argument,
        default=None,
        metavar="S|never",
        help="with --watch: " + GIVE_UP_HELP,
    )
    parser.add_argument(
        "--create-target",
        action="store_true",
        help="create the target as a manual collection if it is missing",
    )
    parser.add_argument(
        "--lease-ttl-ms",
        type=int,
        default=DEFAULT_TTL_MS,
        metavar="T",
        help="ttl of the target's lease that makes one of several runners active; a standby takes over"
        f" within T + 1 s of the active one's death (default {DEFAULT_TTL_MS}; 0: no lease)",
    )
    parser.add_argument("--partitions", type=int, default=4, help="Spark partitions per diff read")
    parser.add_argument(
        "--master",
        default="local[2]",
        help="Spark master: local[N] (default local[2]) or a cluster's (spark://host:7077, yarn, k8s://…)",
    )
    parser.add_argument(
        "--remote",
        default=os.environ.get("SPARK_REMOTE"),
        metavar="sc://HOST:PORT",
        help="run on a Spark Connect server instead of --master (default: $SPARK_REMOTE)",
    )
    server = parser.add_argument_group(
        "server", "the token and, for https://, the TLS files (read here and shipped to Spark's executors)"
    )
    tls.add_client_token_arguments(
        server,
        "bearer token of a token-protected server (env DIFFSTORE_TOKEN; other users of the machine can read"
        " a command line: prefer the environment or --token-from-file)",
    )
    tls.add_client_arguments(server)
    preview = parser.add_argument_group(
        "preview",
        "print what one round would write if the named sources' phantoms were committed, as a new phantom "
        f"of the target, and commit nothing ({guide('preview.md')})",
    )
    preview.add_argument(
        "--preview",
        action="append",
        metavar="ALIAS=PHANTOM",
        help="a source's phantom id, as 'diffstore' prints ids (base64:...) or the phantomId JSON that "
        "phantom/start answers (repeatable)",
    )
    preview.add_argument(
        "--preview-ttl",
        type=shell.positive_int,
        default=3600,
        metavar="SECONDS",
        help="how long the preview's phantom lives (default 3600)",
    )
    preview.add_argument(
        "--format", choices=("text", "json"), default="text", help="output of --preview (default: text)"
    )
    logs.add_arguments(parser)
    jobmetrics.add_arguments(parser)
    parser.set_defaults(func=run_transform)


def _sources(specs: list[str]) -> dict[str, str]:
    sources: dict[str, str] = {}
    for spec in specs:
        alias, sep, collection = spec.partition("=")
        if not sep or not alias or not collection:
            raise SystemExit(f"--source wants ALIAS=COLLECTION, got {spec!r}")
        sources[alias] = collection
    return sources


def _previews(specs: list[str]) -> dict[str, bytes]:
    """``--preview ALIAS=PHANTOM`` options as alias → phantom id bytes."""
    phantoms: dict[str, bytes] = {}
    for spec in specs:
        alias, sep, text = spec.partition("=")
        if not sep or not alias or not text:
            raise InvalidRequest(f"--preview wants ALIAS=PHANTOM, got {spec!r}")
        if alias in phantoms:
            raise InvalidRequest(f"--preview names source {alias!r} twice")
        if text.lstrip().startswith("{"):  # the phantomId JSON of phantom/start, pasted as it is
            try:
                phantoms[alias] = decode_es(orjson.loads(text), f"--preview {alias}")
            except orjson.JSONDecodeError as exc:
                raise InvalidRequest(f"--preview {alias}: not valid JSON ({exc})") from exc
        else:
            phantoms[alias] = shell.parse(text)
    return phantoms


def encode_generation(generation: bytes) -> str:
    """A generation id in the text form, ``""`` for the empty one (as the transform's progress shows it)."""
    return shell.show(generation) or '""'


PREVIEW_SHOWN = 10
"""How many changed keys ``--preview`` prints."""


def print_preview(target: Collection, phantom: bytes, output: str, shown: int = PREVIEW_SHOWN) -> None:
    """Prints a preview's phantom id (the command line's text form) and what it changes in ``target``:
    counts of puts and deletes and the first ``shown`` changed keys (the lines of ``diffstore diff``)."""
    from diffstore.spark.preview import every_phantom_change

    generation = target.generation_id
    changes = list(every_phantom_change(target, phantom, generation))
    puts = sum(1 for item in changes if item.to_value is not None)
    deletes = len(changes) - puts
    rows = [
        {
            "key": shell.show(item.key),
            "fromValue": shell.show_opt(item.from_value),
            "toValue": shell.show_opt(item.to_value),
        }
        for item in changes[:shown]
    ]
    if output == "json":
        body = {
            "target": target.name,
            "phantomId": shell.show(phantom),
            "phantomIdEncodedString": encode_es(phantom),
            "generationId": shell.show(generation),
            "puts": puts,
            "deletes": deletes,
            "changes": rows,
            "more": max(0, len(changes) - shown),
        }
        sys.stdout.write(orjson.dumps(body, option=orjson.OPT_APPEND_NEWLINE).decode())
        return
    lines = [
        f"phantom {shell.show(phantom)}",
        f"{target.name} at generation {encode_generation(generation)}: {shell.counted(puts, 'put')}, "
        f"{shell.counted(deletes, 'delete')}",
    ]
    for row in rows:
        key, old, new = row["key"], row["fromValue"], row["toValue"]
        if old is None:
            lines.append(f"+ {key}\t{new}")
        elif new is None:
            lines.append(f"- {key}\t{old}")
        else:
            lines.append(f"~ {key}\t{old}\t{new}")
    if len(changes) > shown:
        lines.append(f"... and {len(changes) - shown} more")
    print("\n".join(lines))


def load_job(spec: str) -> Any:
    """Imports ``module:function`` (the current directory is importable, like ``python -m``).

    Raises :class:`~diffstore.errors.InvalidRequest` (one line from ``diffstore.cli``) when it cannot.
    """
    return shell.load_callable(spec, "--job")


def check_collections(args: argparse.Namespace, sources: dict[str, str]) -> None:
    """Checks over HTTP that the sources exist and the target is a manual collection (``--create-target``
    creates it); raises :class:`~diffstore.errors.DiffstoreError` (one line from ``diffstore.cli``)."""
    with Client(args.url, token=args.token or None, **tls.client_kwargs(args)) as client:
        names = {info.name: info.manual for info in client.collections()}
        for collection in sources.values():
            if collection not in names:
                raise NoSuchCollection(f"no source collection {collection!r} at {args.url}")
        if args.target not in names:
            if not args.create_target:
                raise NoSuchCollection(
                    f"no target collection {args.target!r} at {args.url}: create it with 'diffstore "
                    f"collections create {args.target} --manual' or pass --create-target"
                )
            try:
                client.create_collection(args.target, manual=True)
                names[args.target] = True
            except CollectionExists:  # another runner started at the same time created it
                names[args.target] = client.collection(args.target).manual
        if not names[args.target]:
            raise NotManual(
                f"the target {args.target!r} is not a manual collection: a transform commits its rounds "
                "itself; create a manual one (diffstore collections create NAME --manual)"
            )


def start_session(args: argparse.Namespace) -> Any:
    """The session ``--remote``/``--master`` ask for, the ``diffstore`` format registered; a Connect
    server that does not answer is one line (``diffstore.cli`` prints the ConnectionError)."""
    from diffstore.spark.session import connect_session, local_session, master_session

    if args.remote:
        try:
            return connect_session(args.remote, "diffstore-transform")
        except (ValueError, ModuleNotFoundError) as exc:
            raise SystemExit(f"diffstore transform: --remote: {exc}") from None
    master = args.master
    if master == "local" or (master.startswith("local[") and master[6:-1].isdigit()):
        cores = int(master[6:-1] or 1) if master != "local" else 1
        # --watch runs round after round: worth the JVM's full JIT (slower for its first minute)
        return local_session("diffstore-transform", cores=cores, long_running=bool(args.watch))
    return master_session(master, "diffstore-transform")


def run_transform(args: argparse.Namespace) -> int:
    """Runs the transform command; returns the exit code."""
    sources = _sources(args.source)
    phantoms = _previews(args.preview or [])
    if phantoms and args.create_target:
        raise InvalidRequest(
            "--preview changes nothing, so it does not create the target: drop --create-target"
        )
    if args.lease_ttl_ms:
        try:
            LeaseConfig("transform", ttl_ms=args.lease_ttl_ms)
        except ValueError as exc:
            raise SystemExit(f"--lease-ttl-ms: {exc} (0: no lease)") from None
    from diffstore.spark.session import require_pyspark

    try:  # first: a job file imports pyspark, and without it would fail as if it could not be found
        require_pyspark("diffstore transform")
    except ModuleNotFoundError as exc:
        raise SystemExit(
            f"diffstore transform: Spark is not installed here ({exc.name} is missing): "
            "pip install 'diffstore[spark]' (from a clone: pip install '.[spark]'); Spark also needs Java 17"
        ) from None
    fn = load_job(args.job)
    check_collections(args, sources)  # before Spark starts: a missing collection fails in one line, at once
    from rich.live import Live
    from rich.markup import escape

    from diffstore.spark.progress import TransformProgress
    from diffstore.spark.transform import Transform, TransformError

    console = logs.console()
    logs.configure_from(args)
    if args.log_level != "debug":  # py4j says INFO about its own connections (at exit): not the user's news
        logging.getLogger("py4j").setLevel(logging.WARNING)
    report = logs.Reporter(console, _log, args.log_format)

    metrics, metrics_server, on_outage = None, None, None
    if args.metrics_port is not None:
        registry = jobmetrics.CollectorRegistry()
        metrics = jobmetrics.TransformMetrics(registry)
        outages = jobmetrics.OutageMetrics(registry, "transform")

        def on_outage(waiting: bool) -> None:
            outages.on_outage("diffstore", waiting)

        metrics_server = jobmetrics.MetricsServer(registry, args.metrics_port, args.metrics_host)

    progress = TransformProgress(
        report,
        sources,
        args.watch,
        metrics,
        live=console.is_terminal and args.log_format == "text",
    )

    with console.status("starting Spark"):
        spark = start_session(args)
    transform = Transform(
        spark,
        args.url,
        args.target,
        sources,
        fn,
        partitions=args.partitions,
        on_event=progress.on_event,
        token=getattr(args, "token", None),
        **tls.client_kwargs(args),
        lease_ttl_ms=args.lease_ttl_ms or None,
        job=args.job,
        outage=RetryPolicy(give_up_after_s=args.give_up_after_s),
        on_outage=on_outage,
    )
    if args.preview:
        try:
            phantom = transform.preview(phantoms, ttl_seconds=args.preview_ttl)
            print_preview(transform.handle(args.target), decode_es(phantom), args.format)
        finally:
            transform.close()
            spark.stop()
            if metrics_server is not None:
                metrics_server.stop()
        return 0
    try:
        if progress.live:
            with Live(console=console, refresh_per_second=4, get_renderable=progress.render, transient=True):
                transform.run(watch=args.watch)
        else:
            transform.run(watch=args.watch)
    except TransformError as exc:
        report.say(logging.ERROR, f"[red]failed[/] {escape(str(exc))}", "transform failed", error=str(exc))
        return 1
    except KeyboardInterrupt:  # how a --watch is stopped (exit 0, as watch and ingest); else cut short
        return 0 if args.watch else 130
    finally:
        transform.close()
        spark.stop()
        if metrics_server is not None:
            metrics_server.stop()
    return 0
