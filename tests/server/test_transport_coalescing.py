"""``CoalescingTransport``: a response's head and body leave in one write, in order, and nothing is lost."""

from __future__ import annotations

import asyncio
from typing import Any

from diffstore.server.transport import JOIN_MAX_BYTES, CoalescingTransport


class Recorder:
    """A transport that records what reaches it."""

    def __init__(self) -> None:
        self.writes: list[bytes] = []
        self.events: list[str] = []
        self.closing = False

    def write(self, data: bytes) -> None:
        self.writes.append(bytes(data))

    def writelines(self, chunks: Any) -> None:
        self.writes.append(b"|".join(chunks))  # the marker shows the chunks were not joined before

    def is_closing(self) -> bool:
        return self.closing

    def close(self) -> None:
        self.events.append("close")
        self.closing = True

    def write_eof(self) -> None:
        self.events.append("eof")

    def abort(self) -> None:
        self.events.append("abort")
        self.closing = True

    def get_write_buffer_size(self) -> int:
        return 0

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"peername": ("127.0.0.1", 1)}.get(name, default)


def run(scenario: Any) -> None:
    asyncio.run(scenario())


def test_head_and_body_leave_as_one_write() -> None:
    async def scenario() -> None:
        inner = Recorder()
        transport = CoalescingTransport(inner, asyncio.get_running_loop())
        transport.write(b"HTTP/1.1 200 OK\r\n\r\n")
        assert inner.writes == [] and transport.get_write_buffer_size() == 19
        transport.write(b"body")
        assert inner.writes == [b"HTTP/1.1 200 OK\r\n\r\nbody"]
        transport.write(b"")  # nothing to hold
        await asyncio.sleep(0)
        assert inner.writes == [b"HTTP/1.1 200 OK\r\n\r\nbody"]

    run(scenario)


def test_a_big_body_is_not_copied_behind_the_head() -> None:
    async def scenario() -> None:
        inner = Recorder()
        transport = CoalescingTransport(inner, asyncio.get_running_loop())
        body = b"x" * (JOIN_MAX_BYTES + 1)
        transport.write(b"head")
        transport.write(body)
        assert inner.writes == [b"head|" + body]

    run(scenario)


def test_a_lone_write_leaves_on_the_next_loop_pass() -> None:
    async def scenario() -> None:
        inner = Recorder()
        transport = CoalescingTransport(inner, asyncio.get_running_loop())
        transport.writelines([b"HTTP/1.1 100 ", b"Continue\r\n\r\n"])
        await asyncio.sleep(0)
        assert inner.writes == [b"HTTP/1.1 100 Continue\r\n\r\n"]
        transport.write(b"a")
        transport.write(b"b")
        transport.write(b"c")  # held again after a pair went out
        await asyncio.sleep(0)
        assert inner.writes[1:] == [b"ab", b"c"]

    run(scenario)


def test_close_and_eof_send_what_is_held_first_abort_drops_it() -> None:
    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        inner = Recorder()
        transport = CoalescingTransport(inner, loop)
        transport.write(b"last words")
        transport.write_eof()
        assert inner.writes == [b"last words"] and inner.events == ["eof"]
        transport.write(b"bye")
        transport.close()
        assert inner.writes == [b"last words", b"bye"] and inner.events == ["eof", "close"]
        transport.write(b"too late")  # a closed transport drops late writes
        await asyncio.sleep(0)
        assert inner.writes == [b"last words", b"bye"]

        other = Recorder()
        aborted = CoalescingTransport(other, loop)
        aborted.write(b"never")
        aborted.abort()
        await asyncio.sleep(0)
        assert other.writes == [] and other.events == ["abort"]

    run(scenario)


def test_everything_else_is_the_wrapped_transport() -> None:
    async def scenario() -> None:
        transport = CoalescingTransport(Recorder(), asyncio.get_running_loop())
        assert transport.get_extra_info("peername") == ("127.0.0.1", 1)
        assert transport.is_closing() is False

    run(scenario)


def test_write_now_sends_a_held_write_first_then_its_own_at_once() -> None:
    async def scenario() -> None:
        inner = Recorder()
        transport = CoalescingTransport(inner, asyncio.get_running_loop())
        transport.write_now(b"whole response")
        assert inner.writes == [b"whole response"]  # nothing held, nothing waits for a loop pass
        transport.write(b"head")
        transport.write_now(b"another")
        assert inner.writes == [b"whole response", b"head", b"another"]
        await asyncio.sleep(0)  # the held write's scheduled flush finds nothing left
        assert inner.writes == [b"whole response", b"head", b"another"]

    run(scenario)
