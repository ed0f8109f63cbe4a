"""The command line without its optional extras (simulated: their modules refuse to import, as in a
``pip install diffstore`` without extras): every command's ``--help`` works, a bare ``diffstore`` prints the
usage, and a command whose extra is missing says in one line which package it needs and what to install.

tests/test_packaging.py checks the same with the wheel really installed for each extra set; this file
runs in seconds, in this venv, and fails on the code that built parsers with their extras' modules.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import HELP_OF_EVERY_COMMAND, command_paths, help_failures

# The top-level modules the extras bring (pyproject.toml): none of them may be needed to build a parser.
EXTRA_MODULES = {
    "server": ("fastapi", "starlette", "uvicorn", "fastapi_offline", "prometheus_client"),
    "streams": ("grpc", "google", "zstandard", "prometheus_client"),
    "spark": ("pyspark", "pyarrow", "pandas", "prometheus_client", "grpc_status", "py4j"),
}
NO_EXTRAS = sorted({module for modules in EXTRA_MODULES.values() for module in modules})
DEADLINE_S = 120.0


def without(modules: list[str], code: str) -> str:
    """``code`` run where ``modules`` cannot be imported (``None`` in sys.modules: ModuleNotFoundError)."""
    return f"import sys\nfor m in {modules!r}:\n    sys.modules[m] = None\n{code}"


def run(code: str, *argv: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code, *argv], capture_output=True, text=True, timeout=DEADLINE_S, cwd=cwd
    )


def test_every_command_s_help_works_without_any_extra() -> None:
    paths = command_paths()
    assert len(paths) > 30  # every command and sub-command, not a front that failed to load
    done = run(without(NO_EXTRAS, HELP_OF_EVERY_COMMAND), json.dumps(paths))
    assert done.returncode == 0, done.stderr
    assert help_failures(json.loads(done.stdout), paths) == []


def test_a_bare_diffstore_prints_the_usage_without_any_extra() -> None:
    done = run(without(NO_EXTRAS, "from diffstore.cli import main\nsys.exit(main([]))"))
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert done.stdout.startswith("usage: diffstore ")
    for command in ("serve", "ingest", "transform", "query", "backup"):
        assert f"\n    {command} " in done.stdout  # every command is listed, with or without its extra


MAIN = "from diffstore.cli import main\nsys.exit(main(sys.argv[1:]))"


@pytest.mark.parametrize(
    ("argv", "extra", "package"),
    [
        (["serve", "--data", "{tmp}/data"], "server", "fastapi"),
        (["streams", "serve", "--data", "{tmp}/hstream"], "streams", "grpcio"),
        (["streams", "ls"], "streams", "grpcio"),
        (["streams", "produce", "s"], "streams", "grpcio"),
        (
            ["ingest", "--hstream", "hstream://127.0.0.1:9", "--subscription", "s", "--collection", "c"]
            + ["--data", "{tmp}/data"],
            "streams",
            "grpcio",
        ),
    ],
    ids=lambda value: " ".join(value[:2]) if isinstance(value, list) else None,
)
def test_a_command_whose_extra_is_missing_names_its_package_and_the_install(
    argv: list[str], extra: str, package: str, tmp_path: Path
) -> None:
    done = run(without(NO_EXTRAS, MAIN), *(a.format(tmp=tmp_path) for a in argv), cwd=tmp_path)
    command = " ".join(["diffstore", *argv[: 2 if argv[0] == "streams" else 1]])
    assert done.returncode == 1 and done.stdout == "", done.stderr
    assert done.stderr == (
        f"{command}: needs the '{extra}' extra ({package} is not installed): pip install 'diffstore[{extra}]'"
        f" (from a clone: pip install '.[{extra}]')\n"
    )
    assert not (tmp_path / "data").exists() and not (tmp_path / "hstream").exists()  # nothing was created


def test_transform_without_its_extra_names_pyspark_not_the_first_module_it_missed(tmp_path: Path) -> None:
    """prometheus_client (of its metrics) was imported first and named: a user knows the extra by pyspark."""
    done = run(
        without(NO_EXTRAS, MAIN),
        *["transform", "--job", "j:f", "--target", "t", "--source", "a=A", "--url", "http://127.0.0.1:9"],
        cwd=tmp_path,
    )
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.startswith("diffstore transform: Spark is not installed here (pyspark is missing): ")
    assert "pip install 'diffstore[spark]'" in done.stderr and "prometheus" not in done.stderr


def test_a_missing_module_of_an_installed_extra_is_named_by_its_pip_name(tmp_path: Path) -> None:
    """grpc there, protobuf not (a broken install): the message names protobuf, the package to install."""
    done = run(without(["google"], MAIN), "streams", "ls", "--hstream", "hstream://127.0.0.1:9", cwd=tmp_path)
    assert done.returncode == 1, done.stderr
    fix = "needs the 'streams' extra (protobuf is not installed)"
    assert done.stderr.startswith(f"diffstore streams ls: {fix}: pip install 'diffstore[streams]'")
