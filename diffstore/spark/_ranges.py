"""Routing rows to Spark partitions by key range, without a sampling job.

``repartitionByRange`` samples its input first, which evaluates the whole upstream plan once more. The
transform already knows good cut points (those of its diff reads), so rows are routed by an expression
instead: a key in range ``i`` gets a small integer *label* and ``repartition(n, label)`` hashes it.
Spark's hash partitioning puts a row in partition ``pmod(murmur3(label, seed 42), n)``; the labels are
chosen so that range ``i``'s label lands in partition ``i``, hence each partition holds one key range.

If the labels ever missed (another Spark hash), rows would still be partitioned by label, only less
evenly: correctness never depends on it.
"""

from __future__ import annotations

from collections.abc import Sequence

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

_MASK = 0xFFFFFFFF
_SEED = 42  # Spark's HashPartitioning uses Murmur3Hash with seed 42


def _rotl(value: int, bits: int) -> int:
    return ((value << bits) | (value >> (32 - bits))) & _MASK


def murmur3_int(value: int, seed: int = _SEED) -> int:
    """Spark's ``Murmur3_x86_32.hashInt`` of a 32-bit int (what ``F.hash`` gives an int column)."""
    k1 = (value & _MASK) * 0xCC9E2D51 & _MASK
    k1 = _rotl(k1, 15) * 0x1B873593 & _MASK
    h1 = (seed & _MASK) ^ k1
    h1 = (_rotl(h1, 13) * 5 + 0xE6546B64) & _MASK
    h1 ^= 4
    h1 ^= h1 >> 16
    h1 = h1 * 0x85EBCA6B & _MASK
    h1 ^= h1 >> 13
    h1 = h1 * 0xC2B2AE35 & _MASK
    h1 ^= h1 >> 16
    return h1 - (1 << 32) if h1 >= 1 << 31 else h1


def partition_labels(count: int) -> list[int]:
    """``labels[i]``: the smallest non-negative int that Spark's hash partitioning sends to partition i."""
    labels: dict[int, int] = {}
    value = 0
    while len(labels) < count:
        labels.setdefault(murmur3_int(value) % count, value)
        value += 1
    return [labels[i] for i in range(count)]


def range_label(key: Column, cuts: Sequence[bytes]) -> Column:
    """The label of the range ``key`` falls in: ``[None, c1)`` → labels[0] ... ``[cN, None)`` → labels[N]."""
    labels = partition_labels(len(cuts) + 1)
    expression = F.lit(labels[-1])
    for cut, label in reversed(list(zip(cuts, labels, strict=False))):
        expression = F.when(key < F.lit(cut), F.lit(label)).otherwise(expression)
    return expression


def by_key_range(frame: DataFrame, key: str, cuts: Sequence[bytes]) -> DataFrame:
    """``frame`` in ``len(cuts) + 1`` partitions, partition ``i`` holding the keys of range ``i``."""
    if not cuts:
        return frame.repartition(1)
    return frame.repartition(len(cuts) + 1, range_label(F.col(key), cuts))
