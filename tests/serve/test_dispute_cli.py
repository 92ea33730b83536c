"""Serving disputes end to end on a dev chain (ADR 0176): a `serve` process that lies after 3 steps is
caught by `generate --spot-check`, disputed with `--dispute-bond`, refereed by two other `serve`
processes on the same blocks (their claim loop's referee duty, on the bundle the client delivered to
them: ADR 0182) and found guilty; its stake is slashed. The client computes with another torch thread
count than the servers, as in a full-suite run."""
import json
from pathlib import Path

import torch

from cli.main import main
from tests.cli.test_operator_path import rpc, stop, wait_height
from tests.serve.test_paid_serving_cli import MODEL, PRICE, fund_servers_and_deposit, start_dev_chain, start_server

ROOT = Path(__file__).resolve().parents[2]


def test_generate_spot_checks_and_disputes_a_lying_server(tmp_path, capsys, monkeypatch):
    # the client (this process) at one torch thread, as tests/ml leave it; the servers at two (ADR 0178)
    torch.set_num_threads(1)
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
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
        if out["disputes"][0].get("status") != "guilty":   # the servers' logs say why (failed fetches, refused bundles)
            for proc in procs:
                proc.kill()
            logs = [proc.communicate(timeout=10)[1][-4000:] for proc in procs]
            raise AssertionError(f"{out}\n" + "\n----\n".join(logs))
        # the liar's first wrong answer is step 3: an earlier mismatch would be the client's own recompute
        # disagreeing with honest answers (torch threads left at 1 by a test run before this one, ADR 0178)
        assert {k: check[k] for k in ("blocks", "ok", "culprit", "step")} == {
            "blocks": "0:4", "ok": False, "culprit": servers[0].peer_id, "step": 3}
        (dispute,) = out["disputes"]
        assert dispute["culprit"] == servers[0].peer_id and dispute["status"] == "guilty", dispute
        record = rpc(http, "dkb_getServeDispute", dispute["dispute"])
        assert sorted(peer for peer, _ in record["referees"]) == sorted(s.peer_id for s in servers[1:])
        # the CLI's client node listens on 0.0.0.0 only, which names no machine: it advertised nothing and the
        # referees judged the bundle it delivered to them (ADR 0182)
        assert record["addrs"] == []
        assert rpc(http, "dkb_getStake", servers[0].peer_id)["slashed"] > 0
    finally:
        for proc in procs:
            proc.kill()
            proc.wait(10)
        stop(chain)
