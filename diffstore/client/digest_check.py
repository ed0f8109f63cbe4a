"""``diffstore check --url REPLICA --against PRIMARY``: proves a replica holds what its primary holds by
comparing the digest (SPEC §9 Integrity) of every collection at every generation both hold.

The work is O(generations): each side lists its generations with their digests, newest first, in pages of
:data:`PAGE`, and the two lists are merged by generation id (both descend). Generations only one side holds
(a replica behind its primary, history it was first copied past) are counted, not compared; a digest one
side does not know (a generation committed by an older server) is counted as unknown. The *first* difference
of a collection is its oldest differing generation: where the two stores parted.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from diffstore.client._sync import Client
from diffstore.engine.types import GenerationDigest
from diffstore.errors import NoSuchCollection

PAGE = 10_000


@dataclass(frozen=True, slots=True)
class CollectionComparison:
    """What comparing one collection found: generations compared, unknown on either side, held by one side
    only, and the oldest that differs (replica's digest, primary's) if any."""

    name: str
    compared: int = 0
    unknown: int = 0
    only_replica: int = 0
    only_primary: int = 0
    first_difference: tuple[GenerationDigest, GenerationDigest] | None = None
    missing: str | None = None  # "replica" or "primary": the collection is not there


def compare(replica: Client, primary: Client) -> Iterator[CollectionComparison]:
    """Compares every collection of either store, in name order."""
    names = {c.name for c in replica.collections()} | {c.name for c in primary.collections()}
    for name in sorted(names):
        yield compare_collection(replica, primary, name)


def compare_collection(replica: Client, primary: Client, name: str) -> CollectionComparison:
    try:
        mine = _digests(replica, name)
        first_mine = next(mine, None)
    except NoSuchCollection:
        return CollectionComparison(name, missing="replica")
    try:
        theirs = _digests(primary, name)
        first_theirs = next(theirs, None)
    except NoSuchCollection:
        return CollectionComparison(name, missing="primary")
    compared = unknown = only_replica = only_primary = 0
    first: tuple[GenerationDigest, GenerationDigest] | None = None
    a, b = first_mine, first_theirs
    while a is not None and b is not None:
        if a.generation_id > b.generation_id:
            only_replica += 1
            a = next(mine, None)
        elif a.generation_id < b.generation_id:
            only_primary += 1
            b = next(theirs, None)
        else:
            if a.digest is None or b.digest is None:
                unknown += 1
            else:
                compared += 1
                if (a.records, a.digest) != (b.records, b.digest):
                    first = (a, b)  # newest first: the last one seen is the oldest
            a, b = next(mine, None), next(theirs, None)
    only_replica += sum(1 for _ in mine) + (a is not None)
    only_primary += sum(1 for _ in theirs) + (b is not None)
    return CollectionComparison(name, compared, unknown, only_replica, only_primary, first)


def _digests(client: Client, name: str) -> Iterator[GenerationDigest]:
    """Every committed generation of ``name`` with its digest, newest first, page by page."""
    collection = client.collection(name)
    found, more = collection.digests(None, PAGE)
    yield from found
    while more and found:
        found, more = collection.digests(found[-1].generation_id, PAGE)
        yield from found
