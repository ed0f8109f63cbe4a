"""How bytes (keys, values, generation ids) are written and read on the command line: one text form.

Every command prints bytes the same way and accepts that form back (``--generation``, ``--from``,
``watch --since``, keys and values):

* bytes that are printable UTF-8 (no control characters) are printed as they are;
* any other bytes are printed as ``base64:`` followed by their standard base64 — and so is printable
  text that itself begins with ``base64:``, so the form is never ambiguous.

    >>> show(b"orders-1"), show(b"\\x00\\x00\\x00\\x01")
    ('orders-1', 'base64:AAAAAQ==')
    >>> parse("base64:AAAAAQ==")
    b'\\x00\\x00\\x00\\x01'
"""

from __future__ import annotations

import base64
import binascii

from diffstore.errors import InvalidEncoding

PREFIX = "base64:"


def show(data: bytes) -> str:
    """The text form of ``data`` (see the module docstring)."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return PREFIX + base64.b64encode(data).decode("ascii")
    if text.isprintable() and not text.startswith(PREFIX):
        return text
    return PREFIX + base64.b64encode(data).decode("ascii")


def show_opt(data: bytes | None) -> str | None:
    return None if data is None else show(data)


def parse(text: str) -> bytes:
    """The bytes of a text form; raises :class:`InvalidEncoding` for a malformed ``base64:`` text."""
    if not text.startswith(PREFIX):
        return text.encode("utf-8")
    try:
        return base64.b64decode(text[len(PREFIX) :], validate=True)
    except (binascii.Error, ValueError) as exc:
        raise InvalidEncoding(f"{text!r} is not valid base64 after 'base64:'") from exc
