"""The build of the compiled accelerator in use is the build of the source beside it: after a pull that
changed ``_accel.c``, a stale in-place build is not used (layout.py warns once and the pure-Python twins
run), and here the suite fails rather than skip tests/engine/test_accel.py quietly. setup.py builds it only
on the CPython versions it is tested on."""

from __future__ import annotations

import importlib.util
import platform
import runpy
import subprocess
import sys
from pathlib import Path

import pytest
import setuptools

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


# --- which interpreters the accelerator is built for -------------------------------------------------------

ROOT = Path(__file__).resolve().parents[2]


def run_setup(
    monkeypatch: pytest.MonkeyPatch, version: tuple[int, int] | None = None
) -> tuple[list[object], dict[str, object]]:
    """The extensions setup.py asks setuptools to build here (with ``version``: as if on that CPython), and
    the module's namespace."""
    asked: list[list[object]] = []
    with monkeypatch.context() as patched:
        patched.setattr(setuptools, "setup", lambda **kwargs: asked.append(kwargs["ext_modules"]))
        if version is not None:
            patched.setattr(sys, "version_info", (*version, 0, "final", 0))
        namespace = runpy.run_path(str(ROOT / "setup.py"))
    assert len(asked) == 1
    return asked[0], namespace


def test_the_accelerator_is_built_on_the_versions_it_is_tested_on(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("DIFFSTORE_ACCEL_UNTESTED", raising=False)
    built, namespace = run_setup(monkeypatch)
    here = (platform.python_implementation(), sys.version_info[:2], False)
    if namespace["refusal"](*here) is not None:  # type: ignore[operator]
        pytest.skip(f"the accelerator is not tested on {here}")
    assert [ext.name for ext in built] == ["diffstore.engine._accel"]  # type: ignore[attr-defined]
    assert capsys.readouterr().err == ""


def test_an_untested_version_builds_without_the_accelerator_and_says_so_once(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("DIFFSTORE_ACCEL_UNTESTED", raising=False)
    assert run_setup(monkeypatch, (3, 99))[0] == []  # before: built on any version
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "building without the compiled accelerator" in err and "this is 3.99" in err
    monkeypatch.setenv("DIFFSTORE_ACCEL_UNTESTED", "1")  # to run its tests on a new version
    assert len(run_setup(monkeypatch, (3, 99))[0]) == 1
    assert capsys.readouterr().err == ""


def test_other_interpreters_and_free_threaded_builds_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    refusal = run_setup(monkeypatch)[1]["refusal"]
    assert refusal("CPython", (3, 11), False) is None  # type: ignore[operator]
    assert "PyPy" in refusal("PyPy", (3, 11), False)  # type: ignore[operator]
    assert "free-threaded" in refusal("CPython", (3, 13), True)  # type: ignore[operator]
    assert "3.10" in refusal("CPython", (3, 10), False)  # type: ignore[operator]
