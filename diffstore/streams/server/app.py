"""Running the embedded server: on the caller's event loop (:class:`StreamServer`), on a background thread
for tests and synchronous callers (:class:`ServerThread`), or in the foreground until a signal (``serve``).
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import logging
import signal
import sys
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

import grpc
from google.protobuf import message_factory
from google.protobuf.message import Message

from diffstore import tls
from diffstore.streams._proto import hstream_pb2 as pb
from diffstore.streams.sharding import SHARD_ADMIN_SERVICE

from .config import StreamServerConfig
from .servicer import HStreamServicer, Undecodable
from .store import StreamStore

logger = logging.getLogger(__name__)

_MESSAGE_LIMIT = 256 << 20
_OPTIONS = [
    ("grpc.max_receive_message_length", _MESSAGE_LIMIT),
    ("grpc.max_send_message_length", _MESSAGE_LIMIT),
    ("grpc.so_reuseport", 0),
]


def _serialize(message: Any) -> bytes:
    """Messages are serialized; hand-encoded responses (``codec``) pass through as they are."""
    return message if isinstance(message, bytes) else message.SerializeToString()


def _deserializer(request_class: type[Message]) -> Callable[[bytes], Message | Undecodable]:
    """Parses a request; bytes that are not one become :class:`Undecodable` for the RPC to refuse with
    INVALID_ARGUMENT (an exception here would be answered UNKNOWN by grpc)."""
    name = request_class.DESCRIPTOR.name

    def parse(raw: bytes) -> Message | Undecodable:
        try:
            return request_class.FromString(raw)
        except Exception as exc:  # DecodeError, and whatever else the parser raises on hostile bytes
            return Undecodable(name, str(exc) or type(exc).__name__)

    return parse


def register(servicer: HStreamServicer, server: grpc.aio.Server) -> None:
    """Adds every RPC of ``protos/hstream.proto`` to ``server``, like the generated
    ``add_HStreamApiServicer_to_server`` but with a serializer that lets responses be bytes and a
    deserializer that hands undecodable requests to the RPC (``_deserializer``); and, as a service of its
    own so that ``HStreamApi`` stays exactly upstream's, the extension ``SHARD_ADMIN_SERVICE``.
    """
    service = pb.DESCRIPTOR.services_by_name["HStreamApi"]
    handlers = {}
    for method in service.methods:
        request_class = message_factory.GetMessageClass(method.input_type)
        kind = {
            (False, False): grpc.unary_unary_rpc_method_handler,
            (True, True): grpc.stream_stream_rpc_method_handler,
        }[(method.client_streaming, method.server_streaming)]
        handlers[method.name] = kind(
            getattr(servicer, method.name),
            request_deserializer=_deserializer(request_class),
            response_serializer=_serialize,
        )
    split = grpc.unary_unary_rpc_method_handler(
        servicer.SplitShard, request_deserializer=_deserializer(pb.Shard), response_serializer=_serialize
    )
    server.add_generic_rpc_handlers(
        (
            grpc.method_handlers_generic_handler(service.full_name, handlers),
            grpc.method_handlers_generic_handler(SHARD_ADMIN_SERVICE, {"SplitShard": split}),
        )
    )


class StreamServer:
    """One embedded HStream-compatible node: LMDB store, servicer and grpc.aio server."""

    def __init__(self, config: StreamServerConfig) -> None:
        self.config = config
        self.port = 0
        self._store: StreamStore | None = None
        self._servicer: HStreamServicer | None = None
        self._server: grpc.aio.Server | None = None

    @property
    def address(self) -> str:
        """``host:port`` that clients dial (and that DescribeCluster advertises)."""
        return f"{self.config.public_host}:{self.port}"

    @property
    def url(self) -> str:
        scheme = "hstreams" if self.config.tls_cert is not None else "hstream"
        return f"{scheme}://{self.address}"

    async def start(self) -> None:
        """Opens the store, binds the port and starts serving.

        Raises:
            OSError: the address cannot be bound.
        """
        self._store = StreamStore(self.config.data_dir, map_size=self.config.map_size, sync=self.config.sync)
        self._servicer = HStreamServicer(self._store, self.config)
        self._server = grpc.aio.server(options=_OPTIONS)
        register(self._servicer, self._server)
        bind = f"{self.config.host}:{self.config.port}"
        try:
            credentials = self._tls_credentials()
            if credentials is None:
                self.port = self._server.add_insecure_port(bind)
            else:
                self.port = self._server.add_secure_port(bind, credentials)
        except (RuntimeError, OSError) as exc:
            self._store.close()
            raise OSError(f"cannot bind {self.config.host}:{self.config.port}: {exc}") from exc
        if self.port == 0:
            self._store.close()
            raise OSError(f"cannot bind {self.config.host}:{self.config.port}")
        self._servicer.advertise(self.config.public_host, self.port)
        await self._server.start()
        logger.info("hstream-compatible server on %s (data %s)", self.address, self.config.data_dir)

    def _tls_credentials(self) -> grpc.ServerCredentials | None:
        """Server credentials from the configured PEM files (``None``: plain gRPC)."""
        if self.config.tls_cert is None or self.config.tls_key is None:
            return None
        key = tls.key_pem(str(self.config.tls_key), self.config.tls_key_password, "tls_key_password")
        return grpc.ssl_server_credentials([(key, self.config.tls_cert.read_bytes())])

    async def stop(self, grace: float | None = None) -> None:
        """Stops serving, ends every subscription loop and closes the store."""
        if self._server is not None:
            await self._server.stop(grace)
            self._server = None
        if self._servicer is not None:
            await self._servicer.close()
            self._servicer = None
        if self._store is not None:
            self._store.close()
            self._store = None

    async def wait(self) -> None:
        if self._server is not None:
            await self._server.wait_for_termination()


class ServerThread:
    """A :class:`StreamServer` on its own event loop in a daemon thread (tests, benchmarks, sync code)."""

    def __init__(self, config: StreamServerConfig) -> None:
        self.server = StreamServer(config)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    @property
    def address(self) -> str:
        return self.server.address

    @property
    def url(self) -> str:
        return self.server.url

    def start(self) -> ServerThread:
        """Starts the thread and returns once the server accepts calls (raises what start raised)."""
        started: Future[None] = Future()
        loop = asyncio.new_event_loop()

        def run() -> None:
            asyncio.set_event_loop(loop)
            try:
                loop.run_until_complete(self.server.start())
            except BaseException as exc:  # handed to the starting thread
                started.set_exception(exc)
                loop.close()
                return
            started.set_result(None)
            loop.run_forever()
            loop.close()

        self._loop = loop
        self._thread = threading.Thread(target=run, name="hstream-server", daemon=True)
        self._thread.start()
        started.result()
        return self

    def stop(self, grace: float | None = None) -> None:
        """Stops the server and joins the thread."""
        if self._loop is None or self._thread is None or not self._thread.is_alive():
            return
        asyncio.run_coroutine_threadsafe(self.server.stop(grace), self._loop).result()
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._loop = None

    def __enter__(self) -> ServerThread:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


LOCK_FILE = "serve.lock"


def serve(config: StreamServerConfig) -> int:
    """Runs a server in the foreground until SIGINT or SIGTERM; returns the exit code.

    One server per data directory: a second one on the same directory refuses to start (exit 1), since
    two would hand out the same record ids and subscriptions twice. The lock is an ``flock`` on
    ``<data>/serve.lock``, released by the kernel however the first server ends.
    """
    config.data_dir.mkdir(parents=True, exist_ok=True)
    with open(config.data_dir / LOCK_FILE, "a+b") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            print(
                f"diffstore streams serve: error: {config.data_dir} is already served by another"
                " 'diffstore streams serve'; stop it or give another --data",
                file=sys.stderr,
            )
            return 1
        return _serve_locked(config)


def _serve_locked(config: StreamServerConfig) -> int:

    async def main() -> None:
        server = StreamServer(config)
        await server.start()
        print(f"diffstore streams server listening on {server.url} (data {config.data_dir})", flush=True)
        stopping = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(NotImplementedError):
                loop.add_signal_handler(sig, stopping.set)
        await stopping.wait()
        await server.stop(grace=1.0)

    asyncio.run(main())
    return 0
