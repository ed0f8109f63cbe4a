"""``diffstore watch COLLECTION``: prints each new generation as it commits, one JSON line each.

With ``--diff`` every generation line is followed by one line per changed key. Byte strings are
EncodedStrings (SPEC §2), so the output can be fed to ``jq`` or back to the HTTP API::

    {"event":"generation","collection":"A","fromGenerationId":{...},"generationId":{...}}
    {"event":"item","collection":"A","generationId":{...},"key":{...},"fromValue":{...}|null,"toValue":...}

Runs until Ctrl-C (exit 0) or until the server fails (one line on stderr from ``diffstore.cli``, exit 1).
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any, TextIO

import orjson

from diffstore import shell
from diffstore.client._sync import Client, Collection
from diffstore.client._transport import DEFAULT_URL
from diffstore.engine.types import DiffItem
from diffstore.wire import JSON

_LINE = orjson.OPT_APPEND_NEWLINE


def add_commands(subparsers: Any) -> None:
    """Registers ``watch`` on the ``diffstore`` command."""
    parser = subparsers.add_parser("watch", help="print each new generation of a collection as it commits")
    parser.add_argument("collection", metavar="COLLECTION")
    parser.add_argument("--url", default=os.environ.get("DIFFSTORE_URL", DEFAULT_URL))
    parser.add_argument("--token", default=os.environ.get("DIFFSTORE_TOKEN"))
    parser.add_argument("--diff", action="store_true", help="also print the changed keys of each generation")
    parser.add_argument("--format", choices=("msgpack", "json"), default="msgpack", help="wire format")
    parser.add_argument(
        "--since",
        metavar="GENERATION",
        help="start after this generation id, as other commands print it (printable text, else "
        "'base64:...'; default: the current generation)",
    )
    parser.set_defaults(func=run_watch)


def run_watch(args: argparse.Namespace) -> int:
    try:
        with Client(args.url, token=args.token, format=args.format) as client:
            since = None if args.since is None else shell.parse(args.since)
            watch(client.collection(args.collection), args.diff, sys.stdout, since)
    except KeyboardInterrupt:
        return 0
    return 0


def watch(collection: Collection, with_diff: bool, out: TextIO, since: bytes | None = None) -> None:
    """Prints forever: a line per new generation and, with ``with_diff``, a line per changed key."""
    previous = collection.generation_id if since is None else since
    for generation_id in collection.watch(previous):
        _print(out, generation_line(collection.name, previous, generation_id))
        if with_diff:
            for item in collection.diff(from_generation_id=previous, to_generation_id=generation_id):
                _print(out, item_line(collection.name, generation_id, item))
        previous = generation_id


def generation_line(collection: str, previous: bytes, generation_id: bytes) -> dict[str, Any]:
    return {
        "event": "generation",
        "collection": collection,
        "fromGenerationId": JSON.es(previous),
        "generationId": JSON.es(generation_id),
    }


def item_line(collection: str, generation_id: bytes, item: DiffItem) -> dict[str, Any]:
    return {
        "event": "item",
        "collection": collection,
        "generationId": JSON.es(generation_id),
        "key": JSON.es(item.key),
        "fromValue": JSON.es_opt(item.from_value),
        "toValue": JSON.es_opt(item.to_value),
    }


def _print(out: TextIO, line: dict[str, Any]) -> None:
    out.write(orjson.dumps(line, option=_LINE).decode())
    out.flush()
