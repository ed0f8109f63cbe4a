"""Refs: the names a person gives a generation, parsed into a typed value and resolved in one read.

Every front (the CLI's options, ``GET /collections/{c}/refs``, the console) uses this one grammar::

    g1, base64:AAE=        a generation id in the one text form (printable UTF-8, else base64:)
    @current               the current (last committed) generation
    @open                  the open generation (none open: noSuchGeneration)
    ~N                     N commits before the current one (~0 is @current)
    @reader:NAME           the position of the reader NAME that targets the collection, whichever
                           collection owns it (several owners: invalidRequest, name one)
    @reader:OWNER/NAME     the position of OWNER's reader NAME (collection names hold no '/', so the
                           first '/' always ends OWNER; a reader name with a '/' needs OWNER/)
    @2026-11-25T10:00:00Z  the newest generation committed at or before that instant (an offset such as
                           +01:00 instead of Z; a time without one is refused, it would depend on the
                           server's zone)

A text beginning with ``@`` or ``~`` is always a ref (an id beginning so is written ``base64:``, as the
text form prints it); an unknown ``@word`` is an ``invalidRequest``.

This module is the grammar alone (pure: the CLI checks ``is_ref`` without loading LMDB);
:mod:`diffstore.engine.refs_resolve` resolves a parsed ref in a read transaction.
"""

from __future__ import annotations

import base64
import binascii
import re
from dataclasses import dataclass
from datetime import datetime

from diffstore.errors import TEXT_FORM_PREFIX, InvalidEncoding, InvalidRequest

MAX_REF_CHARS = 1024

_FORMS = (
    "a generation id, @current, @open, ~N, @reader:NAME, @reader:OWNER/NAME or an ISO time "
    "(@2026-11-25T10:00:00Z)"
)


@dataclass(frozen=True, slots=True)
class Literal:
    """A generation id given as it is."""

    generation_id: bytes


@dataclass(frozen=True, slots=True)
class Current:
    pass


@dataclass(frozen=True, slots=True)
class Open:
    pass


@dataclass(frozen=True, slots=True)
class Back:
    """``~N``: N commits before the current generation."""

    commits: int


@dataclass(frozen=True, slots=True)
class ReaderPosition:
    """``@reader:[OWNER/]NAME``; ``owner`` None: any collection owning a reader of that name."""

    name: str
    owner: str | None = None


@dataclass(frozen=True, slots=True)
class AsOf:
    """``@TIME``: the newest generation committed at or before ``at_ms`` (Unix ms)."""

    at_ms: int


Ref = Literal | Current | Open | Back | ReaderPosition | AsOf


def is_ref(text: str) -> bool:
    """Whether ``text`` is a ref rather than a generation id's text form (it begins with ``@`` or ``~``)."""
    return text.startswith(("@", "~"))


def parse(text: str) -> Ref:
    """The ref ``text`` names (see the module for the grammar).

    Raises:
        InvalidRequest: not one of the forms. InvalidEncoding: a malformed ``base64:`` id.
    """
    if not isinstance(text, str) or len(text) > MAX_REF_CHARS:
        raise InvalidRequest(f"a ref is at most {MAX_REF_CHARS} characters of text")
    if text == "@current":
        return Current()
    if text == "@open":
        return Open()
    if text.startswith("~"):
        if not re.fullmatch(r"~[0-9]{1,18}", text):
            raise InvalidRequest(f"ref {text!r}: ~N takes a whole number of commits, e.g. ~1")
        return Back(int(text[1:]))
    if text.startswith("@reader:"):
        return _reader(text, text[len("@reader:") :])
    if text.startswith("@"):
        return AsOf(_instant(text))
    if text.startswith(TEXT_FORM_PREFIX):
        try:
            return Literal(base64.b64decode(text[len(TEXT_FORM_PREFIX) :], validate=True))
        except (binascii.Error, ValueError) as exc:
            raise InvalidEncoding(f"ref {text!r} is not valid base64 after 'base64:'") from exc
    return Literal(text.encode("utf-8", "surrogatepass"))


def _reader(text: str, rest: str) -> ReaderPosition:
    owner, slash, name = rest.partition("/")
    if not slash:
        owner, name = "", rest
    if not name or (slash and not owner):
        raise InvalidRequest(f"ref {text!r}: expected @reader:NAME or @reader:OWNER/NAME")
    return ReaderPosition(name, owner or None)


def _instant(text: str) -> int:
    try:
        when = datetime.fromisoformat(text[1:])
    except ValueError:
        raise InvalidRequest(f"ref {text!r} is not one of: {_FORMS}") from None
    if when.tzinfo is None:
        raise InvalidRequest(f"ref {text!r}: give the time's zone, Z or an offset such as +01:00")
    return int(when.timestamp() * 1000)
