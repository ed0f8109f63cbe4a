"""Background work, in small resumable steps: automatic commits, GC, phantom and collection purges.

Every step is decided again inside the write transaction that does it, from what LMDB holds then (due
rows, reader positions, the GC position, expiry times), so processes sharing the store never do one
item twice, and a process killed midway leaves the item due for the next worker.

GC of a collection X runs only while some reader targets X. Its horizon is the highest reader
minimum (lowered to what X's retention policy keeps, see ``retention.py``) it has acted on
(monotonic, stored in X's metadata, so reads below it answer ``generationCollected`` even if a reader
later moves back). For every generation at or below the horizon, in order, and every key written
there: all versions older than the key's newest version at or below the horizon are deleted, with
their ``changes`` entries. That newest version (even a tombstone) stays, so reads at or above the
horizon, and diffs from the very beginning, still work.

The steps see the store only as a :class:`~diffstore.engine.access.StoreAccess` and change nothing of its
own state (the GC positions and due times live in LMDB), so the store calls into this module and never
the other way round.
"""

from __future__ import annotations

import time

import lmdb

from diffstore.engine import changes, layout, lineage, retention, writes
from diffstore.engine.access import StoreAccess
from diffstore.engine.meta import CollectionMeta
from diffstore.engine.readers import gc_minimum
from diffstore.engine.tables import Table, Tables, load_meta, resolve_seq, save_meta
from diffstore.errors import NoSuchCollection

# every table whose keys begin with the collection's cid prefix; ``records`` keys begin with its records
# prefix (layout.records_prefix)
_ALL_TABLES_WITH_CID = (
    "gens",
    "commits",
    "digests",
    "gen_ids",
    "changes",
    "change_chunks",
    "phantoms",
    "phantom_ttl",
    "readers",
    "producers",
    "leases",
    "lineage",
)


def collection_metas(txn: lmdb.Transaction, tables: Tables) -> list[CollectionMeta]:
    """Every collection's metadata row in ``txn``."""
    return [
        CollectionMeta.unpack(raw_name.decode(), raw)
        for raw_name, raw in txn.cursor(db=tables.collections)
        if layout.is_collection_row(raw_name)
    ]


def due_auto_commits(store: StoreAccess, now_ms: int) -> tuple[list[str], int | None]:
    """Collections whose automatic commit is due at ``now_ms`` (unix ms), and the next due time after it.

    A due time further ahead than the commit delay (the wall clock went back) counts as due.
    """
    latest = now_ms + store.config.commit_delay_ms
    due: list[str] = []
    later: int | None = None
    with store.read() as txn:
        cursor = txn.cursor(db=store.tables.due)
        if cursor.set_range(layout.AUTO_COMMIT_DUE_PREFIX):
            for raw_key, raw in cursor:
                name = layout.name_of_auto_commit_due_key(raw_key)
                if name is None:
                    break
                at = layout.read_u64(raw)
                if at <= now_ms or at > latest:
                    due.append(name)
                elif later is None or at < later:
                    later = at
    return due, later


def auto_commit(store: StoreAccess, name: str, now_ms: int) -> bool:
    """Takes and does the automatic commit of ``name`` if it is still due; False if it is not (any more).

    Taking it (deleting its due row) and committing are one transaction: whichever process gets there
    first commits, the others find no row.
    """
    latest = now_ms + store.config.commit_delay_ms
    try:
        with store.write() as scope:
            txn, tables = scope.txn, store.tables
            due_key = layout.auto_commit_due_key(name)
            raw = txn.get(due_key, db=tables.due)
            if raw is None:
                return False
            at = layout.read_u64(raw)
            if now_ms < at <= latest:
                return False  # a later write opened a new countdown
            txn.delete(due_key, db=tables.due)
            meta = load_meta(txn, tables, name)
            if meta.manual or meta.next_count == 0:
                return False
            meta = writes.commit_automatic(txn, tables, meta, now_ms)
            scope.commits.append((name, meta.generation))
    except NoSuchCollection:
        return False
    return True


