"""Human byte sizes on the command line (``--map-size 64MiB``), parsed in one place for every command."""

from __future__ import annotations

import argparse
import re

_UNITS = {
    "": 1,
    "b": 1,
    "k": 1 << 10,
    "kib": 1 << 10,
    "kb": 10**3,
    "m": 1 << 20,
    "mib": 1 << 20,
    "mb": 10**6,
    "g": 1 << 30,
    "gib": 1 << 30,
    "gb": 10**9,
    "t": 1 << 40,
    "tib": 1 << 40,
    "tb": 10**12,
}
_SIZE = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*")


def parse_size(text: str) -> int:
    """Bytes in ``text``: a number with an optional unit, case-insensitive.

    ``KiB``/``MiB``/``GiB``/``TiB`` and the bare ``K``/``M``/``G``/``T`` are powers of 1024;
    ``KB``/``MB``/``GB``/``TB`` powers of 1000; ``B`` or no unit is bytes.
    Examples: ``64MiB``, ``1TiB``, ``1.5G``, ``4096``.

    Raises:
        ValueError: not a size, or a fraction of a byte.
    """
    match = _SIZE.fullmatch(text)
    unit = match.group(2).lower() if match else ""
    if match is None or unit not in _UNITS:
        raise ValueError(f"not a size: {text!r} (examples: 64MiB, 1TiB, 4096)")
    number = match.group(1)
    scale = _UNITS[unit]
    if "." in number:
        whole, fraction = number.split(".")
        numerator: int = int(whole + fraction) * scale
        denominator: int = 10 ** len(fraction)
        if numerator % denominator:
            raise ValueError(f"not a whole number of bytes: {text!r}")
        return numerator // denominator
    size: int = int(number) * scale
    return size


def size_argument(text: str) -> int:
    """``parse_size`` as an argparse ``type`` (a bad size is a usage error, not a traceback)."""
    try:
        return parse_size(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc


MAP_SIZE_HELP = (
    "upper bound of the store's file, e.g. 64MiB or 1TiB (default 1TiB; an address-space reservation, not an"
    " allocation; a write past it is refused with storageFull)"
)
