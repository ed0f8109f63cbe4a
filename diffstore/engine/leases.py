"""Leases: named, versioned, expiring ownership records of a collection (Hedwig-style), and fencing.

A lease row holds ``(holder, version v, expiry e, ttl)``; ``n`` is the store's clock
(``StoreConfig.clock_ms``, Unix milliseconds) read inside the transaction. Transitions::

    acquire o t     no row                                  -> (o, 1, n+t)
                    holder None, or e <= n, or holder == o  -> (o, v+1, n+t)
                    else                                    -> leaseLost naming the holder and its expiry
    renew o v' [t]  holder == o and v == v'                 -> (o, v, n+t)  (t: the acquire's ttl if omitted)
                    else                                    -> leaseLost
    release o v'    holder == o and v == v'                 -> (None, v, 0)
                    holder None and v == v' (released)      -> unchanged (release is idempotent)
                    else                                    -> leaseLost
    fence (name,v') holder not None, v == v', n < e         -> ok
                    else                                    -> leaseLost

The open generation of a manual collection remembers the token it was started under (``next_lease`` of
:class:`~diffstore.engine.meta.CollectionMeta`, None: started without one), so that fencing covers its
writes too, whatever generation ids the writers use. With ``L`` that token and ``t`` the request's
(None: the request carries no lease; a ``t`` that is not None is first fenced as above)::

    start G       no open generation, or t == L            -> as SPEC §1, the new open generation keeps t
                  t supersedes L: L None, or the same name  -> the open generation's records are dropped,
                  with a lower version, or L holds no         then G opens afresh under t (G == the old
                  more (whatever t, None included)             id included; abortOutdated not needed)
                  else                                     -> leaseLost
    put, putMany  t == L                                   -> as SPEC §1
    commit        else                                     -> leaseLost
    abort G       t == L, or t supersedes L                -> as SPEC §1
                  else                                     -> leaseLost

A phantom write opens nothing and only fences ``t``; so does any write into a non-manual collection.

Renewing an expired lease that nobody took is allowed: its version is unchanged, which proves that nobody
held it in between (any acquire by another owner bumps the version), so the renewing holder's fencing token
never let two writers through. Fencing refuses an expired lease all the same: an owner that paused past
its expiry commits nothing until it renewed.

Invariants:
    * ``version`` grows by one at every acquire and is never reused: a released lease keeps its row (see
      :mod:`diffstore.engine.layout`), so a fencing token of a former holder never matches a later one.
    * Every transition reads and writes the row in one LMDB write transaction: LMDB's write lock
      serializes them across processes, so compare-and-set holds whatever process runs it.
    * A fencing check runs inside the write transaction of the ``generation/start``, ``/commit``,
      ``/abort`` or write it guards, before anything is written: a refused request changes nothing.
    * ``next_lease`` is set by the start that opens a generation and cleared by its commit or abort, in
      the same transactions: a writer fenced out by a newer version changes nothing of the generation
      it opened (its successor's start dropped it) nor of its successor's (its token is not ``L``).
"""

from __future__ import annotations

import lmdb

from diffstore.engine import layout
from diffstore.engine.meta import CollectionMeta
from diffstore.engine.tables import Tables, validate_collection_name
from diffstore.engine.types import MAX_LEASE_TTL_MS, MAX_LEASE_VERSION, Lease, LeaseToken
from diffstore.errors import InvalidRequest, LeaseLost, text_form

MAX_NAME_BYTES = 255
MAX_TTL_MS = MAX_LEASE_TTL_MS
MAX_VERSION = MAX_LEASE_VERSION


def validate_name(name: str, what: str = "lease name") -> None:
    """1..255 bytes of UTF-8; a lease name (a URL path segment) also follows the rules of collection names."""
    if not isinstance(name, str) or not 1 <= len(name.encode("utf-8", "surrogatepass")) <= MAX_NAME_BYTES:
        raise InvalidRequest(f"{what} must be 1..255 bytes of UTF-8")
    try:
        name.encode()
    except UnicodeEncodeError as exc:
        raise InvalidRequest(f"{what} must be valid UTF-8") from exc
    if what == "lease name":
        try:
            validate_collection_name(name)
        except InvalidRequest as exc:
            raise InvalidRequest(str(exc).replace("collection name", "lease name")) from exc


def validate_ttl(ttl_ms: int) -> None:
    if isinstance(ttl_ms, bool) or not isinstance(ttl_ms, int) or not 1 <= ttl_ms <= MAX_TTL_MS:
        raise InvalidRequest(f"ttlMs must be an integer within 1..{MAX_TTL_MS}")


