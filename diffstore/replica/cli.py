"""``diffstore promote --url REPLICA_URL``: turns a read replica into a primary that accepts writes."""

from __future__ import annotations

import argparse
from typing import Any

from diffstore.client._sync import Client
from diffstore.client.commands import server_options
from diffstore.guides import guide


def add_commands(subparsers: Any) -> None:
    """Registers ``promote`` on the ``diffstore`` command."""
    parser = subparsers.add_parser(
        "promote",
        help="turn a read replica into a primary that accepts writes",
        description="Stops a read replica (diffstore serve --replica-of) following its primary and makes it "
        f"accept writes. What it had applied stays; nothing is half-applied. See {guide('replicas.md')}",
        parents=[server_options()],
        epilog="--url is the replica's address. On a server that is not a replica: notReplica, exit 1.",
    )
    parser.set_defaults(func=run_promote)


def run_promote(args: argparse.Namespace) -> int:
    with Client(args.url, token=args.token) as client:
        client.promote()
    print(f"promoted: {args.url} is a primary")
    return 0
