"""The exactly-once round, written once: a generation of a manual collection that commits its writes
together with the readers recording how far its inputs were applied.

Three fronts use it over any :class:`~diffstore.collection.Collection` (the engine's or the HTTP
client's): stream ingestion (SPEC §5, one round per window), the A+B→C transform (SPEC §6, one round per
iteration, written by Spark executors) and the consumer's checkpoint (one round per window, no records).

A round:

1. :meth:`Round.next` reads the collection's current and open generations and picks the next id
   (:func:`next_generation_id`);
2. :meth:`Round.start` opens it with ``abortOutdated``, which discards a crashed writer's leftovers;
3. the front writes into it;
4. :meth:`Round.commit` commits it together with the reader updates (with compare-and-set expectations
   where the front has them) -- the records and the readers move in one storage transaction, or neither;
5. on any failure :meth:`Round.abort` drops the generation if it is still the open one.

A front that holds all of a round's records at once (an ingestion window, a checkpoint) does 2--4 in one
call, :meth:`Round.write`: on the engine one storage transaction, one durable commit instead of three.

A round may carry a lease's fencing token (:mod:`diffstore.lease_keeper`): its start, writes, commit and abort
are then refused with ``LeaseLost`` once another owner took the lease. The store makes that so whatever
the ids (the open generation remembers the token it was started under, and a newer owner's start drops
it, see :mod:`diffstore.engine.leases`), so the front must pass :attr:`Round.lease` on every write into
the round's generation. The generation id also ends with the lease version (8 bytes, before any other
nonce), so that rounds of two owners never share an id (which the logs and lineage show).

Invariants:
    * Generation ids: an 8-byte big-endian counter, one above the first 8 bytes (zero-padded) of the larger
      of the current and the open generation, followed by a nonce (empty unless the front may race
      another writer of the same collection). The counter alone sorts above both, whatever their length,
      so the new id is always greater; ids of a front's collection therefore look like ``00..01``,
      ``00..02`` (ingestion, the consumer's checkpoints), ``00..01`` + 8 random bytes (the transform) or
      ``00..01`` + batch id + run tag (the Structured Streaming sink, whose tasks start the generation
      and whose driver commits it, so it uses the id scheme and :func:`ensure_readers` only).
    * Reader names (wire facts, see :func:`shard_reader`, :func:`source_reader` and
      :func:`checkpoint_reader`): each front names its readers after what they track.
    * :func:`ensure_readers` creates missing readers with a null generation and refuses a reader whose
      target is not the expected one (it would record another input's progress).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from diffstore.collection import Collection
from diffstore.engine.types import LeaseToken, PutItem, Reader, ReaderUpdateLike
from diffstore.errors import DiffstoreError, InvalidRequest, ReaderExists

COUNTER_BYTES = 8


def next_generation_id(current: bytes, next_open: bytes | None = None, nonce: bytes = b"") -> bytes:
    """The id of the next round's generation: above both ``current`` and ``next_open``.

    Args:
        current: the collection's committed generation.
        next_open: its open generation, if any (a round discards it with ``abortOutdated``).
        nonce: appended to the counter; racing writers pass random bytes so they never share a generation.

    Returns:
        ``counter + 1`` of the larger id's first 8 bytes (zero-padded), big-endian, then ``nonce``.

    Raises:
        OverflowError: the larger id starts with eight ``0xff`` bytes (the counter is exhausted).
    """
    base = max(current, next_open) if next_open is not None else current
    counter = int.from_bytes(base[:COUNTER_BYTES].ljust(COUNTER_BYTES, b"\0"), "big") + 1
    if counter >= 1 << (8 * COUNTER_BYTES):
        raise OverflowError("the collection's generation counter is exhausted")
    return counter.to_bytes(COUNTER_BYTES, "big") + nonce


# -- reader names (SPEC §5, §6) -----------------------------------------------------------------------


def shard_reader(subscription_id: str, shard_id: int) -> str:
    """Ingestion: the reader holding a shard's last applied RecordId, ``hstream/<sub>/<shard>`` (SPEC §5)."""
    return f"hstream/{subscription_id}/{shard_id}"


def shard_reader_target(stream_name: str) -> str:
    """Ingestion: the target of the shard readers, ``hstream://<stream>``."""
    return f"hstream://{stream_name}"


