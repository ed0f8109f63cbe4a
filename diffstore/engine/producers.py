"""Producer sequence-number dedup (SPEC §1, in the manner of YDB topics).

A producer's row keeps the last seqNo of committed writes and, separately, the last seqNo written into
a generation that was still open at the time (``pending``, with that generation's seq). The pending
number counts once its generation is committed; if the generation was aborted (its seq is no longer
registered) it is forgotten, so a retried write of an aborted generation is not mistaken for a
duplicate. Phantom writes never commit, so their seqNos count at once.
"""

from __future__ import annotations

import struct

import lmdb

from diffstore.engine import layout
from diffstore.engine.meta import CollectionMeta
from diffstore.engine.tables import Tables
from diffstore.errors import InvalidRequest

_ROW = struct.Struct(">QQQ")  # committed seqNo, pending seqNo, seq of the pending generation
_NO_GENERATION = (1 << 64) - 1


def validate(producer_id: str | None, seq_no: int | None) -> bool:
    """True when the write carries a producer position (both or neither must be given)."""
    if producer_id is None and seq_no is None:
        return False
    if producer_id is None or seq_no is None:
        raise InvalidRequest("producerId and seqNo go together")
    if not isinstance(producer_id, str) or not 1 <= len(producer_id.encode()) <= 255:
        raise InvalidRequest("producerId must be 1..255 bytes of UTF-8")
    if isinstance(seq_no, bool) or not isinstance(seq_no, int) or not 1 <= seq_no < 1 << 63:
        raise InvalidRequest("seqNo must be an integer >= 1")
    return True


def _settled(
    txn: lmdb.Transaction, tables: Tables, meta: CollectionMeta, raw: bytes | None
) -> tuple[int, int, int]:
    """(committed, pending, pending generation) with a finished pending generation folded in."""
    if raw is None:
        return 0, 0, _NO_GENERATION
    committed, pending, pending_seq = _ROW.unpack(raw)
    if pending_seq == _NO_GENERATION or pending_seq == meta.next_seq:
        return committed, pending, pending_seq
    if pending_seq <= meta.generation_seq and txn.get(
        layout.gen_key(meta.cid_prefix, pending_seq), db=tables.gens
    ):
        committed = max(committed, pending)
    return committed, 0, _NO_GENERATION


def last_seq_no(txn: lmdb.Transaction, tables: Tables, meta: CollectionMeta, producer_id: str) -> int:
    """The last seqNo a new write must exceed (writes of the open generation included)."""
    raw = txn.get(layout.producer_key(meta.cid_prefix, producer_id), db=tables.producers)
    committed, pending, _ = _settled(txn, tables, meta, raw)
    return max(committed, pending)


def admit(
    txn: lmdb.Transaction,
    tables: Tables,
    meta: CollectionMeta,
    producer_id: str,
    seq_no: int,
    generation_seq: int | None,
) -> bool:
    """Records ``seq_no`` for a write into ``generation_seq`` (None: phantom); False if it is a duplicate."""
    key = layout.producer_key(meta.cid_prefix, producer_id)
    committed, pending, pending_seq = _settled(txn, tables, meta, txn.get(key, db=tables.producers))
    if seq_no <= max(committed, pending):
        return False
    if generation_seq is None:
        committed = seq_no
    else:
        pending, pending_seq = seq_no, generation_seq
    txn.put(key, _ROW.pack(committed, pending, pending_seq), db=tables.producers)
    return True


def forget_pending(txn: lmdb.Transaction, tables: Tables, meta: CollectionMeta, generation_seq: int) -> None:
    """Forgets the seqNos pending in generation ``generation_seq``, whose records were dropped while it
    stays registered (a backup empties a non-manual collection's open generation): a retry of those
    writes must be written, not skipped as a duplicate."""
    prefix = meta.cid_prefix
    cursor = txn.cursor(db=tables.producers)
    found = cursor.set_range(prefix)
    while found and cursor.key().startswith(prefix):
        committed, _, pending_seq = _ROW.unpack(cursor.value())
        if pending_seq == generation_seq:
            cursor.put(cursor.key(), _ROW.pack(committed, 0, _NO_GENERATION))
        found = cursor.next()


def check_row(raw: bytes, meta: CollectionMeta) -> str | None:
    """What is wrong with a stored producer row of ``meta`` (None: nothing), for ``diffstore check``."""
    if len(raw) != _ROW.size:
        return f"holds {len(raw)} bytes, not {_ROW.size}"
    _, pending, pending_seq = _ROW.unpack(raw)
    if pending_seq == _NO_GENERATION:
        return None if pending == 0 else f"has seqNo {pending} pending in no generation"
    if pending_seq > meta.last_seq:
        return f"has seqNo {pending} pending in generation #{pending_seq}, never handed out"
    return None
