"""``check``'s scan of its two big tables: every version in ``records`` and every entry of the generations'
runs (``changes``, ``change_chunks``), each read once, in key order, through one cursor, with no look-up
per row (check.py runs the rules of every other table).

A record and its run entry sit far apart (``records`` is ordered by key, a run by generation), so instead
of looking each up in the other, the scan keeps per collection and per registered generation (a
*bucket*; one more, the *stray* bucket, for seqs that no ``gens`` row registers) how many records and how
many run entries it met, and a 64-bit sum of a hash of their key forms. A bucket whose two sides agree
holds the same key forms on both sides (a record without its entry, or an entry without its record,
changes the count or the sum); only a bucket that differs is searched entry by entry (:func:`search`), to
name each record and entry that has no partner, with the messages the row-by-row check always gave.

The same pass re-derives the digests: per bucket the sum that ``digests.recompute`` keeps (each version's
hash minus that of the version before it), so check needs no second pass over the records.

The per-row loops have a compiled twin (``_accel.check_records``, ``_accel.check_runs``) used when it was
built: the same buckets (with its own hash of a form) and the same rows handed back. A row that breaks a
rule of its own (its shape, its collection, its generation, its value; a chunk that does not unpack or
overlaps the one before) is *flagged*: handed back to :func:`record_problems` and :func:`run_problems`,
which name what is wrong -- one place for both loops, so their reports are the same. A row's parsing is
one function in each loop (``read_record_row`` and ``read_run_row`` in C; :func:`read_record_row` and
the head of :func:`_runs` here): a per-row verification belongs there, flagging the row, and in
:func:`record_problems` / :func:`run_problems`, naming what it found.

So a records row's checksum (its sealed value, ``layout.py``) is verified where the row is read: a seal
that fails flags the row, and so does a plain row in a store marked sealed; a plain row in a store that
predates checksums is counted (``check_rows.RowSeals``: the note check gives); record_problems names the
seal's problem as ``check_rows`` words it. Every rule on a value, and the digests, read its plain form
(``layout.plain``): a seal is no part of what a record holds, and a replica's digest equals its primary's.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field

import lmdb

from diffstore.engine import check_rows, digests, layout
from diffstore.engine.meta import CollectionMeta
from diffstore.engine.tables import Tables
from diffstore.errors import text_form

MASK = (1 << 64) - 1
MAX_RECORD_KEY = 511
"""LMDB's default limit on a key: no records key is longer (the compiled loop relies on it)."""
TICK = 1 << 16
"""Rows between two calls of a scan's progress callback."""
FIELDS = 8
"""u64 fields per bucket in the compiled loops' accumulator (see :meth:`Target.accumulator`)."""

Bad = Callable[[str, str], None]
Progress = Callable[[int], None]


@dataclass(slots=True)
class Target:
    """A live collection as the scan sees it, and what the scan counted for each of its buckets (index
    ``i`` for the registered seq ``seqs[i]``, the last for the stray bucket)."""

    meta: CollectionMeta
    seqs: list[int]  # registered (a ``gens`` row), ascending
    ids: dict[int, bytes] = field(default_factory=dict)  # seq -> generation id (to name them in problems)
    records: list[int] = field(default_factory=list)
    record_sums: list[int] = field(default_factory=list)
    entries: list[int] = field(default_factory=list)
    entry_sums: list[int] = field(default_factory=list)
    delta: list[int] = field(default_factory=list)  # digests.recompute's, mod 2^128
    counted: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        size = len(self.seqs) + 1
        for name in ("records", "record_sums", "entries", "entry_sums", "delta", "counted"):
            setattr(self, name, [0] * size)

    def bucket(self, seq: int) -> int:
        at = bisect.bisect_left(self.seqs, seq)
        return at if at < len(self.seqs) and self.seqs[at] == seq else len(self.seqs)

    def accumulator(self) -> bytearray:
        """The buffer the compiled loops add into: per bucket, native u64s records, record sum, entries,
        entry sum, delta low and high words, counted (two's complement), and one unused."""
        return bytearray(8 * FIELDS * (len(self.seqs) + 1))

    def take(self, buffer: bytearray) -> None:
        """Reads what the compiled loops added into ``buffer`` (:meth:`accumulator`)."""
        words = memoryview(buffer).cast("Q")
        for i in range(len(self.seqs) + 1):
            at = i * FIELDS
            self.records[i] += words[at]
            self.record_sums[i] = (self.record_sums[i] + words[at + 1]) & MASK
            self.entries[i] += words[at + 2]
            self.entry_sums[i] = (self.entry_sums[i] + words[at + 3]) & MASK
            self.delta[i] = (self.delta[i] + (words[at + 5] << 64 | words[at + 4])) % digests.MOD
            counted = words[at + 6]
            self.counted[i] += counted - (1 << 64) if counted >> 63 else counted

    def run_count(self, seq: int) -> int:
        """Entries of the run of registered generation ``seq`` (0 for any other)."""
        at = self.bucket(seq)
        return self.entries[at] if at < len(self.seqs) else 0

    def derived(self, txn: lmdb.Transaction, tables: Tables) -> digests.Recomputed:
        """The digests of the committed generations, re-derived from the records scanned."""
        meta = self.meta
        committed = [seq for seq in self.seqs if seq <= meta.generation_seq]
        delta = {seq: self.delta[i] for i, seq in enumerate(self.seqs)}
        counted = {seq: self.counted[i] for i, seq in enumerate(self.seqs)}
        # the stray bucket's versions count in every sum above them, as in recompute
        delta[-1], counted[-1] = self.delta[-1], self.counted[-1]
        return digests.telescope(txn, tables, meta, committed, delta, counted)


