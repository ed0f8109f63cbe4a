"""Reads of other threads step aside while a write transaction changes pages (engine/priority.py)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path

from diffstore import Store, StoreConfig
from diffstore.engine.priority import WriterFirst
from tests.helpers import wait_until

LONG_MS = 60_000  # far longer than any test: a read that returns early was not kept waiting by the bound


def read_in_thread(read: Callable[[], object]) -> tuple[threading.Thread, list[object]]:
    results: list[object] = []
    thread = threading.Thread(target=lambda: results.append(read()), daemon=True)
    thread.start()
    return thread, results


def test_a_read_of_another_thread_waits_until_the_writer_is_done() -> None:
    priority = WriterFirst(LONG_MS)
    with priority.writing():
        thread, results = read_in_thread(priority.before_read)
        wait_until(lambda: thread.is_alive(), what="the reader started")
        thread.join(0.05)
        assert thread.is_alive() and results == []  # still waiting while the writer changes pages
    thread.join(10)
    assert results == [True]


def test_the_writer_thread_itself_and_idle_times_never_wait() -> None:
    priority = WriterFirst(LONG_MS)
    assert priority.before_read() is False
    with priority.writing():
        assert priority.before_read() is False
        with priority.writing():  # nested in the same thread: still one writer
            assert priority.before_read() is False
        thread, results = read_in_thread(priority.before_read)
        wait_until(lambda: thread.is_alive(), what="the reader started")
        thread.join(0.05)
        assert results == []  # the nested block's end did not release the reader
    thread.join(10)
    assert results == [True]
    assert priority.before_read() is False


def test_the_wait_is_bounded() -> None:
    priority = WriterFirst(1)
    with priority.writing():
        thread, results = read_in_thread(priority.before_read)
        thread.join(10)  # the writer never finishes while we wait: only the bound can release the reader
        assert results == [True]


def test_zero_switches_it_off() -> None:
    priority = WriterFirst(0)
    with priority.writing():
        thread, results = read_in_thread(priority.before_read)
        thread.join(10)
        assert results == [False]


def test_store_reads_of_other_threads_wait_for_an_open_write_transaction(tmp_path: Path) -> None:
    with Store.open(tmp_path / "s", StoreConfig(read_yield_ms=LONG_MS)) as store:
        store.create_collection("c")
        writing, release = threading.Event(), threading.Event()

        def writer() -> None:
            with store.write():
                writing.set()
                release.wait(10)

        write_thread = threading.Thread(target=writer, daemon=True)
        write_thread.start()
        assert writing.wait(10)

        def read() -> list[str]:
            return [info.name for info in store.collections()]

        thread, results = read_in_thread(read)
        thread.join(0.05)
        assert results == []
        release.set()
        thread.join(10)
        write_thread.join(10)
        assert results == [["c"]]


def filled_store(path: Path) -> Store:
    store = Store.open(path, StoreConfig(read_yield_ms=LONG_MS))
    c = store.create_collection("c", manual=True)
    c.start_generation(b"1")
    c.put_many([(b"k%d" % i, b"v") for i in range(10)], generation_id=b"1")
    c.commit_generation(b"1")
    return store


def test_pages_of_other_threads_are_built_in_turn(tmp_path: Path) -> None:
    with filled_store(tmp_path / "s") as store:
        c = store.collection("c")
        with store.page_read():
            pages = [
                read_in_thread(lambda: len(c.query_page().items)),
                read_in_thread(lambda: len(c.diff_page(from_generation_id=b"").items)),
                read_in_thread(lambda: len(c.splits(2))),
            ]
            point, point_result = read_in_thread(lambda: c.get(b"k1"))
            point.join(10)
            assert point_result and point_result[0] is not None  # point reads do not queue behind pages
            for thread, results in pages:
                thread.join(0.05)
                assert results == []  # waiting for the page being built
        for thread, _ in pages:
            thread.join(10)
        assert [results for _, results in pages] == [[10], [10], [1]]


def test_an_open_diff_iterator_does_not_hold_up_pages(tmp_path: Path) -> None:
    with filled_store(tmp_path / "s") as store:
        c = store.collection("c")
        items = c.diff(from_generation_id=b"")
        assert next(items).key == b"k0"  # suspended inside its read snapshot
        thread, results = read_in_thread(lambda: len(c.query_page().items))
        thread.join(10)
        assert results == [10]
        assert len(list(items)) == 9


def test_a_thread_that_must_not_block_is_told_when_the_writer_is_done() -> None:
    priority = WriterFirst(LONG_MS)
    told: list[int] = []
    assert priority.call_when_done(lambda: told.append(1)) is False  # no writer: read now
    entered, release = threading.Event(), threading.Event()

    def write() -> None:
        with priority.writing():
            entered.set()
            release.wait(30)

    writer = threading.Thread(target=write, daemon=True)
    writer.start()
    assert entered.wait(10)
    assert priority.call_when_done(lambda: told.append(2)) is True
    assert told == []  # not while the writer changes pages
    release.set()
    writer.join(10)
    assert told == [2]
    assert priority.call_when_done(lambda: told.append(3)) is False


def test_the_writer_itself_and_a_switched_off_priority_are_never_told() -> None:
    priority = WriterFirst(LONG_MS)
    with priority.writing():
        assert priority.call_when_done(lambda: None) is False  # the writer's own thread
    off = WriterFirst(0)
    with off.writing():
        thread, results = read_in_thread(lambda: off.call_when_done(lambda: None))
        thread.join(10)
        assert results == [False]


def test_a_failing_callback_never_reaches_the_writer() -> None:
    priority = WriterFirst(LONG_MS)
    entered, release = threading.Event(), threading.Event()
    finished: list[str] = []

    def fail() -> None:
        raise RuntimeError("the event loop is closed")

    def write() -> None:
        with priority.writing():
            entered.set()
            release.wait(30)
        finished.append("writer done")  # the block ended normally: its transaction would commit

    writer = threading.Thread(target=write, daemon=True)
    writer.start()
    assert entered.wait(10)
    assert priority.call_when_done(fail) is True
    release.set()
    writer.join(10)
    assert finished == ["writer done"]
