"""Process-wide logging of the ``diffstore`` commands: ``--log-level`` and ``--log-format text|json``.

JSON is one object per line: ``time`` (UTC, ISO 8601 with milliseconds), ``level``, ``logger``, ``event``
(the message), ``pid`` (the process), ``worker`` (the worker's number under ``serve --workers N``; absent
in other processes) and the record's own fields: whatever a caller passed with ``extra=``, and for
uvicorn's access log the request's ``client``, ``method``, ``path``, ``http_version``, ``status`` and
``duration_ms`` (from the request's first byte to its response's end). An exception
adds ``exc_info`` (its formatted traceback). Servers hand uvicorn ``log_config=None`` (see
:func:`uvicorn_options`) so that its ``uvicorn.error`` and ``uvicorn.access`` loggers go through the same
handler instead of uvicorn's own.

Logging is the one thing configured per process rather than passed down: the handlers belong to the
process, and :func:`configure` is called once, by the command that starts it.
"""

from __future__ import annotations

import argparse
import logging
import re
import sys
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, TextIO

import orjson

if TYPE_CHECKING:
    from rich.console import Console

LEVELS = ("debug", "info", "warning", "error", "critical")
FORMATS = ("text", "json")

# attributes every LogRecord has; anything else on a record came from ``extra=``
_STANDARD = frozenset(vars(logging.LogRecord("", 0, "", 0, "", (), None))) | {"message", "asctime"}
_ACCESS_FIELDS = ("client", "method", "path", "http_version", "status", "duration_ms")
# uvicorn adds ``color_message``, its message with terminal colours, to its records; JSON has no terminal
_NOT_FIELDS = _STANDARD | {"color_message"}
_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


class JsonFormatter(logging.Formatter):
    """One JSON object per record, on one line; ``worker``: the number of this process among a server's
    workers (None: not a worker)."""

    def __init__(self, worker: int | None = None) -> None:
        super().__init__()
        self.worker = worker

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "event": _ANSI.sub("", record.getMessage()),
            "pid": record.process,
        }
        if self.worker is not None:
            entry["worker"] = self.worker
        if record.name == "uvicorn.access" and isinstance(record.args, tuple) and len(record.args) >= 5:
            # uvicorn's five, and the duration diffstore's protocol adds (server.uvicorn_adapter)
            entry.update(zip(_ACCESS_FIELDS, record.args, strict=False))
        for name, value in vars(record).items():
            if name not in _NOT_FIELDS and not name.startswith("_") and name not in entry:
                entry[name] = _ANSI.sub("", value) if isinstance(value, str) else value
        if record.exc_info:
            entry["exc_info"] = self.formatException(record.exc_info)
        return orjson.dumps(entry, default=str).decode()


def configure(
    level: str = "info", fmt: str = "text", stream: TextIO | None = None, worker: int | None = None
) -> None:
    """Sends every logger's records (uvicorn's too) to one handler on ``stream`` (stderr by default);
    ``worker``: this process's number among a server's workers (a JSON field)."""
    if level not in LEVELS or fmt not in FORMATS:
        raise ValueError(f"log level must be one of {LEVELS} and format one of {FORMATS}")
    handler = logging.StreamHandler(stream or sys.stderr)
    if fmt == "json":
        handler.setFormatter(JsonFormatter(worker))
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper())
    # httpx logs every request at INFO: a standby ingestor polling its lease would write lines non-stop
    logging.getLogger("httpx").setLevel("DEBUG" if level == "debug" else "WARNING")
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):
        logger = logging.getLogger(name)
        for old in list(logger.handlers):
            logger.removeHandler(old)
        logger.propagate = True
        logger.setLevel(level.upper())


def uvicorn_options(level: str) -> dict[str, Any]:
    """What a server passes to uvicorn so that its logs go through :func:`configure`'s handler."""
    return {"log_config": None, "log_level": level}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Adds ``--log-level`` and ``--log-format`` to a command."""
    parser.add_argument("--log-level", choices=LEVELS, default="info", help="least severe level logged")
    parser.add_argument(
        "--log-format", choices=FORMATS, default="text", help="text lines, or one JSON object per line"
    )


def configure_from(args: argparse.Namespace) -> None:
    """:func:`configure` from the arguments :func:`add_arguments` added."""
    configure(args.log_level, args.log_format)


def console() -> Console:
    """The console of a command's messages and live tables (on stderr), without rich's automatic
    highlighting: it would colour the digits and letters inside a base64 generation id as separate pieces
    (and a number inside a name); what a message colours, its markup says."""
    from rich.console import Console  # imported when a command prints, not by every process that logs

    return Console(stderr=True, highlight=False)


class Reporter:
    """What a command tells its user: rich text on the console, or, with ``--log-format json``, log records.

    ``say(level, text, event, **fields)``: ``text`` (rich markup: escape what a user wrote, with
    ``rich.markup.escape``) goes to the console in text format, never wrapped; in
    JSON format a record with message ``event`` and ``fields`` goes to ``logger`` instead, so that the
    process's output stays one JSON object per line.
    """

    def __init__(self, console: Any, logger: logging.Logger, fmt: str) -> None:
        self.console = console
        self.logger = logger
        self.json = fmt == "json"

    def say(self, level: int, text: str, event: str, **fields: Any) -> None:
        if self.json:
            self.logger.log(level, event, extra=fields)
        else:
            # soft_wrap: rich would break a long line (a path, a URL) at the console's width, and a
            # failure must stay one line for whoever reads or greps stderr
            self.console.print(text, soft_wrap=True)
