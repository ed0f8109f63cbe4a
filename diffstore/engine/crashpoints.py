"""Named points where a test may have the process killed (``kill -9`` of itself), to prove that a backup
or a compaction cut off there leaves what it promises. Nothing happens unless the environment variable
``DIFFSTORE_CRASH_AT`` names the point; the tests in tests/engine/test_backup_crash.py set it."""

from __future__ import annotations

import os
import signal

CRASH_AT_ENV = "DIFFSTORE_CRASH_AT"


def reached(point: str) -> None:
    """Kills this process at once (SIGKILL: no cleanup, no flush) when ``DIFFSTORE_CRASH_AT`` is ``point``."""
    if os.environ.get(CRASH_AT_ENV) == point:
        os.kill(os.getpid(), signal.SIGKILL)
