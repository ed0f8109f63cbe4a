"""Which checksum function records carry (issue 49): the cost per records row (a ~20-byte key and a
~100-byte value, hashed as key then value) of each candidate, called from Python the way the general write
path and the pure-Python reads call it, against zlib.crc32 (the standard library's) in the same run.

    .venv/bin/python benchmarks/checksum_functions.py [--rows N] [--rounds R]

Candidates that are not installed are listed as such (``pip install xxhash crc32c google-crc32c`` in a
scratch environment to measure them; diffstore depends on none of them). The compiled accelerator computes
the chosen function (zlib's CRC-32) itself for the bulk path; its cost shows in benchmarks/integrity.py.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import time
import zlib
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _harness import machine, median, ratio_line  # noqa: E402

Hash = Callable[[bytes, bytes], int]


def candidates() -> dict[str, Hash | None]:
    found: dict[str, Hash | None] = {"zlib.crc32 (chosen)": lambda k, v: zlib.crc32(v, zlib.crc32(k))}

    def optional(name: str, make: Callable[[object], Hash]) -> Hash | None:
        try:
            return make(importlib.import_module(name))
        except ImportError:
            return None

    found["xxhash.xxh3_64 (key + value)"] = optional(
        "xxhash",
        lambda m: lambda k, v, f=m.xxh3_64_intdigest: f(k + v),  # type: ignore[attr-defined,misc]
    )
    found["crc32c.crc32c"] = optional(
        "crc32c",
        lambda m: lambda k, v, f=m.crc32c: f(v, f(k)),  # type: ignore[attr-defined,misc]
    )
    found["google_crc32c"] = optional(
        "google_crc32c",
        lambda m: lambda k, v, e=m.extend, s=m.value: e(s(k), v),  # type: ignore[attr-defined,misc]
    )
    return found


def per_row(rows: list[tuple[bytes, bytes]], hash_of: Hash) -> float:
    started = time.perf_counter()
    for key, value in rows:
        hash_of(key, value)
    return (time.perf_counter() - started) / len(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    print(machine())
    rows = [
        (b"\x01\x01key-%012d\x00\x00\x01\x05\x01" % i, b"\x01" + os.urandom(100)) for i in range(args.rows)
    ]
    found = candidates()
    usable = {name: f for name, f in found.items() if f is not None}
    times: dict[str, list[float]] = {name: [] for name in usable}
    for turn in range(args.rounds):  # alternating, each first in turn: load falls on all alike
        names = list(usable)
        for name in names[turn % len(names) :] + names[: turn % len(names)]:
            times[name].append(per_row(rows, usable[name]))
    base = median(times["zlib.crc32 (chosen)"])
    for name, f in found.items():
        if f is None:
            print(f"{name}: not installed")
            continue
        print(
            ratio_line(
                f"{name}, a row of {len(rows[0][0]) + len(rows[0][1])} bytes",
                median(times[name]) * 1e9,
                base * 1e9,
                "ns",
            )
        )


if __name__ == "__main__":
    main()
