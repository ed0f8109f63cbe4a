"""Commands of the streams front: ``diffstore streams serve`` (the embedded HStream-compatible server).

``add_commands(subparsers)`` is called by ``diffstore.cli``. Sub-commands of ``diffstore streams`` are
added by the ``_add_*`` functions listed in ``STREAMS_COMMANDS``; top-level commands of this front (such as
``diffstore ingest``) go in ``TOP_LEVEL_COMMANDS``. Each parser sets ``func(args) -> int``.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from diffstore import tls
from diffstore.errors import InvalidRequest
from diffstore.guides import guide
from diffstore.sizes import MAP_SIZE_HELP, size_argument
from diffstore.streams import DEFAULT_PORT

Subparsers = Any  # argparse's _SubParsersAction is private


def _serve_command(args: argparse.Namespace) -> int:
    from diffstore import logs

    logs.configure_from(args)
    from diffstore.streams.server import StreamServerConfig, serve  # grpc is imported only to serve

    try:
        password = tls.secret_from(
            args.tls_key_password,
            args.tls_key_password_file,
            tls.SERVER_KEY_PASSWORD_ENV,
            ("--tls-key-password", "--tls-key-password-file"),
            os.environ,
            "diffstore streams serve",
        )
        if args.tls_key is not None:  # an encrypted key without (or with a wrong) passphrase: one line now
            tls.key_pem(
                str(args.tls_key), password, f"--tls-key-password-file or {tls.SERVER_KEY_PASSWORD_ENV}"
            )
        config = StreamServerConfig(
            data_dir=args.data,
            host=args.host,
            port=args.port,
            advertised_host=args.advertised_host,
            resend_tick=args.resend_tick,
            assignment_interval=args.assignment_interval,
            ack_timeout_unit=args.ack_timeout_unit,
            map_size=args.map_size,
            tls_cert=args.tls_cert,
            tls_key=args.tls_key,
            tls_key_password=password if args.tls_key is not None else None,
        )
    except (ValueError, InvalidRequest) as exc:
        print(f"diffstore streams serve: {exc}", file=sys.stderr)
        return 2
    return serve(config)


def _add_serve(commands: Subparsers) -> None:
    serve = commands.add_parser(
        "serve",
        help="run the embedded HStream-compatible server",
        description="Serve the HStreamDB gRPC API from a local LMDB directory.",
        epilog=f"What it implements of HStreamDB: {guide('streams-server.md')}",
    )
    serve.add_argument("--data", type=Path, default=Path("./hstream-data"), help="data directory")
    serve.add_argument("--host", default="127.0.0.1", help="interface to bind (default 127.0.0.1)")
    serve.add_argument(
        "--port", type=int, default=DEFAULT_PORT, help=f"port (default {DEFAULT_PORT}; 0 = any)"
    )
    serve.add_argument("--advertised-host", default=None, help="host returned to clients by the lookups")
    serve.add_argument("--resend-tick", type=float, default=0.5, help="seconds between ack-deadline checks")
    serve.add_argument(
        "--assignment-interval", type=float, default=1.0, help="seconds between shard rebalances"
    )
    serve.add_argument(
        "--ack-timeout-unit", type=float, default=1.0, help="seconds per unit of ackTimeoutSeconds (tests)"
    )
    serve.add_argument("--map-size", type=size_argument, default=1 << 40, help=MAP_SIZE_HELP)
    serve.add_argument("--tls-cert", type=Path, default=None, help="PEM certificate: serve TLS (hstreams://)")
    serve.add_argument("--tls-key", type=Path, default=None, help="PEM private key of --tls-cert")
    serve.add_argument(
        "--tls-key-password-file",
        metavar="F",
        default=None,
        help="file holding the passphrase of an encrypted --tls-key on one line"
        f" (env {tls.SERVER_KEY_PASSWORD_ENV}; decrypted in memory with the openssl command)",
    )
    serve.add_argument(
        "--tls-key-password",
        metavar="P",
        default=None,
        help="the passphrase of an encrypted --tls-key (other users of the machine can read it: prefer"
        f" --tls-key-password-file or ${tls.SERVER_KEY_PASSWORD_ENV})",
    )
    from diffstore import logs

    logs.add_arguments(serve)
    serve.set_defaults(func=_serve_command)


def _add_client_commands(commands: Subparsers) -> None:
    from diffstore.streams.commands import add_stream_commands  # create, ls, rm, subscribe, produce, consume

    add_stream_commands(commands)


# `diffstore streams <command>`: add new sub-command builders here.
STREAMS_COMMANDS: list[Callable[[Subparsers], None]] = [_add_serve, _add_client_commands]
# `diffstore <command>` contributed by this front (e.g. ingest): add builders taking the top-level subparsers.
TOP_LEVEL_COMMANDS: list[Callable[[Subparsers], None]] = []


def add_commands(subparsers: Subparsers) -> None:
    """Adds ``diffstore streams …`` and this front's top-level commands to the ``diffstore`` parser."""
    streams = subparsers.add_parser(
        "streams",
        help="HStream streams: the embedded server, streams, subscriptions and records",
        description="Serve HStream streams, or manage streams and produce/consume records from the shell.",
    )
    commands = streams.add_subparsers(dest="streams_command", metavar="COMMAND")

    def _usage(args: argparse.Namespace) -> int:
        streams.print_help()
        return 2

    streams.set_defaults(func=_usage)
    for add in STREAMS_COMMANDS:
        add(commands)
    for add in TOP_LEVEL_COMMANDS:
        add(subparsers)
    from diffstore.streams.ingest_cli import add_ingest_command  # `diffstore ingest` (SPEC §5)

    add_ingest_command(subparsers)


def main(argv: Sequence[str] | None = None) -> int:
    """Runs this front alone (``python -m diffstore.streams.cli streams serve …``)."""
    parser = argparse.ArgumentParser(prog="diffstore")
    add_commands(parser.add_subparsers(dest="command", metavar="COMMAND"))
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
