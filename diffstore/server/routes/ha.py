"""``GET /ha``: a fail-over member's role, the leader it knows and the cluster's term (``docs/failover.md``).

A server that is no member answers too, so that a client can ask any server where writes go: its role
as a plain server (``leader`` for a primary, ``replica``, ``fenced``), ``cluster`` and ``member`` null.
"""

from __future__ import annotations

from fastapi import APIRouter, Request, Response

from diffstore.engine.store import Store
from diffstore.server import schemas
from diffstore.server.exchange import Exchange, handle
from diffstore.server.routing import route
from diffstore.server.scopes import TokenScope
from diffstore.wire import Body

router = APIRouter(tags=["replica"])


def ha_to_wire(store: Store) -> Body:
    """``GET /ha``'s answer (see the module)."""
    record = store.ha_record()
    if record is None:
        state = store.replica_state()
        role = {"primary": "leader"}.get(state.role, state.role)
        primary = state.primary if state.following else state.fenced.primary if state.fenced else None
        leader = None if primary is None else {"member": None, "url": primary}
        return {"cluster": None, "member": None, "role": role, "leader": leader, "term": state.term}
    known = None
    if record.leader_url is not None:
        known = {"member": record.leader_member, "url": record.leader_url}
    return {
        "cluster": record.cluster,
        "member": record.member,
        "role": record.role,
        "leader": known,
        "term": record.term,
        "failovers": record.failovers,
        "discardedGenerations": record.discarded,
    }


@route(
    router,
    "GET",
    "/ha",
    answer=schemas.HaResponse,
    summary="A fail-over member's role (leader, replica, candidate, fenced), its leader and the term",
    scope=TokenScope.READ,
)
async def ha(request: Request) -> Response:
    def work(x: Exchange) -> Body:
        return ha_to_wire(x.store)

    return await handle(request, work)
