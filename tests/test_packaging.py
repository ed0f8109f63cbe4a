"""The wheel as a user gets it: built without warnings, then installed into a fresh venv for each extra set
(none, server, streams, spark, all), where every command's ``--help`` works, one real command of each
front the set brings runs (the engine and the data-directory and client commands always; serve; streams
serve, produce and ingest; transform on Spark), and each command whose extra is missing says in one line
which package it needs and what to install.

Each venv is made by pip from its cache (the index only for what the cache lacks): ~5 s for the base
package, ~20 s for the Spark sets here; the runs in them take most of the few minutes this file takes.
These are the only tests that see the package as installed from a wheel rather than from the checkout;
tests/test_cli_extras.py checks the same messages in seconds, in this venv, with modules refused.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tomllib
import venv
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from diffstore import Store
from tests.helpers import (
    HELP_OF_EVERY_COMMAND,
    close_pipes,
    command_paths,
    free_port,
    help_failures,
    running_server,
    wait_until,
)

REPO = Path(__file__).resolve().parent.parent
DEADLINE_S = 900.0  # an upper bound per command, not a measure: pip and Spark under load
# Lines pip itself prints about this machine's pip configuration (extra index directories that do not
# exist here), not about the project.
_MACHINE_NOISE = re.compile(r"WARNING: Location 'file://[^']*' is ignored")
EXTRA_SETS = ("none", "server", "streams", "spark", "all")
FRONTS = ("server", "streams", "spark")
# the module a front cannot run without (its extra's main package), and what a user is told without it
MAIN_MODULES = {"server": "fastapi", "streams": "grpc", "spark": "pyspark"}
SERVER_FIX = "needs the 'server' extra (fastapi is not installed): pip install 'diffstore[server]'"
STREAMS_FIX = "needs the 'streams' extra (grpcio is not installed): pip install 'diffstore[streams]'"
SPARK_FIX = "Spark is not installed here (pyspark is missing): pip install 'diffstore[spark]'"


def warnings_in(output: str) -> list[str]:
    return [
        line
        for line in output.splitlines()
        if re.search(r"warn", line, re.I) and not _MACHINE_NOISE.search(line)
    ]


def user_env() -> dict[str, str]:
    """This environment without what would make the checkout importable (PYTHONPATH) or change pip's
    build (PYTHONDONTWRITEBYTECODE: setuptools warns that it cannot byte-compile), or Spark's session."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONDONTWRITEBYTECODE", "PYTHONPATH")}
    env.pop("SPARK_REMOTE", None)
    env["PIP_ROOT_USER_ACTION"] = "ignore"
    return env


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """The wheel built from a copy of the checkout (building in the checkout would leave build/ there),
    and pip's output."""
    tmp_path = tmp_path_factory.mktemp("wheel")
    source = tmp_path / "source"
    source.mkdir()
    for name in ("pyproject.toml", "setup.py", "README.md", "LICENSE"):
        shutil.copy(REPO / name, source / name)
    for package in ("diffstore", "pyspark_diffstore"):
        shutil.copytree(REPO / package, source / package, ignore=shutil.ignore_patterns("__pycache__"))
    done = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-v", "-w", str(tmp_path / "dist"), str(source)],
        capture_output=True,
        text=True,
        timeout=DEADLINE_S,
        env=user_env(),
    )
    assert done.returncode == 0, done.stdout + done.stderr
    (wheel,) = (tmp_path / "dist").glob("diffstore-*.whl")
    return wheel, done.stdout + done.stderr


def test_the_wheel_builds_without_warnings(built: tuple[Path, str]) -> None:
    assert warnings_in(built[1]) == []


