"""A collection's metadata row: its id, kind, generations and background-work progress."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import msgpack

from diffstore.engine import layout
from diffstore.engine.types import LeaseToken, RetentionPolicy


@dataclass(frozen=True, slots=True)
class CollectionMeta:
    """The ``collections`` row of one collection.

    ``generation``/``generation_seq`` is the current committed generation; ``next``/``next_seq`` the open
    one (None for a manual collection between generations). ``last_seq`` is the highest seq ever handed
    out. ``next_count`` counts writes into the open generation (auto-commit threshold), ``next_keys`` the
    distinct keys they wrote (its ``changes`` rows: the commit records it without reading them; None:
    unknown, a row written before it was kept, so the commit counts them). ``gc_horizon`` is
    the highest reader minimum the GC has acted on: reads below it answer ``generationCollected``;
    ``gc_done_seq`` the last generation whose garbage is gone. ``next_lease`` is the fencing token the
    open generation was started under (None: none, or no open generation): writes, the commit and the
    abort of that generation must carry it (see :mod:`diffstore.engine.leases`). ``retention`` is the
    collection's retention policy (None: none; see :mod:`diffstore.engine.retention`).
    """

    name: str
    cid: int
    manual: bool
    generation: bytes
    generation_seq: int
    next: bytes | None
    next_seq: int | None
    last_seq: int
    next_count: int = 0
    gc_horizon: bytes | None = None
    gc_done_seq: int = -1
    phantom_counter: int = 0
    next_lease: LeaseToken | None = None
    next_keys: int | None = 0
    retention: RetentionPolicy | None = None

    @property
    def cid_prefix(self) -> bytes:
        return layout.cid_bytes(self.cid)

    @property
    def records_prefix(self) -> bytes:
        """What every key of the collection's records begins with (``layout.records_prefix``)."""
        return layout.records_prefix(self.cid)

    def with_(self, **changes: Any) -> CollectionMeta:
        if changes.get("next_count") == 0 and "next_keys" not in changes:
            # no writes in the open generation (a new one, or one emptied): no keys either
            changes["next_keys"] = 0
        return replace(self, **changes)

    def pack(self) -> bytes:
        fields: list[Any] = [
            self.cid,
            self.manual,
            self.generation,
            self.generation_seq,
            self.next,
            self.next_seq,
            self.last_seq,
            self.next_count,
            self.gc_horizon,
            self.gc_done_seq,
            self.phantom_counter,
            None if self.next_lease is None else [self.next_lease.name, self.next_lease.version],
            self.next_keys,
        ]
        if self.retention is not None:  # only then: a row without a policy stays what older code reads
            fields.append([self.retention.keep_ms, self.retention.keep_generations])
        return msgpack.packb(fields, use_bin_type=True)  # type: ignore[no-any-return]

    @classmethod
    def unpack(cls, name: str, raw: bytes) -> CollectionMeta:
        fields = msgpack.unpackb(raw, raw=False)
        if len(fields) > 11 and fields[11] is not None:  # rows written before leases fenced have 11
            fields[11] = LeaseToken(fields[11][0], fields[11][1])
        if len(fields) < 13:  # written before next_keys: the open generation's keys are not counted yet
            fields[11:] = [fields[11] if len(fields) > 11 else None, None if fields[7] else 0]
        if len(fields) > 13 and fields[13] is not None:  # rows written before retention have 13: none
            fields[13] = RetentionPolicy(fields[13][0], fields[13][1])
        return cls(name, *fields)


def non_manual_generation(counter: int) -> bytes:
    """Generation ids of non-manual collections: 8 bytes, big-endian."""
    return layout.u64(counter)
