"""The replication term and fencing in ``/metrics``: ``diffstore_replication_term``, ``diffstore_fenced``
(0/1) and ``diffstore_step_downs_total`` (stored: it survives kill -9), on a primary told of a higher
term by a request, by a new primary's step-down, and lifted by an operator."""

from __future__ import annotations

import re

import httpx

from diffstore.client import Client

from .conftest import Server


def _series(url: str) -> dict[str, float]:
    text = httpx.get(f"{url}/metrics", timeout=60).text
    found = {}
    for name in ("diffstore_replication_term", "diffstore_fenced", "diffstore_step_downs_total"):
        match = re.search(rf"^{name} (\S+)$", text, re.MULTILINE)
        assert match is not None, f"{name} missing"
        found[name.removeprefix("diffstore_")] = float(match.group(1))
    return found


def _figures(term: float, fenced: float, step_downs: float) -> dict[str, float]:
    return {"replication_term": term, "fenced": fenced, "step_downs_total": step_downs}


def test_term_fencing_and_step_downs_are_in_the_metrics(primary: Server, replica: Server) -> None:
    with primary.client() as p:
        p.create_collection("c", manual=True)
    assert _series(primary.url) == _figures(0, 0, 0)
    with Client(primary.url, term=3) as newer:  # a request that carries a higher term: fenced
        newer.collections()
    assert _series(primary.url) == _figures(3, 1, 1)
    with primary.client() as p:  # an operator lifts it: a term above, the count stays
        p.promote(force=True)
    assert _series(primary.url) == _figures(4, 0, 1)
    with httpx.Client(base_url=primary.url, timeout=60) as http:
        told = {"term": 6, "primary": "http://127.0.0.1:1", "replicaId": "r"}
        assert http.post("/replica/stepDown", json=told).status_code == 200
        assert http.post("/replica/stepDown", json=told).status_code == 200  # asked again: the same one
        stale = http.post("/replica/stepDown", json=told | {"term": 5})
        assert (stale.status_code, stale.json()["error"]) == (409, "fenced")
    assert _series(primary.url) == _figures(6, 1, 2)
    primary.kill9()
    primary.start()
    assert _series(primary.url) == _figures(6, 1, 2)
    # a replica takes a higher term but never steps down: it refuses writes anyway
    assert _series(replica.url) == _figures(0, 0, 0)
    with Client(replica.url, term=9) as newer:
        newer.collections()
    assert _series(replica.url) == _figures(9, 0, 0)
