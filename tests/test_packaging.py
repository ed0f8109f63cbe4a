"""The wheel as a user gets it: built without warnings, installed without extras into a fresh venv, it is
the embedded engine, the client and the data-directory commands, without FastAPI, gRPC or pyspark; serve
says in one line that it needs the server extra, and with it serves; the Spark front says what to install.

Slow-ish (a fresh venv and pip installing the dependencies from its cache: ~40 s here), and in the suite:
it is the only test that sees the package as installed from a wheel rather than from the checkout.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import tomllib
import venv
from pathlib import Path

import httpx

from tests.helpers import free_port, wait_until

REPO = Path(__file__).resolve().parent.parent
DEADLINE_S = 300.0
# Lines pip itself prints about this machine's pip configuration (extra index directories that do not
# exist here), not about the project.
_MACHINE_NOISE = re.compile(r"WARNING: Location 'file://[^']*' is ignored")


def warnings_in(output: str) -> list[str]:
    return [
        line
        for line in output.splitlines()
        if re.search(r"warn", line, re.I) and not _MACHINE_NOISE.search(line)
    ]


def test_the_wheel_installs_without_extras_for_embedded_use_and_serves_with_its_extra(tmp_path: Path) -> None:
    source = tmp_path / "source"  # a copy: building in the checkout would leave build/ there
    source.mkdir()
    for name in ("pyproject.toml", "setup.py", "README.md", "LICENSE"):
        shutil.copy(REPO / name, source / name)
    for package in ("diffstore", "pyspark_diffstore"):
        shutil.copytree(REPO / package, source / package, ignore=shutil.ignore_patterns("__pycache__"))
    # without PYTHONDONTWRITEBYTECODE (setuptools warns that it cannot byte-compile) and PYTHONPATH (only
    # the installed package may be importable)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONDONTWRITEBYTECODE", "PYTHONPATH")}
    env["PIP_ROOT_USER_ACTION"] = "ignore"
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-v", "-w", str(tmp_path / "dist"), str(source)],
        capture_output=True,
        text=True,
        timeout=DEADLINE_S,
        env=env,
    )
    assert built.returncode == 0, built.stdout + built.stderr
    assert warnings_in(built.stdout + built.stderr) == []
    (wheel,) = (tmp_path / "dist").glob("diffstore-*.whl")

    fresh = tmp_path / "venv"
    venv.create(fresh, with_pip=True)
    installed = subprocess.run(
        [str(fresh / "bin" / "pip"), "install", str(wheel)],
        capture_output=True,
        text=True,
        timeout=DEADLINE_S,
        env=env,
    )
    assert installed.returncode == 0, installed.stdout + installed.stderr
    if shutil.which("cc") or shutil.which("gcc"):  # the engine's optional accelerator was compiled
        accel = subprocess.run(
            [str(fresh / "bin" / "python"), "-c", "from diffstore.engine import layout; print(layout.ACCEL)"],
            capture_output=True,
            text=True,
            env=env,
            cwd=tmp_path,
        )
        assert accel.returncode == 0 and "_accel" in accel.stdout, accel.stdout + accel.stderr
    for module in ("pyspark", "fastapi", "uvicorn", "grpc", "prometheus_client"):  # no extra's modules
        missing = subprocess.run(
            [str(fresh / "bin" / "python"), "-c", f"import {module}"],
            capture_output=True,
            env=env,
            cwd=tmp_path,
        )
        assert missing.returncode == 1 and f"No module named '{module}'".encode() in missing.stderr
    _embedded_without_extras(fresh, tmp_path, env)
    # the server is an extra: without it, serve says in one line which one to install
    refused = subprocess.run(
        [str(fresh / "bin" / "diffstore"), "serve", "--data", str(tmp_path / "data")],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=DEADLINE_S,
    )
    (line,) = refused.stderr.splitlines()
    assert refused.returncode == 1 and re.fullmatch(
        r"diffstore serve: needs the 'server' extra \((fastapi|uvicorn) is not installed\): pip install"
        r" 'diffstore\[server\]' \(from a clone: pip install '\.\[server\]'\)",
        line,
    ), refused.stderr
    with_server = subprocess.run(
        [str(fresh / "bin" / "pip"), "install", f"{wheel}[server]"],
        capture_output=True,
        text=True,
        timeout=DEADLINE_S,
        env=env,
    )
    assert with_server.returncode == 0, with_server.stdout + with_server.stderr

    port = free_port()
    server = subprocess.Popen(
        [str(fresh / "bin" / "diffstore"), "serve", "--data", str(tmp_path / "data"), "--port", str(port)]
        + ["--workers", "1"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=tmp_path,  # not the checkout: only the installed package is importable
    )

    def healthy() -> bool:
        assert server.poll() is None, server.communicate()[1]
        try:
            answer = httpx.get(f"http://127.0.0.1:{port}/healthz")
        except httpx.TransportError:
            return False  # not listening yet
        assert answer.status_code == 200 and answer.json()["ok"] is True
        return True

    try:
        wait_until(healthy, 60, 0.1, "diffstore serve to answer /healthz")
        _spark_without_pyspark(fresh, tmp_path, env)
    finally:
        server.send_signal(signal.SIGINT)
        _, stderr = server.communicate(timeout=60)
    assert server.returncode == 0, stderr


def dockerfile_instructions() -> list[tuple[str, str]]:
    """The Dockerfile's instructions as (KEYWORD, arguments), continuation lines joined, comments dropped."""
    text = re.sub(r"\\\n(\s*#.*\n)*", " ", (REPO / "Dockerfile").read_text())
    lines = [line.strip() for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    return [(line.split(None, 1)[0].upper(), line.split(None, 1)[1]) for line in lines]


def test_the_image_installs_its_dependencies_before_it_copies_the_source(tmp_path: Path) -> None:
    """So that a change to the source reuses the (slow) dependency layer of the image."""
    steps = dockerfile_instructions()
    copies = [i for i, (keyword, _) in enumerate(steps) if keyword == "COPY"]
    dependencies = next(
        i for i, (keyword, args) in enumerate(steps) if keyword == "RUN" and "pip install -r" in args
    )
    source = next(
        i for i, (keyword, args) in enumerate(steps) if keyword == "COPY" and "diffstore" in args.split()
    )
    assert [steps[i][1] for i in copies if i < dependencies] == ["pyproject.toml ./"]
    assert dependencies < source
    # the step's own command, run on our pyproject.toml, lists exactly the base dependencies
    shutil.copy(REPO / "pyproject.toml", tmp_path / "pyproject.toml")
    command = re.search(r'python -c "(.*?)"\s*>', steps[dependencies][1])
    assert command, steps[dependencies][1]
    listed = subprocess.run(
        [sys.executable, "-c", command.group(1)], cwd=tmp_path, capture_output=True, text=True, check=True
    ).stdout.split()
    with (REPO / "pyproject.toml").open("rb") as f:
        project = tomllib.load(f)["project"]
    extras = project["optional-dependencies"]
    assert listed == list(dict.fromkeys(project["dependencies"] + extras["server"] + extras["streams"]))
    assert "pip install --no-deps ." in " ".join(args for _, args in steps[source:])


def test_the_python_versions_are_declared() -> None:
    with (REPO / "pyproject.toml").open("rb") as f:
        project = tomllib.load(f)["project"]
    declared = [
        tuple(int(n) for n in c.rsplit(" ", 1)[1].split("."))
        for c in project["classifiers"]
        if re.fullmatch(r"Programming Language :: Python :: 3\.\d+", c)
    ]
    floor = tuple(int(n) for n in re.fullmatch(r">=(\d+)\.(\d+)", project["requires-python"]).groups())  # type: ignore[union-attr]
    assert declared and min(declared) == floor and declared == sorted(declared)
    assert sys.version_info[:2] in declared  # the interpreter the tests run on is one of them


EMBEDDED = """
import sys
from diffstore import Store
with Store.open(sys.argv[1]) as store:
    c = store.create_collection("C", manual=True)
    c.start_generation(b"1")
    c.put_many([(b"k%d" % i, b"v") for i in range(100)], generation_id=b"1")
    c.commit_generation(b"1", metadata={"by": "embedded"})
    assert len(list(c.query())) == 100 and c.history()[0][0].metadata == {"by": "embedded"}
import diffstore.client  # the client of a server is in the base package too
"""


def _embedded_without_extras(fresh: Path, tmp_path: Path, env: dict[str, str]) -> None:
    """The base package is enough for the embedded engine, the client and the commands on a data
    directory (check here)."""
    (tmp_path / "embedded.py").write_text(EMBEDDED)
    store = tmp_path / "embedded-store"
    ran = subprocess.run(
        [str(fresh / "bin" / "python"), "embedded.py", str(store)], capture_output=True, text=True, env=env,
        cwd=tmp_path, timeout=DEADLINE_S,
    )  # fmt: skip
    assert ran.returncode == 0, ran.stderr
    checked = subprocess.run(
        [str(fresh / "bin" / "diffstore"), "check", "--data", str(store)], capture_output=True, text=True,
        env=env, cwd=tmp_path, timeout=DEADLINE_S,
    )  # fmt: skip
    assert checked.returncode == 0 and "every invariant holds" in checked.stdout, checked.stderr


def _spark_without_pyspark(fresh: Path, tmp_path: Path, env: dict[str, str]) -> None:
    """Without pyspark, the Spark front fails in one line that names the extra to install (the command's
    own line: tests/test_cli_errors.py)."""
    fix = (
        "needs pyspark, which is not installed: pip install 'diffstore[spark]' "
        "(from a clone: pip install '.[spark]')"
    )
    imported = subprocess.run(
        [str(fresh / "bin" / "python"), "-c", "from diffstore.spark import Transform"],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
    )
    assert imported.returncode == 1
    assert imported.stderr.splitlines()[-1] == f"ModuleNotFoundError: diffstore.spark.Transform {fix}"
