"""The running HTTP server over an embedded store, with a graceful shutdown (``diffstore serve``).

With ``ServerConfig.workers`` above 1, :func:`serve` is a supervisor: it takes the port, starts that many
worker processes (spawned, so each opens its own LMDB environment after the fork it never had) which
accept on it (on Linux each on a listening socket of its own, see :func:`bind`), and starts a
replacement for any worker that dies while the server runs (``kill -9`` included) or stops answering it: each
worker's event loop beats on a socket pair with the supervisor, and a worker silent for
``ServerConfig.worker_timeout_s`` (stopped or hung: the kernel would go on handing it connections) is
killed and replaced. Workers share nothing
but the data directory: any of them serves any request, background work is taken once through LMDB, and
commits reach every worker's long polls (see ``docs/process-model.md``). With ``workers=1`` the one
process serves alone.

On SIGHUP the token file is re-read (the supervisor forwards the signal to its workers). On SIGTERM/SIGINT
uvicorn stops accepting connections; :class:`GracefulServer` first answers every open
long-poll (they would otherwise hold the shutdown for up to ``timeoutMs``), then waits for running
requests, runs the app's shutdown, and only then is the store closed. The supervisor forwards the
signal to its workers and waits for them.

The server speaks HTTP/1.1 through uvicorn's httptools protocol as adapted in
:mod:`diffstore.server.uvicorn_adapter` (one socket write per response, read timeouts).
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import dataclasses
import gc
import itertools
import logging
import multiprocessing
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator
from multiprocessing.connection import wait
from multiprocessing.process import BaseProcess
from typing import TYPE_CHECKING, Any

import uvicorn
from fastapi import FastAPI

from diffstore import logs, tls
from diffstore.server import metrics, uvicorn_adapter
from diffstore.server.app import create_app
from diffstore.server.config import ServerConfig

if TYPE_CHECKING:
    from diffstore.engine.store import Store

SWITCH_INTERVAL_S = 0.0005
_log = logging.getLogger("diffstore.server")
_CRASH_LOOP = 5  # workers dying this many times in a row within _EARLY_DEATH_S of their start: give up
_EARLY_DEATH_S = 2.0
# A worker's first heartbeat comes once it accepts: spawning, importing and opening the store take seconds
# (tens on a loaded machine), so until then it has this long, or worker_timeout_s if that is longer.
_START_TIMEOUT_S = 120.0
_BEAT_MAX_INTERVAL_S = 1.0


class GracefulServer(uvicorn.Server):
    """A uvicorn server that answers the app's open long-polls as soon as shutdown begins."""

    def __init__(
        self,
        app: FastAPI,
        config: ServerConfig,
        on_ready: Callable[[int], None] | None = None,
        heartbeat: socket.socket | None = None,
        **uvicorn_options: Any,
    ) -> None:
        options: dict[str, Any] = {
            "host": config.host,
            "port": config.port,
            "timeout_graceful_shutdown": config.shutdown_timeout_s,
            "lifespan": "on",
            "log_level": config.log_level,
            "access_log": config.access_log,
            "http": uvicorn_adapter.http_protocol(
                config.header_timeout_s, config.body_timeout_s, config.body_min_rate_bytes_s
            ),
        }
        # every worker builds its own server from the config: each serves TLS when it is asked for
        options.update(
            tls.uvicorn_options(
                config.tls_cert, config.tls_key, config.tls_client_ca, config.tls_key_password
            )
        )
        options.update(uvicorn_options)
        super().__init__(uvicorn.Config(app, **options))
        self.fastapi_app = app
        self.received_signals: list[int] = []
        self.on_ready = on_ready
        self.heartbeat = heartbeat
        self.beat_interval_s = min(config.worker_timeout_s / 4, _BEAT_MAX_INTERVAL_S)
        self._beating: asyncio.Task[None] | None = None

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        if self.started and self.on_ready is not None:  # listening, the app's startup done: it accepts now
            self.on_ready(self.servers[0].sockets[0].getsockname()[1] if self.servers else self.config.port)
        if self.started and self.heartbeat is not None and self.beat_interval_s > 0:
            self._beating = asyncio.create_task(beat(self.heartbeat, self.beat_interval_s))

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        if self._beating is not None:  # only a supervisor that stops stops its workers: it no longer listens
            self._beating.cancel()
        self.fastapi_app.state.hub.close()
        await super().shutdown(sockets)

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        """As uvicorn's, minus re-raising the signal afterwards: the caller still has a store to close."""
        with super().capture_signals():
            yield
            self.received_signals = uvicorn_adapter.take_captured_signals(self)


