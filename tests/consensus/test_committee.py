"""Committee: top-K election, power thresholds, stake-weighted proposer rotation (fairness)."""
from collections import Counter

import pytest

from consensus.committee import CommitteeError, ValidatorSet
from node.identity import Identity

IDS = [Identity.from_seed(bytes([i + 1]) * 32).peer_id for i in range(8)]


def test_elect_takes_top_k_by_stake_with_deterministic_ties():
    stakes = {IDS[0]: 10, IDS[1]: 50, IDS[2]: 30, IDS[3]: 30, IDS[4]: 0, IDS[5]: 5}
    vs = ValidatorSet.elect(stakes, 3)
    assert set(vs.peer_ids) == {IDS[1], IDS[2], IDS[3]}
    assert vs.total_power == 110 and vs.power(IDS[1]) == 50 and vs.power(IDS[0]) == 0
    two = ValidatorSet.elect(stakes, 2)
    assert IDS[1] in two and len(two) == 2
    assert two == ValidatorSet.elect(dict(reversed(stakes.items())), 2)
    assert IDS[4] not in ValidatorSet.elect(stakes, 10)  # zero stake never elected


def test_invalid_sets_rejected():
    with pytest.raises(CommitteeError):
        ValidatorSet({})
    with pytest.raises(CommitteeError):
        ValidatorSet({IDS[0]: 0})
    with pytest.raises(CommitteeError):
        ValidatorSet({"junk": 1})
    with pytest.raises(CommitteeError):
        ValidatorSet([(IDS[0], 1), (IDS[0], 2)])
    with pytest.raises(CommitteeError):
        ValidatorSet.elect({IDS[0]: 1}, 0)


def test_quorum_thresholds_by_power():
    vs = ValidatorSet({IDS[0]: 1, IDS[1]: 1, IDS[2]: 1, IDS[3]: 1})
    assert not vs.is_quorum(2) and vs.is_quorum(3) and vs.quorum_power == 3
    assert not vs.is_one_third(1) and vs.is_one_third(2)
    weighted = ValidatorSet({IDS[0]: 70, IDS[1]: 10, IDS[2]: 10, IDS[3]: 10})
    assert weighted.is_quorum(70) and not weighted.is_quorum(66)
    assert weighted.is_one_third(34) and not weighted.is_one_third(33)


@pytest.mark.parametrize("powers", [[1, 1, 1, 1], [1, 2, 3, 4], [100, 1, 1], [7, 13, 29, 31, 5, 2, 40]])
def test_proposer_frequency_is_proportional_to_power(powers):
    vs = ValidatorSet({IDS[i]: p for i, p in enumerate(powers)})
    heights = vs.total_power * 20
    counts = Counter(vs.proposer(h, 0) for h in range(heights))
    for i, p in enumerate(powers):
        assert counts[IDS[i]] == pytest.approx(p * 20, abs=2)


def test_equal_power_is_round_robin_and_rounds_shift_the_schedule():
    vs = ValidatorSet({IDS[i]: 5 for i in range(4)}, start_height=100)
    first = [vs.proposer(100 + h, 0) for h in range(4)]
    assert len(set(first)) == 4
    assert [vs.proposer(100 + h, 0) for h in range(4, 8)] == first
    assert vs.proposer(100, 1) == vs.proposer(101, 0)
    with pytest.raises(CommitteeError):
        vs.proposer(99, 0)


def test_schedule_is_deterministic_across_instances():
    a = ValidatorSet({IDS[i]: i + 1 for i in range(6)})
    b = ValidatorSet(list(reversed([(IDS[i], i + 1) for i in range(6)])))
    assert [a.proposer(h, r) for h in range(50) for r in range(3)] == \
           [b.proposer(h, r) for h in range(50) for r in range(3)]


def test_heavy_validator_does_not_starve_others():
    vs = ValidatorSet({IDS[0]: 1000, IDS[1]: 1})
    window = [vs.proposer(h, 0) for h in range(1001)]
    assert window.count(IDS[1]) == 1


def test_a_shared_set_is_built_once_and_proposes_as_a_fresh_one_from_any_thread():
    from concurrent.futures import ThreadPoolExecutor

    members = [[Identity.generate().peer_id, power] for power in (5, 3, 3, 2, 1, 1, 1)]
    shared = ValidatorSet.of(members, 10)
    assert ValidatorSet.of([list(m) for m in members], 10) is shared     # the ledger's lists, re-read
    assert ValidatorSet.of(members, 11) is not shared
    fresh = ValidatorSet(members, 10)
    expected = [fresh.proposer(h, r) for h in range(10, 400) for r in range(3)]
    with ThreadPoolExecutor(4) as pool:   # the loop and the executor both ask a shared set
        got = list(pool.map(lambda hr: shared.proposer(*hr), [(h, r) for h in range(10, 400) for r in range(3)]))
    assert got == expected
    with pytest.raises(CommitteeError, match="power"):
        ValidatorSet.of([[members[0][0], "5"]], 1)   # still checked: a corrupt stored committee is refused
