"""Every code block of README.md and docs/*.md runs here, as written, against real servers.

A block that cannot run in a test says so in the markdown, on the line before its fence:
``<!-- not-tested: why -->`` (a diagram, a synopsis of options, Docker, a benchmark that runs for minutes).
Every other block is taken, in page order, by the page's test below (:class:`Page`), which fails unless it
took every unmarked block of its page; :func:`test_every_page_with_code_is_run` fails for a page with
unmarked blocks and no test. The tests change only what a reader would: the server's address (a free port
instead of 3030/6570) and the working directory (a temporary one).

How a page's blocks run: shell blocks with bash (``diffstore`` on PATH, ``DIFFSTORE_URL``/``HSTREAM_URL``
set), what the page says runs "in a second shell" in the background; Python blocks of a page in one
namespace, in order, as typed into one interpreter session; a Python block whose first line is
``# name.py`` is written to that file in the working directory (the page's commands import it).
"""

from __future__ import annotations

import ast
import base64
import contextlib
import itertools
import json
import os
import re
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager, redirect_stdout
from dataclasses import dataclass
from io import StringIO
from pathlib import Path
from typing import Any, TextIO

import httpx
import pytest

from diffstore.client import Client
from tests.helpers import LiveServer, close_pipes, free_port, running_server, wait_until

REPO = Path(__file__).resolve().parent.parent
PAGES = [
    REPO / "README.md",
    *sorted((REPO / "docs").glob("*.md")),
    *sorted(REPO.glob("examples/*/README.md")),
]
DEADLINE_S = 60.0
BIN = Path(sys.executable).parent

_FENCE = re.compile(r"^```(\S*)\s*$")
_MARKER = re.compile(r"^<!--\s*not-tested:\s*(.*?)\s*-->$")


@dataclass(frozen=True)
class Block:
    page: str
    line: int  # of the opening fence, 1-based
    lang: str
    text: str
    not_tested: str | None  # the marker's reason


def blocks_of(path: Path) -> list[Block]:
    """The fenced blocks of a markdown page, with the ``not-tested`` marker that precedes each, if any."""
    lines = path.read_text().splitlines()
    found: list[Block] = []
    i = 0
    while i < len(lines):
        opening = _FENCE.match(lines[i])
        if not opening:
            i += 1
            continue
        end = next(j for j in range(i + 1, len(lines)) if lines[j].startswith("```"))
        before = next((lines[j].strip() for j in range(i - 1, -1, -1) if lines[j].strip()), "")
        marker = _MARKER.match(before)
        text = "\n".join(lines[i + 1 : end]) + "\n"
        found.append(
            Block(
                str(path.relative_to(REPO)),
                i + 1,
                opening.group(1),
                text,
                marker.group(1) if marker else None,
            )
        )
        i = end + 1
    return found


class Page:
    """The unmarked blocks of one page, taken in order by its test; :meth:`done` checks all were taken."""

    def __init__(self, name: str) -> None:
        self.name = name  # the page's path in the repository
        self.blocks = [b for b in blocks_of(REPO / name) if b.not_tested is None]
        self.taken = 0

    def next(self, starts_with: str) -> str:
        """The next block's text; it must start with ``starts_with`` (so a reordered page fails clearly)."""
        assert self.taken < len(self.blocks), f"{self.name}: no block left for {starts_with!r}"
        block = self.blocks[self.taken]
        assert block.text.startswith(starts_with), (
            f"{self.name}:{block.line}: expected a block starting {starts_with!r}, got {block.text[:80]!r}"
        )
        self.taken += 1
        return block.text

    def done(self) -> None:
        left = [f"{self.name}:{b.line}" for b in self.blocks[self.taken :]]
        assert not left, f"blocks not run (run them, or mark them <!-- not-tested: why -->): {left}"


RUN_PAGES: set[str] = set()


def page_test(name: str) -> Callable[[Callable[..., None]], Callable[..., None]]:
    RUN_PAGES.add(name)
    return lambda fn: fn


def test_every_page_with_code_is_run_and_every_marker_says_why() -> None:
    with_code = set()
    for path in PAGES:
        for block in blocks_of(path):
            if block.not_tested is None:
                with_code.add(block.page)
            else:
                assert len(block.not_tested.split()) >= 2, (
                    f"{block.page}:{block.line}: say why it is not tested"
                )
    assert with_code == RUN_PAGES


