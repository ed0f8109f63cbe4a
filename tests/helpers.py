"""Test helpers shared by every test package: waiting on a condition with a deadline, a free port, a
live server, closing a subprocess's pipes, the certificates of a TLS test."""

from __future__ import annotations

import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    import uvicorn

    from diffstore.client import Client, WireFormat
    from diffstore.engine.store import Store
    from diffstore.engine.types import StoreConfig

T = TypeVar("T")


def wait_until(
    predicate: Callable[[], T], timeout: float = 20.0, interval: float = 0.005, what: str = ""
) -> T:
    """Polls ``predicate`` until it returns something truthy (returned) or ``timeout`` seconds pass.

    Raises AssertionError on timeout, naming ``what`` (or the predicate) so the failure says what never
    happened. Never use a bare sleep to wait for a condition: poll it with a deadline.
    """
    deadline = time.monotonic() + timeout
    while True:
        result = predicate()
        if result:
            return result
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what or predicate!r}")
        time.sleep(interval)


def close_pipes(process: subprocess.Popen[Any]) -> None:
    """Closes a finished subprocess's pipes: left to the garbage collector, each is a ResourceWarning,
    which this suite turns into an error (``filterwarnings = error``)."""
    for stream in (process.stdin, process.stdout, process.stderr):
        if stream is not None:
            stream.close()


class ManualClock:
    """A clock the test moves by hand (``StoreConfig(clock_ms=...)``): ``clock.now_ms += 1_000``."""

    def __init__(self, now_ms: int = 1_000_000) -> None:
        self.now_ms = now_ms

    def __call__(self) -> int:
        return self.now_ms


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now (the kernel's pick; a test binds it soon after)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


SERVER_START_S = 30.0


@contextmanager
def serving(server: uvicorn.Server, verify: Any = None) -> Iterator[str]:
    """Runs a uvicorn ``server`` (its app a diffstore app) in a thread on 127.0.0.1:<free port> until the
    block ends; yields its URL once ``/healthz`` answers 200, and fails the test if it does not stop.

    ``verify`` (an SSL context trusting the server, with a client certificate if it asks for one): the
    server serves HTTPS (its config's ``ssl_*``) and the URL is ``https://``."""
    import httpx

    # IPPROTO_TCP explicitly: asyncio sets TCP_NODELAY on accepted sockets only when proto says TCP (else
    # ~40 ms per keep-alive request from Nagle + delayed ACK)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    url = f"{'https' if verify is not None else 'http'}://127.0.0.1:{sock.getsockname()[1]}"
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()

    def healthy() -> bool:
        try:
            return httpx.get(f"{url}/healthz", verify=True if verify is None else verify).status_code == 200
        except httpx.TransportError:
            return False

    try:
        wait_until(healthy, timeout=SERVER_START_S, what=f"the server at {url} to answer /healthz")
        yield url
    finally:
        server.should_exit = True
        thread.join(timeout=15)
        sock.close()
        assert not thread.is_alive(), "the server did not stop"


@dataclass
class LiveServer:
    """A diffstore server of :func:`running_server`: its URL, its store, the token it wants."""

    url: str
    store: Store
    token: str | None

    def client(self, format: WireFormat = "msgpack") -> Client:
        from diffstore.client import Client

        return Client(self.url, token=self.token, format=format)


@contextmanager
def running_server(
    data_dir: Path, token: str | None = None, store_config: StoreConfig | None = None
) -> Iterator[LiveServer]:
    """Serves a store in ``data_dir`` on 127.0.0.1:<free port> until the block ends (diffstore and uvicorn
    are imported here: the engine's tests, which use the other helpers, need neither)."""
    import uvicorn

    from diffstore.engine.store import Store
    from diffstore.engine.types import StoreConfig
    from diffstore.server import ServerConfig, create_app

    store = Store.open(data_dir, store_config or StoreConfig(commit_delay_ms=10))
    app = create_app(store, ServerConfig(token=token))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=2))
    try:
        with serving(server) as url:
            yield LiveServer(url, store, token)
    finally:
        store.close()


