"""The pairs-direct matrix over the NAT zoo (``nat_matrix.py``, about a minute: slow).

Every pair of kinds in which neither side maps endpoint-dependently ends on a punched direct
connection; every pair with a symmetric side stays relayed (the TCP punch has no port prediction
and the endpoint-independent side only accepts the SYNs it expects).
"""
from __future__ import annotations

import pytest

from devtools.netlab.lab import unavailable
from devtools.netlab.nat_matrix import MATRIX_KINDS, run_matrix

pytestmark = [pytest.mark.netlab, pytest.mark.slow]


def test_pairs_without_a_symmetric_nat_go_direct_and_the_rest_stay_relayed():
    why = unavailable()
    if why:
        pytest.skip(why)
    out = run_matrix(MATRIX_KINDS)
    assert out["pairs"] == len(MATRIX_KINDS) * (len(MATRIX_KINDS) + 1) // 2
    for pair, result in out["by_pair"].items():
        symmetric = any(kind.startswith("symmetric") for kind in pair.split("/"))
        assert result["direct"] == (not symmetric), (pair, out)
    assert out["direct_fraction"] == round(10 / 21, 3)
    assert out["median_time_to_direct_s"] < 3.0