# A user guide keeps one current figure with the command that measures it; how the machine was loaded on
# which day, and one run after another, belong in benchmarks/RESULTS.md.
LAB_NOTEBOOK = re.compile(
    r"load average|\bload \d|\bsession \d+\b|\b(?:two|three|four|five|\d+) runs\b"
    r"|\b\d{1,2} (?:Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec)[a-z]*\b(?: \d{4})?",
    re.IGNORECASE,
)


def test_docs_quote_no_load_average_nor_dated_runs() -> None:
    found = []
    for path in [*PAGES]:
        for number, line in enumerate(path.read_text().splitlines(), 1):
            for match in LAB_NOTEBOOK.finditer(line):
                found.append(f"{path.name}:{number}: {match.group(0)!r}")
    assert not found, "dated figures or load averages in the docs (move them to benchmarks/RESULTS.md): " + (
        "; ".join(found)
    )


# --- running blocks ----------------------------------------------------------------------------------


def shell_env(url: str = "", hstream: str = "") -> dict[str, str]:
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}", "PYTHONPATH": str(REPO)}
    env.update({"DIFFSTORE_URL": url, "HSTREAM_URL": hstream, "COLUMNS": "80"})
    env.pop("DIFFSTORE_TOKEN", None)
    return env


def sh(script: str, cwd: Path, env: dict[str, str], timeout: float = DEADLINE_S) -> str:
    """Runs a shell block with ``bash -e``; returns its stdout (fails, with stderr, on a non-zero exit)."""
    done = subprocess.run(
        ["bash", "-e", "-c", script], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )
    assert done.returncode == 0, f"{script}\n--- stderr:\n{done.stderr}\n--- stdout:\n{done.stdout}"
    return done.stdout


class Background:
    """Commands of a "second shell": started in their own process group, stopped with Ctrl-C (SIGINT)."""

    def __init__(self, cwd: Path, env: dict[str, str]) -> None:
        self.cwd, self.env = cwd, env
        self.running: list[tuple[subprocess.Popen[str], TextIO, Path]] = []

    def start(self, script: str, name: str) -> Path:
        """Starts ``script``; returns the file that collects its stdout and stderr."""
        log = self.cwd / f"{name}.log"
        out = log.open("w")
        process = subprocess.Popen(
            ["bash", "-c", script],
            cwd=self.cwd,
            env=self.env,
            stdout=out,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        self.running.append((process, out, log))
        return log

    def stop_all(self) -> list[int]:
        codes = []
        for process, out, _log in reversed(self.running):
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGINT)
                try:
                    process.wait(timeout=DEADLINE_S)
                except subprocess.TimeoutExpired:
                    os.killpg(process.pid, signal.SIGKILL)
                    process.wait()
            codes.append(process.returncode)
            close_pipes(process)
            out.close()
        self.running.clear()
        return codes


@contextmanager
def background(cwd: Path, env: dict[str, str]) -> Iterator[Background]:
    jobs = Background(cwd, env)
    try:
        yield jobs
    finally:
        jobs.stop_all()


def run_python(block: str, namespace: dict[str, Any]) -> str:
    """Runs a Python block in ``namespace`` (shared by a page's blocks); returns what it printed."""
    printed = StringIO()
    with redirect_stdout(printed):
        exec(compile(block, "<doc block>", "exec"), namespace)
    return printed.getvalue()


def local(text: str, url: str) -> str:
    """The block with the documented server address replaced by the test server's."""
    return text.replace("http://127.0.0.1:3030", url)


@pytest.fixture
def server(tmp_path: Path) -> Iterator[LiveServer]:
    with running_server(tmp_path / "server-data") as live:
        yield live


# --- README.md ---------------------------------------------------------------------------------------


@page_test("README.md")
def test_readme(tmp_path: Path, server: LiveServer) -> None:
    page = Page("README.md")
    with contextlib.chdir(tmp_path):  # the example's store goes in the working directory
        printed = run_python(page.next("from diffstore import Store"), {})
    assert printed.splitlines() == [
        "Record(key=b'apple', value=b'red', generation_id=b'0001')",
        "b'apple' b'red' None",
    ]
    curl_session(page, server.url, tmp_path)
    printed = run_python(local(page.next("from diffstore.client import Client"), server.url), {})
    assert printed.splitlines() == [
        "Record(key=b'k', value=b'v', generation_id=b'1')",
        "DiffItem(key=b'k', from_value=None, to_value=b'v', intermediate=())",
    ]
    page.done()


