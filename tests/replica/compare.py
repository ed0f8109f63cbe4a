"""Every read of a primary and of its replica, side by side (the tests compare the two)."""

from __future__ import annotations

from typing import Any

from diffstore.client import Client
from diffstore.errors import DiffstoreError
from diffstore.replica import READER_PREFIX


def _answer(call: Any) -> Any:
    try:
        return call()
    except DiffstoreError as exc:
        return ("error", exc.code)


def user_readers(client: Client, name: str) -> list[Any]:
    return [r for r in client.collection(name).readers() if not r.name.startswith(READER_PREFIX)]


def state(client: Client) -> dict[str, Any]:
    """Every collection's kind, generations (current, open), readers and leases."""
    out: dict[str, Any] = {}
    for info in client.collections():
        c = client.collection(info.name)
        out[info.name] = (info.manual, c.generation_state(), user_readers(client, info.name), c.leases())
    return out


def caught_up(primary: Client, replica: Client) -> bool:
    try:
        return state(primary) == state(replica)
    except DiffstoreError:
        return False


def reads_at(client: Client, name: str, generation: bytes, others: list[bytes]) -> dict[str, Any]:
    """Every read of one collection at one generation: records, point reads, neighbours, lineage, diffs
    from each generation in ``others`` below it."""
    c = client.collection(name)
    records = _answer(lambda: [(r.key, r.value) for r in c.query(generation_id=generation, limit=500)])
    # point reads of a sample of the keys (every seventh, at most 40): records compare whole above
    keys = [k for k, _ in records][::7][:40] if isinstance(records, list) else []
    keys += [b"", b"zz-absent"]
    return {
        "query": records,
        "get": [_answer(lambda k=k: c.get_result(k, generation_id=generation)) for k in keys],
        "getMany": _answer(lambda: c.get_many(keys, generation_id=generation)),
        "around": [
            _answer(
                lambda k=k: c.keys_around(k, require_key_existence=False, limit=3, generation_id=generation)
            )
            for k in keys[:5]
        ],
        "lineage": _answer(lambda: c.lineage(generation)),
        "diffs": {
            g: _answer(lambda g=g: list(c.diff(from_generation_id=g, to_generation_id=generation)))
            for g in others
            if g < generation
        },
    }


def every_read(client: Client, generations: dict[str, list[bytes]]) -> dict[str, Any]:
    return {name: {g: reads_at(client, name, g, gens) for g in gens} for name, gens in generations.items()}


def generations(client: Client) -> dict[str, list[bytes]]:
    """Each collection's committed generations, oldest first."""
    out: dict[str, list[bytes]] = {}
    for info in client.collections():
        c = client.collection(info.name)
        ids, more = c.generations(limit=1000)
        while more:
            page, more = c.generations(before=ids[-1], limit=1000)
            ids += page
        out[info.name] = ids[::-1]
    return out


def histories(client: Client) -> dict[str, Any]:
    """Each collection's history (SPEC §8: commit time, changed keys, metadata), newest first."""
    out: dict[str, Any] = {}
    for info in client.collections():
        c = client.collection(info.name)
        infos, more = c.history(limit=1000)
        while more:
            page, more = c.history(before=infos[-1].generation_id, limit=1000)
            infos += page
        out[info.name] = infos
    return out
