"""The whole pipeline for an hour (or ``--minutes``) under random faults, invariants checked all the time
(issue 52, part 1); prints the figures and writes the samples (CSV) and their plot (PNG) next to them.

    .venv/bin/python benchmarks/soak.py [--minutes 60] [--work DIR] [--fault-every-s 30]
                                        [--records-per-s 100] [--no-spark] [--no-replica]

The pipeline, the faults and the invariants are those of ``tests/soak/harness.py`` (``make test`` runs
it for 3 minutes). Figures: invariant violations (goal 0); each process's RSS after the warm-up (the first
10 minutes; goal ≤ +10%); the store's size in the second half (goal: flat within 20%); end-to-end
freshness, a record's append → C readable with it, between faults (goal p99 ≤ 250 ms).
"""

from __future__ import annotations

import argparse
import csv
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _harness import machine  # noqa: E402

from tests.soak.harness import Soak, SoakConfig  # noqa: E402


def plot(samples_csv: Path, png: Path) -> bool:
    """RSS per process, store size and reader lag over time; False when matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    with samples_csv.open() as f:
        rows = list(csv.DictReader(f))
    if not rows:
        return False
    t = [float(r["t_s"]) / 60 for r in rows]
    figure, (rss, store, lag) = plt.subplots(3, 1, figsize=(10, 10), sharex=True)
    for column in rows[0]:
        if column.startswith("rss_mb:"):
            rss.plot(t, [float(r[column]) for r in rows], label=column.split(":", 1)[1])
    rss.set_ylabel("RSS (MB)")
    rss.legend(fontsize="small", ncol=3)
    store.plot(t, [float(r["store_mb"]) for r in rows])
    store.set_ylabel("store file (MB)")
    lag.plot(t, [int(r["lag_generations"]) for r in rows])
    lag.set_ylabel("max reader lag (generations)")
    lag.set_xlabel("minutes")
    figure.tight_layout()
    figure.savefig(png)
    return True


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=60.0)
    parser.add_argument("--work", type=Path, default=None, help="where the stores and logs go (kept)")
    parser.add_argument("--fault-every-s", type=float, default=30.0)
    parser.add_argument("--records-per-s", type=float, default=100.0)
    parser.add_argument("--backup-every-s", type=float, default=300.0)
    parser.add_argument("--seed", type=int, default=int(time.time()))
    parser.add_argument("--no-spark", action="store_true", help="no transform, C or consumer")
    parser.add_argument("--no-replica", action="store_true")
    args = parser.parse_args()
    print(machine())
    work = args.work or Path(tempfile.mkdtemp(prefix="diffstore-soak-"))
    config = SoakConfig(
        work=work, minutes=args.minutes, records_per_s=args.records_per_s, fault_every_s=args.fault_every_s,
        backup_every_s=args.backup_every_s, seed=args.seed, spark=not args.no_spark,
        replica=not args.no_replica,
    )  # fmt: skip
    soak = Soak(config)
    try:
        soak.start()
        print(f"soaking for {args.minutes} minutes in {work} (seed {args.seed})", flush=True)
        soak.soak()
        print(soak.report())
        samples = work / "samples.csv"
        soak.write_samples(samples)
        png = work / "soak.png"
        drawn = plot(samples, png)
        print(f"samples: {samples}; plot: {png if drawn else 'not drawn (pip install matplotlib)'}")
    finally:
        soak.stop()
    sys.exit(1 if soak.run.violations else 0)


if __name__ == "__main__":
    main()
