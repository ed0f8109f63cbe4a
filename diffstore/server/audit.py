"""The audit trail: one log line (logger ``diffstore.audit``) and one count per audited request.

Audited are the admin actions and the writes outside a generation's data -- the routes declared with
``route(..., audit=ACTION)``: creating and deleting collections, retention, readers created, moved or
deleted by hand, revert, promotion, stepDown/stepUp, backups, lease takeovers -- whatever their outcome,
and every request refused for its token (401 ``unauthorized``, 403 ``forbidden``: action ``denied``).
A line is ``key=value`` pairs, values quoted (JSON) when they hold a blank, a quote or ``=``:

    audit action=deleteCollection token=ops remote=10.0.0.7:51234 collection=orders outcome=ok status=200

``token`` is the token's NAME (``-``: none given or none known; ``token``: the one of ``--token``), never
its secret; ``outcome`` is ``ok`` or the error code of the answer. ``/metrics`` counts the same events in
``diffstore_audit_total{action,token,outcome}``.

A route can add to its line or drop it through the request's scope (:func:`note`): creating a collection
names the collection of its body; a lease acquire is a takeover only when another owner had the lease,
and a replica's own holds on its primary are replication, not a hand's move.
"""

from __future__ import annotations

import json
import logging
from typing import TYPE_CHECKING, Any

import msgpack
import orjson

if TYPE_CHECKING:
    from starlette.types import Scope

    from diffstore.server.metrics import ServerMetrics

_log = logging.getLogger("diffstore.audit")
NOTE = "diffstore.audit"  # the request scope's key of what a route adds (see note)
DENIED = "denied"


def note(scope: Scope, **fields: Any) -> None:
    """Adds ``fields`` to the request's audit line (``collection=``, ``action=``; ``skip=True``: no line)."""
    found = scope.get(NOTE)
    if found is None:
        scope[NOTE] = dict(fields)
    else:
        found.update(fields)


def _value(value: object) -> str:
    text = "-" if value is None or value == "" else str(value)
    if any(ch in text for ch in ' "=\\') or not text.isprintable():
        return json.dumps(text)
    return text


def outcome_of(status: int, body: bytes) -> str:
    """``ok`` for a success, else the answer's error code (its status when the body has none)."""
    if status < 400:
        return "ok"
    for loads in (orjson.loads, msgpack.unpackb):
        try:
            found = loads(body)
        except Exception:  # noqa: S112 (not this format: try the next)
            continue
        if isinstance(found, dict) and isinstance(found.get("error"), str):
            return str(found["error"])
    return str(status)


class AuditTrail:
    """Logs and counts audited requests (``metrics``: where to count them, None: only log)."""

    def __init__(self, metrics: ServerMetrics | None) -> None:
        self.metrics = metrics

    def record(
        self,
        scope: Scope,
        action: str,
        token: str | None,
        collection: str | None,
        outcome: str,
        status: int,
        route: str | None = None,
    ) -> None:
        added = scope.get(NOTE) or {}
        if added.get("skip"):
            return
        action = added.get("action", action)
        collection = added.get("collection", collection)
        client = scope.get("client")
        remote = f"{client[0]}:{client[1]}" if client else None
        fields: list[tuple[str, object]] = [("action", action), ("token", token), ("remote", remote)]
        if route is not None:
            fields.append(("route", route))
        fields += [("collection", collection), ("outcome", outcome), ("status", status)]
        _log.info("audit %s", " ".join(f"{key}={_value(value)}" for key, value in fields))
        if self.metrics is not None:
            try:
                self.metrics.count_audit(action, token or "-", outcome)
            except Exception:  # counting must never turn an answered request into an error
                _log.exception("counting an audit event failed")
