"""Builds the engine's optional compiled accelerator (diffstore/engine/_accel.c); the rest of the
project's configuration is in pyproject.toml. ``optional``: without a C compiler the install still
succeeds and the engine runs its pure-Python twins, with the same results."""

from setuptools import Extension, setup

setup(ext_modules=[Extension("diffstore.engine._accel", ["diffstore/engine/_accel.c"], optional=True)])
