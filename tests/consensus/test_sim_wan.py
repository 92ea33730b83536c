"""The consensus simulator over a WAN (devtools.consensus_sim.wan, ADR 0193): the latency table, the
per-link delay and bandwidth model, and committees that commit safely over it, replayable by seed."""
import random
from types import SimpleNamespace

import pytest

from consensus.messages import Vote, VoteType, encode_message, sign_vote
from devtools.consensus_sim.invariants import Checker
from devtools.consensus_sim.wan import INTRA_REGION_RTT_MS, REGIONS, WanConfig, WanLatency, rtt_ms
from devtools.consensus_sim.wan_measure import measure, timeouts_for
from node.identity import Identity


def test_the_table_covers_every_pair_symmetrically():
    for a in REGIONS:
        assert rtt_ms(a, a) == INTRA_REGION_RTT_MS
        for b in REGIONS:
            assert rtt_ms(a, b) == rtt_ms(b, a)
            if a != b:
                assert 20 <= rtt_ms(a, b) <= 350
    assert rtt_ms("us-east-1", "eu-west-1") < rtt_ms("us-east-1", "ap-southeast-2")


def test_a_payload_takes_half_the_round_trip_plus_bounded_jitter():
    wan = WanLatency(12, WanConfig(jitter=0.1), random.Random(3))
    assert wan.regions[0] == wan.regions[10] == REGIONS[0] and wan.regions[1] == REGIONS[1]
    base = rtt_ms(REGIONS[0], REGIONS[5]) / 2000
    delays = [wan.arrival(5.0, 0, 5, 100) - 5.0 for _ in range(200)]
    assert all(base <= d <= 1.1 * base for d in delays)
    assert max(delays) - min(delays) > 0.05 * base   # jitter is drawn, not constant


def test_bandwidth_makes_a_big_block_take_time_and_queues_the_link():
    wan = WanLatency(2, WanConfig(jitter=0.0, bandwidth=12.5e6), random.Random(1))  # 100 Mbit/s
    base = wan.one_way(0, 1)
    first = wan.arrival(0.0, 0, 1, 1_000_000)
    assert first == pytest.approx(base + 0.08)
    second = wan.arrival(0.0, 0, 1, 1000)          # behind the megabyte on the same link
    assert second == pytest.approx(base + 0.08 + 0.00008)
    assert wan.arrival(0.0, 1, 0, 1000) == pytest.approx(base + 0.00008)  # the other direction is free


def test_a_committee_over_the_wan_commits_safely_in_one_round_and_replays():
    run = measure(7, 8, seed=5)
    assert run["violations"] == []
    assert run["heights"] >= 8
    assert run["rounds_max"] == 1
    # a commit needs a proposal, prevotes and precommits to cross the WAN: far above the LAN delays
    assert 100 <= run["finality_p50_ms"] <= run["finality_p95_ms"] < 1000
    assert run["stored_bytes_per_height"] > 7 * 100   # a block and its certificate of >= 5 precommits
    again = measure(7, 8, seed=5)
    assert again["trace"] == run["trace"] and again["finality_p50_ms"] == run["finality_p50_ms"]
    assert measure(7, 8, seed=6)["trace"] != run["trace"]


def test_timeouts_shorter_than_the_wan_round_trips_cost_rounds_but_stay_safe():
    run = measure(10, 6, seed=2, timeouts=timeouts_for(0.05, 0.02))
    assert run["violations"] == []
    assert run["heights"] >= 6
    assert run["rounds_mean"] > 1.0


@pytest.mark.slow
def test_a_hundred_validators_over_the_wan_commit_under_a_second():
    run = measure(100, 8, seed=1)
    assert run["violations"] == []
    assert run["heights"] >= 8
    assert run["rounds_max"] == 1
    assert run["finality_p50_ms"] < 1000


def test_the_double_sign_tap_checks_each_vote_once_and_still_catches_a_second_vote():
    me = Identity.from_seed(b"\x01" * 32)
    sim = SimpleNamespace(replicas=[SimpleNamespace(peer_id=me.peer_id)], loop=SimpleNamespace(time=lambda: 0.0))
    checker = Checker(sim)
    first = encode_message(sign_vote(me, "c", Vote(VoteType.PREVOTE, 3, 0, b"\x11" * 32, me.peer_id)))
    for _ in range(50):          # the same vote, sent to 50 peers
        checker.on_send(0, first)
    assert checker.violations == [] and len(checker._seen_votes) == 1
    checker.on_send(0, encode_message(sign_vote(me, "c", Vote(VoteType.PREVOTE, 3, 0, b"\x22" * 32, me.peer_id))))
    assert len(checker.violations) == 1 and "DOUBLE-SIGN" in checker.violations[0]
