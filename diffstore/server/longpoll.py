"""Long-poll waiters of ``generationId/stream`` and the fan-out that answers them when a commit lands.

A waiter is one open request: its ASGI ``send``, the codec it asked for and the generation id it was
given. The route (:mod:`diffstore.server.routes.stream`) registers it and then only awaits ``receive()``,
which returns once the response is complete or the client has gone: a waiter costs one suspended task,
one timer handle and one :class:`Waiter`.

Invariants:
    * A commit of this process: the commit listener runs in the committing thread and only schedules
      ``_wake`` on the event loop (``call_soon_threadsafe``). A commit of another process: the hub has
      the store's commit notices read by the event loop itself (``Store.commit_notices``: the loop
      watches the wake-up socket and drains it when readable), so the listener runs on the loop and calls
      ``_wake`` there and then -- no thread, no hand-off. ``_wake`` pops the collection's whole group, so
      one commit answers every waiter of that collection at once.
    * An answer is encoded once per (generation id, codec) -- body, headers and the two ASGI messages --
      and the same messages go to every waiter. Each waiter's two sends run eagerly inside ``_wake``:
      uvicorn's ``send`` writes to the socket and returns without suspending unless that connection's
      write buffer is full, in which case that waiter alone continues in a task. The fan-out is one pass
      over the waiters, with no task switch, Request/Response object or serialization per waiter, and
      with the cyclic garbage collector paused (it would otherwise run a dozen times in the middle).
    * A waiter registers before the route reads the current generation, so a commit between the two is
      never lost. A waiter is answered at most once (``answered``): by a commit, its timer, shutdown or
      the route itself, whichever comes first.
    * ``close`` (graceful shutdown) answers every waiter with the id it was given and refuses new ones.
    * Under ``diffstore serve`` (uvicorn's httptools protocol) an answer skips even the ASGI sends: the
      server's own ``send`` (kept in the scope by the app, under :data:`RAW_SEND`) leads to uvicorn's
      request cycle, and the whole response -- uvicorn's status line and default headers, ours, the
      body -- goes out as one write, after which the cycle is marked complete exactly as its ``send``
      would have. That is the part of a fan-out that scales with the waiters, so it is worth knowing
      uvicorn's cycle; anything unexpected (another server, paused writes, a uvicorn that does not
      match) falls back to the two ASGI sends. What this needs of uvicorn is in
      :mod:`diffstore.server.uvicorn_adapter`, the one module that knows uvicorn's insides.
    * Under ``diffstore serve`` a waiter does not even keep its ASGI call: once registered it is
      *parked* (:func:`diffstore.server.uvicorn_adapter.park`) -- the call returns at once, uvicorn
      counts the request as answered, and the connection is held for the answer, which the hub writes
      and then finishes as uvicorn's ``send`` would. Waking a parked waiter is thus one write and
      uvicorn's end-of-response bookkeeping: no task to resume, no middleware to unwind. A parked
      waiter whose client goes is dropped by the protocol's ``connection_lost`` (:meth:`CommitHub.left`).
      Parked requests are counted in the HTTP metrics by the hub, a pass at a time
      (:attr:`CommitHub.on_answered`), not by the metrics middleware, which saw the call end early.
    * After a fan-out pass the parked connections' bookkeeping (uvicorn's end of response: its keep-alive
      timer, the access log, reading on) waits :data:`FINISH_AFTER_S`, or less for a connection whose
      client sends its next request first (the protocol finishes the answered request before it reads a
      byte of the next). Its clients are reading their answers meanwhile, and on a machine they share
      with the server every CPU-microsecond of bookkeeping in the middle of a fan-out delays its last
      answers; no request ever waits for it. A connection that ends with its answer is closed in the
      pass (its client reads until then), and a shutdown finishes every one at once.
    * Commits of other processes over the same data directory reach the hub through the store's
      listeners (:mod:`diffstore.engine.wakeup`), read on the loop as above: each process's hub answers
      its own waiters.
    * A notice can be lost: a committer whose datagram finds this process's queue full (a burst while
      the worker stalled) drops it and marks the process. Every :data:`MISSED_CHECK_S` the hub asks the
      store whether it was marked (one ``stat``); if so it re-reads the current generation of every
      collection that has waiters -- one point read per collection, none per waiter -- and answers those
      whose generation moved (or whose collection is gone). A lost notice thus costs a long poll well
      under a second, never its timeout.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import threading
import time
from collections.abc import Callable, Coroutine, Iterable
from typing import TYPE_CHECKING, Any

from diffstore.errors import NoSuchCollection
from diffstore.server.uvicorn_adapter import (
    Parked,
    Rendered,
    abandon_if_gone,
    direct_cycle,
    finish_directly,
    park,
    write_directly,
)
from diffstore.wire import Codec, error_to_wire, generation_to_wire

if TYPE_CHECKING:
    from starlette.types import Message, Send

    from diffstore.engine.store import Store
    from diffstore.engine.wakeup import NoticeSource

Answer = tuple["Message", "Message"]
RAW_SEND = "diffstore.raw_send"  # scope key: the server's send, before any middleware wrapped it
PARKED = "diffstore.parked"  # scope key, set once the request is parked: its answer comes from the hub
REQUEST_STARTED = "diffstore.request_started"  # scope key: perf_counter() at the request's arrival
_log = logging.getLogger("diffstore.server")
MISSED_CHECK_S = 0.5  # how often the hub asks whether commit notices were lost (one stat)
FINISH_AFTER_S = 0.05  # a fan-out's bookkeeping waits this long, unless a connection needs it sooner
AnswerCounter = Callable[[int, list[float]], None]  # (status, seconds each request took): one pass's answers


def encode_answer(generation_id: bytes, codec: Codec) -> Answer:
    """The two ASGI messages of a 200 ``{"generationId": ES}`` answer, ready to send to many clients."""
    body = codec.dumps(generation_to_wire(generation_id, codec))
    headers = [(b"content-type", codec.content_type.encode()), (b"content-length", b"%d" % len(body))]
    return (
        {"type": "http.response.start", "status": 200, "headers": headers},
        {"type": "http.response.body", "body": body},
    )


def encode_deleted(collection: str, codec: Codec) -> Answer:
    """The two ASGI messages of the 404 ``noSuchCollection`` that waiters of a deleted collection get."""
    body = codec.dumps(error_to_wire("noSuchCollection", f"collection {collection!r} was deleted"))
    headers = [(b"content-type", codec.content_type.encode()), (b"content-length", b"%d" % len(body))]
    return (
        {"type": "http.response.start", "status": 404, "headers": headers},
        {"type": "http.response.body", "body": body},
    )


def run_eagerly(coro: Coroutine[Any, Any, None]) -> asyncio.Task[None] | None:
    """Runs ``coro`` at once in the caller's frame; if it suspends, a task carries on from there.

    Python 3.12's eager tasks do the same. A send that completes without waiting -- the common case --
    thus costs no task and no pass of the event loop. Returns the task (None: finished at once); the
    caller keeps it referenced until it is done (the event loop holds tasks only weakly).
    """
    try:
        pending = coro.send(None)
    except StopIteration:
        return None
    return asyncio.get_running_loop().create_task(_carry_on(coro, pending))


async def _carry_on(coro: Coroutine[Any, Any, None], pending: Any) -> None:
    """Resumes ``coro`` each time the future it suspended on is done, as a task would."""
    try:
        while True:
            if pending is None:  # a bare yield (``asyncio.sleep(0)``)
                await asyncio.sleep(0)
            else:  # the coroutine sees the future's outcome itself when resumed
                await asyncio.wait((pending,))
            try:
                pending = coro.send(None)
            except StopIteration:
                return
    except BaseException:
        coro.close()
        raise


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


class Waiter:
    """One long-poll request waiting for ``collection`` to move away from ``given``."""

    __slots__ = (
        "collection",
        "given",
        "codec",
        "send",
        "cycle",
        "task",
        "timer",
        "answered",
        "error",
        "sending",
        "parked",
        "started",
    )

    def __init__(
        self,
        collection: str,
        given: bytes,
        codec: Codec,
        send: Send,
        raw_send: Any = None,
        started: float | None = None,
    ) -> None:
        self.collection = collection
        self.given = given
        self.codec = codec
        self.send = send
        self.cycle = direct_cycle(raw_send)  # None: answered through the ASGI sends
        self.task: asyncio.Task[Any] | None = None
        self.timer: asyncio.TimerHandle | None = None
        self.answered = False
        self.error: BaseException | None = None
        self.sending: asyncio.Task[None] | None = None  # a send that had to wait, carried on in a task
        self.parked: Parked | None = None  # the held connection, once the ASGI call has ended (see park)
        self.started = time.perf_counter() if started is None else started

    def park(self, hub: CommitHub) -> bool:
        """Ends the need for this request's ASGI call to wait, if the server allows (see the module).

        True: the call must return now without sending; the hub answers through :attr:`parked`.
        """
        if self.cycle is None:
            return False
        self.parked = park(self.cycle, lambda: hub.left(self))
        return self.parked is not None

    def deliver(self, answer: Answer, rendered: Rendered | None = None) -> bool:
        """Sends ``answer`` unless the waiter was answered already.

        With ``rendered`` (a fan-out pass), True means the answer was written directly and the caller
        :meth:`finish`-es the waiter once every waiter has its bytes; otherwise it is finished here.
        """
        if self.answered:
            return False
        self.answered = True
        parked = self.parked
        if parked is not None:
            if not parked.write(answer):
                return False
        else:
            cycle = self.cycle
            if cycle is not None and abandon_if_gone(cycle):  # its route sees the client gone
                return False
            if cycle is None or not write_directly(cycle, answer, {} if rendered is None else rendered):
                self.sending = run_eagerly(self.send_answer(answer))
                return False
        if rendered is None:
            self.finish(answer[0]["status"])
            return False
        return True

    def finish(self, status: int) -> None:
        """The end of an answer written directly: the connection's bookkeeping (see :meth:`deliver`)."""
        parked = self.parked
        if parked is not None:
            if self.timer is not None:
                self.timer.cancel()
            parked.finish(status)
        else:
            finish_directly(self.cycle, status)

    async def send_answer(self, answer: Answer) -> None:
        """The answer as two ASGI sends (the way for any server but uvicorn's httptools protocol)."""
        try:
            await self.send(answer[0])
            await self.send(answer[1])
        except Exception as exc:  # the route re-raises it, so the server logs it and drops the connection
            self.error = exc
            if self.task is not None:
                self.task.cancel()


