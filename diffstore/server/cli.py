"""``diffstore serve``: the command line; the server itself is in ``serving`` (imported when it runs).

Keeping FastAPI and uvicorn out of this module keeps every ``diffstore`` command quick to start.
"""

from __future__ import annotations

import argparse
import ipaddress
import os
import sys
from typing import Any

from diffstore import logs, tls
from diffstore.client import retention_cli
from diffstore.engine.types import RetentionPolicy
from diffstore.errors import InvalidRequest
from diffstore.guides import guide
from diffstore.ha import cli as ha_cli
from diffstore.server.config import ServerConfig
from diffstore.sizes import MAP_SIZE_HELP, size_argument


def _serve_command(args: argparse.Namespace) -> int:
    # an empty token is refused, never read as "no token": DIFFSTORE_TOKEN="" must not turn auth off
    try:
        token = tls.token_from_args(args, "serve", os.environ)
        link = tls.client_tls_from_args(args)
        key_password = tls.secret_from(
            args.tls_key_password,
            args.tls_key_password_file,
            tls.SERVER_KEY_PASSWORD_ENV,
            ("--tls-key-password", "--tls-key-password-file"),
            os.environ,
            "diffstore serve",
        )
        if key_password is not None and args.tls_cert is None:
            key_password = None  # DIFFSTORE_TLS_KEY_PASSWORD set for another server: no TLS here
            if args.tls_key_password is not None or args.tls_key_password_file is not None:
                raise InvalidRequest("--tls-key-password(-file) needs --tls-cert and --tls-key")
        tls.check_server_files(args.tls_cert, args.tls_key, args.tls_client_ca, key_password)
        check_token_file(args.token_file, token)
    except InvalidRequest as exc:
        print(f"diffstore serve: error: {exc.reason}", file=sys.stderr)
        return 2
    if (
        token is None
        and args.token_file is None
        and not args.allow_unauthenticated
        and not is_loopback(args.host)
    ):
        print(
            f"diffstore serve: error: --host {args.host} is reachable from other machines and no token is"
            " set; give --token-file (or --token, DIFFSTORE_TOKEN), bind 127.0.0.1, or pass"
            " --allow-unauthenticated",
            file=sys.stderr,
        )
        return 2
    try:
        config = ServerConfig(
            data_dir=args.data,
            host=args.host,
            port=args.port,
            token=token,
            token_file=args.token_file,
            token_poll_s=args.token_poll_s,
            commit_delay_ms=args.commit_delay_ms,
            sync=args.sync,
            map_size=args.map_size,
            access_log=args.access_log,
            workers=args.workers,
            worker_timeout_s=args.worker_timeout_s,
            header_timeout_s=args.header_timeout_s,
            body_timeout_s=args.body_timeout_s,
            body_min_rate_bytes_s=args.body_min_rate,
            inflight_body_max_bytes=args.inflight_body_max_bytes,
            inflight_connection_max_bytes=args.inflight_connection_max_bytes,
            backup_max_concurrent=args.backup_max_concurrent,
            backup_stall_timeout_s=args.backup_stall_timeout_s,
            backup_stall_min_bytes=args.backup_stall_min_bytes,
            metrics=args.metrics,
            log_level=args.log_level,
            log_format=args.log_format,
            replica_of=args.replica_of.rstrip("/") if args.replica_of else None,
            replica_token=replica_token(args),
            default_retention=default_retention(args),
            tls_cert=args.tls_cert,
            tls_key=args.tls_key,
            tls_client_ca=args.tls_client_ca,
            tls_key_password=key_password,
            replica_ca_file=link.ca_file,
            replica_cert=link.client_kwargs()["cert"],
            **ha_cli.serve_options(args, args.tls_cert is not None),
            synchronous=args.synchronous,
            synchronous_timeout_s=args.synchronous_timeout_s,
        )
    except InvalidRequest as exc:
        print(f"diffstore serve: error: {exc.reason}", file=sys.stderr)
        return 2
    logs.configure_from(args)
    if config.replica_of is not None:
        from diffstore.replica import Unreachable, check_primary

        try:
            problem = check_primary(
                config.replica_of, config.replica_token, config.replica_ca_file, config.replica_cert
            )
        except Unreachable as exc:
            print(f"diffstore serve: warning: {exc}", file=sys.stderr)
            problem = None
        if problem is not None:
            print(f"diffstore serve: error: {problem}", file=sys.stderr)
            return 2
    from diffstore.server.serving import serve

    return serve(config)


def check_token_file(path: str | None, token: str | None) -> None:
    """Reads the token file once, so that a bad one stops ``serve`` in one line before anything starts.

    Raises:
        InvalidRequest: the file cannot be read or is not a token file (the reason names the line).
    """
    if path is not None:
        from diffstore.server.tokens import Tokens

        Tokens(token, path)


