"""``diffstore check``'s verification of the checksums rows carry (the sealed record values of
``layout.py``): what a records row's seal says, as the scan of ``check_scan.py`` (and its compiled twin,
``read_record_row`` in ``_accel.c``) reads each row once.

A sealed value that does not match its checksum is damage (a flipped bit in the key or the value: the
checksum covers both). A plain value is a row written before checksums existed: legal in a store that
still holds such rows (they are counted, and a note says how many: ``diffstore migrate`` or ``compact``
seals them), damage in a store whose ``layout.SEALED_ROW`` says every record is sealed (a flipped tag bit
turns a sealed value into a plain-looking one).
"""

from __future__ import annotations

import lmdb

from diffstore.engine import layout
from diffstore.engine.tables import Tables

FAILS = "its checksum fails (the key or the value was changed underneath)"
MISSING = "it carries no checksum, in a store whose every record is sealed"


class RowSeals:
    """The checksum verification of one check: whether the store is sealed, and how many rows predate
    checksums (counted by the scan's loops)."""

    def __init__(self, all_sealed: bool) -> None:
        self.all_sealed = all_sealed
        self.unsealed = 0

    @classmethod
    def of(cls, txn: lmdb.Transaction, tables: Tables) -> RowSeals:
        """The verification of the store ``txn`` reads (sealed when ``layout.SEALED_ROW`` is there)."""
        return cls(txn.get(layout.SEALED_ROW, db=tables.collections) is not None)

    def record(self, key: bytes, raw: bytes) -> tuple[bytes, str | None]:
        """The plain value of the records row ``key -> raw`` (for the rest of the checks) and what is
        wrong with its checksum (None: nothing); counts it when it predates checksums."""
        plain, problem = self.problem(key, raw)
        if not layout.is_sealed(raw) and not self.all_sealed:
            self.unsealed += 1
        return plain, problem

    def problem(self, key: bytes, raw: bytes) -> tuple[bytes, str | None]:
        """:meth:`record` without counting (for a row the scan handed back, counted already)."""
        if layout.is_sealed(raw):
            return layout.plain(raw), FAILS if layout.seal_fails(key, raw) else None
        return raw, MISSING if self.all_sealed else None

    def note(self) -> str | None:
        """What check says of the rows that predate checksums (None: there are none)."""
        if not self.unsealed:
            return None
        return (
            f"{self.unsealed} records rows predate checksums (written by an older diffstore): reads cannot"
            " verify them; diffstore migrate (or compact) seals them"
        )
