"""The delivery state machine of one subscription: shard ownership, unacked tracking, commit positions.

Pure: no gRPC, no LMDB, no clock. The caller feeds events (``join``, ``leave``, ``ack``, ``rebalance``) and
asks ``poll(now, source)`` what to send; batches come from a :class:`BatchSource` and stay opaque bytes.

Invariants:
- A position ``(batch_id, index)`` means: every record of the shard that sorts before it is acked.
  ``(0, 0)`` is the start of a shard (batch ids start at 1); LATEST starts at ``(tail_batch, tail_size)``.
- Per shard, the in-flight batches are exactly the stored batches from the committed position's batch up
  to the last batch read, in order; so the committed position moves over contiguous acked records only.
- New batches of a shard are sent in batch order, one batch per delivery, to the shard's one owner.
- Every send has a deadline ``ack_timeout``; past it, only the still-unacked records of the batch are
  sent again (same record ids) to the shard's current owner. When an owner leaves, or a rebalance moves
  a shard away from it, its unacked records of the shard are due at once for the next owner
  (``redeliver_at_once``). Due resends go out before any new batch, so a new owner receives the shard
  in order: the records the previous owner did not ack, then the newer ones. (A server that resends only
  at the deadline, as HStreamDB does, hands the new owner newer batches first: the protocol allows it,
  and an ingestor must be correct under it -- see :mod:`diffstore.streams.ingest_window`.)
- Acks are idempotent: acking an unknown, already-acked or never-delivered record changes nothing.
- No new batch is sent while ``unacked >= max_unacked`` (so the bound can be passed by at most one batch).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Protocol

Position = tuple[int, int]
START: Position = (0, 0)


class ConsumerExists(Exception):
    """A consumer of that name is already attached to the subscription."""


@dataclass(frozen=True, slots=True)
class StoredBatch:
    """One appended batch as stored: its id in the shard, record count and opaque payload."""

    batch_id: int
    size: int
    payload: bytes

    def __post_init__(self) -> None:
        if self.batch_id < 1 or self.size < 1:
            raise ValueError("a stored batch has a positive id and at least one record")


class BatchSource(Protocol):
    """Where the state machine reads batches from (the LMDB store, or a dict in tests)."""

    def next_batch(self, shard_id: int, min_batch_id: int) -> StoredBatch | None:
        """The first batch of ``shard_id`` whose id is ``>= min_batch_id``, if any."""
        ...


@dataclass(frozen=True, slots=True)
class Delivery:
    """One response to send: records ``indices`` of ``batch`` of ``shard_id`` to ``consumer``."""

    consumer: str
    shard_id: int
    batch: StoredBatch
    indices: tuple[int, ...]
    resend: bool

    @property
    def whole_batch(self) -> bool:
        return len(self.indices) == self.batch.size


@dataclass(slots=True)
class _InFlight:
    batch: StoredBatch
    unacked: set[int]
    deadline: float


@dataclass(slots=True)
class _Shard:
    committed: Position
    read_from: int
    owner: str | None = None
    inflight: dict[int, _InFlight] = field(default_factory=dict)


class SubscriptionState:
    """Assignment, delivery and acknowledgement of one subscription (see the module invariants)."""

    def __init__(
        self,
        committed: Mapping[int, Position],
        *,
        ack_timeout: float,
        max_unacked: int,
        redeliver_at_once: bool = True,
    ) -> None:
        """Args:
        committed: every shard of the stream with its committed position.
        ack_timeout: seconds a sent record may stay unacked before it is sent again.
        max_unacked: bound of sent-but-unacked records.
        redeliver_at_once: make a consumer's unacked records due at once when it leaves or loses a shard
            to a rebalance (False: only at their deadline).
        """
        if ack_timeout <= 0 or max_unacked < 1:
            raise ValueError("ack_timeout and max_unacked must be positive")
        self.ack_timeout = ack_timeout
        self.max_unacked = max_unacked
        self.redeliver_at_once = redeliver_at_once
        self._shards = {sid: _Shard(pos, max(pos[0], 1)) for sid, pos in sorted(committed.items())}
        self._consumers: list[str] = []
        self._unacked = 0
        self._changed: set[int] = set()

    # -- queries ----------------------------------------------------------------------------------------

    @property
    def consumers(self) -> list[str]:
        return list(self._consumers)

    @property
    def unacked(self) -> int:
        return self._unacked

    def owner(self, shard_id: int) -> str | None:
        return self._shards[shard_id].owner

    def assignment(self) -> dict[str, list[int]]:
        """Consumer name → the shards it owns (every attached consumer appears)."""
        owned: dict[str, list[int]] = {name: [] for name in self._consumers}
        for sid, shard in self._shards.items():
            if shard.owner is not None:
                owned[shard.owner].append(sid)
        return owned

    def committed(self) -> dict[int, Position]:
        return {sid: shard.committed for sid, shard in self._shards.items()}

    def acked_below(self) -> dict[int, int]:
        """Per shard, a batch id below which every record is acked (GetSubscription's offsets): the first
        sent batch with a record still unacked, else the committed position's batch. Never more, so a
        consumer may rely on it: no record before a sent batch at or below it is unacked."""
        below: dict[int, int] = {}
        for sid, shard in self._shards.items():
            below[sid] = next(
                (batch_id for batch_id, inflight in shard.inflight.items() if inflight.unacked),
                shard.committed[0],
            )
        return below

    def take_changed(self) -> dict[int, Position]:
        """Committed positions that moved since the last call (to persist them)."""
        changed = {sid: self._shards[sid].committed for sid in sorted(self._changed)}
        self._changed.clear()
        return changed

    def add_shard(self, shard_id: int, committed: Position = START) -> None:
        """A shard added to the stream while the subscription runs (read from ``committed``); it gets an
        owner at the next poll. A shard already known is left as it is."""
        if shard_id not in self._shards:
            self._shards[shard_id] = _Shard(committed, max(committed[0], 1))

    # -- consumers --------------------------------------------------------------------------------------

    def join(self, name: str) -> None:
        """Attach a consumer; it gets unowned shards at the next poll, others at a rebalance.

        Raises:
            ConsumerExists: the name is taken.
        """
        if name in self._consumers:
            raise ConsumerExists(name)
        self._consumers.append(name)

    def leave(self, name: str) -> None:
        """Detach a consumer (unknown names are ignored); its shards wait for another owner."""
        if name not in self._consumers:
            return
        self._consumers.remove(name)
        for shard in self._shards.values():
            if shard.owner == name:
                shard.owner = None
                self._owner_changed(shard)

    def rebalance(self) -> list[int]:
        """Give unowned shards out, then move shards until owned counts differ by at most one.

        A moved shard's unacked records are due at once for its new owner (``redeliver_at_once``): sent
        before its newer batches, so the new owner sees the shard in order. The previous owner's acks
        still count (acks are idempotent).

        Returns:
            The shards that changed owner from one consumer to another.
        """
        self._assign_unowned()
        moved: list[int] = []
        while self._consumers:
            owned = self.assignment()
            most = max(owned, key=lambda name: len(owned[name]))
            least = min(owned, key=lambda name: len(owned[name]))
            if len(owned[most]) - len(owned[least]) <= 1:
                break
            sid = max(owned[most])
            self._shards[sid].owner = least
            self._owner_changed(self._shards[sid])
            moved.append(sid)
        return moved

    def _owner_changed(self, shard: _Shard) -> None:
        if self.redeliver_at_once:
            for inflight in shard.inflight.values():
                inflight.deadline = float("-inf")

    def _assign_unowned(self) -> None:
        if not self._consumers:
            return
        owned = self.assignment()
        for sid, shard in self._shards.items():
            if shard.owner is None:
                least = min(owned, key=lambda name: len(owned[name]))
                shard.owner = least
                owned[least].append(sid)

    # -- acks -------------------------------------------------------------------------------------------

    def ack(self, record_ids: Iterable[tuple[int, int, int]]) -> int:
        """Acknowledge ``(shard_id, batch_id, index)`` records; returns how many were newly acked."""
        newly = 0
        touched: set[int] = set()
        for shard_id, batch_id, index in record_ids:
            shard = self._shards.get(shard_id)
            inflight = shard.inflight.get(batch_id) if shard is not None else None
            if inflight is None or index not in inflight.unacked:
                continue
            inflight.unacked.discard(index)
            newly += 1
            touched.add(shard_id)
        self._unacked -= newly
        for shard_id in touched:
            self._advance(shard_id)
        return newly

    def _advance(self, shard_id: int) -> None:
        shard = self._shards[shard_id]
        batch_id, index = shard.committed
        for inflight_id in list(shard.inflight):
            inflight = shard.inflight[inflight_id]
            index = index if inflight_id == batch_id else 0
            batch_id = inflight_id
            while index < inflight.batch.size and index not in inflight.unacked:
                index += 1
            if index < inflight.batch.size:
                break
            del shard.inflight[inflight_id]
        if (batch_id, index) != shard.committed:
            shard.committed = (batch_id, index)
            self._changed.add(shard_id)

    # -- delivery ---------------------------------------------------------------------------------------

    def poll(self, now: float, source: BatchSource, max_new_batches: int = 256) -> list[Delivery]:
        """What to send now: due resends first, then new batches round-robin over the owned shards."""
        self._assign_unowned()
        out: list[Delivery] = []
        for sid, shard in self._shards.items():
            if shard.owner is None:
                continue
            for inflight in shard.inflight.values():
                if inflight.unacked and inflight.deadline <= now:
                    inflight.deadline = now + self.ack_timeout
                    indices = tuple(sorted(inflight.unacked))
                    out.append(Delivery(shard.owner, sid, inflight.batch, indices, resend=True))
        budget = max_new_batches
        progressed = True
        while progressed and budget > 0 and self._unacked < self.max_unacked:
            progressed = False
            for sid, shard in self._shards.items():
                if budget <= 0 or self._unacked >= self.max_unacked:
                    break
                if shard.owner is None:
                    continue
                batch = source.next_batch(sid, shard.read_from)
                if batch is None:
                    continue
                progressed = True
                shard.read_from = batch.batch_id + 1
                first = shard.committed[1] if batch.batch_id == shard.committed[0] else 0
                if first >= batch.size:
                    continue
                indices = tuple(range(first, batch.size))
                shard.inflight[batch.batch_id] = _InFlight(batch, set(indices), now + self.ack_timeout)
                self._unacked += len(indices)
                budget -= 1
                out.append(Delivery(shard.owner, sid, batch, indices, resend=False))
        return out
