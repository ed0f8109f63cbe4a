"""Fencing: the replication term of a store, and a primary that steps down when a newer one exists.

Every store has a **term** (0 until it takes part in a promotion). Promoting a replica raises its term
(``replication.promote``) past its old primary's; the new primary first tells the old one to step down
(:func:`step_down`), and any request may carry a term (the ``Diffstore-Term`` header, :func:`learn_term`).
A store told of a term above its own stores it; one that is no replica then **steps down**: it refuses
every write (409 ``fenced``, :func:`check_writable`) in every process that opens it, across restarts,
until an operator lifts it (:func:`unfence`). A following replica only takes the term: it refuses
writes anyway, and its promotion goes above it.

The rows live in the ``replica`` table (``layout``): ``term``, ``fenced`` and the count of step-downs.
"""

from __future__ import annotations

import lmdb
import msgpack

from diffstore.engine import layout
from diffstore.engine.tables import Tables
from diffstore.engine.types import Fencing
from diffstore.errors import Fenced, NotReplica, ReadOnlyReplica


def _following(txn: lmdb.Transaction, tables: Tables) -> bool:
    """A replica that refuses writes (as ``replication.is_following``, which imports this module)."""
    return (
        txn.get(layout.REPLICA_PRIMARY, db=tables.replica) is not None
        and txn.get(layout.REPLICA_PROMOTED, db=tables.replica) is None
    )


def term(txn: lmdb.Transaction, tables: Tables) -> int:
    """The store's replication term (0: it never took part in a promotion)."""
    raw = txn.get(layout.REPLICA_TERM, db=tables.replica)
    return layout.read_u64(raw) if raw is not None else 0


def set_term(txn: lmdb.Transaction, tables: Tables, value: int) -> None:
    txn.put(layout.REPLICA_TERM, layout.u64(value), db=tables.replica)


def fencing(txn: lmdb.Transaction, tables: Tables) -> Fencing | None:
    """Why the store refuses writes as ``fenced``, or None when it does not."""
    raw = txn.get(layout.REPLICA_FENCED, db=tables.replica)
    if raw is None:
        return None
    told, primary, replica_id, at_ms = msgpack.unpackb(raw)
    return Fencing(told, primary, replica_id, at_ms)


def _fence(txn: lmdb.Transaction, tables: Tables, fenced: Fencing) -> None:
    row = msgpack.packb([fenced.term, fenced.primary, fenced.replica_id, fenced.at_ms])
    txn.put(layout.REPLICA_FENCED, row, db=tables.replica)
    txn.put(layout.REPLICA_STEP_DOWNS, layout.u64(step_downs(txn, tables) + 1), db=tables.replica)


def step_downs(txn: lmdb.Transaction, tables: Tables) -> int:
    """How many times the store stepped down (was fenced), ever: a metric's counter."""
    raw = txn.get(layout.REPLICA_STEP_DOWNS, db=tables.replica)
    return layout.read_u64(raw) if raw is not None else 0


def fenced_error(fenced: Fencing) -> Fenced:
    by = f" for {fenced.primary}" if fenced.primary else ""
    return Fenced(
        f"this server stepped down{by} at term {fenced.term}: it accepts no writes; send them to the primary",
        fenced.term,
        fenced.primary,
    )


def refuse_if_fenced(txn: lmdb.Transaction, tables: Tables) -> None:
    """Raises ``Fenced`` once the store stepped down (inside every user write transaction)."""
    raw = txn.get(layout.REPLICA_FENCED, db=tables.replica)
    if raw is not None:
        raise fenced_error(fencing(txn, tables))  # type: ignore[arg-type]


def check_writable(txn: lmdb.Transaction, tables: Tables) -> None:
    """Raises why the store refuses writes now: a following replica, or a primary that stepped down.

    Raises:
        ReadOnlyReplica: the store follows a primary.
        Fenced: the store stepped down (a higher term exists).
    """
    if _following(txn, tables):
        raise ReadOnlyReplica("this server is a read replica: send writes to its primary (or promote it)")
    fenced = fencing(txn, tables)
    if fenced is not None:
        raise fenced_error(fenced)


def learn_term(txn: lmdb.Transaction, tables: Tables, told: int, now_ms: int) -> bool:
    """A term carried by a request: a higher one is stored, and a store that is no replica steps down
    (some other primary was promoted past it). Returns whether the term was higher."""
    if told <= term(txn, tables):
        return False
    set_term(txn, tables, told)
    if not _following(txn, tables):
        _fence(txn, tables, Fencing(told, None, None, now_ms))
    return True


def step_down(
    txn: lmdb.Transaction, tables: Tables, told: int, primary: str, replica_id: str | None, now_ms: int
) -> Fencing | None:
    """A new primary (``primary``, a replica of this store with ``replica_id``) promoted at term ``told``
    tells this store to step down: the term is stored and a store that is no replica is fenced. Asked
    again by the same new primary at the same term, it answers the same.

    Returns:
        the fencing, or None on a replica (it takes the term; it refuses writes anyway).

    Raises:
        Fenced: ``told`` is not above the store's term (and the store was not fenced by that same
            primary at that term): the asker is not the newest primary.
    """
    current = term(txn, tables)
    fenced = fencing(txn, tables)
    again = fenced is not None and told == fenced.term == current and fenced.replica_id == replica_id
    if told < current or (told == current and not again):
        raise Fenced(
            f"term {told} is not above this server's term {current}: a newer primary exists",
            current,
            fenced.primary if fenced is not None else None,
        )
    if again:
        return fenced
    set_term(txn, tables, told)
    if _following(txn, tables):
        return None
    stepped = Fencing(told, primary, replica_id, now_ms)
    _fence(txn, tables, stepped)
    return stepped


def step_up(txn: lmdb.Transaction, tables: Tables, told: int, replica_id: str | None) -> None:
    """The promotion that stepped this store down at ``told`` was abandoned (its replica could not catch
    up): the fencing is lifted, the term stays (the next promotion goes above it). A store that is not
    fenced answers the same (asked again).

    Raises:
        Fenced: the store was stepped down by another replica or at another term, or its term moved on.
    """
    fenced = fencing(txn, tables)
    if fenced is None:
        return
    if fenced.term != told or fenced.replica_id != replica_id or term(txn, tables) != told:
        raise fenced_error(fenced)
    txn.delete(layout.REPLICA_FENCED, db=tables.replica)


def unfence(txn: lmdb.Transaction, tables: Tables) -> int:
    """Lifts a store's fencing (an operator's decision: the primary it stepped down for is gone); its term
    goes one above the one it was fenced at. Returns the new term.

    Raises:
        NotReplica: the store is not fenced (a replica is promoted instead; a primary has nothing to lift).
    """
    fenced = fencing(txn, tables)
    if fenced is None or _following(txn, tables):
        raise NotReplica("this server is not a replica, nor a primary that stepped down")
    raised = max(term(txn, tables), fenced.term) + 1
    set_term(txn, tables, raised)
    txn.delete(layout.REPLICA_FENCED, db=tables.replica)
    return raised