def curl_session(page: Page, url: str, cwd: Path) -> None:
    """The curl session of README.md and docs/http.md: the long poll in a second shell, then a commit."""
    first = local(page.next("S=http://127.0.0.1:3030\n"), url)
    out = sh(first, cwd, shell_env(url))
    assert '{"generationId":{"value":"1"},"item":{"key":{"value":"k' in out
    assert '"toGenerationId":{"value":"1"}' in out
    long_poll = local(page.next('curl -s "http://127.0.0.1:3030/collections/A/generationId/stream'), url)
    with background(cwd, shell_env(url)) as jobs:
        answer = jobs.start(long_poll, "long-poll")
        # the long poll is waiting (it answers at once only when generation 1 is no longer current)
        with Client(url) as client:
            assert client.collection("A").generation_id == b"1"
        variables = "\n".join(first.splitlines()[:2])  # the first shell's S and C
        sh(variables + "\n" + page.next("$C $S/collections/A/generation/start"), cwd, shell_env(url))
        wait_until(
            lambda: answer.read_text() != "",
            timeout=DEADLINE_S,
            interval=0.05,
            what="the long poll to answer",
        )
        assert answer.read_text() == '{"generationId":{"value":"2"}}'


# --- docs/http.md ------------------------------------------------------------------------------------


@page_test("docs/http.md")
def test_http(tmp_path: Path, server: LiveServer) -> None:
    page = Page("docs/http.md")
    curl_session(page, server.url, tmp_path)
    variables = f"S={server.url}\nC='curl -s -H Content-Type:application/json'\n"
    out = sh(variables + page.next("curl -s $S/collections/A/generations"), tmp_path, shell_env(server.url))
    assert '"committedAtMs":' in out and '{"generationId":{"value":"3"},"changedKeys":1}' in out, out
    assert "reverted A to 1: 1 key changed in generation 4" in out, out
    with Client(server.url) as client:
        a = client.collection("A")
        assert list(a.query()) == [] and [(r.key, r.value) for r in a.query(b"4")] == [(b"k1", b"v1")]
    page.done()


# --- docs/leases.md ----------------------------------------------------------------------------------


@page_test("docs/leases.md")
def test_leases(server: LiveServer) -> None:
    page = Page("docs/leases.md")
    namespace: dict[str, Any] = {}
    printed = run_python(local(page.next("from diffstore.client import Client"), server.url), namespace)
    first, listed = printed.splitlines()
    assert first.startswith("worker-2 stands by:") and "'worker-1'" in first
    assert listed == "[('writer', None, 1)]"
    printed = run_python(local(page.next("from diffstore.lease_keeper import"), server.url), namespace)
    assert printed.splitlines() == ["b'v2'"]
    page.done()


# --- docs/client.md ----------------------------------------------------------------------------------


@page_test("docs/client.md")
def test_client(server: LiveServer) -> None:
    page = Page("docs/client.md")
    first = local(page.next("from diffstore.client import Client, AsyncClient"), server.url)
    expected = [
        "DiffItem(key=b'k1', from_value=None, to_value=b'v1', intermediate=())",
        "b'0002'",
    ]
    assert run_python(first, {}).splitlines() == expected
    assert run_python(first, {}).splitlines() == expected  # again: no CollectionExists, no NoSuchReader
    consumer = local(page.next("from diffstore.client import Client\nfrom diffstore.consumer"), server.url)
    assert run_python(consumer, {}).splitlines() == ["orders b'k1' None b'v2'"]
    assert run_python(consumer, {}) == ""  # its checkpoint moved: nothing left to deliver
    check_synopsis(page.next("diffstore watch orders"))
    page.done()


# --- docs/first-hour.md ------------------------------------------------------------------------------


def write_file_block(block: str, cwd: Path) -> str:
    """A ``# name.py`` block: written to ``cwd/name.py``; returns the name."""
    first = block.splitlines()[0]
    assert re.fullmatch(r"# [\w.]+\.py", first), first
    name = first[2:]
    (cwd / name).write_text(block)
    return name


def longpoll_waiters(url: str) -> float:
    metrics = httpx.get(f"{url}/metrics").text
    found = re.search(r"^diffstore_longpoll_waiters(?:\{[^}]*\})? (\S+)$", metrics, re.M)
    return float(found.group(1)) if found else 0.0


