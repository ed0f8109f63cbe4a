"""The pure part of one A+B→C iteration (SPEC §6): which generation to open and which ranges to read.

No Spark and no I/O here: the runner feeds in what it read from the server and gets back a
:class:`RoundPlan` (or ``None`` when every reader has caught up), so the arithmetic is tested alone.

The round itself (generation ids, reader names, start/commit/abort) is :mod:`diffstore.rounds`.

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
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from diffstore import shell
from diffstore.engine.history import MAX_METADATA_BYTES
from diffstore.engine.types import LeaseToken
from diffstore.rounds import source_reader

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
