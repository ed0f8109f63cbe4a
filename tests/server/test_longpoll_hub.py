"""The long-poll hub without a server: one encoding per codec, answered once, sends that must wait."""

from __future__ import annotations

import asyncio
from typing import Any

import msgpack

from diffstore.server.longpoll import CommitHub, Waiter, run_eagerly
from diffstore.wire import JSON, MSGPACK


class Client:
    """An ASGI ``send`` that records messages; ``gate`` (when set) makes every send wait for it."""

    def __init__(self, gate: asyncio.Future[None] | None = None) -> None:
        self.messages: list[Any] = []
        self.gate = gate

    async def send(self, message: Any) -> None:
        if self.gate is not None:
            await self.gate
        self.messages.append(message)

    def body(self) -> bytes:
        assert [m["type"] for m in self.messages] == ["http.response.start", "http.response.body"]
        assert self.messages[0]["status"] == 200
        headers = dict(self.messages[0]["headers"])
        assert int(headers[b"content-length"]) == len(self.messages[1]["body"])
        return self.messages[1]["body"]  # type: ignore[no-any-return]


def test_a_commit_answers_every_waiter_in_its_format_with_shared_messages() -> None:
    async def scenario() -> None:
        hub = CommitHub()
        clients = [Client() for _ in range(4)]
        for i, client in enumerate(clients):
            assert hub.add(Waiter("c", b"0", JSON if i % 2 else MSGPACK, client.send))
        bystander = Client()
        hub.add(Waiter("d", b"0", JSON, bystander.send))
        assert hub.waiting("c") == 4 and hub.waiting() == 5
        hub._wake("c", b"\x01")
        # sent at once, inside the wake-up: no task had to run
        assert [c.body() for c in clients] == [
            msgpack.packb({"generationId": b"\x01"}),
            b'{"generationId":{"value":"AQ==","encoding":"base64"}}',
        ] * 2
        assert clients[0].messages[1] is clients[2].messages[1]  # encoded once per codec
        assert hub.waiting() == 1 and bystander.messages == []

    asyncio.run(scenario())


def test_a_waiter_is_answered_once_and_close_answers_the_given_ids() -> None:
    async def scenario() -> None:
        hub = CommitHub()
        first, second = Client(), Client()
        early = Waiter("c", b"a", JSON, first.send)
        hub.add(early)
        hub.add(Waiter("c", b"b", JSON, second.send))
        hub.expire(early)  # its timeout: the id it was given
        assert first.body() == b'{"generationId":{"value":"a"}}'
        hub.close()
        assert second.body() == b'{"generationId":{"value":"b"}}'
        early.deliver((first.messages[0], first.messages[1]))
        assert len(first.messages) == 2  # never twice
        assert not hub.add(Waiter("c", b"x", JSON, Client().send)) and hub.waiting() == 0

    asyncio.run(scenario())


def test_a_send_that_must_wait_finishes_in_a_task_without_holding_up_the_others() -> None:
    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        gate: asyncio.Future[None] = loop.create_future()
        slow, fast = Client(gate), Client()
        hub = CommitHub()
        hub.add(Waiter("c", b"0", JSON, slow.send))
        hub.add(Waiter("c", b"0", JSON, fast.send))
        hub._wake("c", b"1")
        assert fast.body() == b'{"generationId":{"value":"1"}}' and slow.messages == []
        gate.set_result(None)
        for _ in range(5):
            await asyncio.sleep(0)
        assert slow.body() == b'{"generationId":{"value":"1"}}'

    asyncio.run(scenario())


def test_run_eagerly_resumes_across_several_suspensions() -> None:
    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        steps: list[str] = []
        gates = [loop.create_future() for _ in range(2)]

        async def work() -> None:
            steps.append("start")
            await gates[0]
            steps.append(f"got {gates[0].result()}")
            await asyncio.sleep(0)
            try:
                await gates[1]
            except ValueError as exc:
                steps.append(f"raised {exc}")

        async def at_once() -> None:
            steps.append("at once")

        assert run_eagerly(at_once()) is None  # finished without suspending: no task
        steps.clear()
        task = run_eagerly(work())
        assert steps == ["start"] and task is not None and not task.done()
        gates[0].set_result(1)
        gates[1].set_exception(ValueError("boom"))
        for _ in range(10):
            await asyncio.sleep(0)
        assert steps == ["start", "got 1", "raised boom"] and task.done()

    asyncio.run(scenario())
