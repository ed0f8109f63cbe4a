"""The pure part of one A+B→C iteration (SPEC §6): which generation to open and which ranges to read.

No Spark and no I/O here: the runner feeds in what it read from the server and gets back a
:class:`RoundPlan` (or ``None`` when every reader has caught up), so the arithmetic is tested alone.

The round itself (generation ids, reader names, start/commit/abort) is :mod:`diffstore.rounds`.
:class:`RoundContext` is what the round's steps outside the runner (:mod:`~diffstore.spark.small_rounds`,
:mod:`~diffstore.spark.preview`) use of it, and :class:`Pinned` where each ``lookup`` alias reads.

Invariants:
    * The new generation ``g`` is strictly above C's current and open generations, so
      ``generation/start g`` with ``abortOutdated`` always discards a leftover (crashed) generation.
    * ``g`` ends with a nonce of ``NONCE_BYTES`` random bytes, unique to the attempt. Two runners that
      read the same state therefore never share a generation (sharing would mix their writes); the
      later start wins and the other one fails.
    * Every reader update carries the reader's value as read, as its compare-and-set expectation, so a
      commit computed from stale readers is refused as a whole (``badVersion``).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from diffstore import shell
from diffstore.engine.history import MAX_METADATA_BYTES
from diffstore.engine.types import LeaseToken
from diffstore.rounds import source_reader

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from diffstore.client import Collection

TARGET = "@target"
"""Pass as ``lookup``'s first argument to read the target's values as they were before this round."""

Lookup = Callable[["str", "DataFrame"], "DataFrame"]
"""``lookup(alias, keys)``: the ``key``, ``value`` rows of ``keys`` where the round reads ``alias``."""
TransformFn = Callable[["SparkSession", "dict[str, DataFrame]", Lookup], "DataFrame"]
"""A transform's ``fn(spark, diffs, lookup)``: the target's changes (``key``, ``value``)."""

NONCE_BYTES = 8
"""The random suffix of a round's generation id (see :func:`diffstore.rounds.next_generation_id`)."""


@dataclass(frozen=True, slots=True)
class SourceRange:
    """What one round reads of one source: changes in ``(from_generation_id, to_generation_id]``."""

    alias: str
    collection: str
    from_generation_id: bytes | None
    to_generation_id: bytes

    @property
    def empty(self) -> bool:
        return (self.from_generation_id or b"") == self.to_generation_id


@dataclass(frozen=True, slots=True)
class RoundPlan:
    """One iteration: the generation to write, the pinned range of every source, and the lease token the
    generation is started under (every write into it carries it)."""

    generation_id: bytes
    base_generation_id: bytes
    sources: tuple[SourceRange, ...]
    lease: LeaseToken | None = None

    def reader_updates(self) -> list[dict[str, Any]]:
        """The commit's ``updateReaders``: every reader moves to its range's end, if still at its start."""
        return [
            {
                "readerName": source_reader(s.alias),
                "generationId": s.to_generation_id,
                "expectedGenerationId": s.from_generation_id,
            }
            for s in self.sources
        ]

    def metadata(self, job: str, number: int) -> dict[str, str]:
        """The commit's metadata (SPEC §8, shown by ``diffstore log``): ``job``, ``round`` (this round's
        number on the target) and ``source.<alias>`` = ``from..to``, the generations read of each source
        (text form, ``""`` for the empty id). Sources that would take it over the 4 KiB limit are left
        out, counted in ``sources.omitted``."""
        metadata = {"job": job[:MAX_JOB_CHARS], "round": str(number)}
        omitted = 0
        for s in self.sources:
            ids = (s.from_generation_id or b"", s.to_generation_id)
            entry = {f"source.{s.alias}": "..".join(shell.quote_empty(shell.show(g)) for g in ids)}
            room = _encoded_size({**metadata, **entry, "sources.omitted": "0000"}) <= MAX_METADATA_BYTES
            if omitted or not room:
                omitted += 1
            else:
                metadata.update(entry)
        if omitted:
            metadata["sources.omitted"] = str(omitted)
        return metadata


MAX_JOB_CHARS = 512
"""A job name longer than this is cut in the commit's metadata (the sources' ranges need the room)."""


def _encoded_size(metadata: Mapping[str, str]) -> int:
    """Bytes of ``metadata`` as the server measures it (compact UTF-8 JSON)."""
    return len(json.dumps(metadata, ensure_ascii=False, separators=(",", ":")).encode("utf-8"))


def next_round_number(previous: Mapping[str, str] | None) -> int:
    """This round's number from the metadata of the target's last commit: one more than the ``round`` it
    recorded, or 1 (the target's first round, or its last commit was not a transform round)."""
    text = (previous or {}).get("round", "")
    return int(text) + 1 if text.isdigit() else 1


@dataclass(frozen=True, slots=True)
class Pinned:
    """Where a ``lookup`` alias reads: a collection at a generation (and, in a preview, with a phantom)."""

    collection: str
    generation_id: bytes
    phantom_id: bytes | None = None


def pinned_lookups(plan: RoundPlan, target: str) -> dict[str, Pinned]:
    """Where a round's ``lookup`` reads each alias: sources at their range's end, :data:`TARGET` at the
    target's generation the round builds on."""
    pinned = {s.alias: Pinned(s.collection, s.to_generation_id) for s in plan.sources}
    pinned[TARGET] = Pinned(target, plan.base_generation_id)
    return pinned


def pinned_alias(pinned: Mapping[str, Pinned], alias: str) -> Pinned:
    """``pinned[alias]``; raises KeyError naming the known aliases (a typo in a transform's ``fn``)."""
    found = pinned.get(alias)
    if found is None:
        raise KeyError(f"unknown source {alias!r}; known: {sorted(pinned)}")
    return found


class RoundContext(Protocol):
    """What the driver-side steps of a round take of the runner (a ``Transform``)."""

    @property
    def spark(self) -> SparkSession: ...

    @property
    def target(self) -> str: ...

    @property
    def sources(self) -> dict[str, str]: ...

    @property
    def fn(self) -> TransformFn: ...

    @property
    def local_diff_max_rows(self) -> int: ...

    def handle(self, name: str) -> Collection:
        """The driver's handle on a collection (looked up once; it raises NoSuchCollection)."""
        ...

    def event(self, name: str, **details: Any) -> None:
        """Tells the runner's ``on_event`` hook."""
        ...


def plan_sources(
    sources: Mapping[str, str], readers: Mapping[str, bytes | None], diff_ends: Mapping[str, bytes]
) -> tuple[SourceRange, ...] | None:
    """The ranges of a round, or ``None`` when every reader already sits at its source's end.

    Args:
        sources: alias → source collection name.
        readers: alias → the generation stored in the target's reader ``from_<alias>`` (None: never read).
        diff_ends: alias → how far this round reads the source (the ``toGenerationId`` the server
            answered for a diff from the reader to the current generation; it may stop short of current).
    """
    ranges = tuple(
        SourceRange(alias, collection, readers[alias], diff_ends[alias])
        for alias, collection in sources.items()
    )
    if all(r.empty for r in ranges):
        return None
    return ranges