async def beat(heartbeat: socket.socket, interval_s: float) -> None:
    """Tells the supervisor every ``interval_s`` that this worker's event loop turns.

    Sent by the loop itself, so that a worker whose loop no longer turns -- a stopped process, or a loop
    blocked -- goes silent. Never blocks the loop: a beat the socket cannot take now is dropped.
    """
    heartbeat.setblocking(False)
    while True:
        with contextlib.suppress(BlockingIOError, InterruptedError):
            heartbeat.send(b".")
        await asyncio.sleep(interval_s)


def serve(config: ServerConfig) -> int:
    """Serves until a signal (one process, or a supervisor of ``config.workers``). Returns the exit code.

    Raises:
        OSError: the port cannot be bound (taken, or not ours to take).
    """
    if config.workers > 1:
        return supervise(config)
    # bound here rather than by uvicorn, which logs a taken port in six lines and exits 3: as with
    # workers, the failure is then one line and exit code 1 (diffstore.cli.main)
    with bind(config, reuse_port=False) as sock, _open_store(config) as store, following(store, config):
        serve_store(store, config, [sock], on_ready=lambda port: _log.info(ready_message(config, port)))
    return 0


def ready_message(config: ServerConfig, port: int) -> str:
    """What ``diffstore serve`` logs once it accepts: its address, the console's and the API docs'."""
    host = f"[{config.host}]" if ":" in config.host else config.host
    scheme = "https" if config.tls_cert is not None else "http"
    base = f"{scheme}://{host}:{port}"
    workers = f"{config.workers} workers" if config.workers > 1 else "1 process"
    return f"diffstore serving {base} ({workers}): console {base}/ui/, API docs {base}/docs"


@contextlib.contextmanager
def following(store: Store, config: ServerConfig) -> Iterator[None]:
    """Follows ``config.replica_of`` into ``store`` while the server runs (a read replica); without it, a
    store that is a replica is served read-only, with a warning. A fail-over member (``--ha-etcd``)
    runs its member instead (:mod:`diffstore.ha.member`): it follows whichever member leads."""
    if config.ha_etcd:
        from diffstore.ha.member import running_member

        with running_member(store, config):
            yield
        return
    if store.ha_record() is not None and store.ha_clear():
        _log.warning("this store was a fail-over member: served without --ha-etcd, it is a plain server now")
    if config.replica_of is None:
        state = store.replica_state()
        if state.following:
            _log.warning(
                "this store is a read replica of %s: serving it read-only without following it;"
                " start with --replica-of %s to follow, or promote it",
                state.primary,
                state.primary,
            )
        yield
        return
    from diffstore.replica import Follower, FollowerConfig, new_replica_id

    state = store.become_replica(config.replica_of, new_replica_id())
    follower: Follower | None = None
    if state.following and state.replica_id is not None:
        follower = Follower(
            store,
            FollowerConfig(
                config.replica_of,
                config.replica_token,
                state.replica_id,
                ca_file=config.replica_ca_file,
                cert=config.replica_cert,
            ),
        )
        follower.start()
        _log.info("diffstore: a read replica of %s", config.replica_of)
    try:
        yield
    finally:
        if follower is not None:
            follower.stop()


@contextlib.contextmanager
def _open_store(config: ServerConfig) -> Iterator[Store]:
    from diffstore.engine.store import Store  # the engine is imported only when a server really starts
    from diffstore.engine.types import StoreConfig

    store_config = StoreConfig(
        commit_delay_ms=config.commit_delay_ms,
        sync=config.sync,
        map_size=config.map_size,
        default_retention=config.default_retention,
    )
    with Store.open(config.data_dir, store_config) as store:
        yield store


def serve_store(
    store: Store,
    config: ServerConfig,
    sockets: list[socket.socket] | None = None,
    on_ready: Callable[[int], None] | None = None,
    heartbeat: socket.socket | None = None,
) -> None:
    """Serves an open store until a signal (the caller closes it), with the process tuned for a server.

    ``on_ready(port)`` is called once the server accepts connections; from then on a worker's event loop
    beats on ``heartbeat``, its end of a socket pair with the supervisor (see :func:`beat`)."""
    # Engine calls run in worker threads; with the default 5 ms switch interval a worker that finishes
    # while the event loop is busy waits up to 5 ms for the GIL, which caps a loaded server's point reads.
    sys.setswitchinterval(SWITCH_INTERVAL_S)
    # uvicorn's loggers go through the handler diffstore.logs set up (text or JSON)
    app = create_app(store, config)
    server = GracefulServer(app, config, on_ready, heartbeat, log_config=None)
    # SIGHUP re-reads the token file (the handler only sets an event: the reading is the watcher's)
    signal.signal(signal.SIGHUP, lambda signum, frame: app.state.tokens.reload_soon())
    # Everything imported so far lives as long as the process: keep it out of the collector's full
    # passes, which otherwise walk FastAPI's and pydantic's whole heap and stall the event loop.
    gc.collect()
    gc.freeze()
    server.run(sockets=sockets)


