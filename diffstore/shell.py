"""What every command-line front shares: one text form for bytes, and loading a user's ``module:function``.

How bytes (keys, values, generation ids) are written and read on the command line: one text form.

Every command prints bytes the same way and accepts that form back (``--generation``, ``--from``,
``watch --since``, keys and values):

* bytes that are printable UTF-8 (no control characters) are printed as they are;
* any other bytes are printed as ``base64:`` followed by their standard base64 — and so is printable
  text that itself begins with ``base64:``, so the form is never ambiguous; and text beginning with ``@``
  or ``~``, which an option taking a generation reads as a ref (``@current``, ``~1``, ``@reader:r``, an
  ISO time as ``@2026-11-25T10:00:00Z``: see ``docs/client.md``).

    >>> show(b"orders-1"), show(b"\\x00\\x00\\x00\\x01")
    ('orders-1', 'base64:AAAAAQ==')
    >>> parse("base64:AAAAAQ==")
    b'\\x00\\x00\\x00\\x01'
"""

from __future__ import annotations

import argparse
import base64
import binascii
import importlib
import importlib.util
import os
import sys
import traceback
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

from diffstore.errors import TEXT_FORM_PREFIX, InvalidEncoding, InvalidRequest, text_form

PREFIX = TEXT_FORM_PREFIX


def show(data: bytes) -> str:
    """The text form of ``data`` (see the module docstring); error messages use the same one."""
    return text_form(data) if data else ""


def show_opt(data: bytes | None) -> str | None:
    return None if data is None else show(data)


def counted(count: int, noun: str, grouped: bool = False) -> str:
    """``1 key``, ``2 keys``: a count and its noun, in the plural unless the count is one; ``grouped``
    writes the count with thousands separators (``1,024 rows``)."""
    number = f"{count:,}" if grouped else f"{count}"
    return f"{number} {noun}{'' if count == 1 else 's'}"


def quote_empty(text: str) -> str:
    """``""`` for the empty text form (the empty generation id), so a line still shows it; the shell reads
    ``""`` back as the empty string."""
    return text or '""'


def change_line(key: str, old: str | None, new: str | None) -> str:
    """One changed key, as ``diff`` and ``watch --diff`` print it: ``+ KEY<TAB>NEW``, ``- KEY<TAB>OLD`` or
    ``~ KEY<TAB>OLD<TAB>NEW`` (arguments in the text form)."""
    if old is None:
        return f"+ {key}\t{new}"
    if new is None:
        return f"- {key}\t{old}"
    return f"~ {key}\t{old}\t{new}"


def parse(text: str, what: str = "") -> bytes:
    """The bytes of a text form; raises :class:`InvalidEncoding` for a malformed ``base64:`` text, naming
    ``what`` (the flag or argument it came from) when given."""
    if not text.startswith(PREFIX):
        return text.encode("utf-8")
    try:
        return base64.b64decode(text[len(PREFIX) :], validate=True)
    except (binascii.Error, ValueError) as exc:
        where = f"{what} " if what else ""
        raise InvalidEncoding(f"{where}{text!r} is not valid base64 after 'base64:'") from exc


def load_callable(spec: str, option: str) -> Callable[..., Any]:
    """Imports ``module:function`` (``function`` may be dotted) for ``option`` (``--mapper``, ``--job``).

    The current directory is importable, as with ``python -m``, so a ``mapper.py`` beside the caller
    works. Every failure is an :class:`InvalidRequest` whose message names the option and what to fix.
    """
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise InvalidRequest(f"{option} {spec}: expected MODULE:FUNCTION, e.g. mymapper:to_items")
    if "" not in sys.path:
        sys.path.insert(0, "")
    try:
        target: object = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name is not None and not _is_prefix(exc.name, module_name):  # found; one of its imports is not
            raise InvalidRequest(
                f"{option} {spec}: {module_name} imports {exc.name}, which is not installed "
                f"(pip install {exc.name.partition('.')[0]}{_EXTRA_OF.get(exc.name.partition('.')[0], '')})"
            ) from exc
        raise InvalidRequest(
            f"{option} {spec}: cannot import {module_name} ({exc}); run from the directory that holds "
            f"{module_name.replace('.', '/')}.py or add it to PYTHONPATH"
        ) from exc
    except Exception as exc:  # the module itself failed while importing: where and why, in one line
        raise InvalidRequest(
            f"{option} {spec}: importing {module_name} failed{_where(exc, module_name)}: "
            f"{type(exc).__name__}: {_first_line(exc)}"
        ) from exc
    for part in attr.split("."):
        if not hasattr(target, part):
            raise InvalidRequest(f"{option} {spec}: {module_name} has no {attr}")
        target = getattr(target, part)
    if not callable(target):
        raise InvalidRequest(f"{option} {spec}: {attr} is not a function")
    return target


# the packages diffstore's extras bring, so that a job or mapper missing one is told which extra to install
_EXTRA_OF = {"pyspark": ", or diffstore's spark extra: pip install 'diffstore[spark]'"}
_EXTRA_OF["pyarrow"] = _EXTRA_OF["pandas"] = _EXTRA_OF["pyspark"]


def _is_prefix(name: str, module_name: str) -> bool:
    """Whether ``name`` is ``module_name`` or one of its parent packages (the module itself is missing)."""
    return module_name == name or module_name.startswith(name + ".")


def _where(exc: BaseException, module_name: str) -> str:
    """`` at FILE:LINE`` of the user's module where ``exc`` was raised (a SyntaxError's own place)."""
    if isinstance(exc, SyntaxError) and exc.filename:
        return f" at {os.path.relpath(exc.filename)}:{exc.lineno}"
    try:  # a module that failed is no longer in sys.modules: find its file again
        origin = getattr(importlib.util.find_spec(module_name), "origin", None)
    except (ImportError, ValueError):
        origin = None
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if f.filename == origin]
    return f" at {os.path.relpath(origin)}:{frames[-1].lineno}" if origin and frames else ""


def _first_line(exc: BaseException) -> str:
    if isinstance(exc, SyntaxError):
        return exc.msg
    lines = str(exc).strip().splitlines()
    return lines[0] if lines else "(no message)"


def positive_int(text: str) -> int:
    """An argparse type: a whole number of at least 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if value < 1:
        raise argparse.ArgumentTypeError("must be at least 1")
    return value


def int_within(low: int, high: int) -> Callable[[str], int]:
    """An argparse type: a whole number within ``low..high``."""

    def parse_int(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"must be within {low}..{high}")
        return value

    return parse_int


def http_urls(text: str) -> str:
    """An argparse type: one server's base URL, or several servers of one cluster, comma-separated
    (``http://a:3030,http://b:3030``); the client follows their leader."""
    parts = [part.strip() for part in text.split(",") if part.strip()]
    if not parts:
        raise argparse.ArgumentTypeError(f"{text!r} names no server (e.g. http://127.0.0.1:3030)")
    for part in parts:
        http_url(part)
    return ",".join(parts)


def http_url(text: str) -> str:
    """An argparse type: a server's base URL, ``http://`` or ``https://`` and a host."""
    parts = urlsplit(text)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        example = "http://127.0.0.1:3030" if "://" in text or not text else f"http://{text}"
        raise argparse.ArgumentTypeError(f"{text!r} is not an http:// or https:// URL (e.g. {example})")
    return text
