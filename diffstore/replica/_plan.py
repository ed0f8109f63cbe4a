"""The follower's decisions, without I/O: what to apply next, what to copy, how far behind it is.

The follower (:mod:`diffstore.replica._follow`) feeds these functions what it read from the primary and
the replica's store and does what they answer. Invariants they keep:

- A collection's position on the replica is its current generation there (the ids are the primary's);
  it only moves in the engine's apply transaction, so after any crash the next step starts from it.
- The generations applied after position R are exactly the primary's committed generations above R, in
  order; if R is not one of them (the collection was deleted and created again on the primary, or the
  primary lost history), the replica's copy is dropped and taken again.
- The replica's own readers on its primary (named :data:`READER_PREFIX` + replica id) are never copied:
  they mean something on the primary only (see ``docs/replicas.md``).
"""

from __future__ import annotations

from dataclasses import dataclass

from diffstore.engine.readers import HOLD_PREFIX
from diffstore.engine.types import Lease, Reader

READER_PREFIX = HOLD_PREFIX  # the engine treats them as holds: they keep GC back, reads do not see them


def reader_name(replica_id: str) -> str:
    """The reader a replica holds in each collection of its primary, at the generation it has copied."""
    return READER_PREFIX + replica_id


@dataclass(slots=True)
class Pending:
    """Walks the primary's generation pages (newest first) back to the replica's position.

    Feed pages to :meth:`page` until it returns True; then ``found`` says whether the position is one of
    the primary's generations and ``ahead`` holds the generations above it, oldest first.
    """

    position: bytes
    ahead: list[bytes]
    found: bool = False

    @classmethod
    def after(cls, position: bytes) -> Pending:
        return cls(position, [])

    def page(self, ids: list[bytes], more: bool) -> bool:
        """Takes one page; True when the walk is over (the position was reached, or nothing older is left)."""
        for generation_id in ids:
            if generation_id <= self.position:
                self.found = generation_id == self.position
                self.ahead.reverse()
                return True
            self.ahead.append(generation_id)
        if not more:
            self.ahead.reverse()
            return True
        return False


def reader_copies(readers: list[Reader]) -> list[Reader]:
    """The primary's readers a replica holds: all but replicas' own."""
    return sorted((r for r in readers if not r.name.startswith(READER_PREFIX)), key=lambda r: r.name)


def copies_differ(
    primary: list[Reader], leases: list[Lease], local: list[Reader], local_leases: list[Lease]
) -> bool:
    """Whether the replica's readers or leases differ from the primary's (then they are copied again)."""
    key = lambda r: r.name  # noqa: E731
    return reader_copies(primary) != sorted(local, key=key) or sorted(leases, key=key) != sorted(
        local_leases, key=key
    )
