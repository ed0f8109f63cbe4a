"""Fixtures for stream tests: a real embedded HStream-compatible server on a free 127.0.0.1 port.

- ``stream_server_config``: a :class:`StreamServerConfig` with millisecond intervals (resend tick, assignment)
  and ``ack_timeout_unit`` = 0.05 s, so ``ackTimeoutSeconds=2`` means 100 ms.
- ``stream_server``: a started :class:`ServerThread` (``.address`` "127.0.0.1:PORT", ``.url``
  "hstream://127.0.0.1:PORT", ``.server.config``), stopped after the test.
- ``hstream_stub``: a synchronous ``HStreamApiStub`` on that server.
- ``fetch_session(subscription_id, consumer)``: a :class:`FetchSession` (a StreamingFetch call driven
  synchronously) on ``stream_server``; ``open_fetch(stub, subscription_id, consumer)`` on any server.
(``wait_until`` is ``tests.helpers.wait_until``.)
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pytest

from diffstore.streams._proto import hstream_pb2 as pb
from diffstore.streams._proto import hstream_pb2_grpc as pb_grpc
from diffstore.streams.server import ServerThread, StreamServerConfig

WAIT_S = 20.0  # upper bound of any wait for a condition; tests never sleep for a fixed time


@pytest.fixture
def stream_server_config(tmp_path: Path) -> StreamServerConfig:
    return StreamServerConfig(
        data_dir=tmp_path / "hstream",
        host="127.0.0.1",
        port=0,
        resend_tick=0.005,
        assignment_interval=0.01,
        ack_timeout_unit=0.05,
        sync=False,
    )


@pytest.fixture
def stream_server(stream_server_config: StreamServerConfig) -> Iterator[ServerThread]:
    server = ServerThread(stream_server_config).start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def hstream_stub(stream_server: ServerThread) -> Iterator[pb_grpc.HStreamApiStub]:
    with grpc.insecure_channel(stream_server.address) as channel:
        yield pb_grpc.HStreamApiStub(channel)


class FetchSession:
    """One consumer's StreamingFetch call: requests from a queue, responses collected by a thread."""

    def __init__(self, stub: pb_grpc.HStreamApiStub, subscription_id: str, consumer: str) -> None:
        self.subscription_id = subscription_id
        self.consumer = consumer
        self._requests: queue.Queue[pb.StreamingFetchRequest | None] = queue.Queue()
        self._responses: queue.Queue[pb.ReceivedRecord | grpc.RpcError | None] = queue.Queue()
        self._requests.put(pb.StreamingFetchRequest(subscriptionId=subscription_id, consumerName=consumer))
        self.call = stub.StreamingFetch(self._request_iter())
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _request_iter(self) -> Iterator[pb.StreamingFetchRequest]:
        while (request := self._requests.get()) is not None:
            yield request

    def _read(self) -> None:
        try:
            for response in self.call:
                self._responses.put(response.receivedRecords)
            self._responses.put(None)
        except grpc.RpcError as exc:
            self._responses.put(exc)

    def ack(self, record_ids: list[pb.RecordId]) -> None:
        self._requests.put(
            pb.StreamingFetchRequest(
                subscriptionId=self.subscription_id, consumerName=self.consumer, ackIds=list(record_ids)
            )
        )

    def next(self, timeout: float = WAIT_S) -> pb.ReceivedRecord:
        """The next response; raises the call's RpcError, or AssertionError when none comes in time."""
        try:
            item = self._responses.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError(f"no response within {timeout} s") from None
        if isinstance(item, grpc.RpcError):
            raise item
        if item is None:
            raise AssertionError("the call ended")
        return item

    def error(self, timeout: float = WAIT_S) -> grpc.RpcError:
        """Waits for the call to fail and returns its error (responses before it are skipped)."""
        deadline = time.monotonic() + timeout
        while (left := deadline - time.monotonic()) > 0:
            try:
                item = self._responses.get(timeout=left)
            except queue.Empty:
                break
            if isinstance(item, grpc.RpcError):
                return item
            if item is None:
                raise AssertionError("the call ended without an error")
        raise AssertionError(f"no error within {timeout} s")

    def collect(self, count: int, *, ack: bool = True, timeout: float = WAIT_S) -> list[pb.ReceivedRecord]:
        """Receives responses until they hold ``count`` records (acking each when ``ack``)."""
        received: list[pb.ReceivedRecord] = []
        deadline = time.monotonic() + timeout
        while sum(len(r.recordIds) for r in received) < count:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"received {received!r}, wanted {count} records")
            record = self.next(left)
            received.append(record)
            if ack:
                self.ack(list(record.recordIds))
        return received

    def close(self) -> None:
        self._requests.put(None)
        self.call.cancel()
        self._reader.join(timeout=WAIT_S)


@pytest.fixture
def open_fetch() -> Iterator[Callable[[pb_grpc.HStreamApiStub, str, str], FetchSession]]:
    """``open_fetch(stub, subscription_id, consumer)``: a FetchSession on any server, closed at teardown."""
    sessions: list[FetchSession] = []

    def make(stub: pb_grpc.HStreamApiStub, subscription_id: str, consumer: str) -> FetchSession:
        session = FetchSession(stub, subscription_id, consumer)
        sessions.append(session)
        return session

    yield make
    for session in sessions:
        session.close()


@pytest.fixture
def fetch_session(
    hstream_stub: pb_grpc.HStreamApiStub,
    open_fetch: Callable[[pb_grpc.HStreamApiStub, str, str], FetchSession],
) -> Callable[[str, str], FetchSession]:
    """``fetch_session(subscription_id, consumer)``: a FetchSession on ``stream_server``."""
    return lambda subscription_id, consumer: open_fetch(hstream_stub, subscription_id, consumer)
