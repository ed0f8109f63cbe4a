"""Hash-range sharding of SPEC §4, used by the client (which shard a key goes to) and the server (the
ranges of a new stream's shards).

Invariants:
- A partition key's UTF-8 bytes → MD5 → 128-bit big-endian integer picks the shard whose inclusive
  ``[start, end]`` hash range holds it; the default partition key is ``""``.
- ``N`` shards split ``[0, 2^128 − 1]`` into ranges of ``(2^128 − 1) // N`` hashes, the last one
  stretched to the end of the space.
"""

from __future__ import annotations

import bisect
import hashlib
from collections.abc import Iterable
from dataclasses import dataclass

from diffstore.streams._proto import hstream_pb2 as pb

HASH_SPACE_MAX = (1 << 128) - 1

SHARD_ADMIN_SERVICE = "diffstore.streams.ShardAdmin"
"""The embedded server's gRPC service beyond HStream: ``SplitShard`` (request ``Shard`` naming
``streamName`` and ``shardId``; answer the stream's ``ListShardsResponse`` after the split)."""
SPLIT_SHARD_METHOD = f"/{SHARD_ADMIN_SERVICE}/SplitShard"


def key_hash(partition_key: str) -> int:
    """MD5 of the key's UTF-8 bytes as a 128-bit big-endian integer."""
    return int.from_bytes(hashlib.md5(partition_key.encode()).digest(), "big")


def shard_ranges(shard_count: int) -> list[tuple[int, int]]:
    """The inclusive ``(start, end)`` hash range of each of ``shard_count`` shards.

    Raises:
        ValueError: ``shard_count`` is not positive.
    """
    if shard_count < 1:
        raise ValueError("a stream has at least one shard")
    cnt = HASH_SPACE_MAX // shard_count
    ranges = [(i * cnt, i * cnt + cnt - 1) for i in range(shard_count)]
    ranges[-1] = (ranges[-1][0], HASH_SPACE_MAX)
    return ranges


@dataclass(frozen=True, slots=True)
class ShardMap:
    """Picks a shard for a partition key from the shards' hash ranges (as ListShards returns them)."""

    starts: tuple[int, ...]
    ends: tuple[int, ...]
    shard_ids: tuple[int, ...]

    @classmethod
    def from_ranges(cls, shards: Iterable[tuple[int, int, int]]) -> ShardMap:
        """Builds from ``(shard_id, start, end)`` triples."""
        ordered = sorted(shards, key=lambda s: s[1])
        if not ordered:
            raise ValueError("a stream has at least one shard")
        return cls(
            starts=tuple(s[1] for s in ordered),
            ends=tuple(s[2] for s in ordered),
            shard_ids=tuple(s[0] for s in ordered),
        )

    @classmethod
    def from_protos(cls, shards: Iterable[pb.Shard]) -> ShardMap:
        """Builds from ``Shard`` messages (range keys are decimal strings)."""
        listed = list(shards)
        active = [s for s in listed if s.isActive] or listed
        return cls.from_ranges((s.shardId, int(s.startHashRangeKey), int(s.endHashRangeKey)) for s in active)

    def shard_for_hash(self, h: int) -> int:
        i = bisect.bisect_right(self.starts, h) - 1
        if i < 0 or h > self.ends[i]:
            raise ValueError(f"no shard covers hash {h}")
        return self.shard_ids[i]

    def shard_for_key(self, partition_key: str) -> int:
        """The shard id of ``partition_key``."""
        return self.shard_for_hash(key_hash(partition_key))
