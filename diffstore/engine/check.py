"""``diffstore check``: every invariant of the storage layout (``layout.py``), verified in one read snapshot.

It runs on a live store (one read transaction: a consistent state, and writers go on meanwhile) and on a
backup. It reads every row of every table once, and looks rows of the small tables up in the others;
``records`` and the runs (``changes``, ``change_chunks``) are matched by per-generation counts and sums,
not by a look-up per row (``check_scan.py``, with a compiled twin). Memory holds each collection's
generation table and the set of live and deleted collection ids, never the records.

Every row of every table but those three is read through ``_Checker._rows``, and every row of those three
in ``check_scan`` (``read_record_row`` in ``_accel.c`` for records): where a per-row verification belongs.

The invariants, table by table (a ``cid`` is *live* when a ``collections`` row holds it, *dropped* when
``dropped`` holds it: a deleted collection whose rows the background purge has not removed yet):

- the store is in the current layout version (``layout.LAYOUT_ROW``; older ones are upgraded when the store
  is opened: ``migrate.py``), and
- ``collections``: every row unpacks; ids are unique, below the next id, never also dropped; the
  generations are ordered (current < open; seqs within ``last_seq``); a non-manual collection always has
  an open generation, and its ids are its seqs (8 bytes big-endian); ``gc_done_seq`` and the GC horizon
  are not past the current generation.
- ``gens``/``gen_ids``: the two directions agree row for row; ids ascend with seqs; every registered
  generation is committed (seq <= current) or the open one; the current and open ones are registered.
- ``records``: every sealed value matches its checksum, and a plain one is legal only while the store
  predates checksums (``check_rows.py``, verified as the scan reads the row); every row's cid is live or
  dropped; for a live one its seq is registered and committed or open (no record of an aborted or unknown
  generation), its value decodes, a long key's form matches the key it holds, and its generation's run
  (``changes`` or ``change_chunks``) holds its key.
- ``changes``, ``change_chunks``: every entry has its record; a chunk holds ascending forms from its
  first, overlaps no other chunk of its generation, and none of its forms also has a ``changes`` row; the
  open generation's entries number at least one and at most ``next_count`` when it has writes, none when
  it has not, and exactly ``next_keys`` when that is known.
- ``readers``/``targets``: each reader row of a live collection has its reverse row with the same data
  and back; a reader targets a collection of this store, or a stream (a ``scheme://`` target).
- ``due``: an automatic-commit row names a live automatic collection; a GC position names a live
  collection, a registered generation not past the GC horizon, and one GC has not finished.
- ``lineage``: rows of live collections name committed generations and unpack.
- ``commits``: rows of live collections name committed generations and unpack to a time, a count and
  metadata (None or a map of strings). Generations without a row are legal only below a collection's
  first row (committed by a store older than the table): from there on every committed generation has
  one. Where GC cannot have removed versions (at or above the GC horizon), the count equals the
  generation's ``changes`` rows (counted while reading them).
- ``cursors``: every spilled token is stored under its own digest, with its age row and back; the totals
  row counts them (entries, bytes) and numbers past them, within the bounds eviction keeps.
- ``replica``: rows only of known kinds, the primary and id first of all; while it follows (not
  promoted) every live collection has a well-formed lag row and none other does, each collection's
  position (its current generation) is an applied one (a commit row, but for an empty automatic
  collection's first, or one applied by a store older than the table: no row at all), and the
  applied count is at least the commit rows; a promoted store keeps no lag.
- ``leases``, ``producers``, ``phantoms``, ``phantom_ttl``: rows unpack, belong to live (or dropped)
  collections; a phantom's records have its expiry row.

Each problem is one line (:class:`Problem`); the caller prints them and a summary.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import lmdb
import msgpack

from diffstore.engine import (
    check_rows,
    check_scan,
    cursor_spill,
    digests,
    files,
    layout,
    manifest,
    migrate,
    producers,
    storage,
)
from diffstore.engine.meta import CollectionMeta, non_manual_generation
from diffstore.engine.tables import Tables
from diffstore.errors import InvalidRequest, text_form


@dataclass(frozen=True, slots=True)
class Problem:
    """One broken invariant: the table it was found in and what is wrong."""

    table: str
    what: str

    def __str__(self) -> str:
        return f"{self.table}: {self.what}"


@dataclass(slots=True)
class Report:
    """What a check found: its problems and how many rows of each table it read."""

    problems: list[Problem] = field(default_factory=list)
    rows: dict[str, int] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)  # not problems: what an upgrade would add

    @property
    def ok(self) -> bool:
        return not self.problems


@dataclass(slots=True)
class _Collection:
    meta: CollectionMeta
    gens: dict[int, bytes] = field(default_factory=dict)  # seq -> generation id
    open_changes: int = 0
    changes: dict[int, int] = field(default_factory=dict)  # seq -> its rows in ``changes``
    commit_rows: set[int] = field(default_factory=set)  # seqs with a ``commits`` row
    scanned: check_scan.Target | None = None  # what the scan of records and runs counted


def check(
    txn: lmdb.Transaction,
    tables: Tables,
    on_problem: Callable[[Problem], None] | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> Report:
    """Checks every invariant of the module docstring in ``txn``.

    Args:
        on_problem: called with each problem as it is found (to print it at once).
        progress: called now and then with the rows read so far and the rows of every table.
    """
    report = Report()

    def bad(table: str, what: str) -> None:
        problem = Problem(table, what)
        report.problems.append(problem)
        if on_problem is not None:
            on_problem(problem)

    checker = _Checker(txn, tables, bad, report.rows, report.notes)
    if progress is not None:
        total = sum(txn.stat(getattr(tables, table.decode()))["entries"] for table in layout.TABLES)
        checker.progress = lambda done: progress(done, total)
    checker.run()
    return report


class _Checker:
    def __init__(
        self,
        txn: lmdb.Transaction,
        tables: Tables,
        bad: Callable[[str, str], None],
        rows: dict[str, int],
        notes: list[str],
    ) -> None:
        self.txn, self.tables, self.bad, self.rows, self.notes = txn, tables, bad, rows, notes
        self.live: dict[int, _Collection] = {}  # cid -> collection
        self.names: set[str] = set()
        self.dropped: set[int] = set()
        self.progress: Callable[[int], None] | None = None  # called with the rows read so far
        self.done = 0

    def run(self) -> None:
        version = migrate.layout_version(self.txn, self.tables)
        if version is not None and version != layout.LAYOUT_VERSION:
            # its records keys are not this layout's: checking them would report every row
            self.bad(
                "collections",
                f"the store is in storage layout {version}, not {layout.LAYOUT_VERSION}: opening it"
                " (diffstore serve, or Store.open) upgrades it; then check it",
            )
            return
        self._collections()
        self._dropped()
        self._generations()
        self._records_and_runs()
        self._readers()
        self._targets()
        self._due()
        self._lineage()
        self._commits()
        self._digests()
        self._cursors()
        self._replica()
        self._leases()
        self._producers()
        self._phantoms()
        self._open_counts()

    def _rows(self, table: str) -> Iterator[tuple[bytes, bytes]]:
        count = 0
        for key, value in self.txn.cursor(db=getattr(self.tables, table)):
            count += 1
            yield bytes(key), bytes(value)
        self.rows[table] = count
        self._read(count)

    def _read(self, count: int) -> None:
        self.done += count
        if self.progress is not None:
            self.progress(self.done)

    def _owner(self, table: str, key: bytes) -> _Collection | None:
        """The live collection a row's cid names; None for a dropped one; a problem for any other."""
        if len(key) < 4:
            self.bad(table, f"row {key.hex()} is too short to name a collection")
            return None
        return self._owner_of(table, key, layout.cid_of_key(key))

    def _owner_of(self, table: str, key: bytes, cid: int) -> _Collection | None:
        found = self.live.get(cid)
        if found is None and cid not in self.dropped:
            self.bad(
                table, f"row {key.hex()} belongs to collection #{cid}, which is neither live nor deleted"
            )
        return found

    # --- collections and generations ----------------------------------------------------------

    def _collections(self) -> None:
        next_cid: int | None = None
        for key, raw in self._rows("collections"):
            if key == layout.NEXT_CID:
                next_cid = layout.read_u64(raw) if len(raw) == 8 else None
                if next_cid is None:
                    self.bad("collections", "the next collection id is not 8 bytes")
                continue
            if key == layout.LAYOUT_ROW:
                if raw != layout.u64(layout.LAYOUT_VERSION):
                    version = layout.LAYOUT_VERSION
                    self.bad("collections", f"the layout version row is {raw.hex()}, not {version}")
                continue
            if key == layout.SEALED_ROW:
                if raw:
                    self.bad("collections", f"the sealed-store row holds {raw.hex()}, not nothing")
                continue
            try:
                name = key.decode()
                meta = CollectionMeta.unpack(name, raw)
            except (UnicodeDecodeError, ValueError, TypeError, msgpack.UnpackException) as exc:
                self.bad("collections", f"row {key.hex()} does not unpack ({exc})")
                continue
            if meta.cid in self.live:
                self.bad(
                    "collections", f"{name!r} and {self.live[meta.cid].meta.name!r} share id #{meta.cid}"
                )
                continue
            self.live[meta.cid] = _Collection(meta)
            self.names.add(name)
            self._meta_rules(meta)
        for cid in self.live:
            if next_cid is not None and cid >= next_cid:
                self.bad("collections", f"collection #{cid} is not below the next id {next_cid}")

    def _meta_rules(self, meta: CollectionMeta) -> None:
        where = f"collection {meta.name!r}"
        if meta.generation_seq > meta.last_seq:
            self.bad(
                "collections",
                f"{where}: current generation #{meta.generation_seq} > last seq {meta.last_seq}",
            )
        if (meta.next is None) != (meta.next_seq is None):
            self.bad("collections", f"{where}: the open generation has an id without a seq, or the reverse")
        if meta.next is not None and meta.next_seq is not None:
            if meta.next <= meta.generation:
                self.bad(
                    "collections",
                    f"{where}: open generation {text_form(meta.next)} is not above the current"
                    f" {text_form(meta.generation)}",
                )
            if not meta.generation_seq < meta.next_seq <= meta.last_seq:
                self.bad("collections", f"{where}: open generation #{meta.next_seq} out of order")
        elif meta.next_count:
            self.bad("collections", f"{where}: counts {meta.next_count} writes but has no open generation")
        elif meta.next_lease is not None:
            self.bad("collections", f"{where}: holds the lease of an open generation, but none is open")
        if not meta.manual:
            if meta.next_seq is None:
                self.bad("collections", f"{where}: an automatic collection without an open generation")
            elif meta.next != non_manual_generation(meta.next_seq):
                self.bad(
                    "collections",
                    f"{where}: open generation {text_form(meta.next)} is not its seq {meta.next_seq}",
                )
            if meta.generation != non_manual_generation(meta.generation_seq):
                self.bad("collections", f"{where}: generation {text_form(meta.generation)} is not its seq")
        if meta.gc_done_seq > meta.generation_seq:
            self.bad(
                "collections", f"{where}: GC finished generation #{meta.gc_done_seq}, past the current one"
            )
        if meta.gc_horizon is not None and meta.gc_horizon > meta.generation:
            self.bad(
                "collections",
                f"{where}: GC horizon {text_form(meta.gc_horizon)} is past the current generation",
            )

    def _dropped(self) -> None:
        for key, _ in self._rows("dropped"):
            if len(key) != 4:
                self.bad("dropped", f"row {key.hex()} is not a collection id")
                continue
            cid = int.from_bytes(key, "big")
            if cid in self.live:
                self.bad(
                    "dropped", f"collection #{cid} ({self.live[cid].meta.name!r}) is both live and deleted"
                )
            self.dropped.add(cid)

    def _generations(self) -> None:
        for key, raw in self._rows("gens"):
            owner = self._owner("gens", key)
            if owner is None:
                continue
            if len(key) != 12:
                self.bad("gens", f"row {key.hex()} is not a collection id and a seq")
                continue
            seq = layout.seq_of_gen_key(key)
            owner.gens[seq] = raw
            meta = owner.meta
            if seq > meta.generation_seq and seq != meta.next_seq:
                self.bad(
                    "gens",
                    f"{meta.name!r}: generation {text_form(raw)} (#{seq}) is neither committed nor open",
                )
            back = self.txn.get(layout.gen_id_key(meta.cid_prefix, raw), db=self.tables.gen_ids)
            if back is None or layout.read_u64(back) != seq:
                self.bad(
                    "gen_ids", f"{meta.name!r}: generation {text_form(raw)} (#{seq}) has no matching id row"
                )
        for key, raw in self._rows("gen_ids"):
            owner = self._owner("gen_ids", key)
            if owner is None:
                continue
            generation_id = layout.after_cid(key)
            if len(raw) != 8 or owner.gens.get(layout.read_u64(raw)) != generation_id:
                self.bad(
                    "gens",
                    f"{owner.meta.name!r}: generation id {text_form(generation_id)} has no matching seq row",
                )
        for owner in self.live.values():
            meta, previous = owner.meta, None
            for seq in sorted(owner.gens):
                gen = owner.gens[seq]
                if previous is not None and gen <= previous:
                    self.bad("gens", f"{meta.name!r}: generation ids do not ascend with seqs at #{seq}")
                previous = gen
            if owner.gens.get(meta.generation_seq) != meta.generation:
                self.bad(
                    "gens",
                    f"{meta.name!r}: its current generation {text_form(meta.generation)} is not registered",
                )
            if meta.next_seq is not None and owner.gens.get(meta.next_seq) != meta.next:
                self.bad(
                    "gens", f"{meta.name!r}: its open generation {text_form(meta.next)} is not registered"
                )

    # --- records and their index (check_scan.py) -------------------------------------------------

    def _records_and_runs(self) -> None:
        scope = check_scan.Scope(
            {
                cid: check_scan.Target(owner.meta, sorted(owner.gens), owner.gens)
                for cid, owner in self.live.items()
            },
            self.dropped,
            check_rows.RowSeals.of(self.txn, self.tables),
        )
        progress = self.progress
        check_scan.scan(
            self.txn,
            self.tables,
            scope,
            self.bad,
            self.rows,
            None if progress is None else lambda count: progress(self.done + count),
        )
        self._read(sum(self.rows[table] for table in ("records", "changes", "change_chunks")))
        for cid, target in scope.targets.items():
            owner = self.live[cid]
            owner.scanned = target
            for i, seq in enumerate(target.seqs):
                owner.changes[seq] = target.entries[i]
            if owner.meta.next_seq is not None:
                owner.open_changes = target.run_count(owner.meta.next_seq)
        if (note := scope.seals.note()) is not None:
            self.notes.append(note)

    def _open_counts(self) -> None:
        for owner in self.live.values():
            meta = owner.meta
            if meta.next_seq is None:
                continue
            if (owner.open_changes == 0) != (meta.next_count == 0) or owner.open_changes > meta.next_count:
                self.bad(
                    "collections",
                    f"{meta.name!r}: the open generation counts {meta.next_count} writes but holds"
                    f" {owner.open_changes} keys",
                )
            if meta.next_keys is not None and meta.next_keys != owner.open_changes:
                self.bad(
                    "collections",
                    f"{meta.name!r}: the open generation counts {meta.next_keys} keys but holds"
                    f" {owner.open_changes}",
                )

    # --- readers ----------------------------------------------------------------------------------

    def _readers(self) -> None:
        for key, raw in self._rows("readers"):
            owner = self._owner("readers", key)
            if owner is None:
                if layout.cid_of_key(key) in self.dropped:
                    self.bad(
                        "readers",
                        f"reader {_scoped_name(key)!r} of a deleted collection was not deleted with it",
                    )
                continue
            name = layout.after_cid(key).decode(errors="replace")
            try:
                target, generation_id = msgpack.unpackb(raw, raw=False)
            except (ValueError, TypeError, msgpack.UnpackException) as exc:
                self.bad("readers", f"{owner.meta.name!r}: reader {name!r} does not unpack ({exc})")
                continue
            where = f"{owner.meta.name!r}: reader {name!r}"
            if not isinstance(target, str) or not (target in self.names or "://" in target):
                self.bad(
                    "readers",
                    f"{where} targets {target!r}, neither a collection of this store nor a stream (scheme://)",
                )
                continue
            reverse = self.txn.get(
                layout.target_key(target, owner.meta.cid_prefix, name), db=self.tables.targets
            )
            if reverse is None or msgpack.unpackb(reverse, raw=False) != [name, generation_id]:
                self.bad("targets", f"{where}: its reverse index row is missing or differs")

    def _targets(self) -> None:
        for key, raw in self._rows("targets"):
            if len(key) != 36:
                self.bad("targets", f"row {key.hex()} is not a target, a collection id and a name digest")
                continue
            cid = layout.owner_of_target_key(key)
            owner = self.live.get(cid)
            try:
                name, generation_id = msgpack.unpackb(raw, raw=False)
            except (ValueError, TypeError, msgpack.UnpackException) as exc:
                self.bad("targets", f"row {key.hex()} does not unpack ({exc})")
                continue
            if owner is None:
                self.bad("targets", f"reader {name!r} of collection #{cid}, which is not live")
                continue
            stored = self.txn.get(layout.reader_key(owner.meta.cid_prefix, name), db=self.tables.readers)
            if stored is None:
                self.bad("targets", f"{owner.meta.name!r}: reader {name!r} is indexed but does not exist")
                continue
            target, stored_generation = msgpack.unpackb(stored, raw=False)
            if (
                key != layout.target_key(target, owner.meta.cid_prefix, name)
                or stored_generation != generation_id
            ):
                self.bad("targets", f"{owner.meta.name!r}: the index row of reader {name!r} differs from it")

    # --- background work, lineage, leases, producers, phantoms ---------------------------------

    def _due(self) -> None:
        by_name = {c.meta.name: c for c in self.live.values()}
        for key, raw in self._rows("due"):
            name = layout.name_of_auto_commit_due_key(key)
            if name is not None:
                found = by_name.get(name)
                if found is None or found.meta.manual:
                    self.bad(
                        "due", f"an automatic commit is due for {name!r}, which is no automatic collection"
                    )
                elif len(raw) != 8:
                    self.bad("due", f"the due time of {name!r} is not 8 bytes")
                continue
            if key[:1] != b"g" or len(key) != 5:
                self.bad("due", f"row {key.hex()} is of no known kind")
                continue
            owner = self.live.get(int.from_bytes(key[1:], "big"))
            if owner is None:
                self.bad(
                    "due", f"a GC position of collection #{int.from_bytes(key[1:], 'big')}, which is not live"
                )
                continue
            seq, _ = layout.read_gc_position(raw)
            meta = owner.meta
            if seq not in owner.gens or seq <= meta.gc_done_seq or seq > meta.generation_seq:
                self.bad(
                    "due", f"{meta.name!r}: the GC position is at generation #{seq}, not one GC is collecting"
                )
        for owner in self.live.values():
            meta = owner.meta
            if (
                not meta.manual
                and meta.next_count
                and self.txn.get(layout.auto_commit_due_key(meta.name), db=self.tables.due) is None
            ):
                self.bad(
                    "due", f"{meta.name!r}: its open generation has writes but no automatic commit is due"
                )

    def _lineage(self) -> None:
        for key, raw in self._rows("lineage"):
            owner = self._owner("lineage", key)
            if owner is None:
                continue
            seq, name = layout.split_lineage_key(key)
            meta = owner.meta
            if seq not in owner.gens or seq > meta.generation_seq:
                self.bad(
                    "lineage", f"{meta.name!r}: moves of reader {name!r} at #{seq}, no committed generation"
                )
            try:
                _, _, _, _ = msgpack.unpackb(raw, raw=False)
            except (ValueError, TypeError, msgpack.UnpackException) as exc:
                self.bad(
                    "lineage", f"{meta.name!r}: the move of reader {name!r} at #{seq} does not unpack ({exc})"
                )

    def _commits(self) -> None:
        for key, raw in self._rows("commits"):
            owner = self._owner("commits", key)
            if owner is None:
                continue
            meta = owner.meta
            seq = layout.seq_of_gen_key(key) if len(key) == 12 else -1
            if seq not in owner.gens or seq > meta.generation_seq:
                self.bad("commits", f"{meta.name!r}: commit row {key.hex()} names no committed generation")
                continue
            try:
                at_ms, changed, metadata = layout.unpack_commit(raw)
            except (ValueError, TypeError, msgpack.UnpackException) as exc:
                self.bad("commits", f"{meta.name!r}: the commit row of #{seq} does not unpack ({exc})")
                continue
            owner.commit_rows.add(seq)
            if (
                at_ms < 0
                or changed < 0
                or not (
                    metadata is None
                    or isinstance(metadata, dict)
                    and all(isinstance(k, str) and isinstance(v, str) for k, v in metadata.items())
                )
            ):
                self.bad("commits", f"{meta.name!r}: commit row of #{seq} holds {at_ms, changed, metadata}")
            elif seq >= self._horizon_seq(meta) and changed != owner.changes.get(seq, 0):
                self.bad(
                    "commits",
                    f"{meta.name!r}: the commit of generation {text_form(owner.gens[seq])} (#{seq}) counts"
                    f" {changed} changed keys, its index holds {owner.changes.get(seq, 0)}",
                )
        for owner in self.live.values():
            if not owner.commit_rows:
                continue  # every generation committed by a store older than the table (or none yet)
            first = min(owner.commit_rows)
            for seq in sorted(owner.gens):
                if first < seq <= owner.meta.generation_seq and seq not in owner.commit_rows:
                    self.bad(
                        "commits",
                        f"{owner.meta.name!r}: committed generation {text_form(owner.gens[seq])} (#{seq})"
                        " has no commit row",
                    )

    def _digests(self) -> None:
        rows: dict[int, dict[int, bytes]] = {}
        for key, raw in self._rows("digests"):
            owner = self._owner("digests", key)
            if owner is not None:
                if len(key) == 4:
                    rows.setdefault(owner.meta.cid, {})[digests.START] = raw
                elif len(key) == 12:
                    rows.setdefault(owner.meta.cid, {})[layout.seq_of_gen_key(key)] = raw
                elif key == layout.digest_pending_key(owner.meta.cid_prefix):
                    self._pending_digest(owner.meta, raw)
                else:
                    self.bad("digests", f"{owner.meta.name!r}: digest row {key.hex()} is neither kind")
        for owner in self.live.values():
            meta = owner.meta
            older = digests.verify(
                self.txn,
                self.tables,
                meta,
                owner.gens,
                rows.get(meta.cid, {}),
                lambda what: self.bad("digests", what),
                None if owner.scanned is None else owner.scanned.derived(self.txn, self.tables),
            )
            if older:
                self.notes.append(
                    f"{meta.name!r}: {older} committed generations predate digests"
                    " (diffstore migrate computes them)"
                )

    def _pending_digest(self, meta: CollectionMeta, raw: bytes) -> None:
        """The open generation's pending digest delta (digests.record_put): it unpacks, and names the open
        generation (an aborted one's is dropped with it; a commit takes it)."""
        try:
            seq = layout.unpack_pending(raw)[0]
        except ValueError as exc:
            self.bad("digests", f"{meta.name!r}: the pending digest row does not unpack ({exc})")
            return
        if seq != meta.next_seq:
            self.bad(
                "digests", f"{meta.name!r}: the pending digest row names #{seq}, not the open generation"
            )

    def _horizon_seq(self, meta: CollectionMeta) -> int:
        """The lowest seq whose ``changes`` rows GC cannot have touched (past every seq: unknown)."""
        if meta.gc_horizon is None:
            return 0
        raw = self.txn.get(layout.gen_id_key(meta.cid_prefix, meta.gc_horizon), db=self.tables.gen_ids)
        return layout.read_u64(raw) if raw is not None and len(raw) == 8 else 1 << 64

    def _cursors(self) -> None:
        entries: dict[bytes, int] = {}  # digest -> number
        ages: dict[int, bytes] = {}  # number -> digest
        size = 0
        totals: bytes | None = None
        for key, raw in self._rows("cursors"):
            if key == layout.CURSOR_TOTALS:
                totals = raw
            elif key[:1] == layout.cursor_entry_key(b"") and len(raw) >= 8:
                number, token = layout.unpack_cursor_entry(raw)
                entries[key[1:]] = number
                size += len(token)
                if cursor_spill.digest(token) != key[1:]:
                    self.bad("cursors", f"the long cursor #{number} is not stored under its own digest")
            elif key[:1] == layout.CURSOR_AGE_PREFIX and len(key) == 9:
                ages[layout.read_u64(key[1:])] = raw
            else:
                self.bad("cursors", f"row {key.hex()} is of no known kind")
        for digest, number in entries.items():
            if ages.get(number) != digest:
                self.bad("cursors", f"the long cursor #{number} has no age row: it would never expire")
        for number, digest in ages.items():
            if entries.get(digest) != number:
                self.bad("cursors", f"the age row #{number} names no stored cursor")
        if totals is None:
            if entries or ages:
                self.bad(
                    "cursors",
                    f"{len(entries)} long cursors and {len(ages)} age rows are stored without a totals row",
                )
            return
        if len(totals) != 24:
            self.bad("cursors", "the totals row is not 24 bytes")
            return
        counted, counted_size, next_number = layout.unpack_cursor_totals(totals)
        if (counted, counted_size) != (len(entries), size):
            self.bad(
                "cursors",
                f"the totals count {counted} long cursors of {counted_size} bytes, the table holds"
                f" {len(entries)} of {size} bytes",
            )
        if any(number >= next_number for number in (*entries.values(), *ages)):
            self.bad("cursors", f"a long cursor is numbered past the next number {next_number}")
        if len(entries) > 1 and (len(entries) > cursor_spill.MAX_ENTRIES or size > cursor_spill.MAX_BYTES):
            self.bad(
                "cursors",
                f"{len(entries)} long cursors of {size} bytes are kept, over the bounds eviction keeps"
                f" ({cursor_spill.MAX_ENTRIES} cursors, {cursor_spill.MAX_BYTES} bytes)",
            )

    def _replica(self) -> None:
        rows = dict(self._rows("replica"))
        # any store may carry a replication term, and a fencing once it stepped down (replication.py)
        term_raw = rows.pop(layout.REPLICA_TERM, None)
        if term_raw is not None and len(term_raw) != 8:
            self.bad("replica", "the replication term is not 8 bytes")
        fenced_raw = rows.pop(layout.REPLICA_FENCED, None)
        if fenced_raw is not None:
            try:
                told, primary_url, fenced_id, at_ms = msgpack.unpackb(fenced_raw)
                stored = layout.read_u64(term_raw) if term_raw is not None and len(term_raw) == 8 else 0
                texts = all(x is None or type(x) is str for x in (primary_url, fenced_id))
                well_formed = type(told) is int and type(at_ms) is int and told <= stored and texts
            except (ValueError, TypeError, msgpack.UnpackException):
                well_formed = False
            if not well_formed:
                self.bad("replica", "the fencing is not [term at most the store's, URL, id, ms]")
        step_downs = rows.pop(layout.REPLICA_STEP_DOWNS, None)  # any store that ever stepped down
        if step_downs is not None and len(step_downs) != 8:
            self.bad("replica", "the count of step-downs is not 8 bytes")
        rows.pop(layout.REPLICA_HA, None)  # a fail-over member's role, leader or not (ha_state.py reads it)
        if not rows:
            return
        address = rows.pop(layout.REPLICA_SELF, None)
        if address is not None and (not _is_text(address) or "://" not in address.decode()):
            self.bad("replica", f"the promoted store's address {address!r} is not a URL")
        primary = rows.pop(layout.REPLICA_PRIMARY, None)
        replica_id = rows.pop(layout.REPLICA_ID, None)
        promoted = rows.pop(layout.REPLICA_PROMOTED, None)
        applied_raw = rows.pop(layout.REPLICA_APPLIED, None)
        lags = {key: raw for key, raw in rows.items() if key.startswith(layout.REPLICA_LAG)}
        staged = {key for key in rows if key.startswith(layout.REPLICA_STAGED)}  # first copies under way
        for key in rows.keys() - lags.keys() - staged:
            self.bad("replica", f"row {key.hex()} is of no known kind")
        if primary is None:
            self.bad("replica", "replica rows are stored, but no primary that they follow")
            return
        if not _is_text(primary) or "://" not in primary.decode():
            self.bad("replica", f"the primary {primary!r} is not a URL")
        if replica_id is None or not _is_text(replica_id):
            self.bad("replica", "the replica has no id (it names its readers on the primary)")
        for name, raw in (("promotion time", promoted), ("applied count", applied_raw)):
            if raw is not None and len(raw) != 8:
                self.bad("replica", f"the {name} is not 8 bytes")
                return
        applied = layout.read_u64(applied_raw) if applied_raw is not None else 0
        if promoted is not None:
            for key in lags:
                self.bad(
                    "replica", f"a promoted store keeps the lag of {_name(key[len(layout.REPLICA_LAG) :])!r}"
                )
            return
        by_name = {owner.meta.name: owner for owner in self.live.values()}
        for key, raw in lags.items():
            name = _name(key[len(layout.REPLICA_LAG) :])
            if name not in by_name:
                self.bad("replica", f"the lag of {name!r}, which is no collection of this replica")
            try:
                row = msgpack.unpackb(raw)
                # an older replica's row holds the first two fields only
                generations, since, state, reason, state_since = [*row, "following", None, None][:5]
                well_formed = (
                    len(row) in (2, 5)
                    and type(generations) is int
                    and generations >= 0
                    and (since is None or type(since) is int)
                    and state in ("copying", "following", "stalled")
                    and (reason is None or type(reason) is str)
                    and (state_since is None or type(state_since) is int)
                )
            except (ValueError, TypeError, msgpack.UnpackException):
                well_formed = False
            if not well_formed:
                self.bad("replica", f"the lag of {name!r} is not [generations, ms or None] (and its state)")
        for name, owner in by_name.items():
            meta = owner.meta
            if layout.replica_lag_key(name) not in lags:
                self.bad(
                    "replica", f"{name!r}: no lag row (every collection of a replica is applied with one)"
                )
            empty_first = not meta.manual and meta.generation_seq == 0
            if owner.commit_rows and not empty_first and meta.generation_seq not in owner.commit_rows:
                self.bad(
                    "replica",
                    f"{name!r}: the replica's position {text_form(meta.generation)} (#{meta.generation_seq})"
                    " is no applied generation (it has no commit row)",
                )
        rows_total = sum(len(owner.commit_rows) for owner in self.live.values())
        if applied < rows_total:
            self.bad("replica", f"the applied count {applied} is below the {rows_total} generations applied")

    def _leases(self) -> None:
        for key, raw in self._rows("leases"):
            owner = self._owner("leases", key)
            if owner is None:
                continue
            try:
                holder, version, expires, _ = layout.unpack_lease(raw)
            except (ValueError, TypeError, msgpack.UnpackException) as exc:
                self.bad(
                    "leases", f"{owner.meta.name!r}: lease {_scoped_name(key)!r} does not unpack ({exc})"
                )
                continue
            if version < 1 or (holder is None and expires != 0):
                self.bad("leases", f"{owner.meta.name!r}: lease {_scoped_name(key)!r} is inconsistent")

    def _producers(self) -> None:
        for key, raw in self._rows("producers"):
            owner = self._owner("producers", key)
            if owner is None:
                continue
            problem = producers.check_row(raw, owner.meta)
            if problem is not None:
                self.bad("producers", f"{owner.meta.name!r}: producer {_scoped_name(key)!r} {problem}")

    def _phantoms(self) -> None:
        for key, raw in self._rows("phantom_ttl"):
            self._owner("phantom_ttl", key)
            if len(key) != 12 or len(raw) != 8:
                self.bad(
                    "phantom_ttl", f"row {key.hex()} is not a collection id and a phantom with an expiry"
                )
        for key, _ in self._rows("phantoms"):
            owner = self._owner("phantoms", key)
            if owner is None:
                continue
            if self.txn.get(key[:12], db=self.tables.phantom_ttl) is None:
                self.bad(
                    "phantoms", f"{owner.meta.name!r}: a record of phantom {key[4:12].hex()} without expiry"
                )