def commit_pending(txn: lmdb.Transaction, tables: Tables, now_ms: int) -> list[tuple[str, bytes]]:
    """Commits, in ``txn``, every automatic collection's writes that wait for their automatic commit;
    returns the (collection, generation) committed. A primary stepping down does it: what it answered
    ``put`` to is then committed, for the new primary to copy."""
    names: list[str] = []
    cursor = txn.cursor(db=tables.due)
    if cursor.set_range(layout.AUTO_COMMIT_DUE_PREFIX):
        for raw_key in cursor.iternext(values=False):
            name = layout.name_of_auto_commit_due_key(raw_key)
            if name is None:
                break
            names.append(name)
    committed: list[tuple[str, bytes]] = []
    for name in names:
        txn.delete(layout.auto_commit_due_key(name), db=tables.due)
        try:
            meta = load_meta(txn, tables, name)
        except NoSuchCollection:
            continue
        if meta.manual or meta.next_count == 0:
            continue
        meta = writes.commit_automatic(txn, tables, meta, now_ms)
        committed.append((name, meta.generation))
    return committed


def collect_step(store: StoreAccess) -> bool:
    """One bounded step of each kind of garbage; True if anything was removed."""
    worked = False
    with store.read() as txn:
        metas = collection_metas(txn, store.tables)
        # Decided in one snapshot, so idle collections cost no write transaction.
        now_ms = store.config.now_ms()
        due = [meta.name for meta in metas if _gc_due(txn, store.tables, meta, now_ms)]
    for name in due:
        worked = _gc_collection(store, name) or worked
    worked = _purge_expired_phantoms(store) or worked
    worked = _purge_dropped(store) or worked
    return worked


def _gc_due(txn: lmdb.Transaction, tables: Tables, meta: CollectionMeta, now_ms: int) -> bool:
    minimum = retention.lower(gc_minimum(txn, tables, meta.name), txn, tables, meta, now_ms)
    if not minimum:
        return False
    horizon = min(max(minimum, meta.gc_horizon or b""), meta.generation)
    if not horizon:
        return False
    if horizon > (meta.gc_horizon or b""):
        return True
    horizon_seq = resolve_seq(txn, tables, meta, horizon)
    return _next_run(txn, tables, meta, horizon_seq) is not None or lineage.has_below(
        txn, tables, meta, horizon_seq
    )


def _gc_collection(store: StoreAccess, name: str) -> bool:
    tables, batch = store.tables, store.config.gc_batch
    try:
        with store.write() as scope:
            txn = scope.txn
            meta = load_meta(txn, tables, name)
            minimum = retention.lower(gc_minimum(txn, tables, name), txn, tables, meta, store.config.now_ms())
            if minimum is None or minimum == b"":
                return False
            horizon = min(max(minimum, meta.gc_horizon or b""), meta.generation)
            if not horizon:
                return False
            if horizon > (meta.gc_horizon or b""):
                meta = meta.with_(gc_horizon=horizon)
                save_meta(txn, tables, meta)
            assert meta.gc_horizon is not None
            horizon_seq = resolve_seq(txn, tables, meta, meta.gc_horizon)
            # the lineage of generations below the horizon goes with them (that of the horizon stays)
            purged = lineage.purge_below(txn, tables, meta, horizon_seq, batch)
            seq = _next_run(txn, tables, meta, horizon_seq)
            if seq is None:
                return purged > 0
            position_key = layout.gc_position_key(meta.cid_prefix)
            raw_position = txn.get(position_key, db=tables.due)
            position = layout.read_gc_position(raw_position) if raw_position else None
            start_form = position[1] if position is not None and position[0] == seq else b""
            last_form, removed = _collect_run(txn, tables, meta, seq, horizon_seq, batch, start_form)
            scope.gc_versions_removed += removed
            if last_form is None:
                txn.delete(position_key, db=tables.due)
                save_meta(txn, tables, meta.with_(gc_done_seq=seq))
            else:
                txn.put(position_key, layout.gc_position(seq, last_form), db=tables.due)
            return True
    except NoSuchCollection:
        return False


def _next_run(txn: lmdb.Transaction, tables: Tables, meta: CollectionMeta, horizon_seq: int) -> int | None:
    cursor = txn.cursor(db=tables.gens)
    if not cursor.set_range(layout.gen_key(meta.cid_prefix, meta.gc_done_seq + 1)):
        return None
    key = cursor.key()
    if not key.startswith(meta.cid_prefix):
        return None
    seq = layout.seq_of_gen_key(key)
    return seq if seq <= horizon_seq else None


