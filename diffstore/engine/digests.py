"""A digest per committed generation: an order-independent sum that proves two stores hold the same records.

The digest of a collection at generation G is the sum, modulo 2^128, of ``layout.record_digest`` over the
live records visible at G, with their number. Every commit -- manual, automatic, and a replica's apply --
stores it for the generation it makes current (``digests`` table, in the commit's own transaction), computed
from the generation's changes alone: the previous generation's digest, minus the hash of each key's version
the generation replaced, plus the hash of its new one. A commit costs O(changes), never O(collection).

What it costs (benchmarks/integrity.py): the hashes are BLAKE2b-128 computed in the compiled accelerator
(``_accel.digest_*``; the Python code here is their twin), so a bulk load's commit would still pay a
read-back pass over what it wrote; instead each put that *appends* new rows (past the table's last key,
a bulk load's shape) sums them while it has them, in a pending row of the open generation
(``layout.digest_pending_key``: open seq, writes covered, records, sum). A commit takes that sum when it
covers every write of the generation and the generation before held no live record (so nothing was
replaced); any other write, an abort, and a backup's emptying of an open generation drop it, and the
commit then reads its changes as above.

The hash covers the key's form and its stored value, not its seq, so a replica, whose seqs may differ from its
primary's, stores the same digests (``diffstore check --url R --against P`` compares them).

Invariants:

- A collection's first generation (seq 0) holds nothing when it is created: its row is ``(0, 0)``.
- A generation has a row only when the generation before it had one (a store written before digests existed
  has none: its digests are *unknown* and stay so until :func:`fill` computes them; ``diffstore migrate``).
- GC removes versions, not digests: the digest of a collected generation stays readable. :func:`recompute`
  can only re-derive the digests at or above the GC floor, where every version and its predecessor is kept.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import lmdb

from diffstore.engine import changes, history, layout
from diffstore.engine.meta import CollectionMeta
from diffstore.engine.tables import Tables, resolve_seq
from diffstore.engine.types import GenerationDigest
from diffstore.errors import text_form

if TYPE_CHECKING:
    from diffstore.engine._accel import SortedRows  # the compiled accelerator's (it may not be built)

MOD = 1 << (8 * layout.DIGEST_BYTES)
START = -1
"""The key :func:`verify` takes the start row (``layout.digest_start_key``) under."""


def stored(txn: lmdb.Transaction, tables: Tables, meta: CollectionMeta, seq: int) -> tuple[int, int] | None:
    """(live records, digest) stored for generation ``seq``, None when there is none."""
    raw = txn.get(layout.digest_key(meta.cid_prefix, seq), db=tables.digests)
    return None if raw is None else layout.unpack_digest(bytes(raw))


def record_commit(txn: lmdb.Transaction, tables: Tables, meta: CollectionMeta, seq: int) -> None:
    """Stores the digest of generation ``seq``, being committed in ``txn`` on top of ``meta.generation_seq``
    (the same seq: a replica's first copy, written into the initial generation, which so held nothing).

    Nothing is stored when the previous generation has no digest (an older store: unknown stays unknown).
    """
    if seq == meta.generation_seq:
        base: tuple[int, int] | None = (0, 0)
    else:
        base = stored(txn, tables, meta, meta.generation_seq)
    if base is None:
        return
    records, digest = base
    head_prefix = meta.records_prefix
    encoded = layout.record_seq(seq)
    pending = _take_pending(txn, tables, meta)
    if records == 0 and pending is not None and pending[:2] == (seq, meta.next_count):
        # every write of this generation appended new rows and summed them (record_put), on top of a
        # generation with no live record (so what they replaced were tombstones, whose hash is 0)
        txn.put(
            layout.digest_key(meta.cid_prefix, seq),
            layout.pack_digest(pending[2], (digest + pending[3]) % MOD),
            db=tables.digests,
        )
        return
    cursor = txn.cursor(db=tables.records)
    set_key, prev, key, value = cursor.set_key, cursor.prev, cursor.key, cursor.value
    added: list[tuple[bytes, bytes]] = []
    removed: list[tuple[bytes, bytes]] = []
    # nothing live before (a first load): every older version is a tombstone, whose hash is 0 -- no look-up
    replaces = records > 0
    if not replaces and meta.next_keys and txn.stat(tables.records)["entries"] <= 2 * meta.next_keys:
        # and the whole table is at most twice what this generation wrote: one forward pass over the
        # collection's rows costs less than a search per key, and stays O(changes)
        count, total = _first_load(cursor, head_prefix, encoded)
        txn.put(
            layout.digest_key(meta.cid_prefix, seq),
            layout.pack_digest(records + count, (digest + total) % MOD),
            db=tables.digests,
        )
        return
    forms = changes.forms(txn, tables, meta.cid_prefix, seq)
    accel = layout.ACCEL
    if accel is not None:  # the loop below in C (it runs once per key a generation wrote)
        (added_count, added_sum), (removed_count, removed_sum) = accel.digest_changes(
            cursor, head_prefix, forms, encoded, replaces
        )
        digest += added_sum - removed_sum
        records += added_count - removed_count
        txn.put(
            layout.digest_key(meta.cid_prefix, seq),
            layout.pack_digest(records, digest % MOD),
            db=tables.digests,
        )
        return
    # the pairs are hashed and summed in one call (pair_sums): a hash call with its int conversion per key
    # cost more than the rest of the loop
    for form in forms:
        head = head_prefix + form
        if not set_key(head + encoded):
            continue  # not written after all (a run entry without its record is check's to report)
        added.append((form, value()))
        if replaces and prev() and key().startswith(head):
            removed.append((form, value()))
    added_count, added_sum = pair_sums(added)
    removed_count, removed_sum = pair_sums(removed)
    digest += added_sum - removed_sum
    records += added_count - removed_count
    txn.put(
        layout.digest_key(meta.cid_prefix, seq), layout.pack_digest(records, digest % MOD), db=tables.digests
    )


def record_put(
    txn: lmdb.Transaction, tables: Tables, meta: CollectionMeta, seq: int, appended: SortedRows | None
) -> None:
    """Keeps the open generation ``seq``'s pending digest delta (``layout.digest_pending_key``) across a
    write, before the write is counted (``meta`` as it was): ``appended`` holds the write's rows when
    each was new (appended past the table's last key), None when the write took another way.

    A bulk load's commit then needs no pass over what it wrote: its rows were hashed here, in C, while
    they were at hand. The delta holds while every write of the generation appended: it counts the writes
    it covers, and a commit uses it only when that is the generation's count (record_commit); any other
    write drops it. Only with the accelerator (in Python the commit's own pass costs the same)."""
    key = layout.digest_pending_key(meta.cid_prefix)
    accel = layout.ACCEL
    if meta.next_count == 0:
        pending: tuple[int, int, int, int] | None = (seq, 0, 0, 0)
    else:
        raw = txn.get(key, db=tables.digests)
        pending = None if raw is None else layout.unpack_pending(bytes(raw))
    if appended is None or accel is None or pending is None or pending[:2] != (seq, meta.next_count):
        txn.delete(key, db=tables.digests)
        return
    count, total = appended.digest()  # digest_rows over its records(), without making them
    txn.put(
        key,
        layout.pack_pending(seq, pending[1] + len(appended), pending[2] + count, (pending[3] + total) % MOD),
        db=tables.digests,
    )


def drop_pending(txn: lmdb.Transaction, tables: Tables, meta: CollectionMeta) -> None:
    """Forgets the pending digest delta (record_put) of an open generation being dropped (an abort)."""
    txn.delete(layout.digest_pending_key(meta.cid_prefix), db=tables.digests)


def _take_pending(
    txn: lmdb.Transaction, tables: Tables, meta: CollectionMeta
) -> tuple[int, int, int, int] | None:
    """The pending row (record_put), deleted: a commit ends what it covered."""
    key = layout.digest_pending_key(meta.cid_prefix)
    raw = txn.get(key, db=tables.digests)
    if raw is None:
        return None
    txn.delete(key, db=tables.digests)
    return layout.unpack_pending(bytes(raw))


def pair_sums(pairs: list[tuple[bytes, bytes]]) -> tuple[int, int]:
    """(live records, sum of their ``layout.record_digest`` mod 2^128) of (key form, stored value) pairs
    (tombstones count for nothing); in C when the accelerator was built (``digest_pairs``)."""
    accel = layout.ACCEL
    if accel is not None:
        return accel.digest_pairs(pairs)
    hashes = [layout.record_digest(form, raw) for form, raw in pairs]
    return sum(1 for h in hashes if h), sum(hashes) % MOD


def _first_load(cursor: lmdb.Cursor, prefix: bytes, encoded: bytes) -> tuple[int, int]:
    """(live records, sum of their hashes mod 2^128) of the versions written in the seq ``encoded`` among
    the rows of ``prefix``; in C when the accelerator was built (``digest_rows``, the same sums)."""
    if not cursor.set_range(prefix):
        return 0, 0
    accel = layout.ACCEL
    if accel is not None:
        return accel.digest_rows(cursor, prefix, encoded)
    hash_of = layout.record_digest
    cut = len(encoded)
    start = len(prefix)
    count = total = 0
    for raw_key, raw in cursor:
        if not raw_key.startswith(prefix):
            break
        if raw_key.endswith(encoded) and len(raw_key) >= start + cut:
            found = hash_of(raw_key[start:-cut], raw)
            count += found != 0
            total += found
    return count, total % MOD


def at(txn: lmdb.Transaction, tables: Tables, meta: CollectionMeta, generation_id: bytes) -> GenerationDigest:
    """The digest of the committed state visible at ``generation_id`` (that of the newest committed
    generation at or below it)."""
    seq = resolve_seq(txn, tables, meta, generation_id)
    return _digest(generation_id, (0, 0) if seq < 0 else stored(txn, tables, meta, seq))


def newest_first(
    txn: lmdb.Transaction, tables: Tables, meta: CollectionMeta, before: bytes | None, limit: int
) -> tuple[list[GenerationDigest], bool]:
    """Up to ``limit`` committed generations below ``before`` (None: from the current one), newest first,
    each with its digest; and whether more remain."""
    walk = history.newest_first(txn, tables, meta, before)
    found: list[GenerationDigest] = []
    for seq, generation_id in walk:
        if len(found) == limit:
            return found, True
        found.append(_digest(generation_id, stored(txn, tables, meta, seq)))
    return found, False


def _digest(generation_id: bytes, found: tuple[int, int] | None) -> GenerationDigest:
    if found is None:
        return GenerationDigest(generation_id, None, None)
    return GenerationDigest(generation_id, found[0], found[1].to_bytes(layout.DIGEST_BYTES, "big"))


@dataclass(slots=True)
class Recomputed:
    """Digests re-derived from the records of one collection: ``by_seq`` maps each committed seq at or above
    ``floor_seq`` (where every version a digest needs is kept) to (live records, digest)."""

    by_seq: dict[int, tuple[int, int]]
    floor_seq: int


def recompute(txn: lmdb.Transaction, tables: Tables, meta: CollectionMeta, seqs: list[int]) -> Recomputed:
    """The digests of committed generations ``seqs`` (ascending) re-derived from one pass over the
    collection's records: per seq, the sum of what it changed; the current one's is the sum of them all
    (each key's changes telescope to its newest version), and each older one's is that minus the changes
    above it."""
    hash_of = layout.record_digest
    delta: dict[int, int] = {}
    counted: dict[int, int] = {}
    current = meta.generation_seq
    previous_head = b""
    previous_hash = 0
    for raw_key, raw_value in _records(txn, tables, meta):
        head = layout.record_head_of(raw_key)
        seq = layout.read_record_seq(raw_key[len(head) :])
        if seq > current:
            continue
        if head != previous_head:
            previous_head, previous_hash = head, 0
        value_hash = hash_of(layout.record_form(raw_key), raw_value)
        delta[seq] = delta.get(seq, 0) + value_hash - previous_hash
        counted[seq] = counted.get(seq, 0) + (value_hash != 0) - (previous_hash != 0)
        previous_hash = value_hash
    return telescope(txn, tables, meta, seqs, delta, counted)


def telescope(
    txn: lmdb.Transaction,
    tables: Tables,
    meta: CollectionMeta,
    seqs: list[int],
    delta: dict[int, int],
    counted: dict[int, int],
) -> Recomputed:
    """The digests of committed generations ``seqs`` (ascending) from what each seq changed (``delta``: the
    sum of its versions' hashes minus those of the versions they replaced; ``counted``: the same for live
    records), as :func:`recompute` sums them over the records (check.py sums them in its own pass)."""
    current = meta.generation_seq
    digest, records = sum(delta.values()), sum(counted.values())
    floor_seq = _floor_seq(txn, tables, meta)
    by_seq: dict[int, tuple[int, int]] = {}
    for seq in reversed(seqs):
        if seq > current:
            continue
        if seq < floor_seq:
            break
        by_seq[seq] = (records, digest % MOD)
        digest -= delta.get(seq, 0)
        records -= counted.get(seq, 0)
    return Recomputed(by_seq, floor_seq)


def fill(txn: lmdb.Transaction, tables: Tables, meta: CollectionMeta) -> int:
    """Stores the digest of every committed generation that has none and that the kept records can still
    prove (at or above the GC floor); returns how many it stored."""
    seqs = sorted(seq for seq, _ in history.newest_first(txn, tables, meta))
    missing = [seq for seq in seqs if stored(txn, tables, meta, seq) is None]
    if not missing:
        return 0
    derived = recompute(txn, tables, meta, seqs)
    filled = 0
    for seq in missing:
        if seq in derived.by_seq:
            records, digest = derived.by_seq[seq]
            txn.put(
                layout.digest_key(meta.cid_prefix, seq),
                layout.pack_digest(records, digest),
                db=tables.digests,
            )
            filled += 1
    if derived.by_seq:  # from the lowest proven generation on, every committed one has its digest now
        txn.put(layout.digest_start_key(meta.cid_prefix), layout.u64(min(derived.by_seq)), db=tables.digests)
    return filled


def _floor_seq(txn: lmdb.Transaction, tables: Tables, meta: CollectionMeta) -> int:
    """The lowest seq whose digest the kept records prove: GC's horizon (0 when it never acted)."""
    if meta.gc_horizon is None:
        return 0
    return max(0, resolve_seq(txn, tables, meta, meta.gc_horizon))


def _records(txn: lmdb.Transaction, tables: Tables, meta: CollectionMeta) -> Iterator[tuple[bytes, bytes]]:
    prefix = meta.records_prefix
    cursor = txn.cursor(db=tables.records)
    if not cursor.set_range(prefix):
        return
    for raw_key, raw_value in cursor:
        if not raw_key.startswith(prefix):
            return
        yield raw_key, raw_value


def verify(
    txn: lmdb.Transaction,
    tables: Tables,
    meta: CollectionMeta,
    gens: dict[int, bytes],
    rows: dict[int, bytes],
    bad: Callable[[str], None],
    derived: Recomputed | None = None,
) -> int:
    """Checks a collection's ``digests`` rows (``rows``: seq -> stored row, the start row under
    :data:`START`) against its generations
    ``gens`` (seq -> id) and against the digests re-derived from its records (``derived``, when the caller
    re-derived them already: :func:`telescope`); calls ``bad`` with each
    problem and returns how many committed generations predate digests (no row below the first one)."""
    committed = sorted(seq for seq in gens if seq <= meta.generation_seq)
    start_row = rows.pop(START, None)
    start = layout.read_u64(start_row) if start_row is not None and len(start_row) == 8 else None
    if start_row is not None and start is None:
        bad(f"{meta.name!r}: the digests' start row is {start_row.hex()}, not a seq")
    if start is None and rows:
        bad(f"{meta.name!r}: {len(rows)} digest rows without the row that says where they start")
    unpacked: dict[int, tuple[int, int]] = {}
    for seq, raw in sorted(rows.items()):
        if seq not in gens or seq > meta.generation_seq:
            bad(f"{meta.name!r}: digest row #{seq} names no committed generation")
            continue
        try:
            unpacked[seq] = layout.unpack_digest(raw)
        except ValueError as exc:
            bad(f"{meta.name!r}: the digest row of {text_form(gens[seq])} (#{seq}) does not unpack ({exc})")
    first = start if start is not None else min(unpacked, default=None)
    if first is None:
        return len(committed)
    for seq in committed:
        if seq >= first and seq not in rows:
            bad(f"{meta.name!r}: committed generation {text_form(gens[seq])} (#{seq}) has no digest row")
    if derived is None:
        derived = recompute(txn, tables, meta, committed)
    for seq, (records, digest) in sorted(derived.by_seq.items()):
        found = unpacked.get(seq)
        if found is not None and found != (records, digest):
            bad(
                f"{meta.name!r}: the digest of generation {text_form(gens[seq])} (#{seq}) is"
                f" {found[0]} records {found[1]:032x}, its records give {records} records {digest:032x}"
            )
    return sum(1 for seq in committed if seq < first)


def fill_all(env: lmdb.Environment, tables: Tables) -> dict[str, int]:
    """:func:`fill` for every collection, each in its own write transaction (an old store's upgrade,
    ``diffstore migrate``); returns how many digests each collection got (those that got some)."""
    with env.begin() as txn:
        names = [
            bytes(n).decode() for n, _ in txn.cursor(db=tables.collections) if layout.is_collection_row(n)
        ]
    filled: dict[str, int] = {}
    for name in names:
        with env.begin(write=True) as txn:
            raw = txn.get(name.encode(), db=tables.collections)
            if raw is None:
                continue  # deleted meanwhile
            count = fill(txn, tables, CollectionMeta.unpack(name, bytes(raw)))
        if count:
            filled[name] = count
    return filled
