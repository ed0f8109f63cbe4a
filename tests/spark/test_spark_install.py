"""``format("diffstore")`` resolves in a fresh, plain session from any working directory, after the
README's install (``make install``: an editable install) and after ``pip install`` of the built wheel.

Spark finds Python data sources by listing ``pyspark_*`` packages with ``pkgutil.iter_modules()``, which
does not see packages that an editable install serves through an import hook: there the format resolved
only where the repository root was the working directory. Each case runs a script that registers nothing,
from a temporary directory, with nothing on ``PYTHONPATH``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import venv
from pathlib import Path

from helpers_spark import commit_items

from diffstore import Store

REPO = Path(__file__).resolve().parents[2]
DEADLINE_S = 600.0

SCRIPT = """
import sys
import diffstore
from pyspark.sql import SparkSession

spark = (
    SparkSession.builder.master("local[1]")
    .config("spark.ui.enabled", "false")
    .config("spark.driver.host", "127.0.0.1")
    .config("spark.driver.bindAddress", "127.0.0.1")
    .config("spark.driver.extraJavaOptions", "-XX:+UseSerialGC -XX:TieredStopAtLevel=1")
    .getOrCreate()
)
rows = spark.read.format("diffstore").option("url", sys.argv[1]).option("collection", sys.argv[2]).load()
print(sorted((bytes(row.key), bytes(row.value)) for row in rows.collect()))
print(diffstore.__file__)
spark.stop()
"""


def _run(python: Path, cwd: Path, server_url: str, collection: str) -> list[str]:
    (cwd / "read.py").write_text(SCRIPT)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "SPARK_REMOTE")}
    env["PYSPARK_PYTHON"] = str(python)
    done = subprocess.run(
        [str(python), "read.py", server_url, collection],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=DEADLINE_S,
    )
    assert done.returncode == 0, done.stdout + done.stderr[-4000:]
    return done.stdout.splitlines()


def _fresh_venv(path: Path) -> Path:
    """A venv whose own site-packages (returned) comes first and this venv's dependencies (pyspark, ~700
    MB) after it, as a plain path entry: the checkout, which this venv reaches by an editable install, is
    not on its path at all."""
    venv.create(path, with_pip=False)
    (site,) = (path / "lib").glob("python*/site-packages")
    deps = next(p for p in map(Path, sys.path) if p.name == "site-packages" and (p / "pyspark").is_dir())
    (site / "deps.pth").write_text(f"{deps}\n")
    return site


def _collection(store: Store, names: dict[str, str]) -> str:
    store.create_collection(names["A"], manual=True)
    commit_items(store, names["A"], [(b"k1", b"v1"), (b"k2", b"v2")])
    return names["A"]


def test_the_editable_install_resolves_the_format_from_any_directory(
    server_url: str, store: Store, names: dict[str, str], tmp_path: Path
) -> None:
    rows, module = _run(Path(sys.executable), tmp_path, server_url, _collection(store, names))
    assert rows == "[(b'k1', b'v1'), (b'k2', b'v2')]"
    assert Path(module).is_relative_to(REPO)  # the checkout's package: an editable install


def test_the_installed_wheel_resolves_the_format_from_any_directory(
    server_url: str, store: Store, names: dict[str, str], tmp_path: Path
) -> None:
    source = tmp_path / "source"  # a copy: building in the checkout would leave build/ there
    source.mkdir()
    for name in ("pyproject.toml", "setup.py", "README.md", "LICENSE"):
        shutil.copy(REPO / name, source / name)
    for package in ("diffstore", "pyspark_diffstore"):
        shutil.copytree(REPO / package, source / package, ignore=shutil.ignore_patterns("__pycache__"))
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(tmp_path / "dist"), str(source)],
        capture_output=True,
        text=True,
        timeout=DEADLINE_S,
        env=env,
    )
    assert built.returncode == 0, built.stdout + built.stderr
    (wheel,) = (tmp_path / "dist").glob("diffstore-*.whl")
    site = _fresh_venv(tmp_path / "venv")
    installed = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(site), str(wheel)],
        capture_output=True,
        text=True,
        timeout=DEADLINE_S,
        env=env,
    )
    assert installed.returncode == 0, installed.stdout + installed.stderr
    fresh = tmp_path / "venv"
    cwd = tmp_path / "elsewhere"
    cwd.mkdir()
    rows, module = _run(fresh / "bin" / "python", cwd, server_url, _collection(store, names))
    assert rows == "[(b'k1', b'v1'), (b'k2', b'v2')]"
    assert Path(module).is_relative_to(site)  # the wheel's package, not the checkout's


UNINSTALLED_WORKERS = """
import sys
from pyspark.sql import SparkSession
from diffstore.spark import Transform, TransformError

spark = (
    SparkSession.builder.master("local[1]")
    .config("spark.ui.enabled", "false")
    .config("spark.driver.host", "127.0.0.1")
    .config("spark.driver.bindAddress", "127.0.0.1")
    .config("spark.driver.extraJavaOptions", "-XX:+UseSerialGC -XX:TieredStopAtLevel=1")
    .getOrCreate()
)


def copy(spark, diffs, lookup):
    return diffs["a"].selectExpr("key", "toValue AS value")


url, source, target = sys.argv[1:4]
transform = Transform(
    spark, url, target, {"a": source}, copy, partitions=1, max_attempts=1, local_diff_max_rows=0
)
try:
    transform.run()
except TransformError as exc:
    print(exc)
finally:
    transform.close()
    spark.stop()
"""


def test_executors_that_cannot_import_diffstore_are_one_line_naming_the_fix(
    server_url: str, store: Store, names: dict[str, str], tmp_path: Path
) -> None:
    source = _collection(store, names)
    store.create_collection(names["C"], manual=True)
    workers = tmp_path / "workers"
    _fresh_venv(workers)  # pyspark, pyarrow…, but no diffstore
    (tmp_path / "job.py").write_text(UNINSTALLED_WORKERS)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "SPARK_REMOTE")}
    env["PYSPARK_PYTHON"] = str(workers / "bin" / "python")
    done = subprocess.run(
        [sys.executable, "job.py", server_url, source, names["C"]],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=DEADLINE_S,
    )
    assert done.returncode == 0, done.stdout + done.stderr[-4000:]
    (line,) = done.stdout.splitlines()
    assert line.startswith("round failed 1 times: "), line
    assert line.endswith(
        "Spark's Python workers cannot import diffstore: install diffstore where the executors run "
        "(pip install 'diffstore[spark]', or ship an environment with spark.archives) and point "
        "spark.pyspark.python (PYSPARK_PYTHON) at that interpreter"
    ), line
    assert (
        store.collection(names["C"]).generation_id == b""
        and store.collection(names["C"]).next_generation_id is None
    )
