"""``diffstore watch COLLECTION``: prints each new generation as it commits.

Generation ids, keys and values are printed in the one text form of :mod:`diffstore.shell` (printable
UTF-8 as is, else ``base64:...``), the form ``--since`` and every other command accept back. With
``--diff`` every generation line is followed by one line per changed key, as ``diffstore diff`` prints
them::

    generation 2 (from 1)
    + pear<TAB>yellow
    ~ apple<TAB>green<TAB>red
    - plum<TAB>purple

``--format json`` prints one JSON object per line with the same text forms as strings::

    {"event":"generation","collection":"A","fromGenerationId":"1","generationId":"2"}
    {"event":"item","collection":"A","generationId":"2","key":"apple","fromValue":"green","toValue":"red"}

Runs until Ctrl-C (exit 0) or until the server fails (one line on stderr from ``diffstore.cli``, exit 1).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any, TextIO

import orjson

from diffstore import shell, tls
from diffstore.client._sync import Client, Collection
from diffstore.client.commands import REFS_HELP, output_options, resolve_generation, server_options
from diffstore.engine.types import DiffItem

_LINE = orjson.OPT_APPEND_NEWLINE


def add_commands(subparsers: Any) -> None:
    """Registers ``watch`` on the ``diffstore`` command."""
    parser = subparsers.add_parser(
        "watch",
        help="print each new generation of a collection as it commits",
        description="Prints each new generation of a collection as it commits, until Ctrl-C.",
        parents=[server_options(), output_options()],
        epilog="Generation ids, keys and values are UTF-8 text when printable, else 'base64:' and their "
        f"base64; --since and every other command accept that form back. {REFS_HELP}",
    )
    parser.add_argument("collection", metavar="COLLECTION")
    parser.add_argument("--diff", action="store_true", help="also print the changed keys of each generation")
    parser.add_argument(
        "--wire", choices=("msgpack", "json"), default="msgpack", help="wire format (json for diffbelt)"
    )
    parser.add_argument(
        "--since",
        metavar="GENERATION",
        help="start after this generation id, as the commands print it (printable text, else "
        "'base64:...'), or a ref such as ~3 (default: the current generation)",
    )
    parser.set_defaults(func=run_watch)


def run_watch(args: argparse.Namespace) -> int:
    try:
        with Client(
            args.url, token=args.token or None, format=args.wire, **tls.client_kwargs(args)
        ) as client:
            collection = client.collection(args.collection)
            since = resolve_generation(collection, args.since, "--since")
            watch(collection, args.diff, sys.stdout, since, args.format)
    except KeyboardInterrupt:
        return 0
    return 0


def watch(
    collection: Collection,
    with_diff: bool,
    out: TextIO,
    since: bytes | None = None,
    output: str = "text",
) -> None:
    """Prints forever: a line per new generation and, with ``with_diff``, a line per changed key."""
    previous = collection.generation_id if since is None else since
    for generation_id in collection.watch(previous):
        _print(out, output, generation_line(collection.name, previous, generation_id))
        if with_diff:
            for item in collection.diff(from_generation_id=previous, to_generation_id=generation_id):
                _print(out, output, item_line(collection.name, generation_id, item))
        previous = generation_id


def generation_line(collection: str, previous: bytes, generation_id: bytes) -> dict[str, Any]:
    return {
        "event": "generation",
        "collection": collection,
        "fromGenerationId": shell.show(previous),
        "generationId": shell.show(generation_id),
    }


def item_line(collection: str, generation_id: bytes, item: DiffItem) -> dict[str, Any]:
    return {
        "event": "item",
        "collection": collection,
        "generationId": shell.show(generation_id),
        "key": shell.show(item.key),
        "fromValue": shell.show_opt(item.from_value),
        "toValue": shell.show_opt(item.to_value),
    }


def text_line(line: dict[str, Any]) -> str:
    """A line of ``--format text``: ``generation G (from F)``, or a changed key as ``diff`` prints it."""
    if line["event"] == "generation":
        generation = shell.quote_empty(line["generationId"])
        return f"generation {generation} (from {shell.quote_empty(line['fromGenerationId'])})"
    return shell.change_line(line["key"], line["fromValue"], line["toValue"])


def _print(out: TextIO, output: str, line: dict[str, Any]) -> None:
    if output == "json":
        out.write(orjson.dumps(line, option=_LINE).decode())
    else:
        out.write(text_line(line) + "\n")
    out.flush()