@dataclass
class Venv:
    """A fresh venv with the wheel installed; commands run from ``cwd``, outside the checkout."""

    path: Path
    cwd: Path
    env: dict[str, str]

    def run(self, *argv: str, **kwargs: object) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(self.path / "bin" / argv[0]), *argv[1:]],
            capture_output=True,
            text=True,
            env=self.env,
            cwd=self.cwd,
            timeout=DEADLINE_S,
            **kwargs,  # type: ignore[call-overload]
        )

    def diffstore(self, *argv: str, **kwargs: object) -> subprocess.CompletedProcess[str]:
        return self.run("diffstore", *argv, **kwargs)

    def start(self, *argv: str, log: Path) -> subprocess.Popen[str]:
        """``diffstore ARGV`` in the background, stdout and stderr to ``log``."""
        with log.open("w") as out:
            return subprocess.Popen(
                [str(self.path / "bin" / "diffstore"), *argv],
                stdout=out,
                stderr=subprocess.STDOUT,
                text=True,
                env=self.env,
                cwd=self.cwd,
            )

    def has(self, module: str) -> bool:
        found = self.run(
            "python", "-c", f"import importlib.util; print(importlib.util.find_spec({module!r}))"
        )
        assert found.returncode == 0, found.stderr
        return found.stdout.strip() != "None"


def install(wheel: Path, extras: str, tmp_path: Path) -> Venv:
    path = tmp_path / f"venv-{extras}"
    venv.create(path, with_pip=True)
    cwd = tmp_path / "work"
    cwd.mkdir()
    env = user_env()
    env["PYSPARK_PYTHON"] = str(path / "bin" / "python")  # Spark's workers: this venv's Python
    fresh = Venv(path, cwd, env)
    # --no-compile: Python compiles what it imports; compiling all of pyspark at install took most of it
    requirement = str(wheel) if extras == "none" else f"{wheel}[{extras}]"
    done = fresh.run("pip", "install", "--no-compile", requirement)
    assert done.returncode == 0, done.stdout + done.stderr
    return fresh


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


# pip unpacking pyspark (~700 MB) and a Spark session: 4 min each for the two Spark sets at load 12 here,
# past pytest's default 10 min per test at a load CI can reach
@pytest.mark.timeout(1800)
@pytest.mark.parametrize("extras", EXTRA_SETS)
def test_each_extra_set_installs_and_runs_what_it_brings(
    extras: str, built: tuple[Path, str], tmp_path: Path
) -> None:
    fresh = install(built[0], extras, tmp_path)
    fronts = set(FRONTS) if extras == "all" else {extras} & set(FRONTS)
    try:
        # the set brings its fronts' modules and not the others' (the spark extra brings grpc too: the
        # Spark Connect client needs it)
        assert fresh.has("fastapi") == ("server" in fronts)
        assert fresh.has("pyspark") == ("spark" in fronts)
        assert fresh.has("grpc") == bool(fronts & {"streams", "spark"})
        paths = command_paths()
        helped = fresh.run("python", "-c", HELP_OF_EVERY_COMMAND, json.dumps(paths))
        assert helped.returncode == 0, helped.stderr
        assert help_failures(json.loads(helped.stdout), paths) == []
        bare = fresh.diffstore()
        assert bare.returncode == 2 and bare.stdout.startswith("usage: diffstore ") and bare.stderr == ""
        _engine_and_data_directory(fresh, tmp_path)
        _missing_fronts(fresh, fronts, tmp_path)
        with _http_server(fresh, "server" in fronts, tmp_path) as url:
            _client_commands(fresh, url)
            if "streams" in fronts:
                _streams_and_ingest(fresh, tmp_path)
            if "spark" in fronts:
                _transform(fresh, url)
    finally:
        shutil.rmtree(fresh.path)  # up to 1 GB with Spark