@dataclass(slots=True)
class Scope:
    """What the scan checks rows against: the live collections by cid, the deleted ones, and whether the
    store is sealed (with the count of rows that predate checksums, which the scan adds to)."""

    targets: dict[int, Target]
    dropped: set[int]
    seals: check_rows.RowSeals = field(default_factory=lambda: check_rows.RowSeals(False))


def scan(
    txn: lmdb.Transaction,
    tables: Tables,
    scope: Scope,
    bad: Bad,
    rows: dict[str, int],
    progress: Progress | None = None,
) -> None:
    """Reads ``changes``, ``change_chunks`` and ``records`` once each, reports each problem through ``bad``,
    counts their rows into ``rows``, and leaves each target's buckets filled."""
    accel = layout.ACCEL
    done = 0

    def tick(count: int) -> None:
        if progress is not None:
            progress(done + count)

    buffers = {cid: target.accumulator() for cid, target in scope.targets.items()} if accel else {}
    # the compiled loops take each collection as (cid, current seq, open seq or -1, seqs, accumulator)
    shapes = (
        [
            (
                cid,
                t.meta.generation_seq,
                -1 if t.meta.next_seq is None else t.meta.next_seq,
                b"".join(layout.u64(seq) for seq in t.seqs),
                buffers[cid],
            )
            for cid, t in scope.targets.items()
        ]
        if accel
        else []
    )
    for table, chunked in (("changes", False), ("change_chunks", True)):
        cursor = txn.cursor(db=getattr(tables, table))
        if accel is not None:
            count, flagged = accel.check_runs(iter(cursor), chunked, shapes, scope.dropped, tick, TICK)
        else:
            count, flagged = _runs(cursor, chunked, scope, tick)
        for key, raw, previous in flagged:
            run_problems(table, key, raw, previous, scope, bad)
        rows[table] = count
        done += count
    cursor = txn.cursor(db=tables.records)
    if accel is not None:
        count, found, unsealed = accel.check_records(
            iter(cursor), shapes, scope.dropped, scope.seals.all_sealed, tick, TICK
        )
    else:
        count, found, unsealed = _records(cursor, scope, tick)
    scope.seals.unsealed += unsealed
    for key, raw in found:
        record_problems(key, raw, scope, bad)
    rows["records"] = count
    for cid, buffer in buffers.items():
        scope.targets[cid].take(buffer)
    for target in scope.targets.values():
        search(txn, tables, target, bad)


# --- the per-row loops (the compiled twin: _accel.check_records, check_runs) ----------------------------


def parse_record_key(key: bytes) -> tuple[int, bytes, int, int] | None:
    """(cid, K, seq, head length) of a records key in its one encoding (``layout.records_prefix`` and
    ``layout.record_seq`` write no leading zero byte); None when it is no such key."""
    parsed = layout.parse_record_key(key) if len(key) <= MAX_RECORD_KEY else None
    if parsed is None:
        return None
    cid_length, seq_length = key[0], key[-1]
    if (cid_length > 1 and key[1] == 0) or (seq_length > 1 and key[-1 - seq_length] == 0):
        return None
    cid, form, seq = parsed
    return cid, form, seq, len(key) - 2 - seq_length


