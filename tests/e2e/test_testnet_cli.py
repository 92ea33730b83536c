"""The README's main job through the CLI: testnet up, wallet send --wait, balances, status, down."""
import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def cli(*argv, check=True):
    done = subprocess.run([sys.executable, "-m", "cli.main", *argv], cwd=REPO, capture_output=True, text=True,
                          timeout=120, env={**os.environ, "PYTHONPATH": str(REPO)})
    if check:
        assert done.returncode == 0, done.stderr
    return done


def test_testnet_up_wallet_send_and_down(tmp_path):
    home = tmp_path / "net"
    try:
        up = cli("testnet", "up", "--validators", "2", "--home", str(home))
        assert "producing blocks" in up.stdout
        manifest = json.loads((home / "testnet.json").read_text())
        rpc = f"http://127.0.0.1:{manifest['nodes'][1]['rpc_port']}"
        faucet = ["--rpc", rpc, "--key", str(home / "faucet_key.json")]
        to = manifest["nodes"][0]["peer_id"]
        before = json.loads(cli("wallet", "balance", to, "--rpc", rpc, "--json").stdout)["balance"]
        sent = json.loads(cli("wallet", "send", to, "4242", "--wait", "--json", *faucet).stdout)
        assert sent["status"] == "ok" and sent["nonce"] == 0
        after = json.loads(cli("wallet", "balance", to, "--rpc", rpc, "--json").stdout)["balance"]
        assert after - before >= 4242                     # (plus any fee it earned as proposer)
        assert json.loads(cli("wallet", "nonce", "--json", *faucet).stdout)["latest"] == 1
        bond = json.loads(cli("wallet", "bond", "1000", "--wait", "--json", "--rpc", rpc,
                              "--home", str(home / "v0")).stdout)
        assert bond["status"] == "ok"
        broke = cli("wallet", "send", to, str(10**30), *faucet, check=False)
        assert broke.returncode == 1 and "INSUFFICIENT_FUNDS" in broke.stderr
        status = json.loads(cli("testnet", "status", "--json", "--home", str(home)).stdout)
        assert all(row["pid"] and row["height"] >= 1 for row in status)
        assert "starting the existing testnet" in cli("testnet", "up", "--home", str(home)).stdout
    finally:
        down = cli("testnet", "down", "--home", str(home), check=False)
    assert "stopped v0, v1" in down.stdout
    status = json.loads(cli("testnet", "status", "--json", "--home", str(home)).stdout)
    assert all(row["pid"] is None for row in status)
    assert cli("testnet", "status", "--home", str(tmp_path / "nothing"), check=False).returncode == 1
