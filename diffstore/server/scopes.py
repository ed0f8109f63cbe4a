"""Scoped bearer tokens: the token file of ``serve --token-file``, and what each scope lets a token do.

A pure module (no I/O but :func:`load_token_file`, no HTTP): :mod:`diffstore.server.auth` asks it who a
bearer secret belongs to and whether that token may call a route.

The file holds one token per line, ``NAME SECRET SCOPE [COLLECTIONS-GLOB]``; ``#`` starts a comment,
blank lines are skipped. Scopes are ordered, each allowing what the one before it does:

    read   every read route (gets, queries, diffs, long polls, the console, /metrics), on every collection
    write  + writes, generations, phantoms, readers and leases on the collections matching the glob
    admin  + creating and deleting collections, revert, retention, on the collections matching the glob;
             with the glob ``*`` also the server-wide actions (/backup, promote, stepDown/stepUp)

The glob (``fnmatch``, case-sensitive; default ``*``) bounds what a token may change, never what it may
read: a pipeline's token writes its own target and still reads its sources. On a ``read`` line it must be
``*`` (a narrower one would promise a restriction that does not exist).

Invariants: secrets are unique in a file, and the lines of one name have one scope and glob; no error
message ever holds a secret (a bad line is named by its number and, when it has one, its name).
"""

from __future__ import annotations

import enum
import fnmatch
import hashlib
import hmac
import re
from dataclasses import dataclass

NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._@:-]{0,63}")
STATIC_TOKEN_NAME = "token"  # how the logs and metrics name the one admin token of --token


class TokenScope(enum.IntEnum):
    """What a route needs (``OPEN``: no token at all) and what a token has; a higher scope has the lower."""

    OPEN = 0
    READ = 1
    WRITE = 2
    ADMIN = 3

    @property
    def label(self) -> str:
        return self.name.lower()


SCOPES_BY_LABEL = {scope.label: scope for scope in (TokenScope.READ, TokenScope.WRITE, TokenScope.ADMIN)}


class TokenFileError(ValueError):
    """A token file that cannot be used (the message names the line, never a secret)."""


@dataclass(frozen=True, slots=True)
class Token:
    """One token of the file: who (``name``, in logs and metrics), its ``secret``, ``scope`` and ``glob``.

    A name may have several secrets (lines) at once, with one scope and glob: that is how a secret is
    rotated (add the new line, move the clients, remove the old line) under one name."""

    name: str
    secret: bytes
    scope: TokenScope
    glob: str = "*"
    line: int = 0  # where the file has it (0: not from the file)

    def __repr__(self) -> str:  # a token in a traceback or a log must not carry its secret
        return f"Token(name={self.name!r}, scope={self.scope.label}, glob={self.glob!r})"

    def may(self, needed: TokenScope, collection: str | None) -> bool:
        """Whether this token may call a route needing ``needed`` on ``collection`` (``None``: a
        server-wide route, which past ``read`` needs the glob ``*``)."""
        if needed > self.scope:
            return False
        if needed <= TokenScope.READ or self.glob == "*":
            return True
        return collection is not None and fnmatch.fnmatchcase(collection, self.glob)

    def has(self) -> str:
        """What the token has, as a refusal names it: ``write on orders-*``."""
        return self.scope.label if self.glob == "*" else f"{self.scope.label} on {self.glob}"


def parse_token_file(text: str, reserved: frozenset[str] = frozenset()) -> tuple[Token, ...]:
    """The tokens of a token file's ``text`` (names in ``reserved`` are refused: another source has them).

    Raises:
        TokenFileError: a malformed line, a duplicate secret, a name with two scopes, or no token at all.
    """
    tokens: list[Token] = []
    names: dict[str, int] = {}
    secrets: dict[bytes, int] = {}
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip() if not raw.lstrip().startswith("#") else ""
        if not line:
            continue
        fields = line.split()
        where = f"line {number}"
        if len(fields) not in (3, 4):
            raise TokenFileError(
                f"{where}: expected NAME SECRET SCOPE [COLLECTIONS-GLOB], got {len(fields)} fields"
            )
        name, secret, label = fields[0], fields[1], fields[2]
        glob = fields[3] if len(fields) == 4 else "*"
        if not NAME.fullmatch(name):
            raise TokenFileError(f"{where}: a name is 1..64 of A-Z a-z 0-9 . _ @ : - (starting alphanumeric)")
        where = f"line {number} ({name})"
        scope = SCOPES_BY_LABEL.get(label)
        if scope is None:
            raise TokenFileError(f"{where}: the scope must be read, write or admin, not {label!r}")
        if scope is TokenScope.READ and glob != "*":
            raise TokenFileError(
                f"{where}: a read token reads every collection: its glob must be * or absent"
            )
        if name in reserved:
            raise TokenFileError(f"{where}: the name {name!r} is taken by --token")
        first = names.get(name)
        if first is not None and (tokens[first].scope, tokens[first].glob) != (scope, glob):
            raise TokenFileError(
                f"{where}: the name is on line {tokens[first].line} with another scope or glob (one name, one"
                " scope: a second line of a name is a second secret, for a rotation)"
            )
        encoded = secret.encode("utf-8")
        if encoded in secrets:
            raise TokenFileError(f"{where}: the secret is already that of line {secrets[encoded]}")
        secrets[encoded] = number
        names.setdefault(name, len(tokens))
        tokens.append(Token(name, encoded, scope, glob, number))
    if not tokens:
        raise TokenFileError("no token in the file (every request would be refused)")
    return tuple(tokens)


def load_token_file(path: str, reserved: frozenset[str] = frozenset()) -> tuple[Token, ...]:
    """The tokens of the file at ``path`` (see :func:`parse_token_file`).

    Raises:
        TokenFileError: the file unreadable or not a token file.
    """
    try:
        with open(path, encoding="utf-8") as file:
            text = file.read()
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise TokenFileError(reason) from exc
    return parse_token_file(text, reserved)


class TokenTable:
    """An immutable set of tokens, looked up by the secret a request carries.

    The lookup compares the given secret with the last token found (most requests in a row carry the
    same one), else hashes it (SHA-256) and finds the token by its hash; secrets are only ever compared
    with :func:`hmac.compare_digest`: what a request's timing can tell is about hashes, never about how
    much of a secret it guessed right.
    """

    __slots__ = ("_by_digest", "_last", "tokens")

    def __init__(self, tokens: tuple[Token, ...]) -> None:
        self.tokens = tokens
        self._by_digest = {hashlib.sha256(token.secret).digest(): token for token in tokens}
        self._last = tokens[0] if tokens else None

    def find(self, secret: bytes) -> Token | None:
        """The token whose secret is ``secret``, or None."""
        last = self._last
        # most requests in a row carry the same token: one constant-time comparison, no hashing
        if last is not None and hmac.compare_digest(last.secret, secret):
            return last
        token = self._by_digest.get(hashlib.sha256(secret).digest())
        if token is None or not hmac.compare_digest(token.secret, secret):
            return None
        self._last = token
        return token