def replica_token(args: argparse.Namespace) -> str | None:
    """The primary's token: ``--replica-token-file F``, ``--replica-token T`` (which warns: every user of
    the machine can read a command line) or ``$DIFFSTORE_REPLICA_TOKEN``, in that order.

    Raises:
        InvalidRequest: both flags given, the file unreadable, or the token empty.
    """
    if args.replica_token is not None and args.replica_token_file is not None:
        raise InvalidRequest("give --replica-token-file or --replica-token, not both")
    if args.replica_token_file is not None:
        try:
            with open(args.replica_token_file, encoding="utf-8") as file:
                token = file.read().strip()
        except (OSError, UnicodeDecodeError) as exc:
            reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
            raise InvalidRequest(f"--replica-token-file {args.replica_token_file}: {reason}") from exc
        source = f"--replica-token-file {args.replica_token_file}"
    elif args.replica_token is not None:
        print(
            "diffstore serve: warning: --replica-token can be read by every user of this machine (ps,"
            " /proc); give it with --replica-token-file F or DIFFSTORE_REPLICA_TOKEN instead",
            file=sys.stderr,
        )
        token, source = args.replica_token, "--replica-token"
    else:
        found = os.environ.get("DIFFSTORE_REPLICA_TOKEN")
        if found is None:
            return None
        token, source = found, "DIFFSTORE_REPLICA_TOKEN"
    if not token.strip() or any(ch in token for ch in "\r\n"):
        raise InvalidRequest(f"{source} is empty or holds more than one line; give one token")
    return token


def is_loopback(host: str) -> bool:
    """Whether ``host`` names this machine only (``localhost``, 127.0.0.0/8, ``::1``)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a host name other than localhost may resolve anywhere


def default_workers() -> int:
    """The number of CPUs this process may run on, at most 8."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cpus = os.cpu_count() or 1
    return max(1, min(cpus, 8))


def default_retention(args: argparse.Namespace) -> RetentionPolicy | None:
    """The store's default policy from ``--default-keep`` / ``--default-keep-generations`` (None: none)."""
    if args.default_keep is None and args.default_keep_generations is None:
        return None
    return RetentionPolicy(args.default_keep, args.default_keep_generations)


