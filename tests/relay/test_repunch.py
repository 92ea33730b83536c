"""The re-punch schedule (relay/repunch.py, ADR 0225): a relayed peer is punched again 30 s after a
failed punch, then after twice as long each time up to 15 min; a peer in progress is not handed out
twice; success or a closed connection forgets it; the number of peers tracked is bounded."""
from relay.repunch import FIRST_S, MAX_S, RepunchSchedule


def test_retries_back_off_exponentially_up_to_the_cap():
    schedule = RepunchSchedule()
    schedule.failed("p", now=0.0)
    assert schedule.due(FIRST_S - 0.1) == [] and schedule.due(FIRST_S) == ["p"]
    assert schedule.due(FIRST_S + 1000) == []          # in progress: not handed out again
    waits, now = [], FIRST_S
    for _ in range(8):
        schedule.failed("p", now)
        waits.append(schedule.next_at("p") - now)
        now = schedule.next_at("p")
        assert schedule.due(now) == ["p"]
    assert waits == [60.0, 120.0, 240.0, 480.0, MAX_S, MAX_S, MAX_S, MAX_S]
    assert schedule.attempts("p") == 8


def test_success_and_a_closed_connection_forget_the_peer():
    schedule = RepunchSchedule(first_s=1.0)
    schedule.failed("a", 0.0)
    schedule.failed("b", 0.0)
    assert sorted(schedule.due(1.0)) == ["a", "b"]
    schedule.succeeded("a")
    schedule.forget("b")
    assert len(schedule) == 0 and schedule.due(10_000.0) == [] and schedule.next_at("a") is None


def test_the_peers_tracked_are_bounded():
    schedule = RepunchSchedule(first_s=1.0, max_peers=3)
    for i in range(5):
        schedule.failed(f"p{i}", float(i))
    assert len(schedule) == 3 and "p0" not in schedule and "p1" not in schedule and "p4" in schedule
