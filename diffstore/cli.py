"""The ``diffstore`` command: a thin dispatcher; each front registers its own sub-commands.

A front exposes ``add_commands(subparsers)`` which adds sub-parsers whose ``func`` attribute takes the
parsed ``argparse.Namespace`` and returns an exit code.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from diffstore.errors import DiffstoreError

# Modules that contribute sub-commands; each may be missing while its front is optional (spark).
_FRONTS = (
    "diffstore.server.cli",
    "diffstore.client.cli",
    "diffstore.streams.cli",
    "diffstore.spark.cli",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="diffstore", description="A generational key-value diff store.")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module_name in _FRONTS:
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name and module_name.startswith(exc.name):
                continue
            raise
        module.add_commands(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except DiffstoreError as exc:  # e.g. a store that cannot be opened (a full disk): one line, no traceback
        print(f"diffstore {args.command}: {exc.reason}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