def validate_version(version: int) -> None:
    if isinstance(version, bool) or not isinstance(version, int) or not 1 <= version <= MAX_VERSION:
        raise InvalidRequest("a lease version must be an integer >= 1")


def validate_token(token: LeaseToken) -> None:
    if not isinstance(token, LeaseToken):
        raise InvalidRequest("lease must be a LeaseToken(name, version)")
    validate_name(token.name)
    validate_version(token.version)


def _load(txn: lmdb.Transaction, tables: Tables, meta: CollectionMeta, name: str) -> tuple[Lease, int] | None:
    raw = txn.get(layout.lease_key(meta.cid_prefix, name), db=tables.leases)
    if raw is None:
        return None
    owner, version, expires_at_ms, ttl_ms = layout.unpack_lease(raw)
    return Lease(name, owner, version, expires_at_ms), ttl_ms


def _store(txn: lmdb.Transaction, tables: Tables, meta: CollectionMeta, lease: Lease, ttl_ms: int) -> None:
    txn.put(
        layout.lease_key(meta.cid_prefix, lease.name),
        layout.pack_lease(lease.owner, lease.version, lease.expires_at_ms, ttl_ms),
        db=tables.leases,
    )


def _holder(stored: Lease, now_ms: int) -> str:
    """Who a lease row says holds it now, for a message."""
    if stored.owner is None:
        return "released"
    if not stored.held_at(now_ms):
        return f"{stored.owner!r}, expired"
    return f"held by {stored.owner!r}"


def _held_elsewhere(meta: CollectionMeta, stored: Lease) -> LeaseLost:
    return LeaseLost(
        f"lease {stored.name!r} of {meta.name!r} is held by {stored.owner!r}"
        f" (version {stored.version}) until {stored.expires_at_ms} ms"
    )


def refuse_acquire(
    txn: lmdb.Transaction, tables: Tables, meta: CollectionMeta, name: str, owner: str, now_ms: int
) -> None:
    """Raises :class:`LeaseLost` if ``owner`` cannot acquire ``name`` now (a read-only pre-check: a standby
    that polls costs a read, not the store's write lock)."""
    found = _load(txn, tables, meta, name)
    if found is not None and found[0].held_at(now_ms) and found[0].owner != owner:
        raise _held_elsewhere(meta, found[0])


def acquire(
    txn: lmdb.Transaction,
    tables: Tables,
    meta: CollectionMeta,
    name: str,
    owner: str,
    ttl_ms: int,
    now_ms: int,
) -> Lease:
    """Takes ``name`` for ``owner`` (see the module's table); the new version is the fencing token."""
    validate_name(name)
    validate_name(owner, "owner")
    validate_ttl(ttl_ms)
    found = _load(txn, tables, meta, name)
    version = 1
    if found is not None:
        stored = found[0]
        if stored.held_at(now_ms) and stored.owner != owner:
            raise _held_elsewhere(meta, stored)
        version = stored.version + 1
    lease = Lease(name, owner, version, now_ms + ttl_ms)
    _store(txn, tables, meta, lease, ttl_ms)
    return lease


def renew(
    txn: lmdb.Transaction,
    tables: Tables,
    meta: CollectionMeta,
    name: str,
    owner: str,
    version: int,
    ttl_ms: int | None,
    now_ms: int,
) -> Lease:
    """Extends ``owner``'s lease by its ttl from now (see the module: an expired one that nobody took too)."""
    validate_name(name)
    validate_name(owner, "owner")
    validate_version(version)
    if ttl_ms is not None:
        validate_ttl(ttl_ms)
    found = _load(txn, tables, meta, name)
    if found is None:
        raise LeaseLost(f"{meta.name!r} has no lease {name!r}")
    stored, stored_ttl = found
    if stored.owner != owner or stored.version != version:
        if stored.held_at(now_ms):
            raise _held_elsewhere(meta, stored)
        raise LeaseLost(f"lease {name!r} of {meta.name!r} is at version {stored.version}, not {version}")
    ttl = stored_ttl if ttl_ms is None else ttl_ms
    lease = Lease(name, owner, version, now_ms + ttl)
    _store(txn, tables, meta, lease, ttl)
    return lease


