"""The wire shapes of leases (``/collections/{c}/leases/…``) and of the fencing token, for server and client.

Like :mod:`diffstore.wire_requests`: ``from_wire`` validates a decoded body (raising only
:class:`~diffstore.errors.BadRequest` subclasses), ``to_wire`` builds it, and ``run`` performs the request
on any :class:`~diffstore.collection.Collection`.

    acquire  {owner, ttlMs}            -> {owner, version, expiresAtMs}
    renew    {owner, version, ttlMs?}  -> {owner, version, expiresAtMs}
    release  {owner, version}          -> {}
    list     -                         -> {items: [{name, owner | null, version, expiresAtMs}]}
    fencing token (generation/start, /commit): "lease": {name, version}
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from diffstore.engine.types import MAX_LEASE_TTL_MS, MAX_LEASE_VERSION, Lease, LeaseToken
from diffstore.errors import InvalidRequest
from diffstore.wire import Body, Codec, Fields, set_if_given

if TYPE_CHECKING:
    from diffstore.collection import Collection

MAX_TTL_MS = MAX_LEASE_TTL_MS
MAX_VERSION = MAX_LEASE_VERSION


def token_from_fields(f: Fields, name: str = "lease") -> LeaseToken | None:
    """The optional fencing token ``{name, version}`` of a generation request (absent or null: None)."""
    raw = f.raw(name)
    if raw is None:
        return None
    t = Fields(raw, f.codec, f.path(name))
    return LeaseToken(t.text("name"), t.integer("version", 1, MAX_VERSION))


def token_to_wire(token: LeaseToken) -> Body:
    return {"name": token.name, "version": token.version}


def lease_to_wire(lease: Lease, with_name: bool = False) -> Body:
    body: Body = {"owner": lease.owner, "version": lease.version, "expiresAtMs": lease.expires_at_ms}
    if with_name:
        body = {"name": lease.name} | body
    return body


def lease_from_wire(obj: Any, codec: Codec, name: str, where: str = "response") -> Lease:
    f = Fields(obj, codec, where)
    owner = f.raw("owner")
    if owner is not None and not isinstance(owner, str):
        raise InvalidRequest(f"{where}.owner: expected a string or null")
    return Lease(name, owner, f.integer("version", 0), f.integer("expiresAtMs", 0))


def leases_to_wire(leases: list[Lease]) -> Body:
    return {"items": [lease_to_wire(lease, with_name=True) for lease in leases]}


def leases_from_wire(obj: Any, codec: Codec) -> list[Lease]:
    found = []
    for i, entry in enumerate(Fields(obj, codec, "response").array("items")):
        where = f"response.items[{i}]"
        found.append(lease_from_wire(entry, codec, Fields(entry, codec, where).text("name"), where))
    return found


@dataclass(frozen=True, slots=True)
class AcquireLeaseRequest:
    owner: str
    ttl_ms: int

    @classmethod
    def from_wire(cls, obj: Any, codec: Codec) -> AcquireLeaseRequest:
        f = Fields(obj, codec)
        return cls(f.text("owner"), f.integer("ttlMs", 1, MAX_TTL_MS))

    def to_wire(self, codec: Codec) -> Body:
        return {"owner": self.owner, "ttlMs": self.ttl_ms}

    def run(self, collection: Collection, name: str) -> Lease:
        return collection.acquire_lease(name, self.owner, self.ttl_ms)


@dataclass(frozen=True, slots=True)
class RenewLeaseRequest:
    owner: str
    version: int
    ttl_ms: int | None = None

    @classmethod
    def from_wire(cls, obj: Any, codec: Codec) -> RenewLeaseRequest:
        f = Fields(obj, codec)
        return cls(
            f.text("owner"), f.integer("version", 1, MAX_VERSION), f.integer_opt("ttlMs", 1, MAX_TTL_MS)
        )

    def to_wire(self, codec: Codec) -> Body:
        body: Body = {"owner": self.owner, "version": self.version}
        set_if_given(body, "ttlMs", self.ttl_ms)
        return body

    def run(self, collection: Collection, name: str) -> Lease:
        return collection.renew_lease(name, self.owner, self.version, self.ttl_ms)


@dataclass(frozen=True, slots=True)
class ReleaseLeaseRequest:
    owner: str
    version: int

    @classmethod
    def from_wire(cls, obj: Any, codec: Codec) -> ReleaseLeaseRequest:
        f = Fields(obj, codec)
        return cls(f.text("owner"), f.integer("version", 1, MAX_VERSION))

    def to_wire(self, codec: Codec) -> Body:
        return {"owner": self.owner, "version": self.version}

    def run(self, collection: Collection, name: str) -> None:
        collection.release_lease(name, self.owner, self.version)