ROW_SEALED, ROW_PLAIN, ROW_SEAL_FAILS = 0, 1, 2
"""What :func:`read_record_row` says of a row's seal: it holds, there is none (a row written before
checksums), it fails."""


def read_record_row(key: bytes, raw: bytes) -> tuple[int, bytes, int, int, bytes, int] | None:
    """(cid, K, seq, head length, plain value, seal: ``ROW_*``) of the records row ``key -> raw``; None when
    ``key`` is no records key (:func:`parse_record_key`). The one place the Python loop reads a row."""
    parsed = parse_record_key(key)
    if parsed is None:
        return None
    if not layout.is_sealed(raw):
        return (*parsed, raw, ROW_PLAIN)
    return (*parsed, layout.plain(raw), ROW_SEAL_FAILS if layout.seal_fails(key, raw) else ROW_SEALED)


def _records(
    rows: Iterable[tuple[bytes, bytes]], scope: Scope, tick: Progress
) -> tuple[int, list[tuple[bytes, bytes]], int]:
    flagged: list[tuple[bytes, bytes]] = []
    count = unsealed = 0
    sealed = scope.seals.all_sealed
    previous_head, previous_hash = b"", 0
    hash_of = layout.record_digest
    mod = digests.MOD
    for key, raw in rows:
        count += 1
        if not count % TICK:
            tick(count)
        row = read_record_row(key, raw)
        if row is None:
            flagged.append((key, raw))
            continue
        cid, form, seq, head_length, plain, seal = row
        # a plain row was written before checksums (counted for the note), unless the store is sealed
        seal_bad = seal == ROW_SEAL_FAILS or (seal == ROW_PLAIN and sealed)
        unsealed += seal == ROW_PLAIN and not sealed
        target = scope.targets.get(cid)
        if target is None:  # a deleted collection's row (the purge's to remove) is not checked
            if cid not in scope.dropped:
                flagged.append((key, raw))
            continue
        meta = target.meta
        at = target.bucket(seq)
        if (
            seal_bad
            or at == len(target.seqs)
            or (seq > meta.generation_seq and seq != meta.next_seq)
            or _record_value_problem(form, plain) is not None
        ):
            flagged.append((key, raw))
        target.records[at] += 1
        target.record_sums[at] = (target.record_sums[at] + hash(form)) & MASK
        if seq > meta.generation_seq:
            continue  # an open generation's version is no digest's (digests.recompute)
        head = key[:head_length]
        if head != previous_head:
            previous_head, previous_hash = head, 0
        value_hash = hash_of(form, plain)
        target.delta[at] = (target.delta[at] + value_hash - previous_hash) % mod
        target.counted[at] += (value_hash != 0) - (previous_hash != 0)
        previous_hash = value_hash
    return count, flagged, unsealed


def _runs(
    rows: Iterable[tuple[bytes, bytes]], chunked: bool, scope: Scope, tick: Progress
) -> tuple[int, list[tuple[bytes, bytes, tuple[bytes, bytes] | None]]]:
    flagged: list[tuple[bytes, bytes, tuple[bytes, bytes] | None]] = []
    count = 0
    previous: tuple[bytes, bytes] | None = None  # the run and last form of the chunk before
    for key, raw in rows:
        count += 1
        if not count % TICK:
            tick(count)
        target = scope.targets.get(layout.cid_of_key(key)) if len(key) >= 4 else None
        if target is None:
            if len(key) < 4 or layout.cid_of_key(key) not in scope.dropped:
                flagged.append((key, raw, previous))
            continue
        if len(key) < 12 + 2:
            flagged.append((key, raw, previous))
            continue
        seq, first = layout.split_change_key(key)
        at = target.bucket(seq)
        if not chunked:
            target.entries[at] += 1
            target.entry_sums[at] = (target.entry_sums[at] + hash(first)) & MASK
            continue
        forms = _unpacked(raw)
        if not _sound_chunk(first, forms):
            flagged.append((key, raw, previous))
            continue
        run = key[:12]
        if previous is not None and previous[0] == run and previous[1] >= first:
            flagged.append((key, raw, previous))
        previous = (run, forms[-1])
        target.entries[at] += len(forms)
        target.entry_sums[at] = (target.entry_sums[at] + sum(map(hash, forms))) & MASK
    return count, flagged


