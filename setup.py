"""Builds the engine's optional compiled accelerator (diffstore/engine/_accel.c); the rest of the
project's configuration is in pyproject.toml. ``optional``: without a C compiler the install still
succeeds and the engine runs its pure-Python twins, with the same results.

The build carries the digest of the source it was built from (``_accel.SOURCE``): layout.py runs the
twins, with a warning, rather than a build of another version of ``_accel.c`` (say, a stale in-place
build after a pull, before ``make install``)."""

import hashlib
from pathlib import Path

from setuptools import Extension, setup

SOURCE = "diffstore/engine/_accel.c"
digest = hashlib.sha256((Path(__file__).parent / SOURCE).read_bytes()).hexdigest()

setup(
    ext_modules=[
        Extension(
            "diffstore.engine._accel",
            [SOURCE],
            define_macros=[("DIFFSTORE_ACCEL_SOURCE", f'"{digest}"')],
            optional=True,
        )
    ]
)
