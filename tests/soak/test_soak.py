"""The soak in ``make test``: the whole pipeline for 3 minutes (``DIFFSTORE_SOAK_MINUTES``) under random
faults, every invariant checked while it runs and at the end (issue 52, part 1).

``benchmarks/soak.py --minutes 60`` is the long run, with figures and plots; this one asserts only what
must hold whatever the machine's speed: no invariant violated, every invariant actually checked, no
component that ended by itself, every acknowledged record in A exactly once.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.soak.harness import Soak, SoakConfig


@pytest.fixture
def soak(tmp_path: Path) -> Iterator[Soak]:
    minutes = float(os.environ.get("DIFFSTORE_SOAK_MINUTES", "3"))
    running = Soak(SoakConfig(work=tmp_path, minutes=minutes, fault_every_s=12.0, backup_every_s=45.0))
    try:
        yield running
    finally:
        running.stop()


@pytest.mark.timeout(1500)
def test_the_pipeline_holds_every_invariant_under_random_faults(soak: Soak) -> None:
    soak.start()
    run = soak.soak()
    report = soak.report()
    print(report)
    assert not run.violations, report
    assert not run.errors, report
    assert run.produced > 0
    every = ("A exactly once", "C = A+B", "view = C", "replica = primary", "backup checked and equal")
    for invariant in every:
        assert run.checks.get(invariant, 0) > 0, f"{invariant} was never checked:\n{report}"
    for final in ("C = A+B (final)", "view = C (final)", "replica = primary at the end (final)"):
        assert run.checks.get(final, 0) == 1, report
    assert soak.faults is not None and len(soak.faults.thrown) >= 3, report
