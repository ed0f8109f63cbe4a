"""Builds the engine's optional compiled accelerator (diffstore/engine/_accel.c); the rest of the
project's configuration is in pyproject.toml. ``optional``: without a C compiler the install still
succeeds and the engine runs its pure-Python twins, with the same results.

The build carries the digest of the source it was built from (``_accel.SOURCE``): layout.py runs the
twins, with a warning, rather than a build of another version of ``_accel.c`` (say, a stale in-place
build after a pull, before ``make install``).

The accelerator is built only on the CPython versions its tests ran on (``TESTED_ON``): it reuses a row
tuple when only it holds one, writes tuple slots and resizes bytes in place -- CPython internals that a
new version may change. Elsewhere (another version, a free-threaded build, another implementation) the
build says so once and leaves it out; ``DIFFSTORE_ACCEL_UNTESTED=1`` builds it anyway, to run its tests
(tests/engine/test_accel.py and scripts/asan_check.sh) on a new version before adding it here."""

import hashlib
import os
import platform
import sys
import sysconfig
from pathlib import Path

from setuptools import Extension, setup

SOURCE = "diffstore/engine/_accel.c"
TESTED_ON = {(3, 11), (3, 12), (3, 13)}  # CPython versions tests/engine/test_accel*.py pass on
UNTESTED = "DIFFSTORE_ACCEL_UNTESTED"


def refusal(implementation: str, version: tuple[int, int], free_threaded: bool) -> str | None:
    """Why the accelerator is not built here (None: it is)."""
    tested = ", ".join(f"{major}.{minor}" for major, minor in sorted(TESTED_ON))
    if implementation != "CPython":
        return f"it is written for CPython, this is {implementation}"
    if free_threaded:
        return "it is not tested on a free-threaded build"
    if version not in TESTED_ON:
        return f"it is tested on CPython {tested}, this is {version[0]}.{version[1]}"
    return None


def ext_modules() -> list[Extension]:
    reason = refusal(
        platform.python_implementation(),
        sys.version_info[:2],
        bool(sysconfig.get_config_var("Py_GIL_DISABLED")),
    )
    if reason is not None and os.environ.get(UNTESTED) != "1":
        print(
            f"diffstore: building without the compiled accelerator ({reason}); the engine runs its "
            f"pure-Python code, with the same results (set {UNTESTED}=1 to build it anyway)",
            file=sys.stderr,
        )
        return []
    digest = hashlib.sha256((Path(__file__).parent / SOURCE).read_bytes()).hexdigest()
    return [
        Extension(
            "diffstore.engine._accel",
            [SOURCE],
            define_macros=[("DIFFSTORE_ACCEL_SOURCE", f'"{digest}"')],
            optional=True,
        )
    ]


setup(ext_modules=ext_modules())
