"""The relay choice rule (relay/choice.py) and the load report's wire format (relay/load.py), sans-I/O."""
import pytest

from consensus.encoding import encode
from relay import choice
from relay.load import LoadError, LoadReport, decode_report


def report(circuits=0, max_circuits=100, reservations=0, max_reservations=100):
    return LoadReport(circuits, max_circuits, reservations, max_reservations)


def test_report_round_trips_and_utilization_is_the_busier_slot_clamped():
    assert decode_report(report(30, 100, 5, 10).encode()) == report(30, 100, 5, 10)
    assert report(30, 100, 5, 10).utilization == 0.5
    assert report(500, 100).utilization == 1.0          # more circuits than it has room for: full, no more
    assert report(0, 0).utilization == 1.0              # announcing no capacity is announcing "full"


@pytest.mark.parametrize("body", [
    b"", b"\xff\xff", encode([1, 2, 3, 4]), encode({"circuits": 1}),
    encode({"circuits": -1, "max_circuits": 1, "reservations": 0, "max_reservations": 1}),
    encode({"circuits": 1 << 32, "max_circuits": 1, "reservations": 0, "max_reservations": 1}),
    encode({"circuits": True, "max_circuits": 1, "reservations": 0, "max_reservations": 1}),
    encode({"circuits": 1, "max_circuits": 1, "reservations": 0, "max_reservations": 1, "x": 0}),
    encode({"circuits": 1, "max_circuits": 1, "reservations": 0, "max_reservations": 1, "pad": "x" * 200}),
])
def test_malformed_or_oversized_reports_are_refused(body):
    with pytest.raises(LoadError):
        decode_report(body)


def test_effective_load_is_floored_and_raised_to_our_own_circuits():
    loads = choice.RelayLoads()
    loads.record("liar", report(0, 100), now=0.0)
    loads.record("busy", report(80, 100), now=0.0)
    assert loads.effective("liar", 1.0) == choice.IDLE              # "0 load" is worth no more than idle
    assert loads.effective("busy", 1.0) == 0.8
    assert loads.effective("liar", 1.0, own_circuits=60) == 0.6      # it carries at least our 60 circuits
    assert loads.effective("busy", 1.0, own_circuits=10) == 0.9      # ours opened since its report add up
    loads.record("busy", report(80, 100), now=0.0, own_circuits=10)
    assert loads.effective("busy", 1.0, own_circuits=10) == 0.8      # ...those it already counted do not
    assert loads.effective("never-asked", 1.0) == choice.UNKNOWN
    assert loads.effective("busy", choice.REPORT_MAX_AGE_S + 1) == choice.UNKNOWN   # too old to use
    assert loads.stale(["liar", "busy", "never-asked"], choice.REPORT_TTL_S + 1) == ["liar", "busy", "never-asked"]
    assert loads.stale(["liar", "never-asked"], 1.0) == ["never-asked"]
    loads.record("huge", report(0, 1 << 31, 0, 1 << 31), now=0.0)
    assert loads.effective("huge", 1.0, own_circuits=choice.MAX_CREDITED_CIRCUITS // 2) == 0.5   # capacity capped
    loads.forget("busy")
    assert loads.effective("busy", 1.0) == choice.UNKNOWN


def test_known_relays_are_bounded():
    loads = choice.RelayLoads()
    for i in range(choice.MAX_KNOWN + 10):
        loads.record(f"r{i}", report(), now=0.0)
    assert loads.utilization("r0") is None and loads.utilization(f"r{choice.MAX_KNOWN + 9}") == 0.0


def test_new_circuits_go_to_the_least_loaded_and_spread_over_equally_good_ones():
    never = lambda relay: False  # noqa: E731
    assert choice.rank_relays(["a", "b", "c"], [0.8, 0.25, 0.5], {}, never) == [1, 2, 0]
    # within MARGIN of the least: equally good, the one holding fewer of our circuits first
    assert choice.rank_relays(["a", "b"], [0.25, 0.3], {"a": 3, "b": 1}, never) == [1, 0]
    assert choice.rank_relays(["a", "b"], [0.25, 0.3], {"a": 1, "b": 3}, never) == [0, 1]
    # a loaded relay is not used for spreading, however few of our circuits it has
    assert choice.rank_relays(["a", "b"], [0.9, 0.25], {"b": 50}, never) == [1, 0]
    # a relay that failed recently goes last even if it is the least loaded
    assert choice.rank_relays(["a", "b"], [0.25, 0.9], {}, lambda relay: relay == "a") == [1, 0]


def test_a_relay_claiming_zero_load_gets_its_fair_share_of_our_circuits():
    loads = choice.RelayLoads()
    loads.record("liar", report(0, 100), now=0.0)
    loads.record("honest", report(20, 100), now=0.0)
    own = {"liar": 0, "honest": 0}
    for _ in range(10):
        relays = ["liar", "honest"]
        first = relays[choice.rank_relays(relays, [loads.effective(r, 1.0, own[r]) for r in relays], own,
                                          lambda relay: False)[0]]
        own[first] += 1
    assert own == {"liar": 5, "honest": 5}


def test_reservations_prefer_load_over_round_trip_time_only_beyond_the_margin():
    assert choice.rank_for_reservation([(0.001, "near-busy"), (0.050, "far-idle")], [0.9, 0.25]) == [
        (0.050, "far-idle"), (0.001, "near-busy")]
    assert choice.rank_for_reservation([(0.050, "far"), (0.001, "near")], [0.25, 0.35]) == [
        (0.001, "near"), (0.050, "far")]


def test_a_reservation_moves_only_for_a_large_difference_after_the_hold_time():
    hold = choice.MIN_HOLD_S
    assert choice.move({"a": (0.9, 0.0)}, {"b": 0.25}, now=hold) == ("a", "b")
    assert choice.move({"a": (0.9, 0.0)}, {"b": 0.25}, now=hold - 1) is None            # held too briefly
    assert choice.move({"a": (0.5, 0.0)}, {"b": 0.25}, now=hold) is None                 # not worth a move
    assert choice.move({"a": (0.9, 0.0), "c": (0.4, 0.0)}, {"b": 0.25, "d": 0.3}, now=hold) == ("a", "b")
    assert choice.move({"a": (0.9, 0.0)}, {}, now=hold) is None
