"""Every read of a primary and of its replica, side by side (the tests compare the two)."""

from __future__ import annotations

from typing import Any

from diffstore.client import Client
from diffstore.engine.types import GetManyResult, GetResult, Record
from diffstore.errors import DiffstoreError, GenerationCollected
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


def _named_from(answer: Any, held: list[bytes]) -> Any:
    """A primary's point read as a replica holding the generations ``held`` answers it: a record of a
    generation it does not hold (older than its first copy) counts as written by the first copy
    (docs/replicas.md, "Where it starts")."""

    def record(r: Record | None) -> Record | None:
        if r is None or r.generation_id in held:
            return r
        return r._replace(generation_id=min(g for g in held if g > r.generation_id))

    if isinstance(answer, GetResult) and answer.record is not None:
        found = record(answer.record)
        assert found is not None
        return GetResult(found.generation_id, found)
    if isinstance(answer, GetManyResult):
        return GetManyResult(answer.generation_id, [record(r) for r in answer.records])
    return answer


def _readable(client: Client, name: str, generation: bytes) -> bool:
    try:
        client.collection(name).query_page(generation_id=generation, limit=1)
    except GenerationCollected:
        return False
    return True


def copied(primary: Client, replica: Client) -> dict[str, list[bytes]] | None:
    """The generations the replica holds of each collection, when it holds exactly the primary's from its
    oldest readable one on (a replica starts each collection there; below it, it may list the initial
    generation of an automatic collection, which answers 410 on both sides), every one of them a
    generation of the primary, and the same readers and leases; None while it does not (yet)."""
    try:
        theirs, mine = generations(primary), generations(replica)
        if set(theirs) != set(mine):
            return None
        for name, held in mine.items():
            readable = [g for g in held if _readable(replica, name, g)]
            if not readable or not set(held) <= set(theirs[name]):
                return None
            if theirs[name][-len(readable) :] != readable:
                return None
            if user_readers(primary, name) != user_readers(replica, name):
                return None
            if primary.collection(name).leases() != replica.collection(name).leases():
                return None
    except DiffstoreError:
        return None
    return mine


def converged(primary: Client, replica: Client, timeout_s: float) -> dict[str, list[bytes]]:
    """Waits until the replica holds the primary's generations (:func:`copied`), then checks that every
    read at each of them answers the same on both; returns the generations the replica holds."""
    from tests.helpers import wait_until

    held = wait_until(lambda: copied(primary, replica), timeout_s, what="the replica to converge")
    mine, theirs = every_read(replica, held), every_read(primary, held)
    for name, reads in theirs.items():
        for kinds in reads.values():
            kinds["get"] = [_named_from(answer, held[name]) for answer in kinds["get"]]
            kinds["getMany"] = _named_from(kinds["getMany"], held[name])
    differ = [
        (name, g, kind, str(mine[name][g][kind])[:300], str(answer)[:300])
        for name, reads in theirs.items()
        for g, kinds in reads.items()
        for kind, answer in kinds.items()
        if mine[name][g][kind] != answer
    ]
    assert not differ, differ[:3]  # (collection, generation, read, replica's answer, primary's answer)
    return held
