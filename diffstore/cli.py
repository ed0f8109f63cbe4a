"""The ``diffstore`` command: a thin dispatcher; each front registers its own sub-commands.

A front exposes ``add_commands(subparsers)`` which adds sub-parsers whose ``func`` attribute takes the
parsed ``argparse.Namespace`` and returns an exit code.

Expected failures are turned into one line on stderr (what failed, what to do) and a non-zero exit code
here, in :func:`main` only: a command raises :class:`DiffstoreError` (or ``OSError`` for a directory or a
port) and never prints a traceback for them.
"""

from __future__ import annotations

import argparse
import errno
import importlib
import importlib.util
import os
import re
import sys
from collections.abc import Sequence
from importlib import metadata
from typing import Any

from diffstore.errors import DiffstoreError, StorageError, Unauthorized
from diffstore.guides import guide

# Modules that contribute sub-commands; each may be missing while its front is optional (spark).
_FRONTS = (
    "diffstore.server.cli",
    "diffstore.server.store_cli",
    "diffstore.client.cli",
    "diffstore.client.commands",
    "diffstore.client.write_cli",
    "diffstore.client.readers_cli",
    "diffstore.client.lineage_cli",
    "diffstore.client.log_cli",
    "diffstore.client.revert_cli",
    "diffstore.replica.cli",
    "diffstore.ha.cli",
    "diffstore.streams.cli",
    "diffstore.spark.cli",
)

# What the optional extras of pyproject.toml bring (the base package is the embedded engine, the Python
# client and the commands on a data directory or a URL): the extra a command needs, and the extra that
# brings each third-party module, so that a missing one is said in one line with what to install. Every
# command's parser is built without its extra (the fronts import their extras' modules when a command
# runs), so `--help` works everywhere: tests/test_cli_extras.py.
COMMAND_EXTRAS = {"serve": "server", "streams": "streams", "ingest": "streams", "transform": "spark"}
MODULE_EXTRAS = {
    "fastapi": "server",
    "starlette": "server",
    "uvicorn": "server",
    "fastapi_offline": "server",
    "grpc": "streams",
    "google": "streams",
    "zstandard": "streams",
    "pyspark": "spark",
    "pyarrow": "spark",
    "pandas": "spark",
}
# The package a user knows an extra by (named when it is missing, rather than whichever of the extra's
# modules happened to be imported first), and the pip name of a module whose import name differs.
EXTRA_MODULES = {"server": "fastapi", "streams": "grpc", "spark": "pyspark"}
PIP_NAMES = {
    "grpc": "grpcio",
    "google": "protobuf",
    "prometheus_client": "prometheus-client",
    "fastapi_offline": "fastapi-offline",
}

# The front that registers each command, so that a command loads only its own front: the others import
# httpx, grpc or FastAPI, which were most of a command's start-up. A command missing here still works
# (every front is loaded, as for --help); tests/test_cli_fronts.py keeps this table complete.
COMMAND_FRONTS = {
    "serve": "diffstore.server.cli",
    "backup": "diffstore.server.store_cli",
    "check": "diffstore.server.store_cli",
    "compact": "diffstore.server.store_cli",
    "migrate": "diffstore.server.store_cli",
    "watch": "diffstore.client.cli",
    "collections": "diffstore.client.commands",
    "get": "diffstore.client.commands",
    "put": "diffstore.client.write_cli",
    "delete": "diffstore.client.write_cli",
    "generation": "diffstore.client.write_cli",
    "query": "diffstore.client.commands",
    "diff": "diffstore.client.commands",
    "readers": "diffstore.client.readers_cli",
    "lineage": "diffstore.client.lineage_cli",
    "log": "diffstore.client.log_cli",
    "revert": "diffstore.client.revert_cli",
    "promote": "diffstore.replica.cli",
    "ha": "diffstore.ha.cli",
    "streams": "diffstore.streams.cli",
    "ingest": "diffstore.streams.cli",
    "transform": "diffstore.spark.cli",
}


class _CommandParser(argparse.ArgumentParser):
    """A sub-command's parser: an unknown flag prints this sub-command's usage, not the top one's.

    (argparse hands a sub-parser's unknown arguments up to the top parser, whose usage says nothing of
    the sub-command's flags.) Sub-parsers of sub-parsers inherit the class.
    """

    def parse_known_args(self, args: Any = None, namespace: Any = None) -> Any:
        namespace, extras = super().parse_known_args(args, namespace)
        if extras:
            self.error(f"unrecognized arguments: {' '.join(extras)}")
        return namespace, extras


def build_parser(argv: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """The whole command line, or, when ``argv`` names a command in :data:`COMMAND_FRONTS`, only that
    command's front (same parser for that command, much less to import)."""
    parser = argparse.ArgumentParser(
        prog="diffstore",
        description="A generational key-value diff store.",
        epilog="Run 'diffstore COMMAND --help' for a command's options. The HTTP protocol, its error codes "
        f"and limits are described in {guide('protocol.md')}",
    )
    parser.add_argument("--version", action="version", version=f"diffstore {_version()}")
    output = parser.add_argument_group(
        "output (also accepted before the command, as 'diffstore --format json query C')"
    )
    output.add_argument("--format", choices=("text", "json"), help="the command's output format")
    output.add_argument("--no-headers", action="store_true", help="tables without their header row")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_CommandParser)
    if argv and argv[0] == "--version":
        return parser  # needs no front at all
    front = COMMAND_FRONTS.get(argv[0]) if argv else None
    if front is None or not _add_front(front, subparsers, required=True):
        for module_name in _FRONTS:  # a missing optional front still leaves the usage naming the others
            _add_front(module_name, subparsers)
    return parser


