"""The fail-over options of ``diffstore serve`` (``--ha-*``) and ``diffstore ha status``.

Kept apart from ``server/cli.py`` so that ``serve``'s own options stay one list; the command itself only
reads ``GET /ha`` of each member, through the client.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from typing import Any

from diffstore import tls
from diffstore.errors import DiffstoreError, InvalidRequest
from diffstore.guides import guide

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,62}")


def add_serve_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group(
        "automatic fail-over on etcd", f"members elect a leader through etcd: see {guide('failover.md')}"
    )
    group.add_argument(
        "--ha-etcd",
        metavar="URL[,URL]",
        default=None,
        help="take part in a fail-over cluster whose leader is elected through etcd at these client URLs"
        " (the leader is the primary, every other member a replica of it)",
    )
    group.add_argument(
        "--ha-cluster", metavar="NAME", default=None, help="the cluster's name (with --ha-etcd)"
    )
    group.add_argument(
        "--ha-member", metavar="NAME", default=None, help="this member's name, unique in the cluster"
    )
    group.add_argument(
        "--ha-advertise",
        metavar="URL",
        default=None,
        help="the URL the other members and clients reach this server at (default: from --host and --port)",
    )
    group.add_argument(
        "--ha-ttl-s",
        metavar="S",
        type=int,
        default=10,
        help="the leader key's lease in seconds: a leader that cannot renew it stops accepting writes after"
        " S/2, another member takes over after S at most (default 10)",
    )


def serve_options(args: argparse.Namespace, tls: bool) -> dict[str, Any]:
    """The ``ServerConfig`` fields of the ``--ha-*`` options (none given: none).

    Raises:
        InvalidRequest: a missing or malformed option, or one that does not go with fail-over.
    """
    given = [args.ha_etcd, args.ha_cluster, args.ha_member]
    if all(value is None for value in given):
        if args.ha_advertise is not None:
            raise InvalidRequest("--ha-advertise goes with --ha-etcd, --ha-cluster and --ha-member")
        return {}
    if any(value is None for value in given):
        raise InvalidRequest("--ha-etcd, --ha-cluster and --ha-member go together")
    for flag, value in (("--ha-cluster", args.ha_cluster), ("--ha-member", args.ha_member)):
        if not _NAME.fullmatch(value):
            raise InvalidRequest(f"{flag}: expected 1..63 letters, digits, '.', '_' or '-', not {value!r}")
    endpoints = tuple(url.strip().rstrip("/") for url in args.ha_etcd.split(",") if url.strip())
    if not endpoints or not all(url.startswith(("http://", "https://")) for url in endpoints):
        raise InvalidRequest(f"--ha-etcd: expected http(s)://host:port[,...], not {args.ha_etcd!r}")
    if not 2 <= args.ha_ttl_s <= 3600:
        raise InvalidRequest("--ha-ttl-s must be within 2..3600")
    if args.replica_of is not None:
        raise InvalidRequest("--replica-of does not go with --ha-etcd: the cluster's leader is the primary")
    advertise = args.ha_advertise
    if advertise is None:
        if args.port == 0:
            raise InvalidRequest("--port 0 needs --ha-advertise URL: the other members must reach this one")
        host = f"[{args.host}]" if ":" in args.host else args.host
        advertise = f"{'https' if tls else 'http'}://{host}:{args.port}"
    return {
        "ha_etcd": endpoints,
        "ha_cluster": args.ha_cluster,
        "ha_member": args.ha_member,
        "ha_advertise": advertise.rstrip("/"),
        "ha_ttl_s": args.ha_ttl_s,
    }


# --- diffstore ha status ------------------------------------------------------------------------------


def add_commands(subparsers: Any) -> None:
    """Registers ``ha status`` on the ``diffstore`` command."""
    parser = subparsers.add_parser(
        "ha",
        help="a fail-over cluster's members",
        description="Commands about a fail-over cluster (diffstore serve --ha-etcd).",
    )
    sub = parser.add_subparsers(dest="ha_command", metavar="COMMAND", required=True)
    status = sub.add_parser(
        "status",
        help="each member's role, leader and term (GET /ha)",
        description="Prints GET /ha of every member given: its role (leader, replica, candidate, fenced),"
        " the leader it knows and the term. Exit code 1 when a member does not answer or no member leads."
        f" See {guide('failover.md')}",
    )
    status.add_argument(
        "--url",
        metavar="URL[,URL]",
        default=None,
        help="the members' URLs, comma-separated (default: $DIFFSTORE_URL)",
    )
    tls.add_client_token_arguments(
        status,
        "bearer token of the members (env DIFFSTORE_TOKEN; other users of the machine can read a command"
        " line: prefer the environment or --token-from-file)",
    )
    tls.add_client_arguments(status)
    status.add_argument("--format", choices=("text", "json"), default="text", help="output format")
    status.set_defaults(func=status_command)


def status_command(args: argparse.Namespace) -> int:
    import os

    from diffstore.client import Client
    from diffstore.client._calls import Call

    urls = [
        u.strip().rstrip("/")
        for u in (args.url or os.environ.get("DIFFSTORE_URL", "")).split(",")
        if u.strip()
    ]
    if not urls:
        print("diffstore ha status: error: give --url URL[,URL] (or DIFFSTORE_URL)", file=sys.stderr)
        return 2
    token = args.token or os.environ.get("DIFFSTORE_TOKEN") or None
    rows: list[dict[str, Any]] = []
    for url in urls:
        try:
            with Client(url, token=token, timeout_s=5.0, **tls.client_kwargs(args)) as client:
                rows.append({"url": url, **client.execute(Call("GET", "/ha", lambda obj, codec: obj))})
        except DiffstoreError as exc:
            rows.append({"url": url, "error": exc.code, "reason": exc.reason})
    if args.format == "json":
        print(json.dumps(rows, indent=2))
    else:
        for row in rows:
            if "error" in row:
                print(f"{row['url']}  unreachable  {row['reason']}")
                continue
            leader = row["leader"]
            known = f"{leader['member']} ({leader['url']})" if leader else "-"
            print(f"{row['url']}  {row['member']}  {row['role']}  leader {known}  term {row['term']}")
    leaders = {row["member"] for row in rows if row.get("role") == "leader"}
    return 0 if leaders and all("error" not in row for row in rows) else 1