def _engine_and_data_directory(fresh: Venv, tmp_path: Path) -> None:
    """The embedded engine, the compiled accelerator, and the commands on a data directory."""
    if shutil.which("cc") or shutil.which("gcc"):  # the engine's optional accelerator was compiled
        accel = fresh.run("python", "-c", "from diffstore.engine import layout; print(layout.ACCEL)")
        assert accel.returncode == 0 and "_accel" in accel.stdout, accel.stdout + accel.stderr
    (fresh.cwd / "embedded.py").write_text(EMBEDDED)
    store = tmp_path / "embedded-store"
    ran = fresh.run("python", "embedded.py", str(store))
    assert ran.returncode == 0, ran.stderr
    backed_up = fresh.diffstore("backup", "--data", str(store), str(tmp_path / "backup"))
    assert backed_up.returncode == 0, backed_up.stderr
    checked = fresh.diffstore("check", "--data", str(tmp_path / "backup"))
    assert checked.returncode == 0 and "every invariant holds" in checked.stdout, checked.stderr


def _missing_fronts(fresh: Venv, fronts: set[str], tmp_path: Path) -> None:
    """Each command whose extra is missing fails in one line naming the package and the install."""
    if not fresh.has(MAIN_MODULES["server"]):
        refused = fresh.diffstore("serve", "--data", str(tmp_path / "never"))
        assert (refused.returncode, refused.stderr) == (
            1,
            f"diffstore serve: {SERVER_FIX} (from a clone: pip install '.[server]')\n",
        )
    if not fresh.has(MAIN_MODULES["streams"]):
        for argv in (
            ["streams", "ls", "--hstream", "hstream://127.0.0.1:9"],
            ["ingest", "--hstream", "hstream://127.0.0.1:9", "--subscription", "s", "--collection", "c"]
            + ["--data", str(tmp_path / "never")],
        ):
            refused = fresh.diffstore(*argv)
            command = " ".join(["diffstore", *argv[: 2 if argv[0] == "streams" else 1]])
            assert (refused.returncode, refused.stderr) == (
                1,
                f"{command}: {STREAMS_FIX} (from a clone: pip install '.[streams]')\n",
            )
    if "spark" not in fronts:
        (fresh.cwd / "myjob.py").write_text("def job(spark, diffs, lookup):\n    return diffs['a']\n")
        refused = fresh.diffstore(
            "transform",
            "--job",
            "myjob:job",
            "--target",
            "T",
            "--source",
            "a=A",
            "--url",
            "http://127.0.0.1:9",
        )
        assert refused.returncode == 1 and refused.stderr.startswith(f"diffstore transform: {SPARK_FIX}")
        imported = fresh.run("python", "-c", "from diffstore.spark import Transform")
        assert imported.returncode == 1
        assert imported.stderr.splitlines()[-1] == (
            "ModuleNotFoundError: diffstore.spark.Transform needs pyspark, which is not installed: "
            "pip install 'diffstore[spark]' (from a clone: pip install '.[spark]')"
        )
    assert not (tmp_path / "never").exists()


@contextmanager
def _http_server(fresh: Venv, in_venv: bool, tmp_path: Path) -> Iterator[str]:
    """``diffstore serve`` of the venv when it has the server extra, else one of this test process."""
    if not in_venv:
        with running_server(tmp_path / "server-data") as live:
            yield live.url
        return
    port = free_port()
    log = tmp_path / "serve.log"
    server = fresh.start("serve", "--data", str(tmp_path / "server-data"), "--port", str(port), log=log)
    url = f"http://127.0.0.1:{port}"

    def healthy() -> bool:
        assert server.poll() is None, log.read_text()
        try:
            answer = httpx.get(f"{url}/healthz")
        except httpx.TransportError:
            return False  # not listening yet
        assert answer.status_code == 200 and answer.json()["ok"] is True
        return True

    try:
        wait_until(healthy, 300, 0.1, "diffstore serve to answer /healthz")
        yield url
    finally:
        server.send_signal(signal.SIGINT)
        server.wait(timeout=60)
        close_pipes(server)
    assert server.returncode == 0, log.read_text()


