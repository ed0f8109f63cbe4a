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
A server that does not answer for a while (a restart, a broken link) is waited for with bounded back-off
(one log line on stderr when the wait starts, one when it is back) and the watch goes on where it was:
each generation and each changed key is printed once; ``--give-up-after-s S`` exits 1 once the server
has not answered for S seconds (default: never).
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from typing import Any, TextIO

import orjson

from diffstore import logs, shell
from diffstore.backoff import GIVE_UP_HELP, GIVE_UP_OPTION, RetryPolicy, give_up_argument
from diffstore.client.backend import Backend, open_backend
from diffstore.client.commands import REFS_HELP, output_options, resolve_generation, server_options
from diffstore.collection import Collection
from diffstore.engine.types import DiffItem, DiffSpec
from diffstore.errors import DiffstoreError
from diffstore.outage import OutageWatch, is_outage

_LINE = orjson.OPT_APPEND_NEWLINE


def add_commands(subparsers: Any) -> None:
    """Registers ``watch`` on the ``diffstore`` command."""
    parser = subparsers.add_parser(
        "watch",
        help="print each new generation of a collection as it commits",
        description="Prints each new generation of a collection as it commits, until Ctrl-C.",
        parents=[server_options(data=True), output_options()],
        epilog="Generation ids, keys and values are UTF-8 text when printable, else 'base64:' and their "
        f"base64; --since and every other command accept that form back. {REFS_HELP}",
    )
    parser.add_argument("collection", metavar="COLLECTION")
    parser.add_argument("--diff", action="store_true", help="also print the changed keys of each generation")
    parser.add_argument(
        "--wire",
        choices=("msgpack", "json"),
        default="msgpack",
        help="with --url: the wire format (json for diffbelt)",
    )
    parser.add_argument(
        "--since",
        metavar="GENERATION",
        help="start after this generation id, as the commands print it (printable text, else "
        "'base64:...'), or a ref such as ~3 (default: the current generation)",
    )
    parser.add_argument(
        GIVE_UP_OPTION, type=give_up_argument, default=None, metavar="S|never", help=GIVE_UP_HELP
    )
    logs.add_arguments(parser)
    parser.set_defaults(func=run_watch)


_log = logging.getLogger("diffstore.watch")


def run_watch(args: argparse.Namespace) -> int:
    logs.configure_from(args)
    try:
        with open_backend(args) as store:
            collection = store.collection(args.collection)
            since = resolve_generation(collection, args.since, "--since")
            outage = None
            if getattr(args, "url", None) and not getattr(args, "data", None):
                policy = RetryPolicy(give_up_after_s=args.give_up_after_s)
                outage = OutageWatch(f"the diffstore server {args.url}", policy, _log)
            watch(store, collection, args.diff, sys.stdout, since, args.format, outage)
    except KeyboardInterrupt:
        return 0
    return 0


def watch(
    store: Backend,
    collection: Collection,
    with_diff: bool,
    out: TextIO,
    since: bytes | None = None,
    output: str = "text",
    outage: OutageWatch | None = None,
) -> None:
    """Prints forever: a line per new generation and, with ``with_diff``, a line per changed key.

    With ``outage`` a server that does not answer is waited for (and the call retried) instead of ending
    the watch; a generation whose diff was cut short is finished first, skipping the lines already printed
    (a diff's items come in key order, the same for the same range), so every line is printed once.
    """
    previous = collection.generation_id if since is None else since
    pending: bytes | None = None  # a generation printed whose changed keys are not all printed yet
    printed = 0  # how many of them are

    def finish(generation_id: bytes) -> None:
        nonlocal previous, pending, printed
        if with_diff:
            spec = DiffSpec.of(from_generation_id=previous, to_generation_id=generation_id)
            for number, item in enumerate(store.changes(collection, spec)):
                if number >= printed:
                    _print(out, output, item_line(collection.name, generation_id, item))
                    printed += 1
        previous, pending, printed = generation_id, None, 0

    while True:
        try:
            if outage is not None and outage.waiting:
                collection.generation_state()  # says the server is back before a commit would
                outage.succeeded()
            if pending is not None:
                finish(pending)
            for generation_id in store.watch(collection.name, previous):
                _print(out, output, generation_line(collection.name, previous, generation_id))
                pending = generation_id
                finish(generation_id)
        except DiffstoreError as exc:
            if outage is None or not is_outage(exc):
                raise
            time.sleep(outage.failed(exc))  # raises exc once the limit passed


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
