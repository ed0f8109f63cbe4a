"""``diffstore log COLLECTION [GENERATION] [--limit N] [--since TIME]``: the collection's committed
generations, newest first.

Text output: one line per generation, the columns separated by a tab -- generation id, commit time (local
time, then how long ago), changed keys, the commit's metadata as ``key=value`` pairs, and the readers the
commit moved (``NAME TARGET FROM -> TO`` as ``diffstore lineage`` prints them, ``-`` for a reader at the
beginning, ``;`` between them; ``?`` when the generation was collected)::

    g3  2026-11-25 21:40:02 CET (3 min ago)  12 keys  job=nightly run=42  from_a A a1 -> a2
    g2  2026-11-25 20:11:40 CET (1 h ago)     1 key
    ""  -                                     -

A ``-`` is unknown: the initial generation, or one committed by an older server (no commit time then).
Generation ids use the one text form of :mod:`diffstore.shell`; ``GENERATION`` (where the listing starts)
takes a ref too (``~10``, ``@reader:NAME``, ``@2026-11-25T10:00:00Z``). ``--since`` stops at the first
generation committed before it: an ISO time (without a zone: local time) or a span back from now
(``90s``, ``30m``, ``2h``, ``7d``). ``--format json`` prints one JSON object per generation:
``{"generationId", "committedAtMs", "changedKeys", "metadata", "movedReaders"}``.
"""

from __future__ import annotations

import argparse
import itertools
import re
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from typing import Any

import orjson

from diffstore import shell, tls
from diffstore.client._sync import Client, Collection
from diffstore.client.commands import REFS_HELP, output_options, resolve_generation, server_options
from diffstore.engine.types import GenerationInfo, LineageSource
from diffstore.errors import GenerationCollected, InvalidRequest

_PAGE = 1000
_LINEAGE_REQUESTS = 8
"""Lineage requests in flight at once: one per listed generation, so a long listing waits on round trips."""
_UNITS = {"s": 1, "m": 60, "min": 60, "h": 3600, "d": 86400}


def add_commands(subparsers: Any) -> None:
    """Registers ``log`` on the ``diffstore`` command."""
    parser = subparsers.add_parser(
        "log",
        help="list a collection's committed generations: time, changed keys, metadata, readers moved",
        description="Lists a collection's committed generations, newest first: when each was committed "
        "(local time, and how long ago), how many keys it changed, its commit's metadata, and the readers "
        "the commit moved (NAME TARGET FROM -> TO).",
        parents=[server_options(), output_options()],
        epilog="Generation ids are UTF-8 text when printable, else 'base64:' and their base64 (the form "
        "every command accepts back). '-' means unknown (the initial generation, or one committed by an "
        f"older server); '?' readers of a collected generation. {REFS_HELP}",
    )
    parser.add_argument("collection", metavar="COLLECTION")
    parser.add_argument(
        "generation",
        metavar="GENERATION",
        nargs="?",
        help="start the listing at this generation, a ref such as ~10 too (default: the current one)",
    )
    parser.add_argument(
        "--limit", type=shell.int_within(1, 1_000_000), default=20, help="how many generations (default 20)"
    )
    parser.add_argument(
        "--since",
        metavar="TIME",
        type=since_ms,
        help="only generations committed at or after TIME: an ISO time (2026-11-25T10:00, local unless it "
        "has a zone) or a span back from now (90s, 30m, 2h, 7d)",
    )
    parser.set_defaults(func=run_log)


def since_ms(text: str, now_ms: int | None = None) -> int:
    """An argparse type: ``--since`` as Unix ms (a span back from ``now_ms``, default the clock; or a
    time)."""
    now_ms = time.time_ns() // 1_000_000 if now_ms is None else now_ms
    span = re.fullmatch(r"(\d{1,9})\s*(s|m|min|h|d)", text.strip())
    if span:
        return now_ms - int(span.group(1)) * _UNITS[span.group(2)] * 1000
    try:
        when = datetime.fromisoformat(text.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is neither an ISO time (2026-11-25T10:00:00, +01:00 or Z for a zone) nor a span "
            "such as 30m, 2h or 7d"
        ) from None
    return int(when.astimezone().timestamp() * 1000)  # a naive time is local


