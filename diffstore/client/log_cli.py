"""``diffstore log COLLECTION [--limit N]``: the collection's committed generations, newest first.

Text output: one line per generation, the columns separated by a tab -- generation id, commit time (local
time, then how long ago), changed keys, and the commit's metadata as ``key=value`` pairs::

    g3  2026-11-25 21:40:02 (3 min ago)  12 keys  job=nightly run=42
    g2  2026-11-25 20:11:40 (1 h ago)     1 key
    ""  -                                 -

A ``-`` is unknown: the initial generation, or one committed by an older server (no commit time then).
Generation ids use the one text form of :mod:`diffstore.shell`. ``--format json`` prints one JSON object
per generation: ``{"generationId", "committedAtMs", "changedKeys", "metadata"}``.
"""

from __future__ import annotations

import argparse
import sys
import time
from datetime import datetime
from typing import Any

import orjson

from diffstore import shell
from diffstore.client._sync import Client
from diffstore.client.commands import output_options, server_options
from diffstore.engine.types import GenerationInfo

_PAGE = 1000


def add_commands(subparsers: Any) -> None:
    """Registers ``log`` on the ``diffstore`` command."""
    parser = subparsers.add_parser(
        "log",
        help="list a collection's committed generations: time, changed keys, metadata",
        description="Lists a collection's committed generations, newest first: when each was committed "
        "(local time, and how long ago), how many keys it changed, and its commit's metadata.",
        parents=[server_options(), output_options()],
        epilog="Generation ids are UTF-8 text when printable, else 'base64:' and their base64 (the form "
        "every command accepts back). '-' means unknown (the initial generation, or one committed by an "
        "older server).",
    )
    parser.add_argument("collection", metavar="COLLECTION")
    parser.add_argument(
        "--limit", type=shell.int_within(1, 1_000_000), default=20, help="how many generations (default 20)"
    )
    parser.set_defaults(func=run_log)


def run_log(args: argparse.Namespace) -> int:
    found: list[GenerationInfo] = []
    with Client(args.url, token=args.token or None) as client:
        collection = client.collection(args.collection)
        before: bytes | None = None
        while len(found) < args.limit:
            page, more = collection.history(before, limit=min(_PAGE, args.limit - len(found)))
            found.extend(page)
            if not more or not page:
                break
            before = page[-1].generation_id
    now_ms = time.time_ns() // 1_000_000
    if args.format == "json":
        for info in found:
            sys.stdout.write(orjson.dumps(to_json(info), option=orjson.OPT_APPEND_NEWLINE).decode())
    else:
        sys.stdout.write("".join(line + "\n" for line in to_text(found, now_ms)))
    sys.stdout.flush()
    return 0


def to_json(info: GenerationInfo) -> dict[str, Any]:
    return {
        "generationId": shell.show(info.generation_id),
        "committedAtMs": info.committed_at_ms,
        "changedKeys": info.changed_keys,
        "metadata": info.metadata,
    }


def to_text(infos: list[GenerationInfo], now_ms: int) -> list[str]:
    rows = [
        [
            shell.show(info.generation_id),
            "-"
            if info.committed_at_ms is None
            else f"{_local(info.committed_at_ms)} ({ago(now_ms - info.committed_at_ms)})",
            "-"
            if info.changed_keys is None
            else f"{info.changed_keys} key{'' if info.changed_keys == 1 else 's'}",
            " ".join(f"{key}={value}" for key, value in sorted((info.metadata or {}).items())),
        ]
        for info in infos
    ]
    return ["\t".join(row).rstrip("\t") for row in rows]


def _local(at_ms: int) -> str:
    return datetime.fromtimestamp(at_ms / 1000).astimezone().strftime("%Y-%m-%d %H:%M:%S %Z")


def ago(elapsed_ms: int) -> str:
    """``elapsed_ms`` as a person says it: "just now", "42 s ago", "3 min ago", "5 h ago", "2 days ago"."""
    seconds = max(elapsed_ms, 0) // 1000
    if seconds < 1:
        return "just now"
    for size, unit in ((86400, "day"), (3600, "h"), (60, "min")):
        if seconds >= size:
            count = seconds // size
            return f"{count} {unit}{'s' if unit == 'day' and count != 1 else ''} ago"
    return f"{seconds} s ago"
