"""Retention: the history a collection keeps beyond what its readers need (SPEC §9 "Retention").

A collection's policy (:class:`~diffstore.engine.types.RetentionPolicy`, stored in its metadata row) names
the oldest generation GC must keep, its *retention floor*:

- ``keep_generations`` N: the N-th newest committed generation (the current one is the first);
- ``keep_ms`` T: the newest generation committed at or before ``now - T`` -- the one current when the window
  began, so that a read as of any instant in the window still works (a generation with no commit row, from
  a store older than commit times, counts as committed before any window);
- both: the lower of the two (a generation either keeps is kept); fewer generations than asked: ``b""``
  (all of them).

GC collects below ``min(readers' minimum, retention floor)`` and reads answer ``generationCollected`` below
the same point (never below what GC already removed: the horizon only rises). The floor of ``keep_ms``
moves with the clock, so GC, which looks again every ``gc_interval_ms``, collects a generation once it
leaves the window, with no write needed to wake it.

Cost: finding the floor walks the generations it keeps, newest first (stopping at the GC horizon, below
which nothing can be kept anyway), so it grows with the number of kept generations, never with the size
of the collection; it is cached until a commit, GC or (for a time window) the clock changes it, so reads
pay for it once. The disk keeps every version written in a kept generation.
"""

from __future__ import annotations

import lmdb

from diffstore.engine import history, layout
from diffstore.engine.meta import CollectionMeta
from diffstore.engine.tables import Tables
from diffstore.engine.types import RetentionPolicy


def effective(policy: RetentionPolicy | None) -> RetentionPolicy | None:
    """``policy`` as stored: None when it keeps nothing."""
    return None if policy is None or policy.empty else policy


_CACHE_SIZE = 4096
_NEVER = 1 << 63


def floor(txn: lmdb.Transaction, tables: Tables, meta: CollectionMeta, now_ms: int) -> bytes | None:
    """The oldest generation ``meta``'s policy keeps (None: it has none, so it keeps nothing).

    A result at or below the GC horizon means "everything still there" (the walk stops at the horizon).
    Every read asks, so the answer is cached (``Tables.retention_cache``): a hit costs no walk.
    """
    policy = meta.retention
    if policy is None or policy.empty:
        return None
    cache = tables.retention_cache
    if len(cache) >= _CACHE_SIZE:
        cache.clear()
    key = (meta.cid, meta.generation_seq, meta.gc_horizon)
    found: list[bytes] = []
    if policy.keep_generations is not None:
        count_key = ("n", *key, policy.keep_generations)
        hit = cache.get(count_key)
        if hit is None:
            hit = cache[count_key] = (_by_count(txn, tables, meta, policy.keep_generations), -_NEVER, _NEVER)
        found.append(hit[0])
    if policy.keep_ms is not None:
        cutoff = now_ms - policy.keep_ms
        time_key = ("t", *key, policy.keep_ms)
        hit = cache.get(time_key)
        if hit is None or not hit[1] <= cutoff < hit[2]:
            hit = cache[time_key] = _by_time(txn, tables, meta, cutoff)
        found.append(hit[0])
    return min(found)


def lower(
    limit: bytes | None, txn: lmdb.Transaction, tables: Tables, meta: CollectionMeta, now_ms: int
) -> bytes | None:
    """``limit`` (a readers' minimum; None: none) lowered to the retention floor; None stays None (no
    reader targets the collection: GC does not run, whatever the policy)."""
    if limit is None:
        return None
    kept = floor(txn, tables, meta, now_ms)
    return limit if kept is None else min(limit, kept)


def _stop(meta: CollectionMeta, generation_id: bytes) -> bool:
    return meta.gc_horizon is not None and generation_id <= meta.gc_horizon


def _by_count(txn: lmdb.Transaction, tables: Tables, meta: CollectionMeta, count: int) -> bytes:
    seen = 0
    for _seq, generation_id in history.newest_first(txn, tables, meta):
        seen += 1
        if seen >= count or _stop(meta, generation_id):
            return generation_id
    return b""


def _by_time(
    txn: lmdb.Transaction, tables: Tables, meta: CollectionMeta, cutoff_ms: int
) -> tuple[bytes, int, int]:
    """The newest generation committed at or before ``cutoff_ms``, and the cutoffs ``[low, high)`` for
    which that is still the answer (from its commit time up to the earliest commit time passed over)."""
    prefix = meta.cid_prefix
    high = _NEVER
    for seq, generation_id in history.newest_first(txn, tables, meta):
        raw = txn.get(layout.commit_key(prefix, seq), db=tables.commits)
        if raw is None or _stop(meta, generation_id):
            return generation_id, -_NEVER, high
        at_ms = layout.unpack_commit(raw)[0]
        if at_ms <= cutoff_ms:
            return generation_id, at_ms, high
        high = min(high, at_ms)
    return b"", -_NEVER, high
