"""Expected failures of the ``diffstore`` command print one line and exit non-zero, never a traceback.

Each runs the real command in a subprocess (``python -m diffstore``), as a newcomer would.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from diffstore import shell
from diffstore.errors import InvalidRequest

DEADLINE_S = 60.0


def cli(*argv: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "diffstore", *argv],
        capture_output=True,
        text=True,
        timeout=DEADLINE_S,
        cwd=cwd,
    )


def one_line(done: subprocess.CompletedProcess[str]) -> str:
    assert done.returncode != 0
    assert "Traceback" not in done.stderr
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, done.stderr
    return lines[0]


def test_serve_on_a_port_in_use(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        line = one_line(cli("serve", "--data", str(tmp_path / "data"), "--port", str(port)))
    assert line.startswith("diffstore serve: ") and "another --port" in line


def test_a_data_directory_that_cannot_be_created(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    line = one_line(cli("serve", "--data", str(blocker / "data"), "--port", "0"))
    assert line.startswith("diffstore serve: ") and str(blocker) in line


def test_mapper_and_job_import_from_the_current_directory(tmp_path: Path) -> None:
    (tmp_path / "mymapper.py").write_text("def to_items(record):\n    return None\n\nnot_callable = 1\n")
    (tmp_path / "broken.py").write_text("raise RuntimeError('boom')\n")
    os.chdir(tmp_path)
    try:
        sys.modules.pop("mymapper", None)
        assert callable(shell.load_callable("mymapper:to_items", "--mapper"))
        for spec, message in [
            ("mymapper", "expected MODULE:FUNCTION"),
            ("mymapper:nope", "mymapper has no nope"),
            ("mymapper:not_callable", "not_callable is not a function"),
            ("nomodule:f", "cannot import nomodule"),
            ("broken:f", "importing broken failed: RuntimeError: boom"),
        ]:
            with pytest.raises(InvalidRequest, match=message):
                shell.load_callable(spec, "--mapper")
    finally:
        os.chdir(Path(__file__).parent.parent)
        sys.modules.pop("mymapper", None)


def test_a_bad_job_module_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "myjob.py").write_text("def job(spark, diffs):\n    return diffs\n")
    line = one_line(
        cli(
            "transform",
            "--url",
            "http://127.0.0.1:9",
            "--job",
            "myjob:nope",
            "--target",
            "T",
            "--source",
            "A=a",
            cwd=tmp_path,
        )
    )
    assert line == "diffstore transform: --job myjob:nope: myjob has no nope (invalidRequest)"


def test_a_bad_mapper_module_is_one_line(tmp_path: Path) -> None:
    # a long message: rich (which ingest reports through) would wrap it at the console's width
    module = "nomodule_" + "x" * 150
    done = cli(
        "ingest",
        "--hstream",
        "hstream://127.0.0.1:9",
        "--subscription",
        "s",
        "--collection",
        "c",
        "--data",
        str(tmp_path / "data"),
        "--mapper",
        f"{module}:f",
        cwd=tmp_path,
    )
    assert one_line(done).startswith(f"diffstore ingest: --mapper {module}:f: cannot import {module}")


def test_a_long_hstream_url_is_one_line(tmp_path: Path) -> None:
    url = "http://" + "h" * 150 + ".invalid:6570/[red]"  # long, and with what rich would take for markup
    line = one_line(
        cli("ingest", "--hstream", url, "--subscription", "s", "--collection", "c", "--data", str(tmp_path))
    )
    assert line.startswith("diffstore ingest: ") and url in line


@pytest.mark.parametrize("hstream", ["http://127.0.0.1:9", "hstream://127.0.0.1:9"])
def test_ingest_creates_nothing_when_the_stream_side_fails(tmp_path: Path, hstream: str) -> None:
    data = tmp_path / "data"
    done = cli(
        "ingest",
        "--hstream",
        hstream,
        "--subscription",
        "s",
        "--collection",
        "c",
        "--data",
        str(data),
        "--create-collection",
    )
    assert done.returncode != 0 and "Traceback" not in done.stderr
    assert "ingest:" in done.stderr
    assert not data.exists()  # neither the store nor the collection was created
