"""Self-contained page cursors: an opaque, URL-safe token that carries its own resume position.

A token needs no server memory and survives restarts: it pins the read (or the diff's range) by
generation and seq, names the collection by its id (a deleted and re-created collection does not
accept old tokens), and holds the last key returned. Reading the same token twice gives the same page.
A checksum turns a mangled token into ``noSuchCursor`` rather than a wrong page.
"""

from __future__ import annotations

import base64
import hashlib
from dataclasses import astuple, dataclass

import msgpack

from diffstore.errors import NoSuchCursor

_VERSION = 1


@dataclass(frozen=True, slots=True)
class QueryCursor:
    cid: int
    generation_id: bytes
    seq: int
    phantom_id: bytes | None
    from_key: bytes | None
    to_key: bytes | None
    limit: int
    after_key: bytes


@dataclass(frozen=True, slots=True)
class DiffCursor:
    cid: int
    from_generation_id: bytes
    from_seq: int
    to_generation_id: bytes
    to_seq: int
    include_intermediate: bool
    from_key: bytes | None
    to_key: bytes | None
    limit: int
    after_key: bytes


_KINDS: dict[str, type[QueryCursor] | type[DiffCursor]] = {"q": QueryCursor, "d": DiffCursor}


def _checksum(body: bytes) -> bytes:
    return hashlib.blake2b(body, digest_size=6).digest()


def encode_cursor(cursor: QueryCursor | DiffCursor) -> str:
    kind = "q" if isinstance(cursor, QueryCursor) else "d"
    body = msgpack.packb([_VERSION, kind, *astuple(cursor)], use_bin_type=True)
    return base64.urlsafe_b64encode(_checksum(body) + body).rstrip(b"=").decode()


def decode_cursor(token: str, kind: type[QueryCursor] | type[DiffCursor]) -> QueryCursor | DiffCursor:
    """Parses a token of the given kind; anything else is ``noSuchCursor``."""
    try:
        raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))
        check, body = raw[:6], raw[6:]
        if _checksum(body) != check:
            raise ValueError("checksum")
        version, tag, *fields = msgpack.unpackb(body, raw=False)
        if version != _VERSION or _KINDS.get(tag) is not kind:
            raise ValueError("kind")
        return kind(*fields)
    except (ValueError, TypeError, msgpack.UnpackException) as exc:
        raise NoSuchCursor("unknown or malformed cursor") from exc