def _add_front(module_name: str, subparsers: Any, required: bool = False) -> bool:
    """Adds a front's commands; False when the front is not installed (an optional extra), or, unless
    ``required``, when a module it needs is not (its extra is missing: the usage leaves it out)."""
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name and module_name.startswith(exc.name):
            return False
        if required or _missing_extra(exc, None) is None:
            raise
        return False
    module.add_commands(subparsers)
    return True


def _missing_extra(exc: ModuleNotFoundError, command: str | None) -> str | None:
    """What to say when ``command`` cannot import a module of an optional extra (None: not one of those)."""
    module = (exc.name or "").split(".")[0]
    if not module or module == "diffstore":
        return None
    extra = COMMAND_EXTRAS.get(command or "") or MODULE_EXTRAS.get(module)
    if extra is None:
        return None
    if importlib.util.find_spec(EXTRA_MODULES[extra]) is None:
        module = EXTRA_MODULES[extra]  # the extra's main package, rather than the first of its modules tried
    package = PIP_NAMES.get(module, module)
    return (
        f"needs the '{extra}' extra ({package} is not installed): pip install 'diffstore[{extra}]'"
        f" (from a clone: pip install '.[{extra}]')"
    )


def main(argv: Sequence[str] | None = None) -> int:
    arguments = output_options_after_command(list(sys.argv[1:] if argv is None else argv))
    try:
        parser = build_parser(arguments)
    except ModuleNotFoundError as exc:  # the command's front needs an extra that is not installed
        fix = _missing_extra(exc, arguments[0] if arguments else None)
        if fix is None:
            raise
        print(f"{' '.join(['diffstore', *arguments[:1]])}: {fix}", file=sys.stderr)
        return 1
    args = parser.parse_args(arguments)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except ModuleNotFoundError as exc:  # a module the command loads as it runs (FastAPI for serve)
        fix = _missing_extra(exc, args.command)
        if fix is None:
            raise
        print(f"{_command(args)}: {fix}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # the reader of our output went away (``query ... | head``): what it wanted was printed; say
        # nothing, and keep the interpreter's last flush of stdout from failing again
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except DiffstoreError as exc:  # e.g. a store that cannot be opened (a full disk): one line, no traceback
        print(f"{_command(args)}: {one_line(exc, args)}", file=sys.stderr)
        return 1
    except OSError as exc:  # a data directory that cannot be created, a port in use, a file not found
        hint = ": stop what listens there or pick another --port" if exc.errno == errno.EADDRINUSE else ""
        print(f"{_command(args)}: {exc.strerror or exc}{_filename(exc)}{hint}", file=sys.stderr)
        return 1


OUTPUT_OPTIONS = {"--format": 1, "--no-headers": 0}
"""Options a user may give before the command (``kubectl -o json get``): their number of values."""


def output_options_after_command(arguments: list[str]) -> list[str]:
    """``arguments`` with the output options given before the command moved after it, where the command
    (and its action: ``collections ls``) takes them; one the command is also given keeps the command's
    value. The rest is left as it is."""
    moved: list[str] = []
    rest = list(arguments)
    while rest:
        name, _, value = rest[0].partition("=")
        if name not in OUTPUT_OPTIONS:
            break
        count = 0 if value else OUTPUT_OPTIONS[name]
        option, rest = rest[: 1 + count], rest[1 + count :]
        moved += option
    if not moved or not rest:
        return arguments  # nothing moved, or no command: the top parser says what is wrong
    end = rest.index("--") if "--" in rest else len(rest)
    given = {word.partition("=")[0] for word in rest[:end]}
    kept: list[str] = []
    while moved:
        count = 0 if "=" in moved[0] else OUTPUT_OPTIONS[moved[0]]
        option, moved = moved[: 1 + count], moved[1 + count :]
        if option[0].partition("=")[0] not in given:
            kept += option
    return rest[:end] + kept + rest[end:]


def one_line(exc: DiffstoreError, args: argparse.Namespace) -> str:
    """What failed and, for the failures a user can fix from the shell, what to do."""
    url = getattr(args, "url", None)
    if isinstance(exc, Unauthorized):
        return f"{exc.reason} ({exc.code}): pass the server's token with --token or DIFFSTORE_TOKEN"
    cause = exc.__cause__
    if isinstance(exc, StorageError) and url and type(cause).__module__.startswith("httpx"):
        # the client's transport failure (refused connection, timeout): the server is not reachable
        return (
            f"cannot reach a diffstore server at {url} ({type(cause).__name__}: {cause or 'no answer'}): "
            "start one with 'diffstore serve' or point --url / DIFFSTORE_URL at it"
        )
    return f"{_flag_names(exc.reason, args)} ({exc.code})"


def _flag_names(reason: str, args: argparse.Namespace) -> str:
    """A server's message in the command's words: ``body.depth`` or ``fromGenerationId`` become the flag
    (``--depth``, ``--from``) that set them, as the command's ``wire_flags`` map them."""
    flags: dict[str, str] = getattr(args, "wire_flags", None) or {}
    reason = re.sub(r"\b(?:body|query)\.(\w+)", r"\1", reason)
    if not flags:
        return reason
    pattern = r"\b(" + "|".join(map(re.escape, flags)) + r")\b"
    return re.sub(pattern, lambda m: flags[m.group(1)], reason)


def _command(args: argparse.Namespace) -> str:
    action = getattr(args, "action", None) or getattr(args, "streams_command", None)
    return " ".join(["diffstore", args.command] + ([action] if isinstance(action, str) else []))


def _filename(exc: OSError) -> str:
    return f": {exc.filename}" if exc.filename else ""


def _version() -> str:
    try:
        return metadata.version("diffstore")
    except metadata.PackageNotFoundError:
        return "unknown (not installed)"


if __name__ == "__main__":
    sys.exit(main())
