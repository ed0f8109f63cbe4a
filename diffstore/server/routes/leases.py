"""``/collections/{c}/leases/``: list, acquire, renew and release leases (compare-and-set ownership)."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response

from diffstore.server import audit, schemas
from diffstore.server.config import Limit
from diffstore.server.exchange import Exchange, handle
from diffstore.server.routing import route
from diffstore.server.scopes import TokenScope
from diffstore.wire import Body
from diffstore.wire_leases import (
    AcquireLeaseRequest,
    ReleaseLeaseRequest,
    RenewLeaseRequest,
    lease_to_wire,
    leases_to_wire,
)

router = APIRouter(tags=["leases"])


@route(router, "GET", "/collections/{c}/leases/", answer=schemas.LeaseList, scope=TokenScope.READ)
async def list_leases(request: Request, c: str) -> Response:
    def work(x: Exchange) -> Body:
        return leases_to_wire(x.store.collection(c).leases())

    return await handle(request, work)


@route(
    router,
    "POST",
    "/collections/{c}/leases/{name}/acquire",
    body=schemas.AcquireLease,
    answer=schemas.LeaseResponse,
    summary="Acquire a lease (free, expired or already the owner's): a new version",
    scope=TokenScope.WRITE,
    audit="leaseTakeover",
)
async def acquire(request: Request, c: str, name: str) -> Response:
    def work(x: Exchange) -> Body:
        req = AcquireLeaseRequest.from_wire(x.body, x.codec)
        collection = x.store.collection(c)
        # audited only as a takeover: another owner had it (expired; or held, and it is refused)
        before = next((lease for lease in collection.leases() if lease.name == name), None)
        if before is None or before.owner in (None, req.owner):
            audit.note(request.scope, skip=True)
        lease = req.run(collection, name)
        return lease_to_wire(lease)

    return await handle(request, work, Limit.OTHER)


@route(
    router,
    "POST",
    "/collections/{c}/leases/{name}/renew",
    body=schemas.RenewLease,
    answer=schemas.LeaseResponse,
    summary="Renew a lease held at {owner, version}",
    scope=TokenScope.WRITE,
)
async def renew(request: Request, c: str, name: str) -> Response:
    def work(x: Exchange) -> Body:
        lease = RenewLeaseRequest.from_wire(x.body, x.codec).run(x.store.collection(c), name)
        return lease_to_wire(lease)

    return await handle(request, work, Limit.OTHER)


@route(
    router,
    "POST",
    "/collections/{c}/leases/{name}/release",
    body=schemas.ReleaseLease,
    summary="Release a lease held at {owner, version}",
    scope=TokenScope.WRITE,
)
async def release(request: Request, c: str, name: str) -> Response:
    def work(x: Exchange) -> Body:
        ReleaseLeaseRequest.from_wire(x.body, x.codec).run(x.store.collection(c), name)
        return {}

    return await handle(request, work, Limit.OTHER)
