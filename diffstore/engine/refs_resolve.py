"""Resolving a parsed ref (:mod:`diffstore.engine.refs`) to a generation of a collection, in one read.

Resolution answers as a read at the resolved generation would: a generation below the readers' minimum
is ``generationCollected`` (410), an id above the current one that is not the open one is
``noSuchGeneration``. A reader at the beginning (null) resolves to ``""`` (a diff may start there).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import lmdb

from diffstore.engine import history, layout
from diffstore.engine.meta import CollectionMeta
from diffstore.engine.readers import load_reader, readable_floor, readers_targeting
from diffstore.engine.refs import AsOf, Back, Current, Open, ReaderPosition, Ref
from diffstore.engine.tables import (
    Tables,
    check_not_collected,
    load_meta,
    require_known,
    validate_generation_id,
)
from diffstore.engine.types import ResolvedRef
from diffstore.errors import InvalidRequest, NoSuchCollection, NoSuchGeneration, NoSuchReader


def resolve(
    txn: lmdb.Transaction, tables: Tables, meta: CollectionMeta, ref: Ref
) -> ResolvedRef:
    """The generation ``ref`` names in ``meta``'s collection, and its commit time (None: not committed, or
    committed before commit times were recorded).

    Raises:
        NoSuchGeneration: no open generation, ~N beyond the history, a time before the first commit, an id
            above the current one that is not the open one. GenerationCollected: below the readers'
            minimum. NoSuchReader: no such reader targets the collection. InvalidRequest: a reader name
            that several collections own.
    """
    if isinstance(ref, Open):
        if meta.next is None:
            raise NoSuchGeneration(f"collection {meta.name!r} has no open generation")
        return ResolvedRef(meta.next, None)
    if isinstance(ref, Current):
        generation_id = meta.generation
    elif isinstance(ref, Back):
        generation_id = _back(txn, tables, meta, ref.commits)
    elif isinstance(ref, AsOf):
        # a time in the future names the current generation, as asOfMs reads (SPEC §8: the newest
        # generation committed at or before the instant): one rule for both, and no refusal of a
        # client whose clock runs ahead of the server's
        try:
            generation_id = history.generation_at(txn, tables, meta, ref.at_ms)
        except NoSuchGeneration as exc:
            raise NoSuchGeneration(
                f"no generation of {meta.name!r} was committed at or before {_iso(ref.at_ms)}"
            ) from exc
    elif isinstance(ref, ReaderPosition):
        generation_id = _reader_position(txn, tables, meta, ref) or b""
    else:
        generation_id = ref.generation_id
        validate_generation_id(generation_id)
        require_known(meta, generation_id)
        if generation_id == meta.next:
            return ResolvedRef(generation_id, None)
    # a reader at the beginning names "" (where a diff may start), which GC cannot take away
    floor = readable_floor(txn, tables, meta)
    check_not_collected(meta, generation_id, floor, allow_beginning=isinstance(ref, ReaderPosition))
    return ResolvedRef(generation_id, _committed_at(txn, tables, meta, generation_id))


def _back(txn: lmdb.Transaction, tables: Tables, meta: CollectionMeta, commits: int) -> bytes:
    cursor = txn.cursor(db=tables.gens)
    found = cursor.set_key(layout.gen_key(meta.cid_prefix, meta.generation_seq))
    for _ in range(commits):
        found = found and cursor.prev() and cursor.key().startswith(meta.cid_prefix)
        if not found:
            break
    if not found:
        raise NoSuchGeneration(
            f"collection {meta.name!r} has fewer than {commits} commits before the current one"
        )
    return bytes(cursor.value())


def _reader_position(
    txn: lmdb.Transaction, tables: Tables, meta: CollectionMeta, ref: ReaderPosition
) -> bytes | None:
    if ref.owner is not None:
        try:
            owner = load_meta(txn, tables, ref.owner)
        except NoSuchCollection:
            owner = None
        reader = None if owner is None else load_reader(txn, tables, owner, ref.name)
        if reader is None or reader.collection != meta.name:
            raise NoSuchReader(f"collection {ref.owner!r} has no reader {ref.name!r} of {meta.name!r}")
        return reader.generation_id
    targeting = readers_targeting(txn, tables, meta.name)
    found = {reader.owner_cid: reader.generation_id for reader in targeting if reader.name == ref.name}
    if not found:
        raise NoSuchReader(f"no reader {ref.name!r} targets {meta.name!r}")
    if len(found) > 1:
        owners = ", ".join(sorted(_names_of(txn, tables, set(found))))
        raise InvalidRequest(
            f"readers named {ref.name!r} of {meta.name!r} are owned by {owners}: "
            f"name one as @reader:OWNER/{ref.name}"
        )
    return next(iter(found.values()))


def _names_of(txn: lmdb.Transaction, tables: Tables, cids: set[int]) -> list[str]:
    names = []
    for raw_name, raw in txn.cursor(db=tables.collections):
        if layout.is_collection_row(raw_name) and CollectionMeta.unpack(raw_name.decode(), raw).cid in cids:
            names.append(raw_name.decode())
    return names


def _committed_at(
    txn: lmdb.Transaction, tables: Tables, meta: CollectionMeta, generation_id: bytes
) -> int | None:
    raw_seq = txn.get(layout.gen_id_key(meta.cid_prefix, generation_id), db=tables.gen_ids)
    if raw_seq is None:
        return None
    return history.info(txn, tables, meta, layout.read_u64(raw_seq), generation_id).committed_at_ms


def _iso(at_ms: int) -> str:
    """``at_ms`` as an ISO time in UTC, to the millisecond (as a person gave it, not as Unix ms)."""
    instant = datetime.fromtimestamp(at_ms // 1000, UTC) + timedelta(milliseconds=at_ms % 1000)
    return instant.isoformat(timespec="milliseconds").replace("+00:00", "Z")
