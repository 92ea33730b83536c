"""Choosing and moving block ranges to fill coverage gaps."""
import pytest

from ml.serve.balance import block_throughput, choose_blocks, should_move, swarm_throughput


def test_a_new_server_fills_the_gap():
    assert choose_blocks(12, 4, []) == (0, 4)
    assert choose_blocks(12, 4, [(0, 4, 10.0)]) == (4, 8)
    assert choose_blocks(12, 4, [(0, 4, 10.0), (4, 8, 10.0)]) == (8, 12)
    assert choose_blocks(12, 4, [(0, 6, 10.0), (8, 12, 10.0)]) == (4, 8)    # covers the 6..8 hole, earliest
    assert choose_blocks(12, 4, [(0, 12, 10.0), (0, 4, 5.0)]) == (4, 8)     # then the thinnest coverage


def test_coverage_is_checked():
    with pytest.raises(ValueError, match="bad coverage"):
        block_throughput(4, [(2, 9, 1.0)])
    with pytest.raises(ValueError, match="1..4"):
        choose_blocks(4, 5, [])
    assert swarm_throughput(4, [(0, 2, 3.0), (2, 4, 1.0), (0, 4, 1.0)]) == 2.0


def test_a_server_moves_only_when_it_helps_enough():
    others = [(0, 4, 10.0), (4, 8, 10.0)]           # blocks 8..12 are not served at all
    assert should_move(12, (0, 4), 10.0, others) == (8, 12)
    balanced = [(0, 4, 10.0), (8, 12, 10.0)]
    assert should_move(12, (4, 8), 10.0, balanced) is None
    slightly = [(0, 4, 10.0), (4, 8, 9.0), (8, 12, 10.0)]   # moving 4..8 -> would leave 4..8 at 9: no gain
    assert should_move(12, (0, 4), 1.0, slightly) is None
