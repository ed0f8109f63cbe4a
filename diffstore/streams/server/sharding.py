"""Hash-range sharding of SPEC §4: MD5 of the partition key, split [0, 2^128−1] evenly over N shards.

Pure functions; the server uses them to lay out a new stream's shards, tests use them to predict where a
key lands.
"""

from __future__ import annotations

import hashlib

HASH_MAX = (1 << 128) - 1


def key_hash(partition_key: str) -> int:
    """The 128-bit big-endian MD5 of a partition key's UTF-8 bytes (the default key is ``""``)."""
    return int.from_bytes(hashlib.md5(partition_key.encode("utf-8")).digest(), "big")


def hash_ranges(shard_count: int) -> list[tuple[int, int]]:
    """Inclusive ``(start, end)`` ranges of a stream of ``shard_count`` shards.

    Raises:
        ValueError: ``shard_count`` is not positive.
    """
    if shard_count < 1:
        raise ValueError("shard count must be positive")
    cnt = HASH_MAX // shard_count
    ranges = [(i * cnt, i * cnt + cnt - 1) for i in range(shard_count)]
    ranges[-1] = (ranges[-1][0], HASH_MAX)
    return ranges


def shard_index(ranges: list[tuple[int, int]], partition_key: str) -> int:
    """Index into ``ranges`` of the range holding ``partition_key``'s hash."""
    h = key_hash(partition_key)
    for index, (start, end) in enumerate(ranges):
        if start <= h <= end:
            return index
    raise ValueError("hash ranges do not cover the hash space")
