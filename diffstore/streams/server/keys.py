"""The binary key layout of the stream server's LMDB environment, in one place.

Integers are big-endian and fixed-width so that LMDB's bytewise order is the numeric order: a shard's
batches sort by batch id, a subscription's positions by shard id.

    meta       b"next_shard_id" | b"next_batch_id"  → u64
    streams    stream name (UTF-8)                    → msgpack map
    shards     shard id u64                           → msgpack map
    batches    shard id u64 · batch id u64            → record count u32 · serialized BatchedRecord
    subs       subscription id (UTF-8)                → msgpack map
    positions  len u16 · subscription id · shard u64  → batch id u64 · index u32
"""

from __future__ import annotations

import struct

DB_NAMES = (b"meta", b"streams", b"shards", b"batches", b"subs", b"positions")
NEXT_SHARD_ID = b"next_shard_id"
NEXT_BATCH_ID = b"next_batch_id"

_U64 = struct.Struct(">Q")
_U16 = struct.Struct(">H")
_BATCH_KEY = struct.Struct(">QQ")
_COUNT = struct.Struct(">I")
_POSITION = struct.Struct(">QI")


def u64(value: int) -> bytes:
    return _U64.pack(value)


def parse_u64(raw: bytes) -> int:
    return int(_U64.unpack(raw)[0])


def batch_key(shard_id: int, batch_id: int) -> bytes:
    return _BATCH_KEY.pack(shard_id, batch_id)


def parse_batch_key(raw: bytes) -> tuple[int, int]:
    shard_id, batch_id = _BATCH_KEY.unpack(raw)
    return int(shard_id), int(batch_id)


def batch_value(size: int, record: bytes) -> bytes:
    return _COUNT.pack(size) + record


def parse_batch_value(raw: bytes) -> tuple[int, bytes]:
    return int(_COUNT.unpack_from(raw)[0]), bytes(raw[_COUNT.size :])


def subscription_prefix(subscription_id: str) -> bytes:
    encoded = subscription_id.encode("utf-8")
    return _U16.pack(len(encoded)) + encoded


def position_key(subscription_id: str, shard_id: int) -> bytes:
    return subscription_prefix(subscription_id) + _U64.pack(shard_id)


def parse_position_key(raw: bytes) -> tuple[str, int]:
    (length,) = _U16.unpack_from(raw)
    name = raw[_U16.size : _U16.size + length].decode("utf-8")
    return name, parse_u64(raw[_U16.size + length :])


def position_value(batch_id: int, index: int) -> bytes:
    return _POSITION.pack(batch_id, index)


def parse_position_value(raw: bytes) -> tuple[int, int]:
    batch_id, index = _POSITION.unpack(raw)
    return int(batch_id), int(index)
