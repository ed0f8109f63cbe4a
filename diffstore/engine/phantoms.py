"""A phantom's changes: what its private writes change for reads at a generation, key by key.

A read at generation G carrying a phantom sees, per key, the phantom's newest record at or below G when
it is at least as new as the base record there (SPEC §1). The *changes* of the phantom at G are the keys
where that read and the same read without the phantom disagree: ``from_value`` is what the base shows at
G, ``to_value`` what the phantom shows (None for absent or a tombstone). A phantom record that a newer base
record hides, or that writes the value the base already has, is no change. This is what a transform
preview reads of a source: "if this phantom were committed on top of G, these keys would change".

Unlike :func:`diffstore.engine.reads.read_point`, an id that is not a live phantom of this collection is
refused: silently reading the base would make a preview of a typo or an expired phantom look like "no
changes". Ids carry their collection (:func:`diffstore.engine.layout.phantom_of`), so a phantom started
on another collection is named as such.

A page's work and memory grow with the phantom's records from its first key to just past its last one
(a whole long-key group at most), never with the collection's size nor with the rest of the phantom --
and a page examines at most :data:`SCAN_MAX` of the phantom's records: a phantom of many records that
change nothing (a preview that rewrote every value as it was) answers a page early, with fewer than
``limit`` changes (none, perhaps) and the ``next_key`` to go on from.
"""

from __future__ import annotations

import lmdb
import msgpack

from diffstore.engine import layout
from diffstore.engine.meta import CollectionMeta
from diffstore.engine.reads import read_point
from diffstore.engine.tables import Tables, generation_of_seq
from diffstore.engine.types import DiffItem, PhantomChanges
from diffstore.engine.visibility import (
    ReadPoint,
    base_version,
    live_phantom,
    lower_form,
    phantom_version,
    upper_form,
)
from diffstore.errors import InvalidRequest

SCAN_MAX = 10_000
"""The phantom records one page examines at most (then it answers with the key to go on from)."""


def live_phantom_of(txn: lmdb.Transaction, tables: Tables, meta: CollectionMeta, phantom_id: bytes) -> int:
    """The phantom number of ``phantom_id`` when it is a started, unexpired phantom of this collection.

    Raises:
        InvalidRequest: not bytes of 1..255, not an id this server makes, another collection's phantom,
            or never started here / expired.
    """
    if not isinstance(phantom_id, bytes) or not 1 <= len(phantom_id) <= 255:
        raise InvalidRequest("phantomId must be 1..255 bytes")
    number = layout.phantom_number(phantom_id)
    if number is None:
        raise InvalidRequest("phantomId is not a phantom id of this server (phantom/start makes 8-byte ids)")
    owner = layout.phantom_owner(number)
    if owner is not None and owner != meta.cid:
        raise InvalidRequest(f"phantomId names a phantom of another collection, not of {meta.name!r}")
    if live_phantom(txn, tables, meta, phantom_id) is None:
        raise InvalidRequest(f"phantomId is not a live phantom of {meta.name!r} (never started, or expired)")
    return number


def changes_page(
    txn: lmdb.Transaction,
    tables: Tables,
    meta: CollectionMeta,
    phantom_id: bytes,
    generation_id: bytes | None,
    from_key: bytes | None,
    to_key: bytes | None,
    limit: int,
) -> PhantomChanges:
    """Up to ``limit`` changes of the phantom at ``generation_id`` (default: current) in ``[from_key,
    to_key)``, in key order; ``next_key`` is the first key of the next page (None: this is the last)."""
    live_phantom_of(txn, tables, meta, phantom_id)
    point = read_point(txn, tables, meta, generation_id, phantom_id)
    found, resume = _changes(txn, tables, point, from_key, to_key, limit)
    changes = sorted(found)
    page = changes[:limit]
    next_key = changes[limit].key if len(changes) > limit else resume
    return PhantomChanges(point.generation_id, page, next_key)


def _changes(
    txn: lmdb.Transaction,
    tables: Tables,
    point: ReadPoint,
    from_key: bytes | None,
    to_key: bytes | None,
    limit: int,
) -> tuple[list[DiffItem], bytes | None]:
    """The changes in the range, in form order, stopping once ``limit + 1`` are found at a short key: every
    later key is then above them all (forms sort like keys outside long-key groups), so a page costs its
    own records, not the rest of the phantom. Also stops at the first short key past :data:`SCAN_MAX`
    records examined, and then returns that key (examined by the next page) with the changes before it."""
    assert point.phantom is not None
    prefix = layout.phantom_prefix(point.meta.cid_prefix, point.phantom)
    records = txn.cursor(db=tables.records)
    upper = upper_form(to_key)
    found: list[DiffItem] = []
    cursor = txn.cursor(db=tables.phantoms)
    if not cursor.set_range(prefix + lower_form(from_key)):
        return found, None
    examined = 0
    for raw_key, raw in cursor:
        if not raw_key.startswith(prefix):
            break
        form = raw_key[len(prefix) :]
        if upper is not None and form >= upper:
            break
        examined += 1
        if examined > SCAN_MAX and not layout.is_long_form(form):
            resume = layout.short_key_of_form(form)
            if from_key is None or resume > from_key:  # always a step forward
                return found, resume
        version = phantom_version(msgpack.unpackb(raw), point.generation_id)
        if version is None:
            continue  # every record of the phantom for this key is above the read's generation
        phantom_generation, phantom_raw = version
        key = layout.key_of(form, phantom_raw)
        if from_key is not None and key < from_key:
            continue
        if to_key is not None and key >= to_key:
            continue  # a long key of the group that straddles to_key (forms sort like keys elsewhere)
        base = base_version(records, point.meta.records_prefix, form, point.seq)
        if base is not None and phantom_generation < generation_of_seq(txn, tables, point.meta, base[0]):
            continue  # a newer base record hides the phantom's
        before = None if base is None else layout.decode_value(base[1])
        after = layout.decode_value(phantom_raw)
        if before != after:
            found.append(DiffItem(key, before, after))
            if len(found) > limit and not layout.is_long_form(form):
                break
    return found, None
