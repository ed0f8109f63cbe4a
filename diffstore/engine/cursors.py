"""Self-contained page cursors: an opaque, URL-safe, authenticated token carrying its own resume position.

A token needs no server memory and survives restarts: it pins the read (or the diff's range) by
generation and seq, names the collection by its id (a deleted and re-created collection does not
accept old tokens), and holds the last key returned. Reading the same token twice gives the same page.

Invariants:
    * A token is ``MAC || body``: ``body`` is msgpack ``[version, kind, *fields]`` and ``MAC`` is an
      HMAC-SHA256 (first 16 bytes) of the body under the store's secret (:class:`CursorSecret`). Only the
      server can make a token; a forged, edited or truncated one fails the MAC and is ``noSuchCursor``.
    * Every decoded field is checked again (type and range, ``limit`` within 1..the store's maximum) even
      behind a good MAC, so a token of an older format or another configuration is ``noSuchCursor`` too,
      never a ``TypeError`` deep in a read nor a page above the limit.
    * A token longer than a URL comfortably carries (a resume key of kilobytes) is stored in the store
      and handed out as a short *reference* token ``MAC || [version, "r", digest]`` instead
      (:mod:`diffstore.engine.cursor_spill`): what reaches a client is always short.
    * The secret lives in the data directory (``cursor.secret``), made once with an atomic link, so every
      process serving the directory, before and after a restart, signs and checks with the same key.

This module knows tokens and the secret's file, nothing of LMDB: whether a pinned generation still
exists (an aborted open generation) is checked by the reads that resume a cursor.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import secrets
import threading
from dataclasses import astuple, dataclass
from pathlib import Path
from typing import Any

import msgpack

from diffstore.engine.types import DiffSpec
from diffstore.errors import NoSuchCursor, StorageError

_VERSION = 2
_MAC_BYTES = 16
_SECRET_BYTES = 32
SECRET_FILE = "cursor.secret"
_MAX_KEY = (1 << 24) - 1  # layout.MAX_KEY_LENGTH (kept here so that this module stays import-light)
_MAX_ID = 255  # generation and phantom ids
_MAX_SEQ = (1 << 64) - 2  # a seq + 1 must still be a u64: reads seek just past a pinned seq
_MAX_CID = (1 << 32) - 1
# the longest token worth decoding: three keys of the largest size in base64, plus the fields
MAX_TOKEN_CHARS = 4 * (3 * _MAX_KEY + 4096) // 3
_REFERENCE = "r"  # a token that names a stored token by its digest
REFERENCE_DIGEST_BYTES = 16
REFERENCE_CHARS_MAX = 96  # a reference token is about 60 characters


def _check_int(value: object, low: int, high: int, what: str) -> None:
    if type(value) is not int or not low <= value <= high:
        raise ValueError(f"{what} out of range")


def _check_bytes(value: object, high: int, what: str, *, optional: bool = False, low: int = 0) -> None:
    if value is None and optional:
        return
    if type(value) is not bytes or not low <= len(value) <= high:
        raise ValueError(f"{what} is not bytes of {low}..{high}")


@dataclass(frozen=True, slots=True)
class QueryCursor:
    """Where a query resumes: the pinned read point, its key range, page size and the last key sent."""

    cid: int
    generation_id: bytes
    seq: int
    phantom_id: bytes | None
    from_key: bytes | None
    to_key: bytes | None
    limit: int
    after_key: bytes

    def __post_init__(self) -> None:
        _check_int(self.cid, 0, _MAX_CID, "cid")
        _check_bytes(self.generation_id, _MAX_ID, "generation_id")
        _check_int(self.seq, -1, _MAX_SEQ, "seq")
        _check_bytes(self.phantom_id, _MAX_ID, "phantom_id", optional=True, low=1)
        _check_bytes(self.from_key, _MAX_KEY, "from_key", optional=True)
        _check_bytes(self.to_key, _MAX_KEY, "to_key", optional=True)
        _check_int(self.limit, 1, _MAX_SEQ, "limit")
        _check_bytes(self.after_key, _MAX_KEY, "after_key")


@dataclass(frozen=True, slots=True)
class DiffCursor:
    """Where a diff resumes: the pinned range (from, to] as seqs, the request that the next pages answer
    (its generation ids are the range's, its ``limit`` the page size) and the last key sent."""

    cid: int
    from_seq: int
    to_seq: int
    request: DiffSpec
    after_key: bytes

    def __post_init__(self) -> None:
        request = self.request
        _check_int(self.cid, 0, _MAX_CID, "cid")
        _check_bytes(request.from_generation_id, _MAX_ID, "from_generation_id")
        _check_bytes(request.to_generation_id, _MAX_ID, "to_generation_id")
        _check_int(self.from_seq, -1, _MAX_SEQ, "from_seq")
        _check_int(self.to_seq, self.from_seq, _MAX_SEQ, "to_seq")
        if request.from_generation_id > request.to_generation_id:  # type: ignore[operator]
            raise ValueError("from_generation_id above to_generation_id")
        if request.from_reader is not None:
            raise ValueError("a cursor's range is resolved: no reader")
        if type(request.include_intermediate) is not bool:
            raise ValueError("include_intermediate is not a bool")
        _check_bytes(request.from_key, _MAX_KEY, "from_key", optional=True)
        _check_bytes(request.to_key, _MAX_KEY, "to_key", optional=True)
        _check_int(request.limit, 1, _MAX_SEQ, "limit")
        _check_bytes(self.after_key, _MAX_KEY, "after_key")

    def fields(self) -> list[object]:
        """The token's fields, in the order of format 2 (flat, as before the request object)."""
        r = self.request
        return [
            self.cid,
            r.from_generation_id,
            self.from_seq,
            r.to_generation_id,
            self.to_seq,
            r.include_intermediate,
            r.from_key,
            r.to_key,
            r.limit,
            self.after_key,
        ]

    @classmethod
    def from_fields(cls, fields: list[Any]) -> DiffCursor:
        cid, from_gen, from_seq, to_gen, to_seq, intermediate, from_key, to_key, limit, after = fields
        request = DiffSpec(
            from_generation_id=from_gen,
            to_generation_id=to_gen,
            include_intermediate=intermediate,
            from_key=from_key,
            to_key=to_key,
            limit=limit,
        )
        return cls(cid, from_seq, to_seq, request, after)


Cursor = QueryCursor | DiffCursor
_KINDS: dict[str, type[QueryCursor] | type[DiffCursor]] = {"q": QueryCursor, "d": DiffCursor}
_FIELD_COUNTS = {"q": len(QueryCursor.__dataclass_fields__), "d": 10}


class CursorSecret:
    """The store's token key, read from (or made once in) ``directory/cursor.secret`` on first use.

    Made lazily so that opening a store never needs to write a file (a full disk keeps it readable);
    several processes making it at once agree, because the file appears whole by ``os.link`` or not at
    all, and the loser of the race reads the winner's.
    """

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.path = Path(directory) / SECRET_FILE
        self._key: bytes | None = None
        self._lock = threading.Lock()

    def key(self) -> bytes:
        key = self._key
        if key is None:
            with self._lock:
                if self._key is None:
                    self._key = self._load_or_create()
                key = self._key
        return key

    def _load_or_create(self) -> bytes:
        try:
            try:
                return self._read()
            except FileNotFoundError:
                pass
            staging = self.path.with_name(f"{SECRET_FILE}.{os.getpid()}.{secrets.token_hex(4)}")
            fd = os.open(staging, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            try:
                with os.fdopen(fd, "wb") as f:
                    f.write(secrets.token_bytes(_SECRET_BYTES))
                    f.flush()
                    os.fsync(f.fileno())
                try:
                    os.link(staging, self.path)  # atomic; fails if another process made it first
                except FileExistsError:
                    pass
            finally:
                staging.unlink(missing_ok=True)
            return self._read()
        except OSError as exc:
            raise StorageError(f"cannot read or create the cursor secret {self.path}: {exc}") from exc

    def _read(self) -> bytes:
        key = self.path.read_bytes()
        if len(key) != _SECRET_BYTES:
            raise OSError(f"{self.path} holds {len(key)} bytes, not {_SECRET_BYTES}")
        return key


class CursorCodec:
    """Encodes cursors into signed tokens and decodes tokens back, refusing anything not made here."""

    def __init__(self, secret: CursorSecret) -> None:
        self.secret = secret

    def _mac(self, body: bytes) -> bytes:
        return hmac.new(self.secret.key(), body, hashlib.sha256).digest()[:_MAC_BYTES]

    def encode(self, cursor: Cursor) -> str:
        if isinstance(cursor, QueryCursor):
            kind, fields = "q", list(astuple(cursor))
        else:
            kind, fields = "d", cursor.fields()
        body = msgpack.packb([_VERSION, kind, *fields], use_bin_type=True)
        return base64.urlsafe_b64encode(self._mac(body) + body).rstrip(b"=").decode()

    def reference(self, digest: bytes) -> str:
        """A short token naming a stored token by its digest (see :mod:`diffstore.engine.cursor_spill`)."""
        body = msgpack.packb([_VERSION, _REFERENCE, digest], use_bin_type=True)
        return base64.urlsafe_b64encode(self._mac(body) + body).rstrip(b"=").decode()

    def referenced(self, token: str) -> bytes | None:
        """The digest a reference token names; None for any other token (which :meth:`decode` judges)."""
        if not isinstance(token, str) or len(token) > REFERENCE_CHARS_MAX:
            return None
        try:
            raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))
            mac, body = raw[:_MAC_BYTES], raw[_MAC_BYTES:]
            if not hmac.compare_digest(mac, self._mac(body)):
                return None
            decoded = msgpack.unpackb(body, raw=False, strict_map_key=True)
        except (ValueError, TypeError, UnicodeError, msgpack.UnpackException):
            return None
        if type(decoded) is not list or len(decoded) != 3 or decoded[:2] != [_VERSION, _REFERENCE]:
            return None
        digest = decoded[2]
        return digest if type(digest) is bytes and len(digest) == REFERENCE_DIGEST_BYTES else None

    def decode(self, token: str, kind: type[QueryCursor] | type[DiffCursor], max_limit: int) -> Cursor:
        """A token of ``kind`` whose page size is at most ``max_limit``.

        Raises:
            NoSuchCursor: anything else -- malformed, forged, edited, another kind, another format.
        """
        cursor = self._decode(token, kind)
        limit = cursor.limit if isinstance(cursor, QueryCursor) else cursor.request.limit
        if limit is None or limit > max_limit:
            raise NoSuchCursor("unknown or malformed cursor")
        return cursor

    def _decode(self, token: str, kind: type[QueryCursor] | type[DiffCursor]) -> Cursor:
        try:
            if not isinstance(token, str) or not 0 < len(token) <= MAX_TOKEN_CHARS:
                raise ValueError("length")
            raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))
            mac, body = raw[:_MAC_BYTES], raw[_MAC_BYTES:]
            if not hmac.compare_digest(mac, self._mac(body)):
                raise ValueError("mac")
            decoded = msgpack.unpackb(body, raw=False, strict_map_key=True)
            if type(decoded) is not list or len(decoded) < 2:
                raise ValueError("shape")
            version, tag, *fields = decoded
            if version != _VERSION or type(tag) is not str or _KINDS.get(tag) is not kind:
                raise ValueError("kind")
            if len(fields) != _FIELD_COUNTS[tag]:
                raise ValueError("fields")
            return DiffCursor.from_fields(fields) if kind is DiffCursor else QueryCursor(*fields)
        except (ValueError, TypeError, UnicodeError, msgpack.UnpackException) as exc:
            raise NoSuchCursor("unknown or malformed cursor") from exc
