"""What a write transaction did, told to write listeners after it committed (metrics, logs).

The engine counts; what a listener does with the counts (Prometheus counters, say) is not its business.
A listener runs in the committing thread, outside the write lock, like a commit listener; its failure is
logged and hides nothing from the other listeners.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class WriteEvent:
    """One committed write transaction.

    Attributes:
        commits: ``(collection, generation id)`` of every generation it committed.
        records_written: collection -> records it wrote into generations (phantom records not included).
        gc_versions_removed: superseded record versions removed by a GC step.
        phantom_records_purged: records of expired phantoms removed.
    """

    commits: tuple[tuple[str, bytes], ...]
    records_written: Mapping[str, int]
    gc_versions_removed: int
    phantom_records_purged: int


WriteListener = Callable[[WriteEvent], None]
