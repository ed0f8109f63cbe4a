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


def usage_error(done: subprocess.CompletedProcess[str]) -> str:
    """argparse's refusal of a flag: exit 2, the usage, then one line naming the flag."""
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    return done.stderr.strip().splitlines()[-1]


@pytest.mark.parametrize("workers", ["1", "2"])
def test_serve_on_a_port_in_use(tmp_path: Path, workers: str) -> None:
    """One process or a supervisor: one line and exit code 1 (uvicorn's own bind logged six lines, exit 3)."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = cli("serve", "--data", str(tmp_path / "data"), "--port", str(port), "--workers", workers)
        line = one_line(done)
    assert line.startswith("diffstore serve: ") and "another --port" in line
    assert done.returncode == 1


def test_a_data_directory_that_cannot_be_created(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    line = one_line(cli("serve", "--data", str(blocker / "data"), "--port", "0"))
    assert line.startswith("diffstore serve: ") and str(blocker) in line


def test_mapper_and_job_import_from_the_current_directory(tmp_path: Path) -> None:
    (tmp_path / "mymapper.py").write_text("def to_items(record):\n    return None\n\nnot_callable = 1\n")
    (tmp_path / "broken.py").write_text("raise RuntimeError('boom')\n")
    (tmp_path / "syntax.py").write_text("def f(x)\n    return x\n")
    (tmp_path / "needs.py").write_text("import diffstore_no_such_dependency\n")
    (tmp_path / "arrow.py").write_text("import pyarrow\n\npyarrow.array([1, 'x'])\n")
    os.chdir(tmp_path)
    try:
        sys.modules.pop("mymapper", None)
        assert callable(shell.load_callable("mymapper:to_items", "--mapper"))
        for spec, message in [
            ("mymapper", "expected MODULE:FUNCTION"),
            ("mymapper:nope", "mymapper has no nope"),
            ("mymapper:not_callable", "not_callable is not a function"),
            ("nomodule:f", "cannot import nomodule"),
            ("broken:f", "importing broken failed at broken.py:1: RuntimeError: boom"),
            ("syntax:f", "importing syntax failed at syntax.py:1: SyntaxError: expected ':'$"),
            ("needs:f", "needs imports diffstore_no_such_dependency, which is not installed"),
            ("arrow:f", "importing arrow failed at arrow.py:3: ArrowInvalid: Could not convert 'x'"),
        ]:
            with pytest.raises(InvalidRequest, match=message) as raised:
                shell.load_callable(spec, "--mapper")
            assert "\n" not in raised.value.reason
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


# --- what the data commands say: the shell's text form and the flag's name, never the wire's --------------


def test_messages_speak_the_text_form_and_the_flags(tmp_path: Path) -> None:
    from tests.helpers import running_server

    with running_server(tmp_path / "data") as server, server.client() as client:
        client.create_collection("A", manual=True)
        a = client.collection("A")
        a.start_generation(b"\x00\x00\x00\x00\x00\x00\x00\x01")
        a.put(b"k", b"v", generation_id=b"\x00\x00\x00\x00\x00\x00\x00\x01")
        a.commit_generation(b"\x00\x00\x00\x00\x00\x00\x00\x01")
        url = ["--url", server.url]
        before = [(r.key, r.value) for r in a.query()]

        line = one_line(cli("diff", "A", "--from", "2026-11-09", *url))
        assert line == (
            "diffstore diff: --from 2026-11-09 is above the current generation base64:AAAAAAAAAAE= "
            "(invalidRequest)"
        )
        line = one_line(cli("diff", "A", "--from", "base64:AAAAAAAAAAE=", "--to", "", *url))
        assert line == 'diffstore diff: --from base64:AAAAAAAAAAE= is above --to "" (invalidRequest)'
        line = one_line(cli("query", "A", "--generation", "base64:*", *url))
        assert line == (
            "diffstore query: --generation 'base64:*' is not valid base64 after 'base64:' (invalidEncoding)"
        )
        line = usage_error(cli("lineage", "A", "--depth", "11", *url))
        assert line.endswith("argument --depth: must be within 1..10")
        # a manual collection without an open generation: no "None, not None"
        with pytest.raises(Exception, match="no generation is open: start one before writing"):
            a.put(b"k", b"w")
        assert [(r.key, r.value) for r in a.query()] == before


def test_a_url_without_its_scheme_says_so() -> None:
    line = usage_error(cli("query", "A", "--url", "127.0.0.1:3030"))
    assert (
        "argument --url: '127.0.0.1:3030' is not an http:// or https:// URL (e.g. http://127.0.0.1:3030)"
        in (line)
    )
    done = subprocess.run(
        [sys.executable, "-m", "diffstore", "collections", "ls"],
        capture_output=True,
        text=True,
        timeout=DEADLINE_S,
        env={**os.environ, "DIFFSTORE_URL": "localhost:3030"},
    )
    assert "argument --url: 'localhost:3030' is not an http:// or https:// URL" in usage_error(done)


def test_a_stream_command_names_the_address_it_could_not_reach() -> None:
    with socket.socket() as unused:  # bound, never listening: nothing answers there
        unused.bind(("127.0.0.1", 0))
        address = f"127.0.0.1:{unused.getsockname()[1]}"
        # --timeout stays at its default (10 s): the command gives up after its connection check (2 s)
        line = one_line(cli("streams", "ls", "--hstream", f"hstream://{address}"))
        assert line.startswith(f"diffstore streams ls: cannot reach an HStream server at hstream://{address}")
        assert f"(no connection to {address} within 2 s)" in line
        ingest = ["ingest", "--hstream", f"hstream://{address}", "--subscription", "s", "--collection", "c"]
        done = cli(*ingest, "--url", "http://127.0.0.1:9")
        assert f"no connection to {address} within 2 s" in done.stderr, done.stderr


def test_query_into_a_closed_pipe_is_quiet_and_succeeds(tmp_path: Path) -> None:
    from tests.helpers import running_server

    with running_server(tmp_path / "data") as server, server.client() as client:
        client.create_collection("big", manual=True)
        big = client.collection("big")
        big.start_generation(b"1")
        big.put_many([(b"k%05d" % i, b"v" * 100) for i in range(20_000)], generation_id=b"1")
        big.commit_generation(b"1")
        done = subprocess.run(
            f"{sys.executable} -m diffstore query big --url {server.url} | head -1; exit ${{PIPESTATUS[0]}}",
            shell=True,
            executable="bash",
            capture_output=True,
            text=True,
            timeout=DEADLINE_S,
        )
    assert done.stdout == "k00000\t" + "v" * 100 + "\n"
    assert (done.returncode, done.stderr) == (0, "")


def test_transform_without_pyspark_says_to_install_it(tmp_path: Path) -> None:
    """In the directory that holds the job (which imports pyspark), as in docs/first-hour.md."""
    (tmp_path / "shout.py").write_text(
        "from pyspark.sql import functions as F\n\ndef job(spark, diffs, lookup):\n    pass\n"
    )
    no_pyspark = "import sys; sys.modules['pyspark'] = None; from diffstore.cli import main; sys.exit(main())"
    done = subprocess.run(
        [sys.executable, "-c", no_pyspark, "transform", "--job", "shout:job", "--target", "t"]
        + ["--source", "a=A", "--url", "http://127.0.0.1:9"],
        capture_output=True,
        text=True,
        timeout=DEADLINE_S,
        cwd=tmp_path,
    )
    line = one_line(done)
    assert line.startswith("diffstore transform: Spark is not installed here (pyspark is missing): ")
    assert "pip install 'diffstore[spark]'" in line and "cannot import shout" not in line
