"""The tokens a server accepts now: ``--token`` (one admin token) and ``--token-file``, re-read while it runs.

The file is re-read when it changes (its inode, size or times, looked at every ``poll_s`` seconds by a
thread of the app) and at once when asked (:meth:`Tokens.reload_soon`: ``serve`` calls it on SIGHUP), so
that a token can be added, rotated and revoked without a restart. A file that cannot be used keeps the
tokens the server has and logs one line (once per version of the file); so does a file that changed
while it was being read: it is read again at the next look. Replacing the file in one step (write a new
file, then ``mv`` it over the old) is what makes a reader never see half of it.

Requests read :attr:`Tokens.table` once: it is an immutable :class:`~diffstore.server.scopes.TokenTable`
swapped whole, so a request sees the tokens before a reload or after it, never a mix.
"""

from __future__ import annotations

import logging
import os
import threading

from diffstore.errors import InvalidRequest
from diffstore.server.scopes import (
    STATIC_TOKEN_NAME,
    Token,
    TokenFileError,
    TokenScope,
    TokenTable,
    load_token_file,
)

_log = logging.getLogger("diffstore.server.tokens")
Signature = tuple[int, int, int, int, int]


def _signature(path: str) -> Signature | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


class Tokens:
    """The live token set of one app. ``enabled``: whether requests need a token at all.

    Raises (at construction):
        InvalidRequest: the token file cannot be used (the server must not start without its tokens).
    """

    def __init__(self, token: str | None, path: str | None, poll_s: float = 1.0) -> None:
        self.path = path
        self.poll_s = poll_s
        self.enabled = token is not None or path is not None
        self._static: tuple[Token, ...] = ()
        if token is not None:
            self._static = (Token(STATIC_TOKEN_NAME, token.encode("utf-8"), TokenScope.ADMIN),)
        self._reserved = frozenset(t.name for t in self._static)
        self.reloads = 0  # file versions taken since the start (tests and the log count them)
        self._seen: Signature | None = None  # the version of the file last read (taken or refused)
        file_tokens: tuple[Token, ...] = ()
        if path is not None:
            self._seen = _signature(path)
            try:
                file_tokens = load_token_file(path, self._reserved)
            except TokenFileError as exc:
                raise InvalidRequest(f"--token-file {path}: {exc}") from exc
        self.table = TokenTable(self._static + file_tokens)
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Starts watching the file (nothing to do without one)."""
        if self.path is None or self._thread is not None:
            return
        self._stopping.clear()
        self._thread = threading.Thread(target=self._watch, name="diffstore-token-file", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        thread, self._thread = self._thread, None
        if thread is not None:
            self._stopping.set()
            self._wake.set()
            thread.join(timeout=10)

    def reload_soon(self) -> None:
        """Re-reads the file now, changed or not (safe from a signal handler: it only sets an event)."""
        self._force = True
        self._wake.set()

    _force = False

    def _watch(self) -> None:
        while not self._stopping.is_set():
            self._wake.wait(self.poll_s)
            self._wake.clear()
            if self._stopping.is_set():
                return
            force, self._force = self._force, False
            try:
                self.check(force)
            except Exception:  # the watcher must outlive any surprise: the tokens stay as they are
                _log.exception("reading the token file %s failed", self.path)

    def check(self, force: bool = False) -> bool:
        """Takes the file's tokens if it changed (or ``force``); whether the tokens were replaced."""
        assert self.path is not None
        before = _signature(self.path)
        if before == self._seen and not force:
            return False
        try:
            tokens = load_token_file(self.path, self._reserved)
        except TokenFileError as exc:
            if before != self._seen or force:  # one line per version of the file
                _log.error("token file %s not taken, the tokens stay as they were: %s", self.path, exc)
            self._seen = before
            return False
        if _signature(self.path) != before:
            return False  # changed while being read: read again at the next look
        self._seen = before
        self.table = TokenTable(self._static + tokens)
        self.reloads += 1
        _log.info(
            "token file %s taken: %d tokens (%s)", self.path, len(tokens), ", ".join(t.name for t in tokens)
        )
        return True
