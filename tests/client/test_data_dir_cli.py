"""Every data command on a data directory (``--data DIR``, the store opened in the command's process) prints
what it prints against a server (``--url``).

The same script of commands runs against two stores that start equal: one served by a real server (in a
thread of this process), one opened by the command itself. Each step's exit code, stdout and stderr must
be the same (commit times, which differ, are masked). ``watch`` runs as a real subprocess both ways; a
data directory that another process (a server) holds open at the same time also works.
"""

from __future__ import annotations

import json
import queue
import re
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from diffstore.cli import main
from diffstore.engine.store import Store
from tests.helpers import close_pipes, running_server

from .conftest import DEADLINE_S

# The script: every data command, its text and its JSON output, refusals included. ``{G1}`` is the first
# generation the automatic collection committed (the same id both ways).
SCRIPT: list[tuple[str, ...]] = [
    ("collections", "create", "A", "--auto"),
    ("collections", "create", "M", "--manual"),
    ("collections", "create", "A", "--auto"),  # collectionExists
    ("put", "A", "k1", "v1"),
    ("put", "A", "k2", "v2"),
    ("put", "A", "k3", "v3", "--format", "json"),
    ("delete", "A", "k1"),
    ("put", "M", "x", "1"),  # a manual collection needs --generation
    ("get", "A", "k2"),
    ("get", "A", "k1"),  # absent: exit 1
    ("get", "A", "k1", "--generation", "~2", "--format", "json"),
    ("get", "NOPE", "k"),
    ("query", "A"),
    ("query", "A", "--format", "json", "--limit", "1"),
    ("query", "A", "--from-key", "k3", "--generation", "@current"),
    ("diff", "A", "--from", "~3"),
    ("diff", "A", "--from", "~3", "--stat"),
    ("diff", "A", "--from", "~2", "--to", "~1", "--format", "json"),
    ("collections", "ls"),
    ("collections", "ls", "--format", "json"),
    ("collections", "show", "A"),
    ("collections", "show", "M", "--format", "json"),
    ("generation", "start", "M"),
    ("put", "M", "x", "1", "--generation", "@open"),
    ("delete", "M", "y", "--generation", "@open"),
    ("readers", "create", "M", "from_a", "--target", "A"),
    ("readers", "create", "M", "self"),
    ("readers", "ls", "M"),
    ("readers", "move", "M", "from_a", "~1"),
    ("readers", "move", "M", "from_a", "@current", "--expect", "-"),  # badVersion: at ~1 now
    ("readers", "move", "M", "from_a", "@current", "--format", "json"),
    ("generation", "commit", "M", "--metadata", "job=nightly"),
    ("generation", "start", "M", "zz"),
    ("generation", "abort", "M"),
    ("generation", "commit", "M"),  # none open
    ("lineage", "M"),
    ("lineage", "M", "--format", "json"),
    ("log", "A"),
    ("log", "M", "--format", "json"),
    ("diff", "M", "--from-reader", "self"),
    ("revert", "A", "~2"),
    ("revert", "A", "@current", "--format", "json"),
    ("query", "A"),
    ("readers", "rm", "M", "self"),
    ("readers", "rm", "M", "self"),  # noSuchReader
    ("collections", "rm", "A", "--yes"),
    ("readers", "ls", "M"),  # the reader of A went with it
    ("collections", "ls"),
]

_TIMES = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d \S+ \([^)]*\)|\"committedAtMs\":\d+")


def _masked(text: str) -> str:
    return _TIMES.sub("<time>", text)


def _run_script(capsys: pytest.CaptureFixture[str], where: list[str]) -> list[tuple[int, str, str]]:
    outputs = []
    for step in SCRIPT:
        code = main([*step, *where])
        out, err = capsys.readouterr()
        outputs.append((code, _masked(out), _masked(err)))
    return outputs


