"""Page tokens too long for a URL, kept in the store and handed out as short reference tokens.

A page token carries its resume position (:mod:`diffstore.engine.cursors`): the last key sent and the
range's bounds. Keys may be up to 16 MiB, and a token after a key of ~48 KB no longer fits in a request
line (``GET .../query/{cursorId}``: servers and clients refuse URLs of 64 KiB or so), yet SPEC §1 says a key
that can be written can always be read. So a token longer than :data:`INLINE_TOKEN_MAX` characters is
stored in the ``cursors`` table under its digest and the client gets a reference token of ~60 characters
(signed like any token); the next page looks the full token up and goes on as usual. Tokens of ordinary
keys stay self-contained and need nothing stored.

Invariants:
    * Content-addressed: the row's key is a digest of the full token, so handing out the same position
      twice stores it once and gives the same reference (reading a cursor twice gives the same page).
    * Bounded: at most :data:`MAX_ENTRIES` tokens and :data:`MAX_BYTES` bytes are kept; storing one more
      evicts the oldest first (the newest is always kept). An evicted reference answers 410
      ``cursorExpired``, as a cursor whose range was collected does.
    * Every process serving the directory sees the same rows (LMDB), before and after a restart.
"""

from __future__ import annotations

import hashlib

import lmdb

from diffstore.engine import layout
from diffstore.engine.access import StoreAccess
from diffstore.engine.cursors import REFERENCE_DIGEST_BYTES
from diffstore.errors import CursorExpired

INLINE_TOKEN_MAX = 2048
"""Tokens up to this many characters go to the client as they are (well within any URL limit)."""
MAX_ENTRIES = 10_000
MAX_BYTES = 256 << 20


def digest(token: bytes | str) -> bytes:
    """The key of a stored token (``check`` verifies rows by it)."""
    if isinstance(token, str):
        token = token.encode()
    return hashlib.blake2b(token, digest_size=REFERENCE_DIGEST_BYTES).digest()


def shorten(store: StoreAccess, token: str | None) -> str | None:
    """``token`` itself when it is short enough, else a reference to it, stored (one write transaction)."""
    if token is None or len(token) <= INLINE_TOKEN_MAX:
        return token
    token_digest = digest(token)
    tables = store.tables
    with store.read() as txn:
        if txn.get(layout.cursor_entry_key(token_digest), db=tables.cursors) is not None:
            return store.cursors.reference(token_digest)  # the same page read again: nothing to write
    with store.write() as scope:
        txn = scope.txn
        entry = layout.cursor_entry_key(token_digest)
        if txn.get(entry, db=tables.cursors) is None:
            entries, size, number = layout.unpack_cursor_totals(
                txn.get(layout.CURSOR_TOTALS, db=tables.cursors)
            )
            data = token.encode()
            txn.put(entry, layout.pack_cursor_entry(number, data), db=tables.cursors)
            txn.put(layout.cursor_age_key(number), token_digest, db=tables.cursors)
            entries, size = _evict(txn, store, entries + 1, size + len(data))
            txn.put(
                layout.CURSOR_TOTALS, layout.pack_cursor_totals(entries, size, number + 1), db=tables.cursors
            )
    return store.cursors.reference(token_digest)


def _evict(txn: lmdb.Transaction, store: StoreAccess, entries: int, size: int) -> tuple[int, int]:
    """Deletes the oldest tokens (never the newest) until the totals are within bounds; the new totals."""
    db = store.tables.cursors
    cursor = txn.cursor(db=db)
    while entries > 1 and (entries > MAX_ENTRIES or size > MAX_BYTES):
        if not cursor.set_range(layout.CURSOR_AGE_PREFIX) or not cursor.key().startswith(
            layout.CURSOR_AGE_PREFIX
        ):
            break
        entry = layout.cursor_entry_key(cursor.value())
        cursor.delete()
        raw = txn.get(entry, db=db)
        if raw is not None:
            txn.delete(entry, db=db)
            size -= len(raw) - 8
            entries -= 1
    return entries, max(size, 0)


def expand(store: StoreAccess, token: str) -> str:
    """The full token a reference names, or ``token`` itself when it is no reference.

    Raises:
        CursorExpired: a reference whose token was evicted.
    """
    digest = store.cursors.referenced(token)
    if digest is None:
        return token
    with store.read() as txn:
        raw = txn.get(layout.cursor_entry_key(digest), db=store.tables.cursors)
        if raw is None:
            raise CursorExpired("the cursor's position is no longer kept (too many long cursors since)")
        return layout.unpack_cursor_entry(raw)[1].decode()
