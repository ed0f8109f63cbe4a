"""The retry policy of every long-running command (diffstore.backoff), without sockets or sleeping, and its
performer (diffstore.outage): what counts as an outage, and the one line at each end of one."""

from __future__ import annotations

import logging

import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st

from diffstore.backoff import GiveUp, Outage, Retry, RetryPolicy, State, give_up_argument
from diffstore.client._transport import error_from_response
from diffstore.errors import NoSuchCollection, Overloaded, StorageError
from diffstore.outage import OutageWatch, is_outage
from diffstore.streams.client import StreamNotFound, StreamUnavailable
from diffstore.wire import JSON


class Draws:
    """A fixed sequence of random draws."""

    def __init__(self, *values: float) -> None:
        self.values = list(values)

    def __call__(self) -> float:
        return self.values.pop(0) if self.values else 0.0


def test_waits_grow_to_the_bound_and_one_success_ends_the_outage() -> None:
    outage = Outage(RetryPolicy(initial_s=0.1, max_s=1.0, multiplier=2, jitter=0.5), Draws())
    decisions = [outage.failed(float(t)) for t in range(6)]
    assert decisions == [
        Retry(0.1, 1, True),
        Retry(0.2, 2, False),
        Retry(0.4, 3, False),
        Retry(0.8, 4, False),
        Retry(1.0, 5, False),
        Retry(1.0, 6, False),
    ]
    assert outage.state is State.WAITING and outage.outages == 1
    assert outage.succeeded(7.5) == 7.5  # the outage's length, said once
    assert outage.succeeded(8.0) is None and outage.state is State.UP
    assert outage.failed(9.0) == Retry(0.1, 1, True)  # a new outage starts from the first wait again
    assert outage.outages == 2


def test_jitter_takes_a_random_share_off_each_wait() -> None:
    outage = Outage(RetryPolicy(initial_s=1.0, max_s=8.0, jitter=0.5), Draws(1.0, 0.0, 0.5))
    assert [outage.failed(0.0).delay_s for _ in range(3)] == [0.5, 2.0, 3.0]  # type: ignore[union-attr]


@given(
    st.floats(0.001, 10),
    st.floats(1, 100),
    st.floats(1, 4),
    st.floats(0, 1),
    st.integers(1, 10_000),
    st.floats(0, 1),
)
def test_every_wait_is_bounded(
    initial: float, ratio: float, multiplier: float, jitter: float, attempt: int, draw: float
) -> None:
    policy = RetryPolicy(initial_s=initial, max_s=initial * ratio, multiplier=multiplier, jitter=jitter)
    delay = policy.delay(attempt, draw)
    assert (1 - jitter) * initial * 0.999999 <= delay <= policy.max_s


def test_it_gives_up_at_the_limit_and_its_last_wait_ends_there() -> None:
    outage = Outage(RetryPolicy(initial_s=2.0, max_s=2.0, jitter=0, give_up_after_s=5.0), Draws())
    assert outage.failed(10.0) == Retry(2.0, 1, True)
    assert outage.failed(12.0) == Retry(2.0, 2, False)
    assert outage.failed(14.0) == Retry(1.0, 3, False)  # cut to end at the limit, not past it
    assert outage.failed(15.0) == GiveUp(5.0, 4)
    assert outage.state is State.GAVE_UP
    with pytest.raises(ValueError):
        outage.failed(16.0)


def test_a_limit_of_zero_gives_up_at_the_first_failure() -> None:
    assert Outage(RetryPolicy(give_up_after_s=0), Draws()).failed(1.0) == GiveUp(0.0, 1)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"initial_s": 0},
        {"initial_s": 2, "max_s": 1},
        {"multiplier": 0.5},
        {"jitter": 1.5},
        {"give_up_after_s": -1},
    ],
)
def test_a_policy_that_makes_no_sense_is_refused(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        RetryPolicy(**kwargs)


def test_the_give_up_option() -> None:
    assert give_up_argument("never") is None and give_up_argument("Never ") is None
    assert give_up_argument("30") == 30.0 and give_up_argument("0") == 0.0
    for bad in ("-1", "soon", "nan", "inf"):
        with pytest.raises(ValueError):
            give_up_argument(bad)


def _transport_failure() -> StorageError:
    try:
        try:
            raise httpx.ConnectError("refused")
        except httpx.ConnectError as exc:
            raise StorageError("GET /collections/A: ConnectError: refused") from exc
    except StorageError as error:
        return error


def test_what_counts_as_an_outage() -> None:
    assert is_outage(_transport_failure())
    assert is_outage(Overloaded("busy"))
    assert is_outage(StreamUnavailable("Append: UNAVAILABLE"))
    assert not is_outage(StorageError("disk I/O error"))  # the server answered: a real failure
    assert not is_outage(NoSuchCollection("A"))
    assert not is_outage(StreamNotFound("no subscription"))
    assert not is_outage(ValueError("x"))
    # a reverse proxy's answer while the server behind it restarts is an outage; diffstore's own 500 is not
    for status, outage in ((502, True), (503, True), (504, True), (500, False)):
        assert is_outage(error_from_response(status, JSON, b"<html>Bad Gateway</html>")) is outage
    assert not is_outage(error_from_response(500, JSON, b'{"error": "storageError", "reason": "EIO"}'))


def test_the_watch_says_one_line_when_waiting_starts_and_one_when_back(
    caplog: pytest.LogCaptureFixture,
) -> None:
    now = [0.0]
    changes: list[bool] = []
    watch = OutageWatch(
        "the server",
        RetryPolicy(initial_s=1, max_s=1, jitter=0),
        logging.getLogger("test.outage"),
        changes.append,
        draw=Draws(),
        clock=lambda: now[0],
    )
    error = _transport_failure()
    with caplog.at_level(logging.INFO, "test.outage"):
        watch.succeeded()
        for _ in range(5):
            assert watch.failed(error) == 1.0
            now[0] += 1
        watch.succeeded()
        watch.succeeded()
    assert [(r.levelname, r.getMessage().split(";")[0]) for r in caplog.records] == [
        ("WARNING", "the server does not answer"),
        ("INFO", "the server is back after 5.0 s"),
    ]
    assert changes == [True, False]


def test_the_watch_raises_the_failure_when_it_gives_up(caplog: pytest.LogCaptureFixture) -> None:
    now = [0.0]
    watch = OutageWatch(
        "the server",
        RetryPolicy(initial_s=1, max_s=1, jitter=0, give_up_after_s=2),
        logging.getLogger("test.outage"),
        draw=Draws(),
        clock=lambda: now[0],
    )
    error = _transport_failure()
    watch.failed(error)
    now[0] = 2.0
    with caplog.at_level(logging.ERROR, "test.outage"), pytest.raises(StorageError) as raised:
        watch.failed(error)
    assert raised.value is error
    assert "gave up after 2.0 s and 2 attempts" in caplog.records[-1].getMessage()