# --- many processes ---------------------------------------------------------------------------------


# On Linux each worker listens on a socket of its own, all bound to the one port with SO_REUSEPORT, and the
# kernel hands each new connection to one of them (by a hash of its addresses). With one shared listening
# socket, an idle worker woken by a connection accepts every connection pending (uvloop accepts until
# none is left), so a few clients that connect together all land on one worker and the others idle
# (benchmarks/workers.py: both diff readers' connections on one worker, 2 workers ~1.0x one).
_REUSE_PORT = sys.platform.startswith("linux") and hasattr(socket, "SO_REUSEPORT")


def bind(config: ServerConfig, *, listen: bool = True, reuse_port: bool = _REUSE_PORT) -> socket.socket:
    """A socket on the configured address: listening, or (``listen=False``) only holding the port."""
    family = socket.AF_INET6 if ":" in config.host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if reuse_port:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((config.host, config.port))
    if listen:
        sock.listen(2048)
    sock.set_inheritable(True)
    return sock


def worker_main(
    config: ServerConfig,
    sock: socket.socket,
    supervisor: int,
    ready: Any = None,
    heartbeat: socket.socket | None = None,
    number: int | None = None,
) -> None:
    """One worker process: its own store over the shared directory, serving on its own listening socket
    bound to the supervisor's port (Linux), or on the supervisor's shared one; sets the ``ready`` event
    (a ``multiprocessing`` Event) once it accepts, then beats on ``heartbeat`` (see :func:`beat`).
    ``number``: which worker it is (1, 2, ...; a replacement gets the next one), in its JSON logs."""
    # a SIGHUP forwarded before serve_store takes it must not end the worker (its default action)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    if not _die_with_parent(supervisor):
        return  # the supervisor died while this worker was starting
    # a spawned process starts without handlers
    logs.configure(config.log_level, config.log_format, worker=number)
    if _REUSE_PORT:
        sock = bind(dataclasses.replace(config, port=sock.getsockname()[1]))
    with _open_store(config) as store:
        on_ready = (lambda port: ready.set()) if ready is not None else None
        serve_store(store, config, sockets=[sock], on_ready=on_ready, heartbeat=heartbeat)


def _die_with_parent(supervisor: int) -> bool:
    """Makes this worker get SIGTERM when the supervisor dies (``kill -9`` included); False if it has.

    On Linux the kernel sends it (``PR_SET_PDEATHSIG``); a supervisor that died before that was asked for
    is seen in the parent pid checked just after. Elsewhere a thread checks the parent every second.
    """
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            pr_set_pdeathsig = 1
            ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, int(signal.SIGTERM))
    else:

        def watch() -> None:
            while os.getppid() == supervisor:
                time.sleep(1.0)
            os.kill(os.getpid(), signal.SIGTERM)

        threading.Thread(target=watch, name="diffstore-supervisor-watch", daemon=True).start()
    return os.getppid() == supervisor


def supervise(config: ServerConfig) -> int:
    """Runs ``config.workers`` worker processes on one socket; replaces any that dies until a signal.

    A read replica's follower runs here, in the supervisor, over a store of its own.
    """
    if config.replica_of is not None or config.ha_etcd:
        with _open_store(config) as store, following(store, config):
            return _supervise(config)
    with _open_store(config):  # fails here, with one clear error, if the directory cannot be a store
        pass
    return _supervise(config)