def run_log(args: argparse.Namespace) -> int:
    found: list[GenerationInfo] = []
    moved: list[tuple[LineageSource, ...] | None] = []
    with Client(args.url, token=args.token or None, **tls.client_kwargs(args)) as client:
        collection = client.collection(args.collection)
        start = resolve_generation(collection, args.generation, "GENERATION")
        # the smallest id above START: the listing includes START itself
        before = None if start is None else start + b"\x00"
        done = False
        with ThreadPoolExecutor(_LINEAGE_REQUESTS, thread_name_prefix="diffstore-log") as lineage:
            while not done and len(found) < args.limit:
                page, more = collection.history(before, limit=min(_PAGE, args.limit - len(found)))
                listed = page
                if args.since is not None:
                    listed = list(itertools.takewhile(lambda i: (i.committed_at_ms or 0) >= args.since, page))
                    done = len(listed) < len(page)
                found.extend(listed)
                moved.extend(lineage.map(lambda info: _moves(collection, info), listed))
                if not more or not page:
                    break
                before = page[-1].generation_id
    now_ms = time.time_ns() // 1_000_000
    if args.format == "json":
        for info, moves in zip(found, moved, strict=True):
            sys.stdout.write(orjson.dumps(to_json(info, moves), option=orjson.OPT_APPEND_NEWLINE).decode())
    else:
        sys.stdout.write("".join(line + "\n" for line in to_text(found, now_ms, moved)))
    sys.stdout.flush()
    return 0


def _moves(collection: Collection, info: GenerationInfo) -> tuple[LineageSource, ...] | None:
    """The readers the commit of ``info`` moved (lineage, one level); None: unknown (collected, or never
    committed: the initial generation)."""
    if info.committed_at_ms is None and info.generation_id == b"":
        return ()
    try:
        return collection.lineage(info.generation_id).sources
    except (GenerationCollected, InvalidRequest):
        return None


def to_json(info: GenerationInfo, moves: tuple[LineageSource, ...] | None = ()) -> dict[str, Any]:
    return {
        "generationId": shell.show(info.generation_id),
        "committedAtMs": info.committed_at_ms,
        "changedKeys": info.changed_keys,
        "metadata": info.metadata,
        "movedReaders": None
        if moves is None
        else [
            {
                "readerName": move.reader_name,
                "target": move.target,
                "fromGenerationId": shell.show_opt(move.from_generation_id),
                "toGenerationId": shell.show_opt(move.to_generation_id),
            }
            for move in moves
        ],
    }


def to_text(
    infos: list[GenerationInfo], now_ms: int, moved: list[tuple[LineageSource, ...] | None] | None = None
) -> list[str]:
    rows = [
        [
            shell.quote_empty(shell.show(info.generation_id)),
            "-"
            if info.committed_at_ms is None
            else f"{_local(info.committed_at_ms)} ({ago(now_ms - info.committed_at_ms)})",
            "-" if info.changed_keys is None else shell.counted(info.changed_keys, "key"),
            " ".join(f"{key}={value}" for key, value in sorted((info.metadata or {}).items())),
            _moves_text(moves),
        ]
        for info, moves in zip(infos, moved or [()] * len(infos), strict=True)
    ]
    return ["\t".join(row).rstrip("\t") for row in rows]


def _moves_text(moves: tuple[LineageSource, ...] | None) -> str:
    if moves is None:
        return "?"
    return "; ".join(
        f"{m.reader_name} {m.target} {_position(m.from_generation_id)} -> {_position(m.to_generation_id)}"
        for m in moves
    )


def _position(generation_id: bytes | None) -> str:
    return "-" if generation_id is None else shell.quote_empty(shell.show(generation_id))


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
