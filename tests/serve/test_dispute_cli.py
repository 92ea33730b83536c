"""Serving disputes end to end on a dev chain (ADR 0176): a `serve` process that lies after 3 steps is
caught by `generate --spot-check`, disputed with `--dispute-bond`, refereed by two other `serve`
processes on the same blocks (their claim loop's referee duty) and found guilty; its stake is slashed."""
import asyncio
import json
import subprocess
import sys
from pathlib import Path

from cli.main import main
from node.identity import Identity
from node.keystore import load_identity, save_identity
from tests.cli.test_operator_path import free_ports, rpc, stop, wait_height
from tests.serve.test_paid_serving_cli import MODEL, PRICE, fund, start_server

ROOT = Path(__file__).resolve().parents[2]


def test_generate_spot_checks_and_disputes_a_lying_server(tmp_path, capsys):
    p2p, http = free_ports(2)
    url = f"http://127.0.0.1:{http}/"
    home = tmp_path / "dev"
    env = {k: v for k, v in __import__("os").environ.items() if not k.startswith("DEKUBE_")}
    chain = subprocess.Popen([sys.executable, "-m", "cli.main", "start", "--dev", "--home", str(home),
                              "--listen", f"/ip4/127.0.0.1/tcp/{p2p}", "--rpc-port", str(http)],
                             cwd=ROOT, env={**env, "HOME": str(tmp_path), "PYTHONPATH": str(ROOT)}, text=True,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    procs = []
    try:
        wait_height(http, 2, chain)
        dev_key = home / "dev_key.json"
        dev = load_identity(dev_key)
        servers = [Identity.generate(), Identity.generate(), Identity.generate()]
        keys = [save_identity(tmp_path / f"server{i}.json", s) for i, s in enumerate(servers)]
        asyncio.run(fund(url, dev, servers))
        wallet = ["--rpc", url, "--key", str(dev_key), "--json"]
        assert main(["wallet", "serve-deposit", "1000000", "--wait", *wallet]) == 0
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
