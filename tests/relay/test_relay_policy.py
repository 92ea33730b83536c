"""RelayPolicy alone (relay/policy.py): admission, reservation and circuit limits, expiry, receipt
pacing and counters, driven by events with explicit clocks; no sockets, no event loop."""
from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from relay.messages import Limit, Status
from relay.policy import AdmissionRule, CircuitRecord, RelayLimits, RelayPolicy

T0 = 1_800_000_000.0
SESSION = bytes(16)


def policy(allow=("a", "b", "c", "d"), min_stake=10, **limits) -> RelayPolicy:
    return RelayPolicy(RelayLimits(**limits), AdmissionRule(set(allow), min_stake))


def open_circuit(p: RelayPolicy, src="a", dst="b", now=T0):
    decision = p.connect(src, dst, None, SESSION, now)
    assert decision.accepted, decision.reason
    return decision.circuit


# ---- admission
def test_admission_by_allow_list_or_stake_at_least_min_stake():
    rule = AdmissionRule({"friend"}, min_stake=10)
    assert not rule.needs_stake("friend") and rule.needs_stake("stranger")
    assert rule.admits_with("friend", None)
    assert rule.admits_with("stranger", 10) and rule.admits_with("stranger", 11)
    assert not rule.admits_with("stranger", 9)
    assert not rule.admits_with("stranger", None)   # unregistered, or the lookup failed


def test_allow_list_changes_apply_at_once():
    p = policy(allow=("a",))
    assert p.reserve("a", "10.0.0.1", None, T0).accepted
    p.admission.allow_list.discard("a")
    decision = p.reserve("a", "10.0.0.1", None, T0)
    assert decision.status == Status.PERMISSION_DENIED


# ---- reservations
def test_reservation_accepted_with_expiry_ttl_after_now():
    p = policy(reservation_ttl=60)
    decision = p.reserve("a", "10.0.0.1", None, T0 + 0.7)
    assert decision.accepted and decision.status == Status.OK
    assert decision.expire == int(T0) + 60
    assert p.reservations["a"].ip == "10.0.0.1"
    assert p.counters["reservations_refused"] == 0


def test_reservation_over_a_relayed_connection_is_denied_even_for_allow_listed_peers():
    p = policy()
    decision = p.reserve("a", None, None, T0)
    assert decision.status == Status.PERMISSION_DENIED and "relayed" in decision.reason
    assert p.reservations == {} and p.counters["reservations_refused"] == 1


def test_reservation_of_unadmitted_peer_denied():
    p = policy(allow=())
    assert p.reserve("rich", "10.0.0.1", 10, T0).accepted
    for stake in (9, None):
        decision = p.reserve("poor", "10.0.0.2", stake, T0)
        assert decision.status == Status.PERMISSION_DENIED
    assert set(p.reservations) == {"rich"} and p.counters["reservations_refused"] == 2


def test_per_ip_limit_counts_other_peers_only():
    p = policy(max_reservations_per_ip=1)
    assert p.reserve("a", "10.0.0.1", None, T0).accepted
    assert p.reserve("a", "10.0.0.1", None, T0 + 1).accepted      # renewing one's own is fine
    decision = p.reserve("b", "10.0.0.1", None, T0 + 1)
    assert decision.status == Status.RESOURCE_LIMIT_EXCEEDED and "10.0.0.1" in decision.reason
    assert p.reserve("b", "10.0.0.2", None, T0 + 1).accepted     # another IP has room


def test_total_reservation_limit_and_room_after_expiry():
    p = policy(max_reservations=2, reservation_ttl=10)
    assert p.reserve("a", "10.0.0.1", None, T0).accepted
    assert p.reserve("b", "10.0.0.2", None, T0).accepted
    assert p.reserve("c", "10.0.0.3", None, T0 + 9).status == Status.RESOURCE_LIMIT_EXCEEDED
    assert p.reserve("c", "10.0.0.3", None, T0 + 10).accepted    # a and b expired at T0 + 10
    assert set(p.reservations) == {"c"}


def test_tick_expires_reservations_at_their_expiry():
    p = policy(reservation_ttl=10)
    p.reserve("a", "10.0.0.1", None, T0)
    p.reserve("b", "10.0.0.2", None, T0 + 5)
    assert p.tick(T0 + 9.9) == []
    assert p.tick(T0 + 10) == ["a"]
    assert p.status(T0 + 10)["reservations"] == 1
    assert p.status(T0 + 15)["reservations"] == 0 and p.reservations == {}


# ---- circuits
def test_circuit_needs_admitted_source_and_live_reservation_of_another_target():
    p = policy(allow=("b",), reservation_ttl=10)
    assert p.connect("a", "b", None, SESSION, T0).status == Status.PERMISSION_DENIED   # a not admitted
    assert p.connect("a", "b", 10, SESSION, T0).status == Status.NO_RESERVATION      # b has none
    p.reserve("b", "10.0.0.2", None, T0)
    assert p.connect("b", "b", None, SESSION, T0).status == Status.NO_RESERVATION    # to itself
    decision = p.connect("a", "b", 10, SESSION, T0 + 1)
    assert decision.accepted and decision.circuit in p.circuits
    assert (decision.circuit.src, decision.circuit.dst, decision.circuit.session) == ("a", "b", SESSION)
    assert p.connect("a", "b", 10, SESSION, T0 + 10).status == Status.NO_RESERVATION  # expired
    assert "b" not in p.reservations
    assert p.counters["circuits_refused"] == 4