@page_test("docs/first-hour.md")
def test_first_hour(tmp_path: Path) -> None:
    page = Page("docs/first-hour.md")
    port, hstream_port = free_port(), free_port()
    url, hstream = f"http://127.0.0.1:{port}", f"hstream://127.0.0.1:{hstream_port}"
    env = shell_env(url, hstream)

    def here(text: str) -> str:
        return text.replace("http://127.0.0.1:3030", url).replace("hstream://127.0.0.1:6570", hstream)

    with background(tmp_path, env) as jobs:
        # 1. two servers, in the background of the first shell (on free ports)
        servers = page.next("diffstore serve --data ./data &")
        lines = [line.split("&")[0].strip() for line in servers.splitlines()]
        assert lines == ["diffstore serve --data ./data", "diffstore streams serve --data ./hstream-data"]
        jobs.start(f"exec {lines[0]} --port {port}", "serve")
        jobs.start(f"exec {lines[1]} --port {hstream_port}", "streams-serve")
        wait_until(lambda: healthy(url), timeout=DEADLINE_S, interval=0.05, what="diffstore serve to answer")
        # 2. a stream and some records (the stream server is up once 'streams ls' answers)
        wait_until(
            lambda: (
                subprocess.run(["diffstore", "streams", "ls"], env=env, capture_output=True).returncode == 0
            ),
            timeout=DEADLINE_S,
            interval=0.05,
            what="streams serve to answer",
        )
        sh(page.next("diffstore streams create fruit"), tmp_path, env)
        # 3. ingestion, in a second shell
        assert write_file_block(page.next("# colours.py"), tmp_path) == "colours.py"
        ingest = jobs.start(here(page.next("diffstore ingest --hstream")), "ingest")
        with Client(url) as client:
            wait_until(
                lambda: records(client, "colours") == {b"apple": b"green", b"pear": b"yellow"},
                timeout=DEADLINE_S,
                interval=0.05,
                what="ingestion",
            )
        said = ingest.read_text()  # alone, it takes the lease: nobody to stand by for
        acquiring = "ingest: acquiring lease 'ingest:fruit-to-store' of collection 'colours'"
        assert acquiring in said and "standby" not in said, said
        assert "ingest: active (lease 'ingest:fruit-to-store' of collection 'colours', version" in said, said
        out = sh(page.next("diffstore collections ls"), tmp_path, env)
        assert "colours\tmanual\n" in out and "apple\tgreen\npear\tyellow\n" in out and "green\n" in out
        assert "hstream/fruit-to-store/" in out  # the readers
        # 4. watch, in a third shell, while more records come
        watch = jobs.start(page.next("diffstore watch colours --diff"), "watch")
        wait_until(
            lambda: longpoll_waiters(url) >= 1,
            timeout=DEADLINE_S,
            interval=0.05,
            what="watch to wait for a commit",
        )
        sh(page.next("printf 'apple=red\\nplum=purple\\n' | diffstore streams produce fruit"), tmp_path, env)
        wait_until(
            lambda: "+ plum\tpurple" in watch.read_text(),
            timeout=DEADLINE_S,
            interval=0.05,
            what="watch to print the new records",
        )
        printed = watch.read_text()
        ids = re.match(r"generation base64:(\S+) \(from base64:(\S+)\)\n", printed)
        assert ids, printed
        # as the page says: 16 bytes, an 8-byte counter and the 8-byte version of the ingestor's lease
        to_id, from_id = (base64.b64decode(ids.group(i)) for i in (1, 2))
        assert len(to_id) == len(from_id) == 16 and to_id[8:] == from_id[8:], (to_id, from_id)
        assert int.from_bytes(to_id[:8], "big") == int.from_bytes(from_id[:8], "big") + 1
        assert "~ apple\tgreen\tred\n" in printed
        # 5. a transform (a real Spark session, started by the command)
        assert write_file_block(page.next("# shout.py"), tmp_path) == "shout.py"
        out = sh(page.next("diffstore transform --job shout:job"), tmp_path, env, timeout=300)
        assert out.endswith("apple\tRED\npear\tYELLOW\nplum\tPURPLE\n"), out
        out = sh(page.next("diffstore lineage colours-loud --depth 2"), tmp_path, env)
        assert re.search(r"^  from_fruit\tcolours\t- -> \S+", out, re.M), out
        assert re.search(r"^    hstream/fruit-to-store/\d+\thstream://fruit\t", out, re.M), out
        # --watch, in a fourth shell: caught up once, then a round per change
        following = jobs.start(
            page.next("diffstore transform --job shout:job --target colours-loud"), "follow"
        )
        wait_until(
            lambda: "caught up" in following.read_text(),
            timeout=300,
            interval=0.05,
            what="transform --watch to catch up",
        )
        produce, get = page.next("printf 'kiwi=brown\\n' | diffstore streams produce fruit").splitlines()
        sh(produce, tmp_path, env)
        with Client(url) as client:
            wait_until(
                lambda: records(client, "colours-loud").get(b"kiwi") == b"BROWN",
                timeout=120,
                interval=0.05,
                what="the round",
            )
        assert sh(get, tmp_path, env) == "BROWN\n"
        said = following.read_text()
        assert "\ncaught up; following colours\n" in said, said
        assert said.count("caught up") == 1 and "committed" in said.split("caught up", 1)[1], said
        # 6. one-line errors: the command, then what it prints (with ... for what varies)
        command, expected = page.next("diffstore query colours --url http://127.0.0.1:3999").splitlines()
        unused = f"http://127.0.0.1:{free_port()}"
        done = subprocess.run(
            command.replace("http://127.0.0.1:3999", unused),
            shell=True,
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=DEADLINE_S,
        )
        pattern = ".*".join(map(re.escape, expected.replace("http://127.0.0.1:3999", unused).split("...")))
        assert done.returncode == 1 and re.fullmatch(pattern, done.stderr.strip()), done.stderr
        codes = jobs.stop_all()  # Ctrl-C in every shell
    assert codes == [0, 0, 0, 0, 0], codes  # transform --watch, watch, ingest and both servers stop cleanly
    page.done()


