"""The build of the compiled accelerator in use is the build of the source beside it: after a pull that
changed ``_accel.c``, a stale in-place build is not used (layout.py warns once and the pure-Python twins
run), and here the suite fails rather than skip tests/engine/test_accel.py quietly."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

from diffstore.engine import layout


def test_a_built_accelerator_is_current_and_used() -> None:
    if importlib.util.find_spec("diffstore.engine._accel") is None:
        pytest.skip("the compiled accelerator was not built")
    assert layout.ACCEL is not None, "the build is of another version of _accel.c: run `make install`"


def test_a_stale_build_warns_once_and_the_engine_runs_without_it(tmp_path: Path) -> None:
    script = """
import sys, types, warnings
stale = types.ModuleType("diffstore.engine._accel")
stale.SOURCE = "0" * 64  # the digest of an older _accel.c
sys.modules["diffstore.engine._accel"] = stale
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    from diffstore import Store, StoreConfig
    from diffstore.engine import layout
print(layout.ACCEL, len(caught), caught[0].category.__name__)
with Store.open(sys.argv[1], StoreConfig(background=False)) as store:
    coll = store.create_collection("c", manual=True)
    coll.start_generation(b"1")
    coll.put_many([(b"a", b"1"), (b"b", b"2")], generation_id=b"1")
    coll.commit_generation(b"1")
    print([(item.key, item.to_value) for item in coll.diff(b"", b"1")])
"""
    done = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path / "s")],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert done.stdout.split("\n")[:2] == ["None 1 RuntimeWarning", "[(b'a', b'1'), (b'b', b'2')]"]
