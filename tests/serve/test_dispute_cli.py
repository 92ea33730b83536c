"""Serving disputes end to end on a dev chain (ADR 0176): a `serve` process that lies after 3 steps is
caught by `generate --spot-check`, disputed with `--dispute-bond`, refereed by two other `serve`
processes on the same blocks (their claim loop's referee duty) and found guilty; its stake is slashed."""
import json
from pathlib import Path

import pytest

from cli.main import main
from tests.cli.test_operator_path import rpc, stop, wait_height
from tests.serve.test_paid_serving_cli import MODEL, PRICE, fund_servers_and_deposit, start_dev_chain, start_server

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.xfail(strict=False, reason="known bug (issue 14 note): in 1 of 3 full-suite runs on the loaded 2-core "
                   "machine the referees voted the claim invalid ('rejected'); cause not found yet")
def test_generate_spot_checks_and_disputes_a_lying_server(tmp_path, capsys):
    chain, http, url, home = start_dev_chain(tmp_path)
    procs = []
    try:
        wait_height(http, 2, chain)
        servers, keys, dev_key, wallet = fund_servers_and_deposit(tmp_path, url, home)
        liar, _ = start_server(url, keys[0], "0:4", "--lie-after", "3")
        procs.append(liar)
        for key in keys[1:]:   # honest servers the client will not pay (their price is above its --max-price)
            proc, info = start_server(url, key, "0:4", "--price", str(PRICE * 10))
            procs.append(proc)
            assert info["announced"]
        capsys.readouterr()
        code = main(["generate", "--model", MODEL, "--ledger", url, "--key", str(dev_key), "--max-price",
                     str(PRICE), "--prompt", "hello", "--max-tokens", "8", "--spot-check", "--dispute-bond", "200",
                     "--dispute-wait", "90"])
        out = json.loads(capsys.readouterr().out)
        assert code == 0, out
        (check,) = out["spot_checks"]
        # the liar counts every step request it serves, a replay after a timeout on a loaded machine too,
        # so its first wrong answer is at generation step 3 or earlier
        assert {k: check[k] for k in ("blocks", "ok", "culprit")} == {"blocks": "0:4", "ok": False,
                                                                     "culprit": servers[0].peer_id}
        assert 0 <= check["step"] <= 3
        (dispute,) = out["disputes"]
        assert dispute["culprit"] == servers[0].peer_id and dispute["status"] == "guilty", dispute
        record = rpc(http, "dkb_getServeDispute", dispute["dispute"])
        assert sorted(peer for peer, _ in record["referees"]) == sorted(s.peer_id for s in servers[1:])
        assert rpc(http, "dkb_getStake", servers[0].peer_id)["slashed"] > 0
    finally:
        for proc in procs:
            proc.kill()
            proc.wait(10)
        stop(chain)