def test_circuit_limits_in_all_and_per_peer_as_source_or_target():
    p = policy(max_circuits=3, max_circuits_per_peer=2)
    for peer in "bcd":
        p.reserve(peer, "10.0.0." + str(ord(peer)), None, T0)
    open_circuit(p, "a", "b")
    open_circuit(p, "c", "b")
    decision = p.connect("d", "b", None, SESSION, T0)       # b is target of two already
    assert decision.status == Status.RESOURCE_LIMIT_EXCEEDED and "per peer" in decision.reason
    open_circuit(p, "a", "c")
    assert p.connect("d", "c", None, SESSION, T0).reason == "circuit limit"   # three open in all
    assert p.circuits_of("a") == 2 and p.circuits_of("b") == 2 and p.circuits_of("d") == 0


def test_failed_and_closed_circuits_free_their_slot_and_count():
    p = policy(max_circuits=1)
    p.reserve("b", "10.0.0.2", None, T0)
    first = open_circuit(p)
    p.circuit_failed(first)
    assert p.circuits == set() and p.counters["circuits_refused"] == 1
    second = open_circuit(p)
    p.relayed(second, 1000, True)
    p.relayed(second, 24, False)
    assert p.status(T0)["bytes_relayed"] == 1024
    assert p.circuit_closed(second)              # unreceipted bytes: a final receipt is due
    assert p.counters["circuits_closed"] == 1 and p.counters["bytes_closed_circuits"] == 1024
    assert p.status(T0)["circuits"] == 0 and p.status(T0)["bytes_relayed"] == 0
    p.circuit_closed(second)                     # closing twice counts once
    assert p.counters["circuits_closed"] == 1


# ---- receipts
def test_receipt_due_every_interval_never_two_at_once():
    p = policy(receipt_interval_bytes=100)
    p.reserve("b", "10.0.0.2", None, T0)
    c = open_circuit(p)
    assert not p.relayed(c, 60, True)
    assert p.relayed(c, 40, False)               # 100 bytes: a round starts
    assert c.receipt_pending and c.receipted_bytes == 100
    assert not p.relayed(c, 500, True)           # interval crossed again, but a round is in flight
    p.receipt_ended(c, 100)
    assert p.relayed(c, 1, True)                 # 601 - 100 >= 100: the next round starts at once
    assert c.receipted_bytes == 601
    p.receipt_ended(c, None)                     # not co-signed
    assert not c.receipt_pending and c.signed_bytes == 100
    assert p.counters["receipts"] == 1 and p.counters["receipts_failed"] == 1


def test_final_receipt_due_only_for_bytes_not_co_signed():
    p = policy(receipt_interval_bytes=100)
    p.reserve("b", "10.0.0.2", None, T0)
    empty = open_circuit(p)
    assert not p.circuit_closed(empty)           # nothing relayed: no receipt
    c = open_circuit(p)
    p.relayed(c, 150, True)
    total = p.receipt_started(c)
    p.receipt_ended(c, total)
    assert not p.circuit_closed(c)               # everything is co-signed already
    d = open_circuit(p)
    p.relayed(d, 150, True)                      # a round for 150 starts...
    p.relayed(d, 20, True)                       # ...and 20 more arrive before the circuit closes
    assert p.circuit_closed(d)
    p.receipt_ended(d, 150)
    assert p.receipt_due(d)                      # the final round covers the last 20
    assert p.receipt_started(d) == 170
    p.receipt_cancelled(d)
    assert not d.receipt_pending and p.counters["receipts_failed"] == 0


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from("abcdef"), st.sampled_from(["10.0.0.1", "10.0.0.2", None]),
                          st.integers(0, 30)), max_size=40))
def test_limits_hold_under_any_sequence_of_reservations(requests):
    """a-c allow-listed, d-e staked, f neither: whatever the order and timing, live reservations stay
    within the limits, a refusal changes nothing, and every refusal is counted."""
    p = policy(allow="abc", max_reservations=3, max_reservations_per_ip=2, reservation_ttl=20)
    now, accepted = T0, 0
    for peer, ip, advance in requests:
        now += advance
        before = dict(p.reservations)
        decision = p.reserve(peer, ip, 10 if peer in "de" else None, now)
        live = [r for r in p.reservations.values() if r.expire > now]
        assert len(live) <= 3
        assert all(sum(1 for r in live if r.ip == i) <= 2 for i in {r.ip for r in live})
        if decision.accepted:
            accepted += 1
            assert ip is not None and peer != "f"
            assert p.reservations[peer].expire == int(now) + 20
        else:
            assert decision.status in (Status.PERMISSION_DENIED, Status.RESOURCE_LIMIT_EXCEEDED)
            assert p.reservations.get(peer) is before.get(peer) or peer not in p.reservations
    assert p.counters["reservations_refused"] == len(requests) - accepted


def test_allowance_follows_the_announced_data_limit():
    unlimited = RelayPolicy(RelayLimits())
    circuit = CircuitRecord("a", "b", b"s")
    assert unlimited.allowance(circuit, True) is None and unlimited.duration_cap() is None
    capped = RelayPolicy(RelayLimits(circuit_limit=Limit(duration=120, data=1000)))
    capped.relayed(circuit, 600, True)
    capped.relayed(circuit, 100, False)
    assert capped.allowance(circuit, True) == 400 and capped.allowance(circuit, False) == 900
    capped.relayed(circuit, 500, True)
    assert capped.allowance(circuit, True) == 0 and capped.duration_cap() == 120
