"""``diffstore lineage COLLECTION [GENERATION] [--depth N]``: which readers made a generation, as a tree.

Text output: a first line ``COLLECTION GENERATION``, then one line per source, indented two spaces per
level of the walk (the columns are separated by a tab)::

    C c2
      from_a  A  a1 -> a2
        hstream/sub/0  hstream://events  base64:AAAAAAAAABQAAAAA -> base64:AAAAAAAAACgAAAAA
      from_b  B  b1 -> b1

A null position prints as ``-``; a source whose span lost part of its
history to garbage collection ends with ``(incomplete)``. Generation ids and positions use the one text
form of :mod:`diffstore.shell`. ``--format json`` prints the answer's shape with those text forms.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

import orjson

from diffstore import shell, tls
from diffstore.client._sync import Client
from diffstore.client.commands import REFS_HELP, output_options, resolve_generation, server_options
from diffstore.engine.types import MAX_LINEAGE_DEPTH, Lineage, LineageSource

_INDENT = "  "


def add_commands(subparsers: Any) -> None:
    """Registers ``lineage`` on the ``diffstore`` command."""
    text = "show the readers a generation's commit moved, and with --depth their sources' own"
    parser = subparsers.add_parser(
        "lineage",
        help=text,
        description=text[:1].upper() + text[1:] + " (down to the streams they were ingested from).",
        parents=[server_options(), output_options()],
        epilog="Generation ids are UTF-8 text when printable, else 'base64:' and their base64 (the form "
        f"every command prints). {REFS_HELP} Lineage is described in docs/lineage.md.",
    )
    parser.add_argument("collection", metavar="COLLECTION")
    parser.add_argument(
        "generation",
        metavar="GENERATION",
        nargs="?",
        help="a committed generation, or a ref such as ~1 (default: the current)",
    )
    parser.add_argument(
        "--depth",
        type=shell.int_within(1, MAX_LINEAGE_DEPTH),
        default=1,
        help=f"levels to walk back, 1..{MAX_LINEAGE_DEPTH} (default 1: the generation's own moves)",
    )
    parser.set_defaults(func=run_lineage)


def run_lineage(args: argparse.Namespace) -> int:
    with Client(args.url, token=args.token or None, **tls.client_kwargs(args)) as client:
        collection = client.collection(args.collection)
        asked = resolve_generation(collection, args.generation, "GENERATION")
        generation_id = collection.generation_id if asked is None else asked
        lineage = collection.lineage(generation_id, depth=args.depth)
    if args.format == "json":
        answer = orjson.dumps(to_json(args.collection, lineage), option=orjson.OPT_APPEND_NEWLINE)
        sys.stdout.write(answer.decode())
    else:
        sys.stdout.write("".join(line + "\n" for line in to_text(args.collection, lineage)))
    sys.stdout.flush()
    return 0


def to_text(collection: str, lineage: Lineage) -> list[str]:
    lines = [f"{collection} {shell.show(lineage.generation_id)}"]
    _text_lines(lineage.sources, 1, lines)
    return lines


def _text_lines(sources: tuple[LineageSource, ...], level: int, lines: list[str]) -> None:
    for source in sources:
        span = f"{_position(source.from_generation_id)} -> {_position(source.to_generation_id)}"
        mark = " (incomplete)" if source.incomplete else ""
        lines.append(f"{_INDENT * level}{source.reader_name}\t{source.target}\t{span}{mark}")
        if source.sources:
            _text_lines(source.sources, level + 1, lines)


def _position(generation_id: bytes | None) -> str:
    return "-" if generation_id is None else shell.show(generation_id)


def to_json(collection: str, lineage: Lineage) -> dict[str, Any]:
    return {
        "collection": collection,
        "generationId": shell.show(lineage.generation_id),
        "sources": _json_sources(lineage.sources),
    }


def _json_sources(sources: tuple[LineageSource, ...]) -> list[dict[str, Any]]:
    out = []
    for source in sources:
        entry: dict[str, Any] = {
            "readerName": source.reader_name,
            "collectionName": source.collection_name,
            "target": source.target,
            "fromGenerationId": shell.show_opt(source.from_generation_id),
            "toGenerationId": shell.show_opt(source.to_generation_id),
        }
        if source.sources is not None:
            entry["sources"] = _json_sources(source.sources)
        if source.incomplete:
            entry["incomplete"] = True
        out.append(entry)
    return out
