"""What the modules below the store see of it: its transactions, tables, page-token codec and configuration.

:class:`~diffstore.engine.store.Store` satisfies :class:`StoreAccess`. A collection
(:mod:`diffstore.engine.collection`), the page-token spill (:mod:`diffstore.engine.cursor_spill`) and the
background work (:mod:`diffstore.engine.background`) take a ``StoreAccess``, so none of them imports
``store.py``: the store imports them, and the engine's modules read top-down.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Protocol

import lmdb

from diffstore.engine.cursors import CursorCodec
from diffstore.engine.tables import Tables
from diffstore.engine.types import StoreConfig


@dataclass(slots=True)
class WriteScope:
    """An open write transaction plus what to announce once it has committed."""

    txn: lmdb.Transaction
    commits: list[tuple[str, bytes]] = field(default_factory=list)
    deletions: list[str] = field(default_factory=list)
    # non-manual collections whose open generation got its first write (an automatic commit becomes
    # due) or was committed at its threshold (the due commit is no more): applied to ``due`` in the txn
    first_writes: list[str] = field(default_factory=list)
    threshold_commits: list[str] = field(default_factory=list)
    # counted for write listeners (see engine/events.py)
    records_written: dict[str, int] = field(default_factory=dict)
    gc_versions_removed: int = 0
    phantom_records_purged: int = 0


class StoreAccess(Protocol):
    """A store's transactions, tables, page-token codec and configuration (see the module docstring)."""

    @property
    def config(self) -> StoreConfig: ...

    @property
    def tables(self) -> Tables: ...

    @property
    def cursors(self) -> CursorCodec: ...

    def read(self) -> AbstractContextManager[lmdb.Transaction]:
        """A read-only snapshot."""
        ...

    def page_read(self) -> AbstractContextManager[lmdb.Transaction]:
        """A read-only snapshot for building one whole page (pages of other threads wait their turn)."""
        ...

    def write(self) -> AbstractContextManager[WriteScope]:
        """One atomic write transaction."""
        ...

    def let_waiting_writers_in(self, timeout_s: float = 1.0) -> None:
        """Between two write transactions of a long job: the writers waiting for the lock go first."""
        ...

    def user_write(self, hold: bool = False) -> AbstractContextManager[WriteScope]:
        """One atomic write transaction of a user's request: refused once the store stepped down."""
        ...