def _supervise(config: ServerConfig) -> int:
    # holds the port (so that a taken one fails here, once); on Linux it only holds it: a socket that
    # listened here would be handed connections that no worker accepts
    if _REUSE_PORT:
        # SO_REUSEPORT would let a second server of the same user share the port silently: a probe
        # without it fails if anything holds the port, and ours, held with it, fails any later probe
        with bind(config, listen=False, reuse_port=False) as probe:
            port = probe.getsockname()[1]
        sock = bind(dataclasses.replace(config, port=port), listen=False)
    else:
        sock = bind(config)
    metrics_dir = metrics.prepare_multiprocess()  # inherited by the workers: a scrape of one sums them all
    context = multiprocessing.get_context("spawn")
    stopping: list[int] = []
    ready = context.Event()  # set by the first worker that accepts: then the address is worth announcing
    announced = False

    def on_signal(signum: int, frame: object) -> None:
        stopping.append(signum)

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
    workers: dict[int, _Worker] = {}  # by the process's sentinel

    def forward_hangup(signum: int, frame: object) -> None:  # each worker re-reads its token file
        for worker in list(workers.values()):
            with contextlib.suppress(ProcessLookupError, TypeError):
                os.kill(worker.process.pid, signal.SIGHUP)  # type: ignore[arg-type]

    previous[signal.SIGHUP] = signal.signal(signal.SIGHUP, forward_hangup)
    early_deaths = 0
    numbers = itertools.count(1)  # each worker's number in the logs; a replacement gets a new one

    def start() -> None:
        ours, theirs = socket.socketpair()
        number = next(numbers)
        process = context.Process(
            target=worker_main,
            args=(config, sock, os.getpid(), ready, theirs, number),
            name=f"diffstore-worker-{number}",
        )
        process.start()
        theirs.close()  # the worker has its own copy
        workers[process.sentinel] = _Worker(process, ours)

    try:
        for _ in range(config.workers):
            start()
        while not stopping:
            if not announced and ready.is_set():
                _log.info(ready_message(config, sock.getsockname()[1]))
                announced = True
            beats = {worker.heartbeat: worker for worker in workers.values() if not worker.gone}
            for sentinel in wait([*workers, *beats], timeout=0.5):
                if isinstance(sentinel, socket.socket):
                    beats[sentinel].hear()
                    continue
                worker = workers.pop(sentinel)  # type: ignore[arg-type]
                worker.heartbeat.close()
                process = worker.process
                process.join()
                metrics.worker_exited(process.pid or 0)
                if stopping:
                    break
                if worker.killed:  # logged when it was killed; not a crash at start
                    start()
                    continue
                early_deaths = early_deaths + 1 if time.monotonic() - worker.started < _EARLY_DEATH_S else 0
                if early_deaths >= _CRASH_LOOP:
                    print(
                        f"diffstore serve: workers keep dying at start (last exit code {process.exitcode}); "
                        "stopping",
                        file=sys.stderr,
                    )
                    return 1
                _log.error(
                    "worker %s exited with code %s; starting a replacement", process.pid, process.exitcode
                )
                start()
            if config.worker_timeout_s > 0 and not stopping:
                for worker in workers.values():
                    worker.kill_if_silent(config.worker_timeout_s)
    finally:
        for worker in workers.values():
            if worker.process.is_alive():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(worker.process.pid or 0, signal.SIGTERM)
        deadline = time.monotonic() + config.shutdown_timeout_s + 10
        for worker in workers.values():
            process = worker.process
            process.join(max(0.0, deadline - time.monotonic()))
            if process.is_alive():
                process.kill()
                process.join()
            worker.heartbeat.close()
        metrics.cleanup_multiprocess(metrics_dir)
        sock.close()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return 0


class _Worker:
    """The supervisor's view of one worker process: when it started and when its event loop last beat."""

    def __init__(self, process: BaseProcess, heartbeat: socket.socket) -> None:
        self.process = process
        self.heartbeat = heartbeat  # the supervisor's end of the pair; the worker beats on the other
        heartbeat.setblocking(False)
        self.started = self.last_beat = time.monotonic()
        self.beating = False  # no beat comes before the worker accepts
        self.gone = False  # the worker's end is closed: it exited (its sentinel tells the rest)
        self.killed = False

    def hear(self) -> None:
        """Reads what the worker sent (the socket is readable)."""
        try:
            data = self.heartbeat.recv(4096)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:
            self.gone = True
            return
        self.last_beat = time.monotonic()
        self.beating = True

    def kill_if_silent(self, timeout_s: float) -> None:
        """Kills the worker if it has been silent for ``timeout_s`` (SIGKILL: a stopped process takes it
        too); the supervisor then replaces it as any dead worker. Logs one line."""
        allowed = timeout_s if self.beating else max(timeout_s, _START_TIMEOUT_S)
        silent = time.monotonic() - self.last_beat
        if self.killed or self.gone or silent <= allowed:
            return
        self.killed = True
        _log.error(
            "worker %s has not answered its supervisor for %.1f s (stopped or hung): killed it, starting"
            " a replacement",
            self.process.pid,
            silent,
        )
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.process.pid or 0, signal.SIGKILL)
