"""Commit history (SPEC §8): when each generation was committed, how many keys it changed, and the metadata
a manual commit carried.

Every commit -- manual, automatic (by the background, or at once when the open generation is full, so
ingestion windows and transform rounds too), and a replica's apply -- writes one ``commits`` row for the
generation it makes current, in the commit's own transaction: the row exists exactly when the commit
happened. A store written before this row existed has none for its old generations: their time, count
and metadata read as None (unknown), never as a guess.

``changedKeys`` counts the distinct keys the generation wrote (its ``changes`` rows: a key written twice
into one generation counts once, a tombstone counts as a change). The writes count them as they add the
rows (``CollectionMeta.next_keys``), so a commit costs the same whatever it commits; only an open
generation written before that count was kept has its rows read once at commit.

The rows go with their collection (the purge of a dropped collection removes every row of its cid); GC
of old versions keeps them, as it keeps the generations themselves (they stay listed, reads there 410).
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator
from dataclasses import replace

import lmdb

from diffstore.engine import changes, layout
from diffstore.engine.meta import CollectionMeta
from diffstore.engine.tables import Tables
from diffstore.engine.types import GenerationInfo, wall_clock_ms
from diffstore.errors import InvalidRequest, NoSuchGeneration

MAX_METADATA_BYTES = 4096
"""A commit's metadata, encoded as compact UTF-8 JSON (as it travels), at most this many bytes."""


def validate_metadata(metadata: object) -> dict[str, str] | None:
    """``metadata`` as stored: None, or a flat map of strings of at most :data:`MAX_METADATA_BYTES`.

    Raises:
        InvalidRequest: not a map of strings to strings, or too large.
    """
    if metadata is None:
        return None
    if not isinstance(metadata, dict) or not all(
        isinstance(key, str) and isinstance(value, str) for key, value in metadata.items()
    ):
        raise InvalidRequest("metadata must be a flat map of strings to strings")
    try:
        size = len(json.dumps(metadata, ensure_ascii=False, separators=(",", ":")).encode("utf-8"))
    except UnicodeEncodeError as exc:
        raise InvalidRequest("metadata must be valid UTF-8") from exc
    if size > MAX_METADATA_BYTES:
        raise InvalidRequest(f"metadata is {size} bytes encoded, over the limit of {MAX_METADATA_BYTES}")
    return dict(metadata)


def changed_keys(txn: lmdb.Transaction, tables: Tables, meta: CollectionMeta, seq: int) -> int:
    """How many distinct keys generation ``seq`` wrote."""
    return changes.count(txn, tables, meta.cid_prefix, seq)


def record(
    txn: lmdb.Transaction,
    tables: Tables,
    meta: CollectionMeta,
    seq: int,
    now_ms: int | None = None,
    metadata: dict[str, str] | None = None,
    changed: int | None = None,
) -> None:
    """Writes the commit row of generation ``seq`` (being committed in ``txn``).

    ``now_ms`` None: the wall clock (callers pass their store config's clock); ``changed`` None:
    counted here (the open generation's ``next_keys``, when known, is that count).
    """
    at_ms = wall_clock_ms() if now_ms is None else now_ms
    count = changed_keys(txn, tables, meta, seq) if changed is None else changed
    txn.put(
        layout.commit_key(meta.cid_prefix, seq), layout.pack_commit(at_ms, count, metadata), db=tables.commits
    )


def info(
    txn: lmdb.Transaction, tables: Tables, meta: CollectionMeta, seq: int, generation_id: bytes
) -> GenerationInfo:
    """What is known of committed generation ``seq`` (None fields: committed before the row existed)."""
    raw = txn.get(layout.commit_key(meta.cid_prefix, seq), db=tables.commits)
    if raw is None:
        return GenerationInfo(generation_id)
    at_ms, count, metadata = layout.unpack_commit(raw)
    return GenerationInfo(generation_id, at_ms, count, metadata)


def newest_first(
    txn: lmdb.Transaction, tables: Tables, meta: CollectionMeta, before: bytes | None = None
) -> Iterator[tuple[int, bytes]]:
    """``(seq, generation_id)`` of the committed generations below ``before`` (None: from the current
    one), newest first. Collected generations are listed too (reads there answer 410)."""
    prefix = meta.cid_prefix
    cursor = txn.cursor(db=tables.gens)
    if not cursor.set_key(layout.gen_key(prefix, meta.generation_seq)):
        return
    while True:
        generation_id = bytes(cursor.value())
        if before is None or generation_id < before:
            yield layout.read_u64(cursor.key()[len(prefix) :]), generation_id
        if not cursor.prev() or not cursor.key().startswith(prefix):
            return


def committed(
    txn: lmdb.Transaction,
    tables: Tables,
    meta: CollectionMeta,
    before: bytes | None,
    limit: int,
    floor: bytes | None = None,
) -> tuple[list[GenerationInfo], bool]:
    """Up to ``limit`` committed generations below ``before`` (None: from the current one), newest first,
    with what is known of each, and whether more remain. Collected generations are listed too, marked
    ``collected`` when below ``floor`` (the readable floor: reads there answer 410)."""
    walk = newest_first(txn, tables, meta, before)
    found = [info(txn, tables, meta, seq, generation) for seq, generation in itertools.islice(walk, limit)]
    if floor:
        found = [replace(item, collected=True) if item.generation_id < floor else item for item in found]
    return found, next(walk, None) is not None


def generation_at(txn: lmdb.Transaction, tables: Tables, meta: CollectionMeta, at_ms: int) -> bytes:
    """The newest committed generation committed at or before ``at_ms`` (its reads answer 410 when it was
    collected). Generations without a commit row (unknown time) are passed over.

    Raises:
        NoSuchGeneration: none was committed by then (as far as the rows tell).
    """
    for seq, generation_id in newest_first(txn, tables, meta):
        raw = txn.get(layout.commit_key(meta.cid_prefix, seq), db=tables.commits)
        if raw is not None and layout.unpack_commit(raw)[0] <= at_ms:
            return generation_id
    raise NoSuchGeneration(f"no generation of {meta.name!r} was committed at or before {at_ms} ms")
