"""Multi-request operations written once, as generators, and run by both the sync and the async client.

A plan is a generator that yields either a :class:`~diffstore.client._calls.Call` — the driver performs
it and sends the parsed answer back in — or an output item, which the driver hands to the caller (and
sends ``None`` back). The sync driver is a plain generator, the async one an async generator; neither
knows what the plan does, and no plan knows whether it runs sync or async.

Invariants:
    * A plan never yields a ``Call`` as an output item (drivers tell the two apart by type).
    * ``diff_items`` covers exactly (from, target]: it follows every cursor, then repeats from the
      returned ``toGenerationId`` until it reaches the target or the server reports no progress
      (``from == to``), as SPEC §3 asks of clients.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Generator, Iterator
from typing import Any, TypeVar

from diffstore.client import _calls
from diffstore.client._calls import Call
from diffstore.engine.types import DiffItem, DiffPage, DiffSpec, Record
from diffstore.wire_requests import QueryRequest

T = TypeVar("T")

Plan = Generator["Call[Any] | T", Any, None]


def query_records(name: str, request: QueryRequest) -> Plan[Record]:
    """Every record of a query, following cursors."""
    page = yield _calls.query_page(name, request, None)
    while True:
        yield from page.items
        if page.cursor is None:
            return
        page = yield _calls.query_page(name, request, page.cursor)


def diff_items(name: str, request: DiffSpec) -> Plan[DiffItem]:
    """Every item of a diff up to a pinned target (the current generation when no ``to`` is given)."""
    target = yield from _target(name, request)
    page: DiffPage | None = yield _calls.diff_page(name, _with(request, to=target), None)
    while page is not None:
        yield from page.items
        page = yield from _following_page(name, request, page, target)


def net_diff_items(name: str, request: DiffSpec) -> Plan[DiffItem]:
    """Like :func:`diff_items`, but each changed key once, from its value at ``from`` to its value at the
    target, as a person reading ``diffstore diff`` expects. A range the server answers in one span is
    streamed page by page; a range it splits (more generations than a page covers) is composed in memory,
    one entry per changed key, and yielded in key order (keys changed and changed back are left out)."""
    target = yield from _target(name, request)
    first: DiffPage = yield _calls.diff_page(name, _with(request, to=target), None)
    split = first.to_generation_id != target and first.from_generation_id != first.to_generation_id
    page: DiffPage | None = first
    composed: dict[bytes, tuple[bytes | None, bytes | None]] = {}
    while page is not None:
        if split:
            for item in page.items:
                earlier = composed.get(item.key)
                composed[item.key] = (item.from_value if earlier is None else earlier[0], item.to_value)
        else:
            yield from page.items
        page = yield from _following_page(name, request, page, target)
    for key in sorted(composed):
        from_value, to_value = composed[key]
        if from_value != to_value:
            yield DiffItem(key, from_value, to_value)


def _target(name: str, request: DiffSpec) -> Generator[Call[Any], Any, bytes]:
    """The generation a diff runs to: the one asked for, else the collection's current one (pinned once)."""
    if request.to_generation_id is not None:
        return request.to_generation_id
    state = yield _calls.collection_state(name)
    return bytes(state.generation_id)


def _following_page(
    name: str, request: DiffSpec, page: DiffPage, target: bytes
) -> Generator[Call[Any], Any, DiffPage | None]:
    """The page after ``page``: through its cursor, else from the generation it reached when the server
    split the range; None once ``target`` is reached (or the server reports no progress, from == to)."""
    following: DiffPage
    if page.cursor is not None:
        following = yield _calls.diff_page(name, request, page.cursor)
    elif page.to_generation_id == target or page.from_generation_id == page.to_generation_id:
        return None
    else:
        following = yield _calls.diff_page(name, _with(request, start=page.to_generation_id, to=target), None)
    return following


def _with(request: DiffSpec, to: bytes | None, start: bytes | None = None) -> DiffSpec:
    """The same diff with another target, and (to continue a split range) another start."""
    if start is None:
        start_generation, reader = request.from_generation_id, request.from_reader
    else:
        start_generation, reader = start, None
    return DiffSpec(
        from_generation_id=start_generation,
        from_reader=reader,
        to_generation_id=to,
        include_intermediate=request.include_intermediate,
        from_key=request.from_key,
        to_key=request.to_key,
        limit=request.limit,
    )


def watch_generations(name: str, since: bytes | None, timeout_ms: int) -> Plan[bytes]:
    """Each new generation id of a collection, forever; ``since=None`` starts at the current one.

    Commits that follow each other faster than a round trip are coalesced: the long poll answers the
    collection's current generation, so intermediate ids may be skipped (a diff between two yielded ids
    still covers every change).
    """
    if since is None:
        since = yield _calls.generation_stream(name, None)
    while True:
        current = yield _calls.generation_stream(name, since, timeout_ms)
        if current != since:
            yield current
            since = current


def drive(plan: Plan[T], execute: Callable[[Call[Any]], Any]) -> Iterator[T]:
    """Runs a plan synchronously: performs its calls with ``execute`` and yields its outputs."""
    reply: Any = None
    while True:
        try:
            step = plan.send(reply)
        except StopIteration:
            return
        if isinstance(step, Call):
            reply = execute(step)
        else:
            reply = None
            yield step


async def drive_async(plan: Plan[T], execute: Callable[[Call[Any]], Awaitable[Any]]) -> AsyncIterator[T]:
    """Runs a plan on an event loop: the async twin of :func:`drive`."""
    reply: Any = None
    try:
        while True:
            try:
                step = plan.send(reply)
            except StopIteration:
                return
            if isinstance(step, Call):
                reply = await execute(step)
            else:
                reply = None
                yield step
    finally:
        plan.close()