# --- what a flagged row breaks (for both loops) ------------------------------------------------------


def record_problems(key: bytes, raw: bytes, scope: Scope, bad: Bad) -> None:
    """Names each rule a flagged ``records`` row breaks."""
    parsed = parse_record_key(key)
    if parsed is None:
        bad("records", f"row {key.hex()} is not a records key (rcid | K | rseq)")
        return
    cid, form, seq, _ = parsed
    target = scope.targets.get(cid)
    if target is None:
        if cid not in scope.dropped:
            bad("records", f"row {key.hex()} belongs to collection #{cid}, which is neither live nor deleted")
        return
    meta = target.meta
    plain, seal_problem = scope.seals.problem(key, raw)
    if seal_problem is not None:
        gen = text_form(target.ids[seq]) if seq in target.ids else "unknown"
        bad("records", f"{meta.name!r}: record {key_text(form)} #{seq} ({gen}): {seal_problem}")
    if target.bucket(seq) == len(target.seqs):
        bad("records", f"{meta.name!r}: a record of unregistered generation #{seq} ({key_text(form)})")
    elif seq > meta.generation_seq and seq != meta.next_seq:
        bad("records", f"{meta.name!r}: a record of generation #{seq}, neither committed nor open")
    problem = _record_value_problem(form, plain)
    if problem is not None:
        bad("records", f"{meta.name!r}: record {key_text(form)} #{seq}: {problem}")


def run_problems(
    table: str, key: bytes, raw: bytes, previous: tuple[bytes, bytes] | None, scope: Scope, bad: Bad
) -> None:
    """Names each rule a flagged ``changes`` or ``change_chunks`` row breaks (``previous``: the run and last
    form of the sound chunk before it)."""
    if len(key) < 4:
        bad(table, f"row {key.hex()} is too short to name a collection")
        return
    cid = layout.cid_of_key(key)
    target = scope.targets.get(cid)
    if target is None:
        if cid not in scope.dropped:
            bad(table, f"row {key.hex()} belongs to collection #{cid}, which is neither live nor deleted")
        return
    meta = target.meta
    if len(key) < 12 + 2:
        bad(table, f"{meta.name!r}: row {key.hex()} is too short")
        return
    seq, first = layout.split_change_key(key)
    if table != "change_chunks":
        return
    if not _sound_chunk(first, _unpacked(raw)):
        bad(
            table,
            f"{meta.name!r}: chunk {key_text(first)} #{seq} does not hold ascending forms from its first",
        )
    elif previous is not None and previous[0] == key[:12] and previous[1] >= first:
        bad(table, f"{meta.name!r}: chunk {key_text(first)} #{seq} overlaps the one before")


# --- a bucket whose records and entries differ: which ones -------------------------------------------


