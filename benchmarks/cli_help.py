"""``diffstore COMMAND --help`` of the commands whose parsers imported their extra's modules before.

    .venv/bin/python benchmarks/cli_help.py [--rounds 7]

The streams, ingest and transform parsers imported grpc, the stream client and prometheus_client to build
their options (and so failed without them); they now import them when a command runs. Timed, alternately,
``--rounds`` times each, in a fresh interpreter: the command's ``--help`` as it is, and the baseline, the
same ``--help`` after importing the modules its parser imported before (what it cost then). Prints the
medians and the ratios; the machine is shared, so compare the ratios, not the milliseconds.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time

from _harness import machine, median, ratio_line

# each command, and what its parser imported before
COMMANDS = {
    "streams ls": "import diffstore.streams.client",
    "ingest": "import diffstore.streams.client, diffstore.streams.ingest, prometheus_client",
    "transform": "import prometheus_client",
}
HELP = """\
{before}
from diffstore.cli import main
try:
    main({argv!r})
except SystemExit:
    pass
"""


def timed(code: str) -> float:
    started = time.perf_counter()
    subprocess.run([sys.executable, "-c", code], check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - started


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    print(machine())
    for command, before in COMMANDS.items():
        argv = [*command.split(), "--help"]
        ours, baseline = [], []
        for _ in range(args.rounds):
            ours.append(timed(HELP.format(before="", argv=argv)))
            baseline.append(timed(HELP.format(before=before, argv=argv)))
        ours_ms, baseline_ms = median(ours) * 1e3, median(baseline) * 1e3
        print(ratio_line(f"{command} --help", ours_ms, baseline_ms, "ms", "lower is better"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