def healthy(url: str) -> bool:
    try:
        return httpx.get(f"{url}/healthz").status_code == 200
    except httpx.TransportError:
        return False


def records(client: Client, name: str) -> dict[bytes, bytes]:
    if name not in [info.name for info in client.collections()]:
        return {}
    return {record.key: record.value for record in client.collection(name).query()}


# --- docs/streams.md and docs/streams-server.md ------------------------------------------------------


@page_test("docs/streams-server.md")
def test_streams_server(tmp_path: Path) -> None:
    page = Page("docs/streams-server.md")
    check_synopsis(page.next("diffstore streams serve [--data DIR]"))
    namespace: dict[str, Any] = {"path": tmp_path / "hstream-data"}  # the block's data directory
    run_python(page.next("from diffstore.streams.server import"), namespace)
    assert re.fullmatch(r"hstream://127\.0\.0\.1:\d+", namespace["url"])
    page.done()


@page_test("docs/streams.md")
def test_streams(tmp_path: Path) -> None:
    from diffstore.streams.client import StreamClient
    from diffstore.streams.producer import BufferedProducer
    from diffstore.streams.server import ServerThread, StreamServerConfig

    page = Page("docs/streams.md")
    with ServerThread(StreamServerConfig(data_dir=tmp_path / "hstream-data", port=0)) as server:

        def here(text: str) -> str:
            return text.replace("hstream://127.0.0.1:6570", server.url)

        namespace: dict[str, Any] = {}
        run_python(here(page.next("from diffstore.streams.client import StreamClient")), namespace)
        run_python(here(page.next("from diffstore.streams.producer import")), namespace)
        assert namespace["record_id"].shard_id >= 0
        printed = run_python(here(page.next("from diffstore.streams.subscriber import")), namespace)
        keys, payloads = zip(*(line.split(" ", 1) for line in printed.splitlines()), strict=True)
        assert keys == ("customer-17", "customer-17")  # one key: its records in order
        # (a JSON record's fields come in no particular order)
        assert list(map(ast.literal_eval, payloads)) == [b"raw bytes", {"total": 12.5, "items": 3}]
        # the mapper file: written as the page says, then used on a record
        run_python(page.next("# mymappers.py"), namespace)
        order = type("Record", (), {"json": lambda self: {"id": 7, "customer": "c1"}, "payload": b"{}"})()
        assert namespace["by_customer"](order) == [("order/7", b"{}"), ("customer/c1", b"{}")]
        # ingestion in Python: new records for the subscription (the consumer above acked the first two)
        with StreamClient(server.url) as client, BufferedProducer(client, "orders") as producer:
            producer.append(b"one", key="k1")
            producer.append(b"two", key="k2")
        check_synopsis(page.next("diffstore ingest --hstream"))
        ingest = here(page.next("from diffstore.streams.ingest import"))
        with contextlib.chdir(tmp_path):  # EngineSink.open("./data", ...)
            failed: list[BaseException] = []

            def run() -> None:
                try:
                    run_python(ingest, namespace)
                except BaseException as exc:  # reported by the test's thread
                    failed.append(exc)

            thread = threading.Thread(target=run)
            thread.start()
            try:
                wait_until(
                    lambda: (
                        failed != [] or ("ingestor" in namespace and namespace["ingestor"].applied_total == 2)
                    ),
                    timeout=DEADLINE_S,
                    interval=0.05,
                    what="the ingestor to apply the records",
                )
            finally:
                if "ingestor" in namespace:
                    namespace["ingestor"].stop()
                thread.join(timeout=DEADLINE_S)
            assert not failed and not thread.is_alive()
            from diffstore import Store

            with Store.open(tmp_path / "data") as store:
                stored = {r.key: r.value for r in store.collection("orders").query()}
            assert stored == {b"k1": b"one", b"k2": b"two"}
    page.done()