def _client_commands(fresh: Venv, url: str) -> None:
    """The base package's commands on a URL: a manual collection, one generation, a query."""
    for argv in (
        ["collections", "create", "A", "--manual"],
        ["generation", "start", "A", "g1"],
        ["put", "A", "k", "v", "--generation", "g1"],
        ["generation", "commit", "A", "g1"],
    ):
        done = fresh.diffstore(*argv, "--url", url)
        assert done.returncode == 0, f"{argv}: {done.stderr}"
    queried = fresh.diffstore("query", "A", "--url", url)
    assert (queried.returncode, queried.stdout) == (0, "k\tv\n"), queried.stderr
    for argv, shown in (
        (["get", "A", "k"], "v"),
        (["diff", "A", "--from", "", "--to", "g1"], "k"),
        (["log", "A"], "g1"),
    ):
        done = fresh.diffstore(*argv, "--url", url)
        assert done.returncode == 0 and shown in done.stdout, f"{argv}: {done.stdout} {done.stderr}"


def _streams_and_ingest(fresh: Venv, tmp_path: Path) -> None:
    """The stream server, records produced to it, and ingest applying them to a data directory."""
    port = free_port()
    hstream = f"hstream://127.0.0.1:{port}"
    log = tmp_path / "streams.log"
    server = fresh.start(
        "streams", "serve", "--data", str(tmp_path / "hstream"), "--port", str(port), log=log
    )
    ingest: subprocess.Popen[str] | None = None
    try:

        def listening() -> bool:
            assert server.poll() is None, log.read_text()
            return fresh.diffstore("streams", "ls", "--hstream", hstream).returncode == 0

        wait_until(listening, 300, 0.2, "diffstore streams serve to answer")
        for argv in (["create", "events"], ["subscribe", "events", "--subscription", "sub"]):
            done = fresh.diffstore("streams", *argv, "--hstream", hstream)
            assert done.returncode == 0, f"{argv}: {done.stderr}"
        produced = fresh.diffstore(
            "streams", "produce", "events", "--key", "k", "--hstream", hstream, input="a\nb\nc\n"
        )
        assert produced.returncode == 0, produced.stderr
        ingested = tmp_path / "ingested"
        ingest_log = tmp_path / "ingest.log"
        ingest = fresh.start(
            "ingest", "--hstream", hstream, "--subscription", "sub", "--collection", "C", "--data",
            str(ingested), "--create-collection", "--window-ms", "100", "--log-commits", log=ingest_log,
        )  # fmt: skip

        def applied() -> bool:
            assert ingest is not None and ingest.poll() is None, ingest_log.read_text()
            commits = [
                json.loads(line) for line in ingest_log.read_text().splitlines() if line.startswith("{")
            ]
            return bool(commits) and commits[-1]["applied"] == 3

        wait_until(applied, 300, 0.1, "ingest to apply the 3 records produced")
        ingest.send_signal(signal.SIGTERM)
        assert ingest.wait(timeout=60) == 0, ingest_log.read_text()
        with Store.open(ingested) as store:  # the last record of key k
            assert [(r.key, r.value) for r in store.collection("C").query()] == [(b"k", b"c")]
    finally:
        for process in (ingest, server):
            if process is not None and process.poll() is None:
                process.send_signal(signal.SIGINT)
                process.wait(timeout=60)
            if process is not None:
                close_pipes(process)


def _transform(fresh: Venv, url: str) -> None:
    """A transform on a local Spark session: the target T becomes a copy of A."""
    (fresh.cwd / "copyjob.py").write_text(
        "from pyspark.sql import functions as F\n\n"
        "def job(spark, diffs, lookup):\n"
        "    return diffs['a'].select('key', F.col('toValue').alias('value'))\n"
    )
    done = fresh.diffstore(
        "transform", "--url", url, "--job", "copyjob:job", "--target", "T", "--source", "a=A",
        "--create-target", "--master", "local[1]",
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr[-4000:]
    queried = fresh.diffstore("query", "T", "--url", url)
    assert (queried.returncode, queried.stdout) == (0, "k\tv\n"), queried.stderr


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
