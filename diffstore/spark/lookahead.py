"""A small round's lookups fetched ahead: while the driver reads the round's diffs, the values its sources'
lookups will probably ask for are already on their way.

In the joins these transforms are written for (A+B→C by key), a source's ``lookup`` asks for keys that
changed in the *other* sources: the side of a changed user that did not change. So as each page of a
source's diff arrives on the driver, its keys go to ``getMany`` at every other source's pinned generation,
in background threads, while the driver reads the next page (the server answers both at once: it runs a
worker per core). When the user's ``fn`` then calls ``lookup(alias, keys)`` and the keys are collected,
the values already fetched are taken from here and only the others are fetched then. On the 2-core test
machine, where the server shares the cores with Spark, rounds of the example job over 100,000 changes
took 1.01 s against 1.07 s without it (2M keys) and 1.46 s against 1.55 s (10M keys), alternating in one
session: B's lookup lost ~0.1 s, the diff read took a little longer (benchmarks/RESULTS.md, session 23).
A server with cores of its own answers the two reads side by side.

Answers stay exact: a key fetched ahead was read at the same pinned generation as the lookup reads, and a
key not fetched ahead is fetched when asked. A guess that a job does not bear out costs the server work
and nothing else, so a runner stops guessing for an alias (:class:`LookaheadPolicy`) after a round that
fetched ahead for it and took none of it from here.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor

import pyarrow as pa
import pyarrow.compute as pc

from diffstore.client import Collection
from diffstore.spark.lookup import get_many
from diffstore.spark.plan import Pinned
from diffstore.wire_columns import BinaryColumn

LOOKAHEAD_THREADS = 2
"""Requests in flight at once: the server's answers to them share its cores with the diff read."""

Fetch = Callable[[list[bytes]], pa.Array]
"""Values of ascending keys (a binary array aligned with them, null where a key is absent)."""


class Lookahead:
    """One round's values fetched ahead, per lookup alias: :meth:`offer` a diff page's keys as it arrives,
    :meth:`values` when ``fn`` looks keys up, :meth:`close` when the round ends (taken or not)."""

    def __init__(
        self, handle: Callable[[str], Collection], pinned: Mapping[str, Pinned], aliases: Iterable[str]
    ) -> None:
        self._handle = handle
        self._pinned = pinned
        self._ahead: dict[str, list[tuple[list[bytes], Future[pa.Array]]]] = {alias: [] for alias in aliases}
        self._pool = ThreadPoolExecutor(LOOKAHEAD_THREADS, thread_name_prefix="diffstore-lookahead")
        self.taken: dict[str, int] = {}
        """Per alias, how many keys a lookup took from here."""

    @property
    def fetched(self) -> set[str]:
        """The aliases something was fetched ahead for."""
        return {alias for alias, parts in self._ahead.items() if parts}

    def offer(self, source: str, keys: BinaryColumn) -> None:
        """Fetches the values of ``keys`` (a diff page's), which changed in ``source``, for every other
        alias; the column becomes a list only when some alias is fetched ahead."""
        targets = [alias for alias in self._ahead if alias != source]
        if not targets or not len(keys):
            return
        listed: list[bytes] = keys.to_list()  # type: ignore[assignment]  # a page's keys are never absent
        for alias in targets:
            self._ahead[alias].append((listed, self._pool.submit(self._fetch, self._pinned[alias], listed)))

    def _fetch(self, where: Pinned, keys: list[bytes]) -> pa.Array:
        return get_many(self._handle(where.collection), where.generation_id, keys, where.phantom_id)

    def values(self, alias: str, wanted: list[bytes], fetch: Fetch) -> pa.Array:
        """The values of ascending keys ``wanted`` at ``alias``'s pinned generation: those fetched ahead
        from here, the others by ``fetch`` (an ahead fetch that failed is fetched again that way)."""
        parts = [(keys, future) for keys, future in self._ahead.get(alias, []) if _succeeds(future)]
        if not parts:
            return fetch(wanted)
        known = pa.array(itertools.chain.from_iterable(keys for keys, _ in parts), pa.binary())
        known_values = pa.concat_arrays([future.result() for _, future in parts])
        asked = pa.array(wanted, pa.binary())
        where = pc.index_in(asked, value_set=known)
        missing = asked.filter(pc.is_null(where)).to_pylist()
        self.taken[alias] = self.taken.get(alias, 0) + len(wanted) - len(missing)
        if missing:
            known = pa.concat_arrays([known, pa.array(missing, pa.binary())])
            known_values = pa.concat_arrays([known_values, fetch(missing)])
            where = pc.index_in(asked, value_set=known)
        return known_values.take(where)

    def close(self) -> None:
        """Drops what was not fetched yet. A request in flight ends in its thread: a round never waits
        for a guess (over a stalled link, until the client's timeout)."""
        self._pool.shutdown(wait=False, cancel_futures=True)


def _succeeds(future: Future[pa.Array]) -> bool:
    """Waits for ``future``: whether it holds values (not cancelled, no exception)."""
    if future.cancelled():
        return False
    return future.exception() is None


class LookaheadPolicy:
    """Which lookup aliases a runner fetches ahead: every source's at first, and no longer an alias after a
    round that fetched ahead for it and took nothing from there (its job does not look up the other
    sources' changed keys there, or not at all)."""

    def __init__(self) -> None:
        self._stopped: set[str] = set()

    def start(
        self, handle: Callable[[str], Collection], pinned: Mapping[str, Pinned], aliases: Iterable[str]
    ) -> Lookahead:
        """A round's :class:`Lookahead` for those of ``aliases`` still fetched ahead."""
        return Lookahead(handle, pinned, [alias for alias in aliases if alias not in self._stopped])

    def learn(self, lookahead: Lookahead) -> None:
        """Stops fetching ahead for the aliases this round fetched for and took nothing of."""
        self._stopped.update(alias for alias in lookahead.fetched if not lookahead.taken.get(alias))