def release(
    txn: lmdb.Transaction, tables: Tables, meta: CollectionMeta, name: str, owner: str, version: int
) -> None:
    """Frees ``owner``'s lease at once (its row and version stay); releasing it again is fine."""
    validate_name(name)
    validate_name(owner, "owner")
    validate_version(version)
    found = _load(txn, tables, meta, name)
    if found is None:
        raise LeaseLost(f"{meta.name!r} has no lease {name!r}")
    stored, ttl = found
    if stored.version == version and stored.owner is None:
        return
    if stored.owner != owner or stored.version != version:
        raise LeaseLost(
            f"lease {name!r} of {meta.name!r} is version {stored.version} of {stored.owner!r},"
            f" not version {version} of {owner!r}"
        )
    _store(txn, tables, meta, Lease(name, None, version, 0), ttl)


def fence(
    txn: lmdb.Transaction, tables: Tables, meta: CollectionMeta, token: LeaseToken, now_ms: int
) -> None:
    """Raises :class:`LeaseLost` unless ``token``'s version still holds its lease, unexpired."""
    validate_token(token)
    found = _load(txn, tables, meta, token.name)
    if found is None:
        raise LeaseLost(f"{meta.name!r} has no lease {token.name!r}")
    stored = found[0]
    if stored.version < token.version:
        raise LeaseLost(
            f"lease {token.name!r} of {meta.name!r}: version {token.version} was never issued; the lease is"
            f" at version {stored.version} ({_holder(stored, now_ms)})"
        )
    if stored.version != token.version:
        raise LeaseLost(
            f"lease {token.name!r} of {meta.name!r}: version {token.version} no longer holds it; the lease"
            f" is at version {stored.version} ({_holder(stored, now_ms)})"
        )
    if not stored.held_at(now_ms):
        raise LeaseLost(
            f"lease {token.name!r} of {meta.name!r} (version {token.version}) expired or was released"
        )


def list_leases(txn: lmdb.Transaction, tables: Tables, meta: CollectionMeta) -> list[Lease]:
    """Every lease row of the collection (released ones included), by name."""
    prefix = meta.cid_prefix
    found: list[Lease] = []
    cursor = txn.cursor(db=tables.leases)
    if cursor.set_range(prefix):
        for key, raw in cursor:
            if not key.startswith(prefix):
                break
            owner, version, expires_at_ms, _ = layout.unpack_lease(raw)
            found.append(Lease(layout.lease_name_of_key(key), owner, version, expires_at_ms))
    return found


def replicate(
    txn: lmdb.Transaction, tables: Tables, meta: CollectionMeta, copies: list[Lease], now_ms: int
) -> None:
    """Stores a primary's lease rows as they are (a replica's copy; see ``replication``).

    A version never goes back (a copy older than the stored row is left out), so a fencing token keeps
    meaning the same holder after a promotion. The primary does not send its ttl: a copy keeps the
    stored one, else the time left (at least 1 ms), which only a renew without ``ttl_ms`` reads.
    """
    for lease in copies:
        found = _load(txn, tables, meta, lease.name)
        if found is not None and found[0].version > lease.version:
            continue
        ttl = found[1] if found is not None else max(1, lease.expires_at_ms - now_ms)
        _store(txn, tables, meta, lease, ttl)


def supersedes(token: LeaseToken | None, opened: LeaseToken | None, opened_holds: bool = True) -> bool:
    """Whether a request fenced by ``token`` may drop a generation opened under ``opened``: a newer version
    of the same lease, a lease where the generation was opened with none, or anything once ``opened``
    holds no more (``opened_holds`` False: moved, expired or released -- its owner is fenced out anyway)."""
    if opened is not None and not opened_holds:
        return True
    if token is None:
        return False
    return opened is None or (opened.name == token.name and token.version > opened.version)


def holds(
    txn: lmdb.Transaction, tables: Tables, meta: CollectionMeta, token: LeaseToken, now_ms: int
) -> bool:
    """Whether ``token`` still holds its lease, unexpired (:func:`fence` without the error)."""
    found = _load(txn, tables, meta, token.name)
    return found is not None and found[0].version == token.version and found[0].held_at(now_ms)


def require_opened_under(meta: CollectionMeta, token: LeaseToken | None, what: str) -> None:
    """Raises :class:`LeaseLost` unless the open generation was started under ``token`` (None: no lease)."""
    opened = meta.next_lease
    if opened == token:
        return
    held = "no lease" if opened is None else f"lease {opened.name!r} version {opened.version}"
    carried = "none" if token is None else f"lease {token.name!r} version {token.version}"
    raise LeaseLost(
        f"generation {text_form(meta.next)} of {meta.name!r} was started under {held};"
        f" this {what} carries {carried}"
    )