# --- docs/backups.md ---------------------------------------------------------------------------------


@page_test("docs/backups.md")
def test_backups(tmp_path: Path, server: LiveServer) -> None:
    page = Page("docs/backups.md")
    check_synopsis(page.next("diffstore backup --data DIR OUT"))
    env = shell_env(server.url)
    with contextlib.chdir(tmp_path):  # the page's store goes in the working directory
        run_python(page.next("from diffstore import Store"), {})
    printed = sh(page.next("diffstore backup --data data/ backup-1"), tmp_path, env)
    assert "1 open generation of manual collections" in printed
    assert "backup-1: every invariant holds" in printed
    sh(local(page.next("diffstore backup --url http://127.0.0.1:3030 backup-2"), server.url), tmp_path, env)
    assert (tmp_path / "backup-2" / "data.mdb").exists()
    check_synopsis(page.next("diffstore serve --data data/ --backup-max-concurrent 1"))
    printed = sh(page.next("diffstore backup --data data/ --disk-share 0.1 backup-3"), tmp_path, env)
    assert "into backup-3:" in printed and "into backup-4:" in printed
    printed = sh(page.next("mv data data-lost"), tmp_path, env)
    assert "data: every invariant holds" in printed
    printed = sh(page.next("diffstore compact --data data"), tmp_path, env)
    assert printed.startswith("compacted the diffstore store in data:")
    from diffstore import Store

    with Store.open(tmp_path / "data") as store:  # restored: the committed state, no open generation
        a = store.collection("A")
        assert (a.generation_id, a.next_generation_id) == (b"1", None)
        assert a.get(b"apple").value == b"red" and a.get(b"pear") is None
    page.done()


# --- docs/cli.md -------------------------------------------------------------------------------------


@page_test("docs/cli.md")
def test_cli(tmp_path: Path, server: LiveServer) -> None:
    page = Page("docs/cli.md")
    check_synopsis(page.next("diffstore collections create NAME"))
    env = shell_env(server.url)
    printed = sh(page.next("diffstore collections create orders --manual"), tmp_path, env).splitlines()
    assert "committed generation g2 of orders" in printed
    assert "started generation g3 of orders" in printed and "aborted generation g3 of orders" in printed
    log = [line for line in printed if line.startswith(("g2\t", "g1\t"))]
    assert [line.split("\t")[0] for line in log] == ["g2", "g1"]
    assert log[0].split("\t")[2] == "2 keys" and log[1].split("\t")[2:] == ["2 keys", "job=by-hand"]
    printed = sh(page.next("diffstore collections create notes --auto"), tmp_path, env).splitlines()
    assert printed[-1] == "removed collection notes"
    printed = sh(page.next("diffstore query orders --generation ~1"), tmp_path, env).splitlines()
    assert printed == [
        "apple\tred",
        "pear\tgreen",
        "0 inserted, 1 updated, 1 deleted",
        "- apple\tred",
        "~ pear\tgreen\tyellow",
    ]
    printed = sh(page.next("diffstore collections create report --manual"), tmp_path, env).splitlines()
    assert "from_orders\torders\tg2" in printed and "pear\tyellow" in printed
    assert printed[-1] == "removed reader from_orders"
    printed = sh(page.next("diffstore collections create prices --manual"), tmp_path, env).splitlines()
    reverted = "reverted prices to p1: 2 keys changed in generation p3 (open: commit it to keep the revert)"
    assert reverted in printed and printed[-1] == "tea\t3"
    printed = sh(page.next("diffstore collections create events"), tmp_path, env).splitlines()
    assert "retention of events: keep 1w, keep 100 generations" in printed
    assert "retention of events: now keep 2 generations" in printed
    assert "~ a\t1\t2" in printed
    assert [line.split("\t")[0] for line in printed if line.startswith(("e2\t", "e1\t", '""'))] == [
        "e2",
        "e1",
        '"" (collected)',
    ]
    assert printed[-1] == "retention\tkeep 2 generations"
    page.done()


# --- docs/operations.md ------------------------------------------------------------------------------


