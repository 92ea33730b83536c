"""The pairs-direct matrix over the NAT zoo (``nat_matrix.py``; the full one takes about a minute:
slow; a short one over three kinds, with QUIC, runs by default).

Every pair in which neither side maps endpoint-dependently ends on a punched direct connection; a
pair with one symmetric side ends direct when the other side's NAT lets the symmetric side's SYN
in from an unpredicted port (full cone, restricted: filtering by address at most) and both sides
listen on their punch ports; a sequential symmetric side also reaches a port-restricted or CGNAT
side, by offering the ports its NAT will map next (port prediction, ADR 0204); a random symmetric
side meets a port-restricted or CGNAT side by birthday probing, by chance; two symmetric sides of
different kinds, or two random ones, stay relayed; two sequential ones end direct or not depending
on how their counters meet. A ``upnp`` side (its router maps its punch port, ADR 0221) ends direct
with anyone, a random symmetric side included. A ``udp-blocked`` side punches over TCP as a
port-restricted one does.
"""
from __future__ import annotations

import pytest

from devtools.netlab import upnp
from devtools.netlab.lab import unavailable
from devtools.netlab.nat_matrix import MATRIX_KINDS, run_matrix

pytestmark = pytest.mark.netlab
SHORT_KINDS = ("full-cone", "udp-blocked", "symmetric")


def expected_direct(pair: str) -> bool | None:
    """True/False where the outcome is determined; None for two sequential symmetric sides (both
    predict: direct when the two counters' next ports meet, which the order of flows decides)."""
    kinds = ["port-restricted" if k == "udp-blocked" else k for k in pair.split("/")]  # TCP: the same NAT
    if "upnp" in kinds:
        return True  # its router forwards the mapped punch port: any side's SYN gets in (ADR 0221)
    if kinds == ["symmetric-seq", "symmetric-seq"]:
        return None
    if "symmetric" in kinds and ({"port-restricted", "cgnat"} & set(kinds)):
        return None  # birthday probing: ~64% per attempt (256 sockets x 256 probed ports)
    symmetric = [k for k in kinds if k.startswith("symmetric")]
    if len(symmetric) != 1:
        return not symmetric
    other = kinds[1] if kinds[0] in symmetric else kinds[0]
    if symmetric[0] == "symmetric-seq":
        return True  # its next ports are predicted: the other side's SYNs open its filter towards them
    return other in ("full-cone", "restricted")


@pytest.mark.slow
def test_pairs_end_direct_wherever_one_side_can_accept_the_other():
    why = unavailable()
    if why:
        pytest.skip(why)
    out = run_matrix(MATRIX_KINDS)
    assert out["pairs"] == len(MATRIX_KINDS) * (len(MATRIX_KINDS) + 1) // 2
    for pair, result in out["by_pair"].items():
        if expected_direct(pair) is not None:
            assert result["direct"] == expected_direct(pair), (pair, out)
    assert out["direct_fraction"] >= round(22 / 28, 3)
    assert out["median_time_to_direct_s"] < 3.0


@pytest.mark.slow
def test_a_port_mapping_side_ends_direct_even_with_a_random_symmetric_side():
    why = unavailable() or upnp.unavailable()
    if why:
        pytest.skip(why)
    out = run_matrix(("upnp", "symmetric"))
    assert out["by_pair"]["upnp/upnp"]["direct"] and out["by_pair"]["upnp/symmetric"]["direct"], out
    assert not out["by_pair"]["symmetric/symmetric"]["direct"], out


def test_short_matrix_direct_where_possible_relayed_bytes_only_where_relayed():
    """Three kinds with QUIC: every pair with a full-cone side, and two UDP-blocked homes, end direct
    (the UDP-blocked ones over TCP: QUIC cannot reach them); two random symmetric homes stay relayed;
    the relay carried the moved bytes of the relayed pair only."""
    why = unavailable()
    if why:
        pytest.skip(why)
    out = run_matrix(SHORT_KINDS, quic=True)
    by_pair = out["by_pair"]
    assert out["pairs"] == 6, out
    for pair, result in by_pair.items():
        if expected_direct(pair) is not None:
            assert result["direct"] == expected_direct(pair), (pair, out)
        if "udp-blocked" in pair.split("/"):
            assert not result["quic"], (pair, out)
        if result["direct"]:
            assert result["relayed_bytes"] < result["moved_bytes"] // 100, (pair, out)
        else:
            assert result["relayed_bytes"] == result["moved_bytes"], (pair, out)
    assert not by_pair["symmetric/symmetric"]["direct"], out
    moved = sum(r["moved_bytes"] for r in by_pair.values())
    assert out["relayed_bytes_fraction"] == round(sum(r["relayed_bytes"] for r in by_pair.values()) / moved, 3)
    assert 1 / 6 <= out["relayed_bytes_fraction"] <= 2 / 6 + 0.01, out   # udp-blocked/symmetric: birthday
