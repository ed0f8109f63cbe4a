"""``diffstore check``'s verification of the checksums rows carry (the sealed record values of
``layout.py``), one row at a time: the scan of ``check.py`` hands each records row to :meth:`RowSeals.record`
and reports what it answers.

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


class RowSeals:
    """The checksum verification of one check: what it found and how many rows predate checksums."""

    def __init__(self, txn: lmdb.Transaction, tables: Tables) -> None:
        self.all_sealed = txn.get(layout.SEALED_ROW, db=tables.collections) is not None
        self.unsealed = 0

    def record(self, key: bytes, raw: bytes) -> tuple[bytes, str | None]:
        """The plain value of the records row ``key -> raw`` (for the rest of the checks) and what is
        wrong with its checksum (None: nothing)."""
        if layout.is_sealed(raw):
            if layout.seal_fails(key, raw):
                return layout.plain(raw), "its checksum fails (the key or the value was changed underneath)"
            return layout.plain(raw), None
        if self.all_sealed:
            return raw, "it carries no checksum, in a store whose every record is sealed"
        self.unsealed += 1
        return raw, None

    def note(self) -> str | None:
        """What check says of the rows that predate checksums (None: there are none)."""
        if not self.unsealed:
            return None
        return (
            f"{self.unsealed} records rows predate checksums (written by an older diffstore): reads cannot"
            " verify them; diffstore migrate (or compact) seals them"
        )