@contextmanager
def running_tls_server(
    data_dir: Path, certs: Certificates, client_ca: bool = False, token: str | None = None
) -> Iterator[LiveServer]:
    """:func:`running_server` over HTTPS with ``certs``' server certificate; with ``client_ca`` every
    connection must show a client certificate of ``certs.ca`` (``serve --tls-client-ca``).

    For clients that end before it: the server's thread cannot close the event loop while another process
    (a Spark worker) still holds a TLS connection (uvloop: EBUSY); serve those with ``diffstore serve``."""
    import ssl

    import uvicorn

    from diffstore import tls
    from diffstore.engine.store import Store
    from diffstore.engine.types import StoreConfig
    from diffstore.server import ServerConfig, create_app

    ca = str(certs.ca) if client_ca else None
    options = tls.uvicorn_options(str(certs.server_cert), str(certs.server_key), ca)
    store = Store.open(data_dir, StoreConfig(commit_delay_ms=10))
    app = create_app(store, ServerConfig(token=token))
    config = uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=2, **options)
    verify = ssl.create_default_context(cafile=str(certs.ca))
    verify.load_cert_chain(str(certs.client_cert), str(certs.client_key))
    try:
        with serving(uvicorn.Server(config), verify) as url:
            yield LiveServer(url, store, token)
    finally:
        store.close()


def command_paths() -> list[list[str]]:
    """Every command and sub-command of the ``diffstore`` command line, as argv prefixes (``[]``: the top)."""
    import argparse

    from diffstore import cli

    def walk(parser: argparse.ArgumentParser, prefix: list[str]) -> list[list[str]]:
        paths = [prefix]
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    paths += walk(sub, [*prefix, name])
        return paths

    return walk(cli.build_parser(), [])


HELP_OF_EVERY_COMMAND = """
import contextlib, io, json, sys
from diffstore.cli import main
results = {}
for path in json.loads(sys.argv[1]):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main([*path, "--help"])
        except SystemExit as exc:
            code = exc.code
    results[" ".join(path)] = [code, out.getvalue(), err.getvalue()]
print(json.dumps(results))
"""
"""A script that prints, as JSON, ``[exit code, stdout, stderr]`` of ``diffstore PATH --help`` for each
command path of ``argv[1]`` (JSON), in one interpreter (see :func:`help_failures`)."""


def help_failures(results: dict[str, list[Any]], paths: list[list[str]]) -> list[str]:
    """The commands whose ``--help`` (:data:`HELP_OF_EVERY_COMMAND`'s report) failed or printed no usage."""
    failures = []
    for path in paths:
        code, out, err = results[" ".join(path)]
        if (code, err) != (0, "") or not out.startswith(f"usage: {' '.join(['diffstore', *path])} "):
            failures.append(f"diffstore {' '.join(path)} --help: exit {code}: {err or out[:200]}")
    return failures
@dataclass(frozen=True)
class Certificates:
    """Files of :func:`make_certificates`: a private CA, a server and a client certificate it signed, and a
    client certificate of another CA (which a server asking for client certificates must refuse)."""

    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    stranger_cert: Path
    stranger_key: Path


def make_certificates(directory: Path) -> Certificates:
    """Makes the certificates of a TLS test with ``openssl`` (EC keys: quick), valid two days."""
    directory.mkdir(parents=True, exist_ok=True)

    def run(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=directory, check=True, capture_output=True)

    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    for ca in ("ca", "other-ca"):
        run("req", "-x509", *ec, "-keyout", f"{ca}.key", "-out", f"{ca}.crt", "-days", "2",
            "-subj", f"/CN=diffstore test {ca}", "-addext", "basicConstraints=critical,CA:TRUE",
            "-addext", "keyUsage=critical,keyCertSign,cRLSign")  # fmt: skip
    leaves = (
        ("server", "ca", "serverAuth"),
        ("client", "ca", "clientAuth"),
        ("stranger", "other-ca", "clientAuth"),
    )
    for name, ca, usage in leaves:
        extensions = directory / f"{name}.ext"
        extensions.write_text(
            "basicConstraints=CA:FALSE\nsubjectAltName=IP:127.0.0.1,DNS:localhost\n"
            f"extendedKeyUsage={usage}\nsubjectKeyIdentifier=hash\nauthorityKeyIdentifier=keyid\n"
        )
        run(
            "req", *ec, "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", f"/CN=diffstore test {name}"
        )
        run("x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}.crt", "-CAkey", f"{ca}.key",
            "-CAcreateserial", "-out", f"{name}.crt", "-days", "2", "-extfile", extensions.name)  # fmt: skip
    return Certificates(
        *(directory / name for name in ("ca.crt", "server.crt", "server.key", "client.crt", "client.key")),
        directory / "stranger.crt",
        directory / "stranger.key",
    )