class CommitHub:
    """Routes commits of a store to the waiters of each collection."""

    def __init__(self) -> None:
        self._waiters: dict[str, set[Waiter]] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread: int | None = None  # the loop's thread: listeners called there wake at once
        self._notices: NoticeSource | None = None  # other processes' commits, read by the loop
        self._unsubscribe: Callable[[], None] | None = None
        self.closed = False
        self.written_directly = 0  # answers that went out as one write to uvicorn's cycle (see the module)
        self.on_answered: AnswerCounter | None = None  # counts parked requests' answers (the metrics)
        self.on_close: list[Callable[[], None]] = []  # other long polls to answer at shutdown
        self._store: Store | None = None
        self._missed_timer: asyncio.TimerHandle | None = None
        self._missed_seen = 0  # the store's count of lost-notice marks when last looked at
        self.rechecks = 0  # times the waiters' collections were re-read after lost notices

    def attach(self, store: Store, loop: asyncio.AbstractEventLoop) -> None:
        """Starts listening to ``store``'s commits; wake-ups are delivered on ``loop``.

        Called on ``loop``'s thread, the loop also reads other processes' commit notices itself.
        """
        self._loop = loop
        self._store = store
        self.closed = False
        self._missed_seen = store.commit_notices_missed()
        if _running_loop() is loop:
            self._schedule_missed_check()
        else:
            loop.call_soon_threadsafe(self._schedule_missed_check)
        if _running_loop() is loop:
            self._loop_thread = threading.get_ident()
            notices = store.commit_notices()  # None: another server's loop reads them for the store
            if notices is not None:
                try:
                    loop.add_reader(notices.fileno(), notices.drain)
                except NotImplementedError:  # a loop without add_reader (Windows' proactor): a thread reads
                    notices.release()
                else:
                    self._notices = notices
        unsubscribe_commits = store.add_commit_listener(self._on_commit)
        unsubscribe_deletes = store.add_delete_listener(self._on_delete)

        def unsubscribe() -> None:
            unsubscribe_commits()
            unsubscribe_deletes()

        self._unsubscribe = unsubscribe

    def _schedule_missed_check(self) -> None:
        loop = self._loop
        if loop is not None and not loop.is_closed() and not self.closed:
            self._missed_timer = loop.call_later(MISSED_CHECK_S, self._check_missed)

    def _check_missed(self) -> None:
        """Re-reads the waited-for collections if the store says notices were lost (see the module)."""
        self._missed_timer = None
        store = self._store
        if store is None or self.closed:
            return
        try:
            missed = store.commit_notices_missed()
            if missed != self._missed_seen:
                self._missed_seen = missed
                self.rechecks += 1
                self.recheck(store)
        except Exception:  # a store closing under a shutdown, say: the next tick tries again
            _log.exception("re-reading the collections of waiting long polls failed")
        self._schedule_missed_check()

    def recheck(self, store: Store) -> None:
        """Answers the waiters whose collection moved away from the id they were given, or is gone."""
        for collection in list(self._waiters):
            try:
                current = store.collection(collection).generation_id
            except NoSuchCollection:
                self.deleted(collection)
                continue
            group = self._waiters.get(collection)
            if not group:
                continue
            moved = {waiter for waiter in group if waiter.given != current}
            if not moved:
                continue
            staying = group - moved  # given the current id: they wait for the next commit
            self._waiters[collection] = moved
            self._wake(collection, current)
            if staying:
                self._waiters[collection] = staying

    def detach(self) -> None:
        if self._missed_timer is not None:
            self._missed_timer.cancel()
            self._missed_timer = None
        self._store = None
        notices, self._notices = self._notices, None
        if notices is not None:
            if self._loop is not None and not self._loop.is_closed():
                self._loop.remove_reader(notices.fileno())
            notices.release()
        if self._unsubscribe is not None:
            self._unsubscribe()
            self._unsubscribe = None

    def waiting(self, collection: str | None = None) -> int:
        """How many waiters are registered (for one collection, or in all)."""
        if collection is not None:
            return len(self._waiters.get(collection, ()))
        return sum(len(group) for group in self._waiters.values())

    def add(self, waiter: Waiter) -> bool:
        """Registers ``waiter`` for the next commit of its collection; False once the hub is closed."""
        if self.closed:
            return False
        self._waiters.setdefault(waiter.collection, set()).add(waiter)
        return True

    def discard(self, waiter: Waiter) -> None:
        group = self._waiters.get(waiter.collection)
        if group is not None:
            group.discard(waiter)
            if not group:
                del self._waiters[waiter.collection]

    def left(self, waiter: Waiter) -> None:
        """A parked waiter's client has gone: the waiter is dropped (unanswered, if it still was)."""
        if waiter.timer is not None:
            waiter.timer.cancel()
        if not waiter.answered:
            waiter.answered = True
            self.discard(waiter)

    def expire(self, waiter: Waiter) -> None:
        """The waiter's timeout: it is answered with the id it was given."""
        self.discard(waiter)
        if not waiter.answered:
            waiter.deliver(encode_answer(waiter.given, waiter.codec))
            self._count(200, (waiter,))

    def _count(self, status: int, waiters: Iterable[Waiter]) -> None:
        """Hands the answers of parked waiters to :attr:`on_answered` (the others count themselves)."""
        on_answered = self.on_answered
        if on_answered is None:
            return
        now = time.perf_counter()
        seconds = [now - waiter.started for waiter in waiters if waiter.parked is not None]
        if seconds:
            on_answered(status, seconds)

    def _on_commit(self, collection: str, generation_id: bytes) -> None:
        if threading.get_ident() == self._loop_thread:  # on the loop (another process's commit, drained)
            self._wake(collection, generation_id)
            return
        loop = self._loop
        # Reading the dict from another thread is safe under the GIL; a waiter added after this check
        # reads the current generation itself (see the invariants above).
        if loop is not None and collection in self._waiters and not loop.is_closed():
            loop.call_soon_threadsafe(self._wake, collection, generation_id)

    def _on_delete(self, collection: str) -> None:
        if threading.get_ident() == self._loop_thread:
            self.deleted(collection)
            return
        loop = self._loop
        if loop is not None and collection in self._waiters and not loop.is_closed():
            loop.call_soon_threadsafe(self.deleted, collection)

    def _wake(self, collection: str, generation_id: bytes | None, finish_now: bool = False) -> None:
        """Answers every waiter of ``collection`` with ``generation_id`` (``None``: with its own id).

        ``finish_now``: the connections' bookkeeping is done in the pass, not left for later.
        """
        group = self._waiters.pop(collection, None)
        if not group:
            return
        answers: dict[tuple[bytes, Codec], Answer] = {}
        rendered: Rendered = {}
        whole: dict[tuple[tuple[bytes, Codec], tuple[int, bool]], bytes] = {}  # parked waiters' bytes
        written: list[Waiter] = []  # parked waiters answered: finished later (see the module)
        # finished once every waiter has its bytes: the unparked written directly (their ASGI calls wait
        # for it) and parked ones whose connection closes after the answer
        at_once: list[Waiter] = []

        def answer_of(key: tuple[bytes, Codec]) -> Answer:
            answer = answers.get(key)
            if answer is None:
                answer = answers[key] = encode_answer(*key)
            return answer

        collecting = gc.isenabled()
        if collecting:  # the pass allocates a little per waiter; a collection in its middle would stall it
            gc.disable()
        try:
            for waiter in group:
                if waiter.answered:
                    continue
                key = (waiter.given if generation_id is None else generation_id, waiter.codec)
                parked = waiter.parked
                if parked is not None:  # the bulk of a fan-out: one dict lookup and one write each
                    shaped = (key, parked.shape)
                    data = whole.get(shaped)
                    if data is None:
                        data = whole[shaped] = parked.render(answer_of(key))
                    waiter.answered = True
                    if not parked.write_bytes(data):  # closed already: its on_lost comes, or came
                        continue
                    parked.owed = 200
                    # a connection that ends with its answer is closed now: its client reads until then
                    (written if parked.shape[1] else at_once).append(waiter)
                elif waiter.deliver(answer_of(key), rendered):
                    at_once.append(waiter)
            self._finish(at_once)
            self.written_directly += len(written) + len(at_once)
            self._count(200, written + at_once)
            if written:
                loop = self._loop
                if finish_now or loop is None or loop.is_closed():
                    self._finish(written)
                else:  # the clients are reading their answers now: the bookkeeping can wait (see the module)
                    loop.call_later(FINISH_AFTER_S, self._finish, written)
        finally:
            if collecting:
                gc.enable()

    def deleted(self, collection: str) -> None:
        """Answers every waiter of ``collection`` with 404 ``noSuchCollection`` at once (SPEC §7).

        Runs on the event loop when the store says the collection was deleted, by any process.
        """
        waiters = [waiter for waiter in self._waiters.pop(collection, ()) if not waiter.answered]
        for waiter in waiters:
            waiter.deliver(encode_deleted(collection, waiter.codec))
        self._count(404, waiters)

    def close(self) -> None:
        """Answers every waiter (with the id it was given) and refuses new ones; runs on the event loop."""
        self.closed = True
        for close in self.on_close:
            close()
        for collection in list(self._waiters):
            self._wake(collection, None, finish_now=True)

    @staticmethod
    def _finish(waiters: list[Waiter]) -> None:
        for waiter in waiters:
            waiter.finish(200)  # every answer of a pass is a 200 (encode_answer)