@page_test("docs/operations.md")
def test_operations_json_logs(tmp_path: Path) -> None:
    page = Page("docs/operations.md")
    command, ready_sample, sample = page.next("diffstore serve --access-log --log-format json").splitlines()
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with background(tmp_path, shell_env()) as jobs:
        log = jobs.start(f"exec {command} --port {port} --workers 1", "serve")
        wait_until(lambda: healthy(url), timeout=DEADLINE_S, interval=0.05, what="diffstore serve to answer")
        httpx.get(f"{url}/collections/").raise_for_status()

        def access_line() -> dict[str, Any] | None:
            for line in log.read_text().splitlines():
                if '"uvicorn.access"' in line and "/collections/" in line:
                    parsed: dict[str, Any] = json.loads(line)
                    return parsed
            return None

        wait_until(
            lambda: access_line() is not None, timeout=DEADLINE_S, interval=0.05, what="the access log line"
        )
        line = access_line()
        assert line is not None
        expected = json.loads(sample)
        assert line.keys() == expected.keys()
        assert {k: line[k] for k in ("level", "logger", "method", "path", "status")} == {
            k: expected[k] for k in ("level", "logger", "method", "path", "status")
        }
        # the address line, as the page shows it (on our port), and no terminal colours anywhere
        ready = json.loads(ready_sample.replace("3030", str(port)))
        logged = [json.loads(line) for line in log.read_text().splitlines() if line.startswith("{")]
        server = [entry for entry in logged if entry["logger"] == "diffstore.server"]
        assert [{**entry, "time": "", "pid": 0} for entry in server] == [{**ready, "time": "", "pid": 0}]
        assert all(isinstance(entry["pid"], int) for entry in logged)
        assert "\x1b" not in log.read_text() and "\\u001b" not in log.read_text()
        assert jobs.stop_all() == [0]
    page.done()


def check_synopsis(block: str) -> None:
    """A synopsis (``diffstore CMD [--flag X] ...``, maybe with sample output after it): every flag of
    each ``diffstore`` line (and its continuation lines) is listed by ``diffstore CMD --help``."""
    commands: list[str] = []
    for line in block.splitlines():
        code = line.split("  #")[0]
        if code.startswith("diffstore "):
            commands.append(code)
        elif commands and line[:1].isspace() and commands[-1].rstrip().endswith(("\\", "]")):
            commands[-1] += " " + code
    assert commands, block
    for text in commands:
        words = text.split()
        command = list(itertools.takewhile(lambda w: w[0].isalpha(), words[1:]))
        done = subprocess.run(
            [str(BIN / "diffstore"), *command, "--help"], capture_output=True, text=True, timeout=DEADLINE_S
        )
        assert done.returncode == 0, done.stderr
        flags = set(re.findall(r"--[a-z][a-z-]*", text))
        assert flags <= set(re.findall(r"--[a-z][a-z-]*", done.stdout)), (flags, done.stdout)


# --- docs/spark.md -----------------------------------------------------------------------------------

SPARK_DRIVER = """
import json, pathlib, sys
namespace = {}
for label, code in json.loads(pathlib.Path(sys.argv[1]).read_text()):
    print("---", label, flush=True)
    exec(compile(code, label, "exec"), namespace)
print("--- all ran", flush=True)
"""


