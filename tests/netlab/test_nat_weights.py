"""The weighted pairs-direct figure (ADR 0223, issue 25's benchmark): P(direct) of two homes whose NAT
kinds are drawn from the stated shares, from saved matrix runs; no lab needed."""
import json

import pytest

from devtools.netlab.nat_weights import (
    SHARES,
    load_runs,
    pair_probabilities,
    parse_shares,
    relayed_fractions,
    shortfall,
    summary,
    unweighted_direct,
    weighted_direct,
)


def run(**direct) -> dict:
    return {"by_pair": {name.replace("__", "/"): {"direct": ok, "seconds": 0.1} for name, ok in direct.items()}}


def test_weights_are_products_of_shares_both_orders_counted():
    runs = [run(a__a=True, a__b=False, b__b=True)]
    p = pair_probabilities(runs)
    assert p == {("a", "a"): 1.0, ("a", "b"): 0.0, ("b", "b"): 1.0}
    # shares 0.75 / 0.25: P(a,a) 0.5625 + P(b,b) 0.0625 direct; the mixed pair (2 x 0.1875) is not
    assert weighted_direct(p, {"a": 0.75, "b": 0.25}) == pytest.approx(0.625)
    assert weighted_direct(p, {"a": 3, "b": 1}) == pytest.approx(0.625)       # shares need not sum to 1
    assert weighted_direct(p, {"a": 1, "b": 0}) == 1.0                         # a kind without share drops out
    assert unweighted_direct(p) == pytest.approx(2 / 3)
    assert shortfall(p, {"a": 0.75, "b": 0.25}) == [{"pair": "a/b", "p_direct": 0.0, "weight": 0.375,
                                                      "lost": 0.375}]


def test_several_runs_give_each_pair_its_direct_fraction_and_order_does_not_matter():
    runs = [run(a__b=True, a__a=True, b__b=True), run(b__a=False, a__a=True, b__b=True)]
    p = pair_probabilities(runs)
    assert p[("a", "b")] == 0.5
    assert weighted_direct(p, {"a": 0.5, "b": 0.5}) == pytest.approx(0.25 + 0.25 + 0.5 * 0.5)


def test_a_weighted_kind_missing_from_the_runs_is_an_error_not_a_guess():
    p = pair_probabilities([run(a__a=True)])
    with pytest.raises(ValueError, match="no a/b pair"):
        weighted_direct(p, {"a": 0.5, "b": 0.5})
    with pytest.raises(ValueError):
        weighted_direct(p, {"a": -1.0})
    with pytest.raises(ValueError):
        parse_shares("full-cone")


def test_the_stated_shares_over_a_saved_run(tmp_path):
    assert sum(SHARES.values()) == pytest.approx(1.0)
    kinds = list(SHARES)
    pairs = {f"{a}__{b}": not (a == b == "symmetric") for i, a in enumerate(kinds) for b in kinds[i:]}
    saved = tmp_path / "run.json"
    saved.write_text("matrix log line\n" + json.dumps(run(**pairs)) + "\n")
    out = summary(load_runs([saved]))
    assert out["pairs"] == 28 and out["runs"] == 1
    assert out["direct_fraction"] == round(27 / 28, 3)
    assert "relayed_bytes_fraction" not in out          # a run that moved no bytes has no such figure
    assert out["direct_fraction_weighted"] == round(1 - SHARES["symmetric"] ** 2, 3)
    assert [row["pair"] for row in out["shortfall"]] == ["symmetric/symmetric"]
    (tmp_path / "bad.json").write_text('{"pairs": 3}\n')
    with pytest.raises(ValueError, match="by_pair"):
        load_runs([tmp_path / "bad.json"])


def test_relayed_bytes_are_weighted_like_direct_pairs():
    runs = [run(a__a=True, a__b=False, b__b=True), run(b__a=True, a__a=True, b__b=True)]
    moved = {"a/a": (0, 100), "a/b": (100, 100), "b/b": (0, 100)}
    for name, (relayed, total) in moved.items():
        runs[0]["by_pair"][name].update(relayed_bytes=relayed, moved_bytes=total)
    runs[1]["by_pair"]["b/a"].update(relayed_bytes=0, moved_bytes=300)      # direct the second time
    fractions = relayed_fractions(runs)
    assert fractions == {("a", "a"): 0.0, ("a", "b"): 0.25, ("b", "b"): 0.0}   # 100 of 400 bytes
    out = summary(runs, {"a": 0.75, "b": 0.25})
    assert out["relayed_bytes_fraction"] == round(0.25 / 3, 3)
    assert out["relayed_bytes_fraction_weighted"] == round(2 * 0.75 * 0.25 * 0.25, 3)
