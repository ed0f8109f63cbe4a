"""The data commands on a data directory (``--data DIR``) against the same commands over HTTP (``--url``).

    .venv/bin/python benchmarks/cli_data_dir.py [--records 200000] [--gets 200] [--rounds 3]

A server (``diffstore serve`` in a child process) serves a directory holding an automatic collection C of
``--records`` records. Timed, alternately, ``--rounds`` times each, through the command's ``main`` in this
process (an interpreter's start is not what is compared): ``query C`` printing every record, and
``--gets`` runs of ``get C KEY`` (each opens its store or its connection, as a shell loop of commands
does), once with ``--data`` (the directory opened here, beside the running server) and once with
``--url`` (the baseline). Both print the same bytes (checked). Prints the medians and the ratios; the
machine is shared, so compare the ratios, not the seconds.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import tempfile
import time
from pathlib import Path

from _harness import diffstore_serve, load_average, machine, median, ratio_line

from diffstore import cli
from diffstore.client import Client


def run(argv: list[str]) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert cli.main(argv) == 0, argv
    return out.getvalue()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--gets", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    print(machine())
    with tempfile.TemporaryDirectory(prefix="diffstore-cli-bench-") as tmp:
        data = Path(tmp) / "data"
        with diffstore_serve(data, "--no-sync") as served:
            with Client(served.url) as client:
                c = client.create_collection("C", manual=False)
                for start in range(0, args.records, 10_000):
                    stop = min(start + 10_000, args.records)
                    c.put_many([(b"k%09d" % i, b"v%d" % i) for i in range(start, stop)])
                wanted = c.next_generation_id
                while wanted is not None and c.generation_id < wanted:  # the last write's commit
                    time.sleep(0.05)
            where = {"data": ["--data", str(data)], "url": ["--url", served.url]}
            times: dict[str, list[float]] = {f"{w} {what}": [] for w in where for what in ("query", "get")}
            outputs: dict[str, str] = {}
            for _ in range(args.rounds):
                for name, flags in where.items():
                    started = time.perf_counter()
                    outputs[name] = run(["query", "C", *flags])
                    times[f"{name} query"].append(time.perf_counter() - started)
                    started = time.perf_counter()
                    for i in range(args.gets):
                        run(["get", "C", f"k{i * 997 % args.records:09d}", *flags])
                    times[f"{name} get"].append((time.perf_counter() - started) / args.gets)
            assert outputs["data"] == outputs["url"] and outputs["data"].count("\n") == args.records
        query_data, query_url = median(times["data query"]), median(times["url query"])
        get_data, get_url = median(times["data get"]), median(times["url get"])
        print(f"query of {args.records:,} records, {args.rounds} rounds (medians; baseline: --url):")
        print(
            ratio_line(
                "query --data (records/s)", args.records / query_data, args.records / query_url, "rec/s"
            )
        )
        print(ratio_line("get --data (ms/command)", get_data * 1000, get_url * 1000, "ms"))
    print(f"load average: {load_average()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