def _collect_run(
    txn: lmdb.Transaction,
    tables: Tables,
    meta: CollectionMeta,
    seq: int,
    horizon_seq: int,
    batch: int,
    start_form: bytes,
) -> tuple[bytes | None, int]:
    """Removes superseded versions of up to ``batch`` keys written in generation ``seq``.

    Returns the last key form handled when the run goes on (the next step resumes after it), None when
    the run is done; and how many versions it removed. Idempotent, so a crash only repeats work.
    """
    prefix = meta.cid_prefix
    if not changes.any_run_below(txn, tables, prefix, seq):
        # The oldest versions stored are this run's: it supersedes nothing. Its versions that a later run
        # supersedes go when that run is collected, so a collection's first load (10M keys: minutes of
        # seeks) costs GC nothing.
        return None, 0
    records = txn.cursor(db=tables.records)
    forms: list[bytes] = []
    removed = 0
    for form in changes.forms(txn, tables, prefix, seq, start_form):
        if form == start_form and start_form:
            continue
        forms.append(form)
        if len(forms) >= batch:
            break
    # the forms leave the runs of the generations whose versions go, one pass per run (a chunk is
    # rewritten once for all the forms it loses)
    gone: dict[int, list[bytes]] = {}
    records_prefix, above_horizon = meta.records_prefix, layout.record_seq(horizon_seq + 1)
    for form in forms:
        head = layout.record_head(records_prefix, form)
        if records.set_range(head + above_horizon):
            found = records.prev()
        else:
            found = records.last()
        if not found or not records.key().startswith(head):  # heads are prefix-free: a version of K
            continue
        stale: list[int] = []
        while records.prev():
            key = records.key()
            if not key.startswith(head):
                break
            stale.append(layout.read_record_seq(key[len(head) :]))
        for old in stale:
            txn.delete(layout.record_key(records_prefix, form, old), db=tables.records)
            gone.setdefault(old, []).append(form)
        removed += len(stale)
    for old, forms_gone in gone.items():
        changes.remove(txn, tables, prefix, old, forms_gone)
    return (forms[-1] if len(forms) >= batch else None), removed


def _purge_expired_phantoms(store: StoreAccess) -> bool:
    now_ms = int(time.time() * 1000)
    tables = store.tables
    with store.read() as txn:
        expired = [key for key, raw in txn.cursor(db=tables.phantom_ttl) if layout.read_u64(raw) < now_ms]
    if not expired:
        return False
    with store.write() as scope:
        for ttl_key in expired[:16]:
            if scope.txn.get(ttl_key, db=tables.phantom_ttl) is None:
                continue  # another process purged it meanwhile
            scope.phantom_records_purged += _delete_prefix(
                scope.txn, tables.phantoms, ttl_key, store.config.gc_batch
            )
            if not _has_prefix(scope.txn, tables.phantoms, ttl_key):
                scope.txn.delete(ttl_key, db=tables.phantom_ttl)
    return True


def _purge_dropped(store: StoreAccess) -> bool:
    tables = store.tables
    with store.read() as txn:
        dropped = list(txn.cursor(db=tables.dropped).iternext(values=False))
    if not dropped:
        return False
    with store.write() as scope:
        prefix = dropped[0]
        remaining = store.config.gc_batch
        records_prefix = layout.records_prefix(layout.cid_of_key(prefix))
        for db, table_prefix in (
            (tables.records, records_prefix),
            *((getattr(tables, table_name), prefix) for table_name in _ALL_TABLES_WITH_CID),
        ):
            remaining -= _delete_prefix(scope.txn, db, table_prefix, remaining)
            if remaining <= 0:
                return True
        scope.txn.delete(prefix, db=tables.dropped)
    return True


def _delete_prefix(txn: lmdb.Transaction, db: Table, prefix: bytes, limit: int) -> int:
    cursor = txn.cursor(db=db)
    deleted = 0
    if not cursor.set_range(prefix):
        return 0
    while deleted < limit and cursor.key().startswith(prefix):
        if not cursor.delete():
            break
        deleted += 1
    return deleted


def _has_prefix(txn: lmdb.Transaction, db: Table, prefix: bytes) -> bool:
    cursor = txn.cursor(db=db)
    return bool(cursor.set_range(prefix)) and cursor.key().startswith(prefix)
