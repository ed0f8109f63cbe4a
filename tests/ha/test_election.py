"""The fail-over election as a pure state machine: events in, actions out (no etcd, no store)."""

from __future__ import annotations

import pytest

from diffstore.ha import election as el

TTL = 10.0


def started(member: str = "b", now: float = 0.0, term: int = 0) -> el.Election:
    """A member whose first lease was granted at ``now``."""
    machine = el.Election(member, f"http://{member}", TTL, term)
    assert machine.handle(el.Tick(now)) == [el.NewLease()]
    machine.handle(el.Renewed(now))
    return machine


def leading(member: str = "b", now: float = 0.0) -> el.Election:
    machine = started(member, now)
    assert machine.handle(el.Observed(now, None, 0)) == [el.Campaign(1, 0)]
    assert machine.handle(el.Won(now, 1)) == [el.Lead(1)]
    return machine


def test_alone_a_member_campaigns_at_the_next_term_and_leads() -> None:
    machine = started(term=4)
    assert machine.handle(el.Observed(0.1, None, 6)) == [el.Campaign(7, 6)]
    assert machine.handle(el.Won(0.2, 7)) == [el.Lead(7)]
    assert machine.role == "leader" and machine.term == 7
    assert machine.writable_until == pytest.approx(TTL / 2)


def test_no_campaign_without_a_lease() -> None:
    machine = el.Election("b", "http://b", TTL)
    assert machine.handle(el.Observed(0.0, None, 0)) == []


def test_a_member_defers_to_a_more_caught_up_one_then_campaigns_after_defer() -> None:
    machine = started("a")
    mine = {"c1": "0002"}
    ahead = (el.Peer("z", "http://z", {"c1": "0003"}),)
    assert machine.handle(el.Observed(0.1, None, 0, ahead, mine)) == []
    assert machine.handle(el.Observed(0.1 + machine.defer_s, None, 0, ahead, mine)) == [el.Campaign(1, 0)]


def test_ties_go_by_name() -> None:
    same = {"c1": "0003"}
    later = started("b")
    assert later.handle(el.Observed(0.1, None, 0, (el.Peer("a", "http://a", same),), same)) == []
    first = started("a")
    assert first.handle(el.Observed(0.1, None, 0, (el.Peer("b", "http://b", same),), same)) == [
        el.Campaign(1, 0)
    ]


def test_being_ahead_beats_being_named_first() -> None:
    machine = started("b")
    peers = (el.Peer("a", "http://a", {"c1": "01"}),)
    assert machine.handle(el.Observed(0.1, None, 0, peers, {"c1": "0100"})) == [el.Campaign(1, 0)]


def test_ahead_compares_positions_per_collection() -> None:
    assert el.ahead({"x": "02"}, {"x": "01"})
    assert el.ahead({"x": "01", "y": "00"}, {"x": "01"})  # a collection the other lacks
    assert not el.ahead({"x": "01"}, {"x": "01"})
    assert not el.ahead({"x": "02", "y": "00"}, {"x": "01", "y": "01"})  # mixed: neither is ahead
    assert el.ahead({"x": "0100"}, {"x": "01"})  # a longer id with the same prefix sorts after


def test_a_leader_without_renewal_steps_back_at_half_the_ttl() -> None:
    machine = leading()
    assert machine.handle(el.Tick(TTL / 2 - 0.01)) == [el.Renew()]
    actions = machine.handle(el.Tick(TTL / 2))
    assert isinstance(actions[0], el.StepBack) and machine.role == "fenced"
    assert machine.writable_until == 0.0


def test_a_renewal_moves_the_deadline_from_when_it_was_sent() -> None:
    machine = leading()
    assert machine.handle(el.Renewed(3.0)) == [el.Publish()]
    assert machine.writable_until == pytest.approx(3.0 + TTL / 2)
    assert machine.handle(el.Tick(3.0 + TTL / 2 - 0.01)) == [el.Renew()]
    assert machine.role == "leader"


def test_a_lost_lease_steps_back_and_asks_for_a_new_one() -> None:
    machine = leading()
    actions = machine.handle(el.LeaseExpired(1.0))
    assert isinstance(actions[0], el.StepBack) and actions[1] == el.NewLease()


def test_a_member_follows_the_leader_it_sees_once() -> None:
    machine = started()
    key = el.LeaderKey("a", "http://a", 3)
    assert machine.handle(el.Observed(0.1, key, 3)) == [el.Follow(key)]
    assert machine.handle(el.Observed(0.2, key, 3)) == []
    assert machine.role == "replica" and machine.term == 3
    newer = el.LeaderKey("c", "http://c", 4)
    assert machine.handle(el.Observed(0.3, newer, 4)) == [el.Follow(newer)]


def test_a_replica_whose_leader_vanished_is_a_candidate_then_follows_the_winner() -> None:
    machine = started("z")
    old = el.LeaderKey("a", "http://a", 3)
    machine.handle(el.Observed(0.1, old, 3))
    ahead = (el.Peer("b", "http://b", {"c": "09"}),)
    assert machine.handle(el.Observed(0.2, None, 3, ahead, {"c": "01"})) == []
    assert machine.role == "candidate"
    new = el.LeaderKey("b", "http://b", 4)
    assert machine.handle(el.Observed(0.3, new, 4)) == [el.Follow(new)]


def test_a_leader_that_sees_another_key_steps_back_and_follows() -> None:
    machine = leading("b")
    other = el.LeaderKey("c", "http://c", 2)
    actions = machine.handle(el.Observed(1.0, other, 2))
    assert isinstance(actions[0], el.StepBack) and actions[1] == el.Follow(other)
    assert machine.role == "replica" and machine.writable_until == 0.0


def test_a_leader_whose_key_is_gone_steps_back_and_campaigns_again_higher() -> None:
    machine = leading("b")
    actions = machine.handle(el.Observed(1.0, None, 1))
    assert isinstance(actions[0], el.StepBack) and actions[1] == el.Campaign(2, 1)
    assert machine.handle(el.Won(1.1, 2)) == [el.Lead(2)]


def test_a_key_of_a_previous_life_is_waited_out() -> None:
    machine = started("b")
    stale = el.LeaderKey("b", "http://b", 5, ours=False)
    assert machine.handle(el.Observed(0.1, stale, 5)) == []
    assert machine.role == "candidate"


def test_a_late_renewal_with_the_key_still_ours_leads_again() -> None:
    machine = leading("b")
    machine.handle(el.Tick(TTL / 2))  # stepped back
    machine.handle(el.Renewed(TTL / 2 + 0.1))
    ours = el.LeaderKey("b", "http://b", 1, ours=True)
    assert machine.handle(el.Observed(TTL / 2 + 0.2, ours, 1)) == [el.Lead(1)]


def test_failovers_count_leads_taken_from_another_member() -> None:
    machine = started("b")
    machine.handle(el.Observed(0.1, el.LeaderKey("a", "http://a", 1), 1))
    machine.handle(el.Observed(0.2, None, 1))
    machine.handle(el.Won(0.3, 2))
    assert machine.failovers == 1
