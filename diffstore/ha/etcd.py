"""etcd v3 through its JSON gateway (``/v3/kv/range``, ``/v3/kv/txn``, ``/v3/lease/grant|keepalive``)
over httpx: what a fail-over member needs, and nothing more.

Why the gateway and not a client library: it is part of every etcd since 3.3 (Debian's 3.4 included),
it needs no dependency beyond httpx (which the client already uses), and a member's traffic is a few
small requests a second, where a gRPC client's speed buys nothing (``benchmarks/failover.py`` measures
a round trip). ``etcd3gw`` wraps the same gateway, with ``requests`` and threads of its own for
keep-alives; ``aetcd`` needs asyncio and gRPC stubs of its own.

Keys and values travel base64-encoded; int64 fields arrive as strings. Several endpoints may be given:
a request that cannot reach one tries the next. Every failure is :class:`EtcdUnavailable`.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass
from typing import Any

import httpx


class EtcdUnavailable(Exception):
    """No endpoint answered, or one answered with an error (the message says which)."""


class LeaseNotFound(EtcdUnavailable):
    """etcd answered that the lease a request names does not exist (it expired)."""


@dataclass(frozen=True, slots=True)
class EtcdKey:
    key: bytes
    value: bytes
    create_revision: int
    mod_revision: int
    lease: int


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def prefix_end(prefix: bytes) -> bytes:
    """The first key after every key that starts with ``prefix`` (etcd's ``range_end`` of a prefix)."""
    end = bytearray(prefix)
    while end and end[-1] == 0xFF:
        end.pop()
    if not end:
        return b"\0"
    end[-1] += 1
    return bytes(end)


class Etcd:
    """A small synchronous etcd v3 client over the JSON gateway (see the module)."""

    def __init__(self, endpoints: list[str], timeout_s: float = 1.0) -> None:
        if not endpoints:
            raise ValueError("at least one etcd endpoint is needed")
        self.endpoints = [url.rstrip("/") for url in endpoints]
        self._http = httpx.Client(timeout=timeout_s)
        self._current = 0

    def close(self) -> None:
        self._http.close()

    def _post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        errors: list[str] = []
        for attempt in range(len(self.endpoints)):
            index = (self._current + attempt) % len(self.endpoints)
            url = self.endpoints[index] + path
            try:
                answer = self._http.post(url, json=body)
            except httpx.HTTPError as exc:
                errors.append(f"{self.endpoints[index]}: {type(exc).__name__}")
                continue
            if answer.status_code != 200:
                if "lease not found" in answer.text:
                    raise LeaseNotFound(f"{url}: the lease expired")
                raise EtcdUnavailable(f"{url} answered {answer.status_code}: {answer.text[:200]}")
            self._current = index
            found: dict[str, Any] = answer.json()
            return found
        raise EtcdUnavailable("no etcd endpoint answered (" + "; ".join(errors) + ")")

    def grant(self, ttl_s: int) -> int:
        """A new lease of ``ttl_s`` seconds; its id."""
        return int(self._post("/v3/lease/grant", {"TTL": ttl_s})["ID"])

    def keepalive(self, lease: int) -> bool:
        """Renews ``lease``; False when etcd no longer has it (it expired)."""
        result = self._post("/v3/lease/keepalive", {"ID": str(lease)}).get("result", {})
        return int(result.get("TTL", 0)) > 0

    def revoke(self, lease: int) -> None:
        """Ends ``lease`` now (its keys go with it)."""
        self._post("/v3/lease/revoke", {"ID": str(lease)})

    def range_prefix(self, prefix: bytes) -> list[EtcdKey]:
        """Every key that starts with ``prefix``, in key order."""
        body = {"key": _b64(prefix), "range_end": _b64(prefix_end(prefix))}
        return [_kv(item) for item in self._post("/v3/kv/range", body).get("kvs", [])]

    def put(self, key: bytes, value: bytes, lease: int = 0) -> None:
        body: dict[str, Any] = {"key": _b64(key), "value": _b64(value)}
        if lease:
            body["lease"] = str(lease)
        self._post("/v3/kv/put", body)

    def create_both(
        self,
        absent: bytes,
        value: bytes,
        lease: int,
        checked: bytes,
        checked_revision: int,
        checked_value: bytes,
    ) -> bool:
        """One transaction: if ``absent`` does not exist and ``checked`` was last changed at
        ``checked_revision`` (0: does not exist), put ``absent`` (on ``lease``) and ``checked``; whether
        it did."""
        compare = [
            {"key": _b64(absent), "target": "CREATE", "result": "EQUAL", "create_revision": "0"},
            {"key": _b64(checked), "target": "MOD", "result": "EQUAL", "mod_revision": str(checked_revision)},
        ]
        success = [
            {"request_put": {"key": _b64(absent), "value": _b64(value), "lease": str(lease)}},
            {"request_put": {"key": _b64(checked), "value": _b64(checked_value)}},
        ]
        answer = self._post("/v3/kv/txn", {"compare": compare, "success": success})
        return bool(answer.get("succeeded", False))


def _kv(item: dict[str, Any]) -> EtcdKey:
    return EtcdKey(
        base64.b64decode(item.get("key", "")),
        base64.b64decode(item.get("value", "")),
        int(item.get("create_revision", 0)),
        int(item.get("mod_revision", 0)),
        int(item.get("lease", 0)),
    )
