"""The pure subscription state machine, fed events directly (no gRPC, no LMDB, a fake clock)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from diffstore.streams.server.subscription import (
    START,
    ConsumerExists,
    Delivery,
    StoredBatch,
    SubscriptionState,
)


class Shards:
    """An in-memory BatchSource: shard id → {batch id: size}."""

    def __init__(self, batches: dict[int, dict[int, int]]) -> None:
        self.batches = batches

    def next_batch(self, shard_id: int, min_batch_id: int) -> StoredBatch | None:
        ids = sorted(b for b in self.batches.get(shard_id, {}) if b >= min_batch_id)
        if not ids:
            return None
        return StoredBatch(ids[0], self.batches[shard_id][ids[0]], b"batch-%d" % ids[0])


def ids(delivery: Delivery) -> list[tuple[int, int, int]]:
    return [(delivery.shard_id, delivery.batch.batch_id, i) for i in delivery.indices]


def new_state(shards: list[int], timeout: float = 10.0, max_unacked: int = 1000) -> SubscriptionState:
    return SubscriptionState({s: START for s in shards}, ack_timeout=timeout, max_unacked=max_unacked)


def test_no_consumer_no_delivery() -> None:
    state = new_state([1])
    assert state.poll(0.0, Shards({1: {1: 2}})) == []


def test_batches_of_a_shard_come_in_order_one_per_delivery() -> None:
    state = new_state([1, 2])
    state.join("c")
    source = Shards({1: {1: 2, 5: 1, 9: 3}, 2: {3: 1}})
    out = state.poll(0.0, source)
    assert [(d.shard_id, d.batch.batch_id, d.indices) for d in out] == [
        (1, 1, (0, 1)),
        (2, 3, (0,)),
        (1, 5, (0,)),
        (1, 9, (0, 1, 2)),
    ]
    assert all(d.consumer == "c" and not d.resend and d.whole_batch for d in out)
    assert state.unacked == 7
    assert state.poll(1.0, source) == []
    source.batches[1][12] = 1
    assert [(d.batch.batch_id, d.indices) for d in state.poll(2.0, source)] == [(12, (0,))]


def test_commit_moves_over_contiguous_acks_only_and_acks_are_idempotent() -> None:
    state = new_state([1])
    state.join("c")
    first, second = state.poll(0.0, Shards({1: {4: 3, 7: 2}}))
    assert state.ack([(1, 4, 1)]) == 1
    assert state.committed() == {1: (4, 0)}  # the same place as START: nothing before batch 4 is acked
    state.take_changed()
    assert state.ack([(1, 7, 0), (1, 7, 1)]) == 2
    assert state.committed() == {1: (4, 0)}
    assert state.take_changed() == {}
    assert state.ack([(1, 4, 0)]) == 1
    assert state.committed() == {1: (4, 2)}
    assert state.take_changed() == {1: (4, 2)}
    assert state.ack([(1, 4, 0), (1, 4, 1), (9, 4, 2), (1, 5, 0)]) == 0
    assert state.ack(ids(first)) == 1
    assert state.committed() == {1: (7, 2)}
    assert state.unacked == 0
    assert state.ack(ids(first) + ids(second)) == 0
    assert state.take_changed() == {1: (7, 2)}
    assert state.take_changed() == {}


def test_unacked_records_are_resent_after_the_deadline_only_those_and_same_ids() -> None:
    state = new_state([1], timeout=5.0)
    state.join("c")
    source = Shards({1: {2: 4}})
    (delivery,) = state.poll(0.0, source)
    state.ack([(1, 2, 0), (1, 2, 2)])
    assert state.poll(4.9, source) == []
    (resend,) = state.poll(5.0, source)
    assert resend.resend and resend.consumer == "c"
    assert ids(resend) == [(1, 2, 1), (1, 2, 3)]
    assert not resend.whole_batch
    assert state.poll(9.9, source) == []
    state.ack([(1, 2, 1)])
    (again,) = state.poll(10.0, source)
    assert ids(again) == [(1, 2, 3)]
    state.ack([(1, 2, 3)])
    assert state.poll(100.0, source) == []
    assert state.committed() == {1: (2, 4)}


def test_max_unacked_bounds_new_deliveries() -> None:
    state = new_state([1], max_unacked=3)
    state.join("c")
    source = Shards({1: {1: 2, 2: 2, 3: 2}})
    out = state.poll(0.0, source)
    assert [d.batch.batch_id for d in out] == [1, 2]
    assert state.unacked == 4
    assert state.poll(0.1, source) == []
    state.ack(ids(out[0]))
    assert [d.batch.batch_id for d in state.poll(0.2, source)] == [3]


def test_each_shard_has_one_owner_and_rebalance_spreads_shards() -> None:
    state = new_state([1, 2, 3, 4])
    state.join("a")
    state.poll(0.0, Shards({}))
    assert state.assignment() == {"a": [1, 2, 3, 4]}
    state.join("b")
    assert state.rebalance() == [4, 3]
    assert state.assignment() == {"a": [1, 2], "b": [3, 4]}
    state.join("c")
    state.rebalance()
    owned = state.assignment()
    assert sorted(len(v) for v in owned.values()) == [1, 1, 2]
    assert sorted(s for v in owned.values() for s in v) == [1, 2, 3, 4]
    with pytest.raises(ConsumerExists):
        state.join("a")


def test_a_leaving_owner_hands_its_unacked_records_to_the_next_owner_at_once() -> None:
    state = new_state([1], timeout=100.0)
    state.join("a")
    source = Shards({1: {3: 3}})
    (delivery,) = state.poll(0.0, source)
    assert delivery.consumer == "a"
    state.ack([(1, 3, 0)])
    state.join("b")
    state.leave("a")
    assert state.owner(1) is None
    (resend,) = state.poll(1.0, source)
    assert resend.consumer == "b" and resend.resend
    assert ids(resend) == [(1, 3, 1), (1, 3, 2)]
    state.leave("nobody")
    assert state.consumers == ["b"]


def test_a_moved_shard_goes_to_its_new_owner_in_order() -> None:
    """A rebalance hands the moved shard's unacked records to the new owner at once, before its newer
    batches: the new owner receives the shard in order (#25; at the deadline it got newer batches first)."""
    state = new_state([1, 2], timeout=10.0)
    state.join("a")
    source = Shards({1: {1: 1}, 2: {2: 1}})
    assert len(state.poll(0.0, source)) == 2
    state.ack([(1, 1, 0)])
    state.join("b")
    assert state.rebalance() == [2]
    source.batches[2][7] = 2  # a newer batch of the moved shard
    out = state.poll(1.0, source)
    assert [(d.consumer, d.shard_id, d.batch.batch_id, d.resend) for d in out] == [
        ("b", 2, 2, True),
        ("b", 2, 7, False),
    ]
    state.ack([(2, 2, 0)])  # whoever acks, the ack counts
    state.ack([(2, 7, 0), (2, 7, 1)])
    assert state.poll(30.0, source) == []
    assert state.committed() == {1: (1, 1), 2: (7, 2)}


def test_without_redelivery_at_once_a_moved_shard_keeps_its_deadlines() -> None:
    """HStreamDB's order, which ingestion must survive: the new owner gets newer batches first and the
    previous owner's unacked records only at their deadline."""
    state = SubscriptionState(
        {1: START, 2: START}, ack_timeout=10.0, max_unacked=100, redeliver_at_once=False
    )
    state.join("a")
    source = Shards({1: {1: 1}, 2: {2: 1}})
    assert len(state.poll(0.0, source)) == 2
    state.ack([(1, 1, 0)])
    state.join("b")
    assert state.rebalance() == [2]
    source.batches[2][7] = 1
    assert [(d.batch.batch_id, d.resend) for d in state.poll(1.0, source)] == [(7, False)]
    (resend,) = state.poll(10.0, source)
    assert (resend.consumer, resend.shard_id, resend.batch.batch_id) == ("b", 2, 2)
    state.leave("a")
    assert state.poll(10.5, source) == []  # a leaving owner's records too wait for their deadline


def test_start_positions_latest_and_mid_batch() -> None:
    latest = SubscriptionState({1: (5, 2)}, ack_timeout=1.0, max_unacked=10)
    latest.join("c")
    source = Shards({1: {2: 1, 5: 2, 8: 1}})
    assert [(d.batch.batch_id, d.indices) for d in latest.poll(0.0, source)] == [(8, (0,))]
    middle = SubscriptionState({1: (5, 1)}, ack_timeout=1.0, max_unacked=10)
    middle.join("c")
    out = middle.poll(0.0, source)
    assert [(d.batch.batch_id, d.indices) for d in out] == [(5, (1,)), (8, (0,))]
    middle.ack(ids(out[0]))
    assert middle.committed() == {1: (8, 0)}  # batch 5 done, nothing of batch 8 yet


def test_max_new_batches_limits_one_round() -> None:
    state = new_state([1])
    state.join("c")
    source = Shards({1: {i: 1 for i in range(1, 11)}})
    assert [d.batch.batch_id for d in state.poll(0.0, source, max_new_batches=4)] == [1, 2, 3, 4]
    assert [d.batch.batch_id for d in state.poll(0.0, source, max_new_batches=100)] == [5, 6, 7, 8, 9, 10]


def test_invalid_construction() -> None:
    with pytest.raises(ValueError):
        SubscriptionState({1: START}, ack_timeout=0, max_unacked=1)
    with pytest.raises(ValueError):
        StoredBatch(0, 1, b"")


EVENTS = st.lists(
    st.one_of(
        st.tuples(st.just("join"), st.sampled_from("abc")),
        st.tuples(st.just("leave"), st.sampled_from("abc")),
        st.tuples(st.just("poll"), st.floats(0, 3)),
        st.tuples(st.just("ack"), st.integers(0, 10**6)),
        st.tuples(st.just("rebalance"), st.none()),
    ),
    max_size=60,
)


@settings(max_examples=200, deadline=None)
@given(EVENTS, st.integers(1, 8))
def test_invariants_hold_under_any_event_sequence(events: list[tuple[str, Any]], max_unacked: int) -> None:
    batches = {1: {2: 3, 4: 1, 9: 2}, 2: {3: 2, 5: 2}, 3: {}}
    source = Shards(batches)
    state = SubscriptionState({s: START for s in batches}, ack_timeout=1.0, max_unacked=max_unacked)
    now = 0.0
    sent_new: dict[int, list[int]] = {s: [] for s in batches}
    outstanding: list[tuple[int, int, int]] = []
    acked: set[tuple[int, int, int]] = set()
    previous = state.committed()
    for kind, arg in events:
        if kind == "join" and arg not in state.consumers:
            state.join(arg)
        elif kind == "leave":
            state.leave(arg)
        elif kind == "rebalance":
            state.rebalance()
        elif kind == "poll":
            now += arg
            before = state.unacked
            out = state.poll(now, source)
            new = [d for d in out if not d.resend]
            if new:
                assert before < max_unacked  # no new batch once the bound is reached
            for d in out:
                assert d.consumer in state.consumers and state.owner(d.shard_id) == d.consumer
                assert not set(ids(d)) & acked  # acked records are never sent again
                outstanding.extend(ids(d))
            for d in new:
                sent_new[d.shard_id].append(d.batch.batch_id)
        elif kind == "ack" and outstanding:
            record = outstanding[arg % len(outstanding)]
            state.ack([record])
            acked.add(record)
        owners = [state.owner(s) for s in batches]
        assert all(o is None or o in state.consumers for o in owners)
        assert state.unacked == len({r for r in outstanding if r not in acked})
        committed = state.committed()
        assert all(committed[s] >= previous[s] for s in batches)  # commits only move forward
        previous = committed
    for sent in sent_new.values():
        assert sent == sorted(sent) and len(sent) == len(set(sent))  # new batches in order, once
    for shard, (batch_id, index) in state.committed().items():
        # everything before the committed position was acked
        for b, size in batches[shard].items():
            for i in range(size):
                if (b, i) < (batch_id, index):
                    assert (shard, b, i) in acked
