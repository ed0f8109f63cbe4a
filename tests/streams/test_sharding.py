"""Hash-range sharding (SPEC §4): the ranges of N shards and the shard of a partition key."""

from __future__ import annotations

import hashlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from diffstore.streams._proto import hstream_pb2 as pb
from diffstore.streams.sharding import HASH_SPACE_MAX, ShardMap, key_hash, shard_ranges


def test_shard_ranges_follow_the_spec_rule() -> None:
    n = 3
    cnt = HASH_SPACE_MAX // n
    ranges = shard_ranges(n)
    assert ranges[0] == (0, cnt - 1)
    assert ranges[1] == (cnt, 2 * cnt - 1)
    assert ranges[2] == (2 * cnt, HASH_SPACE_MAX)
    assert shard_ranges(1) == [(0, HASH_SPACE_MAX)]


def test_shard_map_picks_the_range_holding_the_md5() -> None:
    ranges = shard_ranges(4)
    shard_map = ShardMap.from_ranges((100 + i, s, e) for i, (s, e) in enumerate(ranges))
    for key in ["", "a", "key-17", "\u00e9t\u00e9"]:
        h = int(hashlib.md5(key.encode()).hexdigest(), 16)
        assert key_hash(key) == h
        expected = next(100 + i for i, (s, e) in enumerate(ranges) if s <= h <= e)
        assert shard_map.shard_for_key(key) == expected
    assert shard_map.shard_for_hash(HASH_SPACE_MAX) == 103
    assert shard_map.shard_for_hash(0) == 100
    protos = [
        pb.Shard(shardId=100 + i, startHashRangeKey=str(s), endHashRangeKey=str(e), isActive=True)
        for i, (s, e) in enumerate(ranges)
    ]
    assert ShardMap.from_protos(reversed(protos)) == shard_map


@pytest.mark.parametrize("count", [1, 2, 3, 7])
def test_shard_ranges_cover_the_space_without_overlap(count: int) -> None:
    ranges = shard_ranges(count)
    cnt = HASH_SPACE_MAX // count
    assert ranges[0][0] == 0 and ranges[-1][1] == HASH_SPACE_MAX
    assert all(ranges[i][0] == i * cnt for i in range(count))
    assert all(ranges[i][1] + 1 == ranges[i + 1][0] for i in range(count - 1))


@given(st.text(max_size=30), st.integers(1, 8))
def test_a_key_lands_in_the_range_of_its_md5(key: str, count: int) -> None:
    h = int(hashlib.md5(key.encode()).hexdigest(), 16)
    assert key_hash(key) == h
    ranges = shard_ranges(count)
    shard = ShardMap.from_ranges((i, s, e) for i, (s, e) in enumerate(ranges)).shard_for_key(key)
    assert ranges[shard][0] <= h <= ranges[shard][1]