def check_directory(
    path: Path,
    on_problem: Callable[[Problem], None] | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> Report:
    """Checks the store in directory ``path`` (live or a backup) in one read transaction (``progress``: see
    :func:`check`).

    Raises:
        InvalidRequest: ``path`` holds no diffstore store (a stream server's store is not checked).
        StorageError: it cannot be opened or read.
    """
    proof = manifest.verify(path) if (Path(path) / manifest.MANIFEST_FILE).exists() else None
    with files.open_existing(path) as opened:
        if (
            proof is not None
        ):  # a backup's manifest first: a file that is not what was written explains the rest
            report = Report(notes=proof.notes)
            for what in proof.problems:
                _report(report, Problem("manifest", what), on_problem)
            if opened.kind is files.Kind.STREAMS:
                report.notes.append(f"{path} holds a {opened.kind.value}: only its manifest is verified")
                return report
        if opened.kind is not files.Kind.STORE:
            raise InvalidRequest(f"{path} holds a {opened.kind.value}: check verifies diffstore stores only")
        try:
            tables = Tables.open(opened.env)
            with opened.env.begin() as txn:
                found = check(txn, tables, on_problem, progress)
            if proof is not None:
                found.problems[:0] = report.problems
                found.notes[:0] = report.notes
            return found
        except lmdb.Error as exc:
            raise storage.storage_error(
                exc, path, files.MAP_SIZE, writing=False, doing="check failed"
            ) from exc


def _report(report: Report, problem: Problem, on_problem: Callable[[Problem], None] | None) -> None:
    report.problems.append(problem)
    if on_problem is not None:
        on_problem(problem)


def _name(raw: bytes) -> str:
    return raw.decode(errors="replace")


def _scoped_name(key: bytes) -> str:
    """The name in a collection-scoped key (a reader's, lease's or producer's)."""
    return _name(layout.after_cid(key))


def _is_text(raw: bytes) -> bool:
    try:
        raw.decode()
    except UnicodeDecodeError:
        return False
    return True