@page_test("docs/spark.md")
def test_spark(tmp_path: Path, server: LiveServer) -> None:
    """The page's blocks in one Python process and one Spark session, with the set-up each one assumes
    (collections A and B: the page's own blocks make ``url``, ``client`` and C) and checks of what each
    did, in between."""
    pytest.importorskip("pyspark")
    page = Page("docs/spark.md")
    checkpoint = tmp_path / "checkpoint"
    segments = [
        ("spark.md: local_session", local(page.next("from diffstore.client import Client"), server.url)),
        (
            "set-up: A (the page creates its reader indexer)",
            """
a = client.create_collection("A", manual=True)
a.start_generation(b"1")
a.put_many([(b"k1", b"a1"), (b"k2", b"a2")], generation_id=b"1")
a.commit_generation(b"1")
""",
        ),
        ("spark.md: reading", local(page.next('snapshot = (spark.read.format("diffstore")'), server.url)),
        (
            "check: reading",
            """
assert sorted(map(tuple, snapshot.collect())) == [(b"k1", b"a1"), (b"k2", b"a2")]
assert sorted(map(tuple, diff.collect())) == [(b"k1", None, b"a1"), (b"k2", None, b"a2")]
assert [(r.name, r.generation_id) for r in a.readers()] == [("indexer", None)]
""",
        ),
        ("spark.md: writing", page.next('c = client.create_collection("C", manual=True)')),
        (
            "check: writing",
            """
assert [(r.key, r.value) for r in c.query()] == [(b"k1", b"v1")]
assert [(r.name, r.generation_id) for r in c.readers()] == [("from_a", b"1")]
""",
        ),
        ("spark.md: stream source", page.next('changes = (spark.readStream.format("diffstore")')),
        (
            "set-up: the sink's rows, a fresh C",
            """
assert changes.isStreaming and changes.columns == ["key", "fromValue", "toValue", "generationId"]
rows = changes.selectExpr("key", "toValue AS value")
client.delete_collection("C")
client.create_collection("C", manual=True)
""",
        ),
        (
            "spark.md: stream sink",
            page.next('query = (rows.select("key", "value")').replace("/path/to/checkpoint", str(checkpoint)),
        ),
        (
            "check: stream sink; set-up: B, a fresh C",
            """
query.processAllAvailable()
query.stop()
assert [(r.key, r.value) for r in client.collection("C").query()] == [(b"k1", b"a1"), (b"k2", b"a2")]
b = client.create_collection("B", manual=True)
b.start_generation(b"1")
b.put_many([(b"k1", b"b1"), (b"k3", b"b3")], generation_id=b"1")
b.commit_generation(b"1")
client.delete_collection("C")
client.create_collection("C", manual=True)
""",
        ),
        ("spark.md: transform", page.next("from pyspark.sql import functions as F")),
        (
            "check: transform",
            """
assert [(r.key, r.value) for r in client.collection("C").query()] == [(b"k1", b"a1b1")]
assert len(stats) == 1
client.close()
spark.stop()
""",
        ),
    ]
    script = tmp_path / "segments.json"
    script.write_text(json.dumps(segments))
    done = subprocess.run(
        [sys.executable, "-c", SPARK_DRIVER, str(script)],
        cwd=tmp_path,
        env=shell_env(server.url),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0 and done.stdout.endswith("--- all ran\n"), done.stdout + done.stderr[-5000:]
    assert "| k1|   a1|" in done.stdout, done.stdout  # the cast shows keys and values as text
    check_synopsis(page.next("diffstore transform --url"))
    page.done()


# --- docs/preview.md ---------------------------------------------------------------------------------


@page_test("docs/preview.md")
def test_preview() -> None:
    """The command's synopsis names flags the command has (tests/spark/test_preview.py runs it)."""
    page = Page("docs/preview.md")
    check_synopsis(page.next("diffstore transform --url"))
    page.done()


# --- examples/spark_a_plus_b/README.md ---------------------------------------------------------------


@page_test("examples/spark_a_plus_b/README.md")
def test_spark_example(tmp_path: Path, server: LiveServer) -> None:
    """run.py --url works on the server and removes what it created; the command line runs the same job."""
    pytest.importorskip("pyspark")
    page = Page("examples/spark_a_plus_b/README.md")
    env = shell_env(server.url)
    small = " --users 200 --changes 50"  # the example's own options, for a shorter run
    server.store.create_collection("mine")
    run = local(page.next(".venv/bin/python examples/spark_a_plus_b/run.py --url"), server.url)
    out = sh(run.rstrip("\n") + small, REPO, env, timeout=600)
    assert out.count("matches a from-scratch recomputation: True") == 2, out
    assert "C (country_total) after random updates and deletes:" in out
    assert [info.name for info in server.store.collections()] == ["mine"]  # removed what it created
    # a name already taken: nothing is written, nothing removed
    server.store.create_collection("users_amount", manual=True)
    done = subprocess.run(["bash", "-c", run], cwd=REPO, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 1 and "users_amount already on" in done.stdout, done.stdout + done.stderr
    assert [info.name for info in server.store.collections()] == ["mine", "users_amount"]
    server.store.delete_collection("users_amount")

    # the command line, over A and B as run.py --keep leaves them
    sys.path.insert(0, str(REPO / "examples" / "spark_a_plus_b"))
    try:
        import run as example  # type: ignore[import-not-found]
        from job import recompute  # type: ignore[import-not-found]
    finally:
        sys.path.pop(0)
    with Client(server.url) as client:
        a = client.create_collection("users_country", manual=True)
        b = client.create_collection("users_amount", manual=True)
        example.write_generation(a, [(b"u1", b"DE"), (b"u2", b"FR"), (b"u3", b"DE")])
        example.write_generation(b, [(b"u1", b"10"), (b"u2", b"20"), (b"u3", b"5")])
        cli = local(page.next("cd examples/spark_a_plus_b\ndiffstore transform"), server.url)
        sh(cli, REPO, env, timeout=600)
        totals = records(client, "country_total")
        assert totals == recompute(records(client, "users_country"), records(client, "users_amount"))
        assert totals == {b"DE": b"15", b"FR": b"20"}
    page.done()