def test_every_data_command_prints_the_same_on_a_data_directory(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    with running_server(tmp_path / "served") as server:
        over_http = _run_script(capsys, ["--url", server.url])
    in_process = _run_script(capsys, ["--data", str(tmp_path / "local")])
    for step, remote, local in zip(SCRIPT, over_http, in_process, strict=True):
        assert local == remote, " ".join(step)
    # the script did reach each kind of answer: success, refusal, an absent key
    assert {code for code, _, _ in in_process} == {0, 1}
    assert any("(collectionExists)" in err for _, _, err in in_process)
    assert any("(badVersion)" in err for _, _, err in in_process)


def test_a_data_directory_that_a_server_holds_open(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """Any process may open a data directory: a command (a subprocess) beside a running server sees the
    server's writes, and the server sees the command's."""
    data = tmp_path / "data"
    with running_server(data) as server:
        assert main(["collections", "create", "A", "--auto", "--url", server.url]) == 0
        assert main(["put", "A", "k", "served", "--url", server.url]) == 0
        capsys.readouterr()
        process = subprocess.run(
            [sys.executable, "-m", "diffstore", "put", "A", "k2", "local", "--data", str(data)],
            capture_output=True,
            text=True,
            timeout=DEADLINE_S * 3,
        )
        assert process.returncode == 0, process.stderr
        assert main(["query", "A", "--url", server.url]) == 0
        assert capsys.readouterr().out == "k\tserved\nk2\tlocal\n"


def test_a_missing_data_directory_is_refused_and_not_created(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    missing = tmp_path / "typo"
    assert main(["query", "A", "--data", str(missing)]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"diffstore query: data directory {missing} does not exist") and "--data" in err
    assert not missing.exists()
    (tmp_path / "empty").mkdir()
    assert main(["collections", "ls", "--data", str(tmp_path / "empty")]) == 1
    assert "holds no diffstore store" in capsys.readouterr().err
    assert list((tmp_path / "empty").iterdir()) == []


def test_url_and_data_together_are_refused(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["query", "A", "--url", "http://127.0.0.1:1", "--data", str(tmp_path)])
    assert exit_info.value.code == 2
    assert "not allowed with argument --url" in capsys.readouterr().err


def test_data_beats_the_url_of_the_environment(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DIFFSTORE_URL", "http://127.0.0.1:1")
    assert main(["collections", "create", "A", "--manual", "--data", str(tmp_path / "d")]) == 0
    assert main(["collections", "ls", "--data", str(tmp_path / "d")]) == 0
    assert capsys.readouterr().out.endswith("A\tmanual\n")


def _read_lines(stream: Iterator[str], lines: queue.Queue[str | None]) -> None:
    for line in stream:
        lines.put(line.rstrip("\n"))
    lines.put(None)


@contextmanager
def _watching(*argv: str) -> Iterator[Callable[[], str | None]]:
    process = subprocess.Popen(
        [sys.executable, "-m", "diffstore", "watch", *argv],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    lines: queue.Queue[str | None] = queue.Queue()
    assert process.stdout is not None
    threading.Thread(target=_read_lines, args=(process.stdout, lines), daemon=True).start()
    try:
        yield lambda: lines.get(timeout=DEADLINE_S * 3)
    finally:
        process.kill()
        process.wait(timeout=DEADLINE_S)
        close_pipes(process)


def _watch_two_commits(where: list[str], store: Store) -> list[str | None]:
    """``watch A --diff --since ""`` while two generations commit (the second once the first is seen)."""
    collection = store.collection("A")
    with _watching("A", "--diff", "--since", "", "--format", "json", *where) as next_line:
        collection.write_generation(b"g1", [(b"k", b"v1")])
        got = [next_line(), next_line()]
        collection.write_generation(b"g2", [(b"k", None)])
        got += [next_line(), next_line()]
    return got


def test_watch_on_a_data_directory_prints_what_it_prints_over_http(tmp_path: Path) -> None:
    with running_server(tmp_path / "served") as server:
        server.store.create_collection("A", manual=True)
        served = _watch_two_commits(["--url", server.url], server.store)
    with Store.open(tmp_path / "local") as store:
        store.create_collection("A", manual=True)
        local = _watch_two_commits(["--data", str(tmp_path / "local")], store)
    assert local == served
    assert [json.loads(line or "{}").get("generationId") for line in local] == ["g1", "g1", "g2", "g2"]
    assert json.loads(local[3] or "{}")["toValue"] is None


def test_output_options_may_come_before_the_command(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """As ``kubectl -o json get``: ``diffstore --format json query C`` is ``query C --format json``."""
    data = ["--data", str(tmp_path / "d")]
    assert main(["collections", "create", "A", "--auto", *data]) == 0
    assert main(["put", "A", "k", "v", *data]) == 0
    assert main(["readers", "create", "A", "r", *data]) == 0
    capsys.readouterr()
    assert main(["--format", "json", "query", "A", *data]) == 0
    assert capsys.readouterr().out == '{"key":"k","value":"v"}\n'
    assert main(["--format=json", "collections", "ls", *data]) == 0
    assert json.loads(capsys.readouterr().out) == {"collections": [{"name": "A", "manual": False}]}
    assert main(["--no-headers", "--format", "text", "readers", "ls", "A", *data]) == 0
    assert capsys.readouterr().out == "r\tA\t-\n"
    assert main(["--format", "json", "query", "A", "--format", "text", *data]) == 0  # the command's own wins
    assert capsys.readouterr().out == "k\tv\n"
    # a command without the option says so in its own usage, as for any flag it does not take
    with pytest.raises(SystemExit) as exit_info:
        main(["--format", "json", "compact", *data])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "usage: diffstore compact" in err and "unrecognized arguments: --format json" in err


def test_output_options_move_behind_the_command_and_before_a_double_dash() -> None:
    from diffstore.cli import output_options_after_command as moved

    assert moved(["--format", "json", "get", "C", "--", "-k"]) == ["get", "C", "--format", "json", "--", "-k"]
    assert moved(["--no-headers", "--format=json", "log", "C"]) == [
        "log",
        "C",
        "--no-headers",
        "--format=json",
    ]
    assert moved(["query", "C", "--format", "json"]) == ["query", "C", "--format", "json"]
    assert moved(["--format", "json", "query", "--format=text"]) == ["query", "--format=text"]
    assert moved(["--format", "json"]) == ["--format", "json"]  # no command: the top parser answers
    assert moved(["--version"]) == ["--version"]