def search(txn: lmdb.Transaction, tables: Tables, target: Target, bad: Bad) -> None:
    """Names each record without its run entry and each entry without its record in the buckets of
    ``target`` whose two sides differ (a read of the collection's records and of those buckets' runs)."""
    differing = [
        i
        for i in range(len(target.seqs) + 1)
        if (target.records[i], target.record_sums[i]) != (target.entries[i], target.entry_sums[i])
    ]
    if not differing:
        return
    meta = target.meta
    stray = len(target.seqs) in differing
    seqs = {target.seqs[i] for i in differing if i < len(target.seqs)}

    def searched(seq: int) -> bool:
        return seq in seqs or (stray and target.bucket(seq) == len(target.seqs))

    found = 0

    def report(table: str, what: str) -> None:
        nonlocal found
        found += 1
        bad(table, what)

    records = txn.cursor(db=tables.records)
    chunks = _ChunkLookup(txn, tables)
    for key, _ in _prefixed(records, meta.records_prefix):
        parsed = parse_record_key(key)
        if parsed is None or not searched(parsed[2]):
            continue
        _, form, seq, _ = parsed
        run = layout.change_prefix(meta.cid_prefix, seq)
        if txn.get(run + form, db=tables.changes) is None and not chunks.holds(run, form):
            report(
                "changes",
                f"{meta.name!r}: record {key_text(form)} #{seq} is missing from its generation's index",
            )
    # the runs of those seqs; with the stray bucket, every run of the collection (searched() picks)
    runs = (
        [meta.cid_prefix] if stray else [layout.change_prefix(meta.cid_prefix, seq) for seq in sorted(seqs)]
    )
    for run in runs:
        for key, _ in _prefixed(txn.cursor(db=tables.changes), run):
            seq, form = layout.split_change_key(key) if len(key) >= 14 else (-1, b"")
            if seq < 0 or not searched(seq):
                continue
            if txn.get(layout.record_key(meta.records_prefix, form, seq), db=tables.records) is None:
                report("changes", f"{meta.name!r}: index row {key_text(form)} #{seq} has no record")
        for key, raw in _prefixed(txn.cursor(db=tables.change_chunks), run):
            seq, first = layout.split_change_key(key) if len(key) >= 14 else (-1, b"")
            forms = _unpacked(raw)
            if seq < 0 or not searched(seq) or not _sound_chunk(first, forms):
                continue
            for form in forms:
                if txn.get(layout.record_key(meta.records_prefix, form, seq), db=tables.records) is None:
                    report(
                        "change_chunks", f"{meta.name!r}: index entry {key_text(form)} #{seq} has no record"
                    )
                if txn.get(key[:12] + form, db=tables.changes) is not None:
                    report(
                        "change_chunks",
                        f"{meta.name!r}: {key_text(form)} #{seq} is in a chunk and has a changes row too",
                    )
    if not found:  # each is found in the other, yet the sides differ: a key form counted twice
        for i in differing:
            which = f"#{target.seqs[i]}" if i < len(target.seqs) else "of unregistered seqs"
            bad(
                "changes",
                f"{meta.name!r}: generation {which} holds {target.records[i]} records and"
                f" {target.entries[i]} index entries that do not match",
            )


class _ChunkLookup:
    """Whether a chunk of a run holds a form. Records come in key order, a run's forms ascending: the last
    chunk read of each run is kept (memory: a chunk per generation)."""

    def __init__(self, txn: lmdb.Transaction, tables: Tables) -> None:
        self._cursor = txn.cursor(db=tables.change_chunks)
        self._cache: dict[bytes, tuple[bytes, bytes, frozenset[bytes]]] = {}

    def holds(self, run: bytes, form: bytes) -> bool:
        cached = self._cache.get(run)
        if cached is None or not cached[0] <= form <= cached[1]:
            cursor = self._cursor
            if not cursor.set_range(run + form) or cursor.key() != run + form:
                if not (cursor.prev() if cursor.key() else cursor.last()) or not cursor.key().startswith(run):
                    return False
            forms = _unpacked(bytes(cursor.value()))
            if not forms:
                return False
            cached = (forms[0], forms[-1], frozenset(forms))
            self._cache[run] = cached
        return form in cached[2]


def _prefixed(cursor: lmdb.Cursor, prefix: bytes) -> Iterator[tuple[bytes, bytes]]:
    if not cursor.set_range(prefix):
        return
    for key, raw in cursor:
        if not key.startswith(prefix):
            return
        yield bytes(key), bytes(raw)


# --- helpers --------------------------------------------------------------------------------------


def _sound_chunk(first: bytes, forms: list[bytes]) -> bool:
    """Whether a chunk's forms begin with its key's form and strictly ascend."""
    return bool(forms) and forms[0] == first and all(a < b for a, b in zip(forms, forms[1:], strict=False))


def _unpacked(raw: bytes) -> list[bytes]:
    """The forms of a chunk's value, [] when it does not unpack."""
    try:
        return layout.unpack_forms(raw)
    except ValueError:
        return []


def key_text(form: bytes) -> str:
    """How a problem names a record's key: the user key of a short form, else the form's hex."""
    if form.endswith(b"\x00\x00") and not layout.is_long_form(form):
        return f"key {text_form(layout.short_key_of_form(form))}"
    return f"long key form {form.hex()}"


def _record_value_problem(form: bytes, raw: bytes) -> str | None:
    if form.endswith(b"\x00\x00") and not layout.is_long_form(form):
        return None if raw[:1] in (b"", b"\x01") else "a short key's value has an unknown tag"
    if not layout.is_long_form(form):
        return "its key form ends neither as a short nor as a long key"
    if raw[:1] not in (b"\x02", b"\x03") or len(raw) < 4:
        return "a long key's record does not hold its key"
    key = layout.long_key_of_value(raw)
    if layout.key_form(key) != form:
        return "the key it holds does not match its form"
    return None