def source_reader(alias: str) -> str:
    """The transform: the reader of source ``alias`` in the target, ``from_<alias>`` (SPEC §6)."""
    return f"from_{alias}"


def checkpoint_reader(source: str) -> str:
    """The consumer: the reader of source collection ``source`` in its checkpoint collection (its name)."""
    return source


def ensure_readers(collection: Collection, targets: Mapping[str, str]) -> dict[str, Reader]:
    """The readers named in ``targets`` (name → target) as stored, creating missing ones (null).

    A reader created meanwhile by a racing writer is fine.

    Raises:
        InvalidRequest: a reader exists with another target.
    """
    stored = {r.name: r for r in collection.readers()}
    missing = [name for name in targets if name not in stored]
    for name in missing:
        with contextlib.suppress(ReaderExists):
            collection.create_reader(name, targets[name], None)
    if missing:
        stored = {r.name: r for r in collection.readers()}
    for name, target in targets.items():
        if stored[name].collection != target:
            raise InvalidRequest(f"reader {name!r} targets {stored[name].collection!r}, not {target!r}")
    return {name: stored[name] for name in targets}


# -- the round ----------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Round:
    """One generation of ``collection`` that commits together with reader updates (see the module doc).

    Attributes:
        collection: a manual collection.
        generation_id: the generation this round writes.
        base_generation_id: the collection's current generation when the round was planned (reads "as
            before this round" use it).
        lease: a fencing token carried by start and commit (see the module), or None.
    """

    collection: Collection
    generation_id: bytes
    base_generation_id: bytes
    lease: LeaseToken | None = None

    @classmethod
    def next(cls, collection: Collection, nonce: bytes = b"", lease: LeaseToken | None = None) -> Round:
        """The round after the collection's current and open generations (fenced by ``lease`` if given)."""
        current, next_open = collection.generation_state()
        if lease is not None:
            nonce = lease.version.to_bytes(COUNTER_BYTES, "big") + nonce
        return cls(collection, next_generation_id(current, next_open, nonce), current, lease)

    def start(self) -> None:
        """Opens the generation, discarding an older open one (a crashed writer's)."""
        self.collection.start_generation(self.generation_id, abort_outdated=True, lease=self.lease)

    def commit(self, updates: Iterable[ReaderUpdateLike], metadata: dict[str, str] | None = None) -> None:
        """Commits the generation and moves the readers, in one transaction (a failed CAS: neither);
        ``metadata`` is kept with the generation (SPEC §8)."""
        self.collection.commit_generation(
            self.generation_id, update_readers=updates, lease=self.lease, metadata=metadata
        )

    def write(
        self,
        items: Sequence[PutItem],
        updates: Iterable[ReaderUpdateLike],
        metadata: dict[str, str] | None = None,
    ) -> None:
        """Start, write ``items``, commit with ``updates`` (and ``metadata``) in one call
        (:meth:`Collection.write_generation`: one storage transaction on the engine); a failure aborts what
        is left open and re-raises."""
        try:
            self.collection.write_generation(
                self.generation_id, items, updates, abort_outdated=True, lease=self.lease, metadata=metadata
            )
        except BaseException:
            self.abort()
            raise

    def abort(self) -> bool:
        """Drops the generation if it is still the open one.

        Returns:
            True when it was aborted; False when it was not open any more (another writer took the
            collection over, or it was committed or aborted) or the abort failed -- nothing of this round
            is visible either way (the next start discards a leftover).
        """
        try:
            if self.collection.generation_state()[1] != self.generation_id:
                return False
            self.collection.abort_generation(self.generation_id, lease=self.lease)
        except DiffstoreError:
            return False
        return True

    def run(
        self,
        updates: Iterable[ReaderUpdateLike],
        write: Callable[[bytes], object] | None = None,
        metadata: dict[str, str] | None = None,
    ) -> None:
        """Start, ``write(generation_id)``, commit with ``updates`` (and ``metadata``); any failure aborts
        and re-raises.

        ``write`` must carry :attr:`lease` on its writes (a generation started under a lease refuses
        writes without it).
        """
        self.start()
        try:
            if write is not None:
                write(self.generation_id)
            self.commit(updates, metadata)
        except BaseException:
            self.abort()
            raise
