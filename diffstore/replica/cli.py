"""``diffstore promote --url REPLICA_URL [--force] [--wait S]``: turns a read replica into a primary that
accepts writes, after telling its old primary to step down (see :mod:`diffstore.replica.promotion`)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from diffstore import tls
from diffstore.client import _calls as calls
from diffstore.client._sync import Client
from diffstore.client.commands import server_options
from diffstore.errors import InvalidRequest, ReplicaBehind
from diffstore.guides import guide


def add_commands(subparsers: Any) -> None:
    """Registers ``promote`` on the ``diffstore`` command."""
    parser = subparsers.add_parser(
        "promote",
        help="turn a read replica into a primary that accepts writes",
        description="Makes a read replica (diffstore serve --replica-of) a primary. While the old primary "
        "answers, it is told to step down first (it then refuses writes: 409 fenced) and the replica catches "
        "up with it; a replica that has not copied every collection, or is behind, is refused (409 "
        "replicaBehind, each collection's state and lag printed) unless --force. What it had applied stays; "
        f"nothing is half-applied. See {guide('replicas.md')}",
        parents=[server_options()],
        epilog="--url is the replica's address; --token its token (the old primary is reached with the "
        "replica's own --replica-token). On a server that is not a replica: notReplica, exit 1; on a "
        "primary that stepped down, --force makes it a primary again (only once the new one is stopped).",
    )
    parser.add_argument(
        "--force",
        action="store_true",
        help="promote even when collections are not copied or behind: what is not copied is lost",
    )
    parser.add_argument(
        "--wait",
        type=float,
        default=10.0,
        metavar="S",
        help="how long the replica may take to catch up before it is refused (default 10 s, at most 300)",
    )
    parser.set_defaults(func=run_promote)


def run_promote(args: argparse.Namespace) -> int:
    if "," in args.url:  # several servers would send it to their leader, which is no replica
        raise InvalidRequest(f"promote names the one replica to promote: --url {args.url} names several")
    wait_ms = max(0, min(300_000, int(args.wait * 1000)))
    with Client(args.url, token=args.token, **tls.client_kwargs(args)) as client:
        try:
            answer = client.execute(calls.promotion(args.force, wait_ms))
        except ReplicaBehind as exc:
            _print_collections(exc.collections, sys.stderr)
            raise
    _print_collections(answer.get("collections") or [], sys.stdout)
    if answer.get("unfenced"):
        print(f"promoted: {args.url} is a primary again at term {answer.get('term')} (its fencing lifted)")
        return 0
    if not answer.get("primaryReachable"):
        fenced = "the old primary did not answer: it is told to step down when it does (stop it meanwhile)"
    elif answer.get("steppedDown"):
        fenced = "the old primary stepped down"
    else:
        fenced = "the old primary was not told (it knows no terms)"
    print(f"promoted: {args.url} is a primary at term {answer.get('term')}; {fenced}")
    return 0


def _print_collections(collections: list[Any], out: Any) -> None:
    for item in collections:
        if isinstance(item, dict):
            name, state, lag = item.get("collectionName"), item.get("state"), item.get("lagGenerations")
            why = f" ({item['reason']})" if item.get("reason") else ""  # a stalled follower's reason
            print(f"  {name}: {state}{why}, {lag} generation{'' if lag == 1 else 's'} behind", file=out)
