"""A fail-over member's role as the store keeps it, and the write deadline every writer checks.

``diffstore serve --ha-etcd`` (:mod:`diffstore.ha`) elects one leader per cluster through etcd. The
engine knows nothing of etcd: the member tells the store what it decided -- lead at a term, follow a
leader, step back -- and the store keeps it in one row of the ``replica`` table (``layout.REPLICA_HA``),
so that every process over the data directory (the HTTP workers, a script) obeys the same decision.

Invariants:
- A store with an HA row accepts a user write only while the row says ``leader`` and the write's
  transaction begins before ``writable_until`` (``time.monotonic_ns``, one clock for every process of the
  machine). The member sets that deadline to half the etcd lease's TTL after the last renewal it *sent*
  that etcd acknowledged: the key can only expire a TTL after that send, so a member cut off from etcd, or
  stopped and continued, refuses writes before any other member can take the key.
- Leading, following and stepping back are each one transaction with the role row: there is no instant
  at which the store is a primary and the row says otherwise.
- A store without the row (no ``--ha-etcd``) is not affected; ``serve`` without ``--ha-etcd`` removes it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import lmdb
import msgpack

from diffstore.engine import fencing, layout, replication
from diffstore.engine.tables import Tables
from diffstore.errors import ReadOnlyReplica

ROLES = ("leader", "replica", "candidate", "fenced")


@dataclass(frozen=True, slots=True)
class HaRecord:
    """What a fail-over member decided, as every process reads it.

    Attributes:
        cluster, member: the cluster's and this member's names.
        role: ``leader`` | ``replica`` | ``candidate`` | ``fenced`` (a leader that stepped back).
        leader_member, leader_url: the leader this member knows (None: none known).
        term: the cluster's term this member knows.
        writable_until_ns: ``time.monotonic_ns()`` up to which a leader accepts writes (0: never).
        failovers: how many times this member took the lead after another member held it.
        discarded: generations of its own this member discarded when it rejoined (never replicated).
    """

    cluster: str
    member: str
    role: str
    leader_member: str | None = None
    leader_url: str | None = None
    term: int = 0
    writable_until_ns: int = 0
    failovers: int = 0
    discarded: int = 0

    def __post_init__(self) -> None:
        if self.role not in ROLES:
            raise ValueError(f"role must be one of {', '.join(ROLES)}")

    def writable(self, now_ns: int) -> bool:
        return self.role == "leader" and now_ns < self.writable_until_ns


def _pack(record: HaRecord) -> bytes:
    packed: bytes = msgpack.packb(
        [
            record.cluster,
            record.member,
            record.role,
            record.leader_member,
            record.leader_url,
            record.term,
            record.writable_until_ns,
            record.failovers,
            record.discarded,
        ]
    )
    return packed


def read(txn: lmdb.Transaction, tables: Tables) -> HaRecord | None:
    """The member's row, or None on a store that is not a fail-over member."""
    raw = txn.get(layout.REPLICA_HA, db=tables.replica)
    return None if raw is None else HaRecord(*msgpack.unpackb(raw))


def put(txn: lmdb.Transaction, tables: Tables, record: HaRecord) -> None:
    txn.put(layout.REPLICA_HA, _pack(record), db=tables.replica)


def clear(txn: lmdb.Transaction, tables: Tables) -> bool:
    """Removes the row (the store served without fail-over); whether there was one."""
    return bool(txn.delete(layout.REPLICA_HA, db=tables.replica))


def refusal(record: HaRecord, now_ns: int) -> ReadOnlyReplica | None:
    """Why a member refuses a write now (None: it is the leader and its lease holds)."""
    if record.writable(now_ns):
        return None
    if record.role == "leader":
        why = "this member's lease on the leader key was not renewed in time: it accepts no writes"
    else:
        why = f"this member is a {record.role}, not the leader of cluster {record.cluster}: send writes to"
        why += f" {record.leader_url}" if record.leader_url else " the leader (none is known yet)"
    return ReadOnlyReplica(why, record.leader_url if record.role != "leader" else None)


def refuse_unless_leading(txn: lmdb.Transaction, tables: Tables) -> None:
    """Raises ``ReadOnlyReplica`` in a user write's transaction when the store is a fail-over member that
    is not a leader within its deadline (nothing when it is no member)."""
    record = read(txn, tables)
    if record is not None:
        refused = refusal(record, time.monotonic_ns())
        if refused is not None:
            raise refused


def lead(txn: lmdb.Transaction, tables: Tables, record: HaRecord, now_ms: int) -> None:
    """This member won the leader key at ``record.term``: a following store is promoted, a stepped-back
    one lifts its fencing; the store's term becomes the cluster's."""
    if replication.is_following(txn, tables):
        replication.promote(txn, tables, now_ms, record.term, record.leader_url)
    txn.delete(layout.REPLICA_FENCED, db=tables.replica)
    fencing.set_term(txn, tables, max(record.term, fencing.term(txn, tables)))
    put(txn, tables, record)


def follow(txn: lmdb.Transaction, tables: Tables, record: HaRecord, replica_id: str) -> None:
    """This member follows ``record.leader_url``: the store becomes its replica (whatever it was: a
    primary, a promoted replica, a replica of another leader), keeping its collections -- the follower
    keeps what the leader also has and copies again what diverged."""
    assert record.leader_url is not None
    txn.put(layout.REPLICA_PRIMARY, record.leader_url.encode(), db=tables.replica)
    txn.put(layout.REPLICA_ID, replica_id.encode(), db=tables.replica)
    for key in (layout.REPLICA_PROMOTED, layout.REPLICA_FENCED, layout.REPLICA_SELF):
        txn.delete(key, db=tables.replica)
    fencing.set_term(txn, tables, max(record.term, fencing.term(txn, tables)))
    put(txn, tables, record)