def add_commands(subparsers: Any) -> None:
    """Adds ``serve`` to the ``diffstore`` command."""
    parser = subparsers.add_parser(
        "serve",
        help="run the HTTP API over a data directory",
        epilog=f"The HTTP protocol is described in {guide('protocol.md')} and read replicas in "
        f"{guide('replicas.md')}",
    )
    parser.add_argument("--data", default="./data", help="data directory (default ./data)")
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=3030, help="port (default 3030)")
    tls.add_token_arguments(
        parser,
        "require 'Authorization: Bearer T' (other users of the machine can read it: prefer"
        " --token-from-file or $DIFFSTORE_TOKEN, the default)",
    )
    parser.add_argument(
        "--token-file",
        metavar="F",
        default=None,
        help="scoped tokens, one a line: NAME SECRET SCOPE [COLLECTIONS-GLOB] with SCOPE read, write or"
        " admin ('#' comments); re-read when it changes and on SIGHUP (a bad file keeps the old tokens);"
        f" with --token both are accepted (see {guide('security.md')})",
    )
    parser.add_argument(
        "--token-poll-s",
        metavar="S",
        type=float,
        default=1.0,
        help="look at --token-file for a change every S seconds (default 1; SIGHUP re-reads it at once)",
    )
    parser.add_argument(
        "--allow-unauthenticated",
        action="store_true",
        help="serve without a token on an address other machines can reach (refused otherwise)",
    )
    parser.add_argument(
        "--commit-delay-ms", type=int, default=50, help="auto-commit delay of non-manual collections"
    )
    parser.add_argument(
        "--no-sync",
        dest="sync",
        action="store_false",
        help="flush to disk once a second instead of at every commit: commits survive a crash of the server"
        " process but not of the OS; small commits get several times faster",
    )
    parser.add_argument("--map-size", type=size_argument, default=1 << 40, help=MAP_SIZE_HELP)
    parser.add_argument(
        "--default-keep",
        metavar="T",
        type=retention_cli.duration_ms,
        help="retention of collections created without a policy: keep the generations committed in the"
        " last T (e.g. 7d; the collection keeps it, see 'collections retention')",
    )
    parser.add_argument(
        "--default-keep-generations",
        metavar="N",
        type=retention_cli.generations,
        help="retention of collections created without a policy: keep the N newest generations",
    )
    parser.add_argument("--access-log", action="store_true", help="log every request")
    parser.add_argument(
        "--workers",
        type=int,
        default=default_workers(),
        help="server processes over the data directory; a dead one is replaced"
        " (default: the number of CPUs, at most 8; 1: one process)",
    )
    parser.add_argument(
        "--worker-timeout-s",
        type=float,
        default=10.0,
        help="kill and replace a worker whose event loop has not answered the supervisor this long"
        " (a stopped or hung process; default 10, 0: never)",
    )
    parser.add_argument(
        "--header-timeout-s",
        type=float,
        default=10.0,
        help="close a connection whose request headers are not read whole in this time (default 10)",
    )
    parser.add_argument(
        "--body-timeout-s",
        type=float,
        default=30.0,
        help="close a connection whose request body stalls this long between chunks (default 30)",
    )
    parser.add_argument(
        "--body-min-rate",
        type=size_argument,
        default=64 * 1024,
        metavar="BYTES",
        help="close a connection whose request body has not arrived within --body-timeout-s plus one second"
        " per this many bytes received (default 64KiB; 0: no minimum rate)",
    )
    parser.add_argument(
        "--inflight-body-max-bytes",
        type=size_argument,
        default=128 * 1024 * 1024,
        metavar="SIZE",
        help="request body bytes all requests of a worker may hold at once; past it: 503 overloaded"
        " (default 128MiB)",
    )
    parser.add_argument(
        "--inflight-connection-max-bytes",
        type=size_argument,
        default=32 * 1024 * 1024,
        metavar="SIZE",
        help="what one request may hold of --inflight-body-max-bytes while others hold some too"
        " (default 32MiB)",
    )
    parser.add_argument(
        "--backup-max-concurrent",
        type=int,
        default=2,
        metavar="N",
        help="GET /backup streams that may run at once, every worker together; past it: 503 overloaded"
        f" (default 2; see {guide('backups.md')})",
    )
    parser.add_argument(
        "--backup-stall-timeout-s",
        type=float,
        default=60.0,
        metavar="S",
        help="end a GET /backup stream that sent less than --backup-stall-min-bytes in the last S seconds"
        " (a client that stopped reading would pin the store's old pages; default 60; 0: never)",
    )
    parser.add_argument(
        "--backup-stall-min-bytes",
        type=size_argument,
        default=1024 * 1024,
        metavar="SIZE",
        help="see --backup-stall-timeout-s (default 1MiB)",
    )
    parser.add_argument(
        "--no-request-metrics",
        dest="metrics",
        action="store_false",
        help="do not count and time each request in /metrics (engine metrics stay)",
    )
    parser.add_argument(
        "--replica-of",
        metavar="URL",
        default=None,
        help="serve a read replica of the diffstore server at URL (writes answer 409 readOnlyReplica;"
        " 'diffstore promote' makes it a primary; see the replicas guide below)",
    )
    parser.add_argument(
        "--replica-token",
        metavar="T",
        default=None,
        help="the primary's bearer token (other users of the machine can read it: prefer"
        " --replica-token-file or $DIFFSTORE_REPLICA_TOKEN, the default)",
    )
    parser.add_argument(
        "--replica-token-file",
        metavar="F",
        default=None,
        help="read the primary's bearer token from file F (one line), so that it is on no command line",
    )
    ha_cli.add_serve_arguments(parser)
    parser.add_argument(
        "--synchronous",
        metavar="N",
        type=int,
        default=0,
        help="acknowledge a commit (and an automatic collection's put) only once N replicas applied its"
        " generation (default 0: at once; see the replicas guide, 'Synchronous replication')",
    )
    parser.add_argument(
        "--synchronous-timeout-s",
        metavar="S",
        type=float,
        default=10.0,
        help="with --synchronous, how long a write waits for its replicas before answering 503"
        " notReplicated -- committed here all the same (default 10; 0: wait for ever)",
    )
    add_tls_arguments(parser)
    logs.add_arguments(parser)
    parser.set_defaults(func=_serve_command)


def add_tls_arguments(parser: argparse.ArgumentParser) -> None:
    """The server's TLS files (the streams server's names), and the replica link's (the CLI's names)."""
    group = parser.add_argument_group("TLS")
    group.add_argument("--tls-cert", default=None, help="PEM certificate: serve HTTPS only (https://)")
    group.add_argument("--tls-key", default=None, help="PEM private key of --tls-cert")
    group.add_argument(
        "--tls-key-password-file",
        metavar="F",
        default=None,
        help="file holding the passphrase of an encrypted --tls-key on one line"
        f" (env {tls.SERVER_KEY_PASSWORD_ENV})",
    )
    group.add_argument(
        "--tls-key-password",
        metavar="P",
        default=None,
        help="the passphrase of an encrypted --tls-key (other users of the machine can read it: prefer"
        f" --tls-key-password-file or ${tls.SERVER_KEY_PASSWORD_ENV})",
    )
    group.add_argument(
        "--tls-client-ca",
        metavar="F",
        default=None,
        help="PEM authority: require a client certificate signed by it on every connection",
    )
    link = parser.add_argument_group("replica link over https:// (--replica-of)")
    tls.add_client_arguments(link)
