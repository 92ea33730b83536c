"""The operator path: README's "Run a node" as written, ``start --dev``, ``genesis new|add-validator|
add-account|show``, joining a chain with ``--genesis`` and ``--bootstrap`` (block sync as a full node),
``DEKUBE_RPC``, ``testnet up --json``, and one fee default across the CLI."""
from __future__ import annotations

import json
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from cli.main import build_parser, main
from cli.rpc_env import _parsers, rpc_options
from consensus.genesis import Genesis
from consensus.tx import DEFAULT_FEE

REPO = Path(__file__).resolve().parents[2]


def free_ports(n: int) -> list[int]:
    socks = []
    for _ in range(n):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        socks.append(s)
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def env_for(home_dir: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DEKUBE_")}
    # README's init encrypts the key; the passphrase comes the way services give it (ADR 0161)
    return {**env, "HOME": str(home_dir), "PYTHONPATH": str(REPO), "DEKUBE_KEY_PASSPHRASE": "operator test phrase",
            **extra}


def cli(*args: str, env: dict[str, str], check: bool = True) -> subprocess.CompletedProcess:
    done = subprocess.run([sys.executable, "-m", "cli.main", *args], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=120)
    if check:
        assert done.returncode == 0, f"dekube-node {' '.join(args)}: {done.stderr}"
    return done


class StillLoading(Exception):
    """The node answered "the chain is still loading" (it listens before its state sync ends)."""


def rpc(port: int, method: str, *params):
    body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": method, "params": list(params)}).encode()
    with urllib.request.urlopen(urllib.request.Request(f"http://127.0.0.1:{port}/", body), timeout=5) as r:
        answer = json.loads(r.read())
    if "error" in answer and "still loading" in answer["error"].get("message", ""):
        raise StillLoading(answer["error"]["message"])
    assert "result" in answer, f"{method}: {answer}"
    return answer["result"]


def wait_height(port: int, height: int, proc: subprocess.Popen, timeout: float = 60.0) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"node exited: {proc.stdout.read() if proc.stdout else ''}"
        try:
            h = rpc(port, "dkb_blockNumber")
            if h >= height:
                return h
        except (OSError, StillLoading):
            pass
        time.sleep(0.3)
    raise AssertionError(f"no height {height} on port {port} within {timeout} s")


def start(args: list[str], env: dict[str, str]) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "cli.main", *args], cwd=REPO, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


def stop(proc: subprocess.Popen) -> str:
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
    return proc.stdout.read() if proc.stdout else ""


# ---------------------------------------------------------------- README "Run a node", as written


def readme_commands() -> tuple[list[str], list[str]]:
    """The ``dekube-node`` command lines of README's "Run a node": (dev chain block, real network block)."""
    text = (REPO / "README.md").read_text()
    section = text.split("## Run a node\n", 1)[1].split("\n## ", 1)[0]
    blocks, current = [], []
    for line in section.splitlines():
        if line.startswith("    "):
            current.append(line.strip())
        elif current:
            blocks.append(current)
            current = []
    if current:
        blocks.append(current)
    cmds = [[c.split("  #")[0].strip() for c in block if c.startswith("dekube-node ")] for block in blocks]
    return cmds[0], cmds[1]


def as_args(command: str, home_dir: Path) -> list[str]:
    return shlex.split(command.replace("~", str(home_dir)))[1:]


def test_readme_dev_chain_as_written(tmp_path):
    """``start --dev`` then the wallet command, exactly as README prints them (HOME is a temp dir;
    the ports are the README's own, so this test holds 4001 and 8645 while it runs)."""
    dev_block, _ = readme_commands()
    assert dev_block[0].startswith("dekube-node start --dev")
    env = env_for(tmp_path)
    if not all(_port_free(p) for p in (4001, 8645)):
        pytest.skip("ports 4001/8645 (README's) are taken on this machine")
    proc = start(as_args(dev_block[0], tmp_path), env)
    try:
        wait_height(8645, 2, proc)
        out = cli(*as_args(dev_block[1], tmp_path), env=env).stdout
        assert re.search(r"free:\s+1000000000000000\b", out), out   # the free part of the balance
    finally:
        log = stop(proc)
    assert "dev key:" in log and str(tmp_path / ".dekube-dev" / "dev_key.json") in log
    # the second start goes on with the same chain
    proc = start(as_args(dev_block[0], tmp_path), env)
    try:
        assert wait_height(8645, 3, proc) >= 3
    finally:
        log = stop(proc)
    assert "using dev chain 'dekube-dev'" in log


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
            return True
        except OSError:
            return False


def test_readme_real_network_as_written(tmp_path):
    """init, genesis new, add-validator, show, start --genesis, status: README's lines, with the ports
    moved by environment variables (DEKUBE_P2P_LISTEN, DEKUBE_RPC_PORT) the README documents."""
    _, block = readme_commands()
    assert [c.split()[1] for c in block] == ["init", "genesis", "genesis", "genesis", "start", "status"]
    p2p, http = free_ports(2)
    env = env_for(tmp_path, DEKUBE_RPC_PORT=str(http), DEKUBE_P2P_LISTEN=f"/ip4/127.0.0.1/tcp/{p2p}")
    for command in block[:4]:
        cli(*as_args(command, tmp_path), env=env)
    genesis = Genesis.from_json((tmp_path / "mynet-genesis.json").read_text())
    assert genesis.chain_id == "mynet" and len(genesis.validators) == 1
    proc = start(as_args(block[4], tmp_path), env)
    try:
        wait_height(http, 2, proc)
        status = json.loads(cli(*as_args(block[5], tmp_path), env=env).stdout)
        assert "validator" in status["roles"]
    finally:
        stop(proc)
    assert (tmp_path / ".dekube" / "genesis.json").exists()


# ---------------------------------------------------------------- joining by block sync


@pytest.mark.parametrize("validators", [1, 2])
def test_a_new_node_joins_with_genesis_and_bootstrap_and_syncs_blocks(tmp_path, validators):
    """A one- or two-validator chain (``testnet up``); a new home joins it with the chain's genesis file
    and one bootstrap address, and as a full node syncs its blocks (a lone validator serves sync
    requests while it commits height after height; ADR 0154)."""
    p2p_b, http_b = free_ports(2)
    env = env_for(tmp_path)
    net = tmp_path / "net"
    info = json.loads(cli("testnet", "up", "--validators", str(validators), "--json", "--home", str(net),
                          env=env).stdout)
    http_a = int(info["validators"][0]["rpc"].rsplit(":", 1)[1])
    b = None
    try:
        cli("init", "--home", str(tmp_path / "joiner"), env=env)
        b = start(["start", "--home", str(tmp_path / "joiner"), "--genesis", str(net / "genesis.json"),
                   "--bootstrap", info["validators"][0]["p2p"], "--role", "validator",
                   "--listen", f"/ip4/127.0.0.1/tcp/{p2p_b}", "--rpc-port", str(http_b)], env)
        target = rpc(http_a, "dkb_blockNumber") + 2
        wait_height(http_b, target, b, timeout=60)
        assert rpc(http_b, "dkb_chainId") == "dekube-testnet"
        block_a = rpc(http_a, "dkb_getBlockByNumber", target)
        block_b = rpc(http_b, "dkb_getBlockByNumber", target)
        assert block_a["hash"] == block_b["hash"]
    finally:
        if b is not None:
            stop(b)
        cli("testnet", "down", "--home", str(net), env=env, check=False)
    # the joiner's home now belongs to that chain: another genesis is refused
    other = tmp_path / "other.json"
    cli("genesis", "new", "--chain-id", "other", "--genesis", str(other), env=env)
    done = cli("start", "--home", str(tmp_path / "joiner"), "--genesis", str(other), env=env, check=False)
    assert done.returncode == 1 and "holds another genesis" in done.stderr


# ---------------------------------------------------------------- genesis and start errors


def test_genesis_commands(tmp_path, capsys):
    g = str(tmp_path / "g.json")
    assert main(["genesis", "new", "--chain-id", "net1", "--genesis", g, "--param", "committee_size=7"]) == 0
    assert main(["genesis", "new", "--chain-id", "net1", "--genesis", g]) == 1
    assert "refusing to overwrite" in capsys.readouterr().err
    assert main(["genesis", "new", "--chain-id", "x", "--genesis", g, "--force", "--param", "nope=1"]) == 1
    assert "expected NAME=INT" in capsys.readouterr().err
    assert main(["genesis", "new", "--chain-id", "net1", "--genesis", g, "--force"]) == 0
    assert main(["init", "--home", str(tmp_path / "h"), "--insecure-unencrypted-key"]) == 0
    capsys.readouterr()
    assert main(["genesis", "add-validator", "--genesis", g, "--home", str(tmp_path / "h"),
                 "--addr", "/ip4/10.0.0.1/tcp/4001", "--balance", "50"]) == 0
    assert main(["genesis", "add-validator", "--genesis", g, "--home", str(tmp_path / "h")]) == 1
    assert "already a validator" in capsys.readouterr().err
    assert main(["genesis", "add-validator", "--genesis", g, "--peer-id", "12D3KooWbad", "--stake", "5"]) == 1
    assert "not a peer ID" in capsys.readouterr().err
    genesis = Genesis.from_json(Path(g).read_text())
    (v,) = genesis.validators
    assert v.listen_addrs == (f"/ip4/10.0.0.1/tcp/4001/p2p/{v.peer_id}",)
    assert main(["genesis", "add-account", v.peer_id, "25", "--genesis", g]) == 0
    capsys.readouterr()
    assert main(["genesis", "show", "--json", "--genesis", g]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["genesis"]["balances"] == {v.peer_id: 75}
    assert shown["hash"] == Genesis.from_json(Path(g).read_text()).hash.hex()


def test_validator_without_genesis_names_the_fixes(tmp_path, capsys):
    assert main(["init", "--home", str(tmp_path), "--insecure-unencrypted-key"]) == 0
    capsys.readouterr()
    assert main(["start", "--home", str(tmp_path), "--role", "validator"]) == 1
    err = capsys.readouterr().err
    assert "--genesis FILE" in err and "genesis new" in err and "start --dev" in err
    assert main(["start", "--home", str(tmp_path / "nothing"), "--role", "relay"]) == 1
    assert "dekube-node init" in capsys.readouterr().err


def test_dev_refuses_a_home_of_another_node(tmp_path, capsys):
    assert main(["init", "--home", str(tmp_path), "--insecure-unencrypted-key"]) == 0
    capsys.readouterr()
    assert main(["start", "--dev", "--home", str(tmp_path)]) == 1
    assert "not a dev chain" in capsys.readouterr().err


# ---------------------------------------------------------------- CLI defaults


def test_every_rpc_option_takes_dekube_rpc(monkeypatch):
    monkeypatch.setenv("DEKUBE_RPC", "http://10.1.2.3:9000")
    parser = build_parser()
    options = list(rpc_options(parser))
    assert len(options) >= 8  # wallet and task subcommands at least
    assert all(o.default == "http://10.1.2.3:9000" for o in options)
    args = parser.parse_args(["wallet", "balance"])
    assert args.rpc == "http://10.1.2.3:9000"
    assert parser.parse_args(["wallet", "balance", "--rpc", "http://x:1"]).rpc == "http://x:1"
    monkeypatch.delenv("DEKUBE_RPC")
    assert build_parser().parse_args(["wallet", "balance"]).rpc == "http://127.0.0.1:8645"


def test_one_fee_default_across_subcommands():
    fees = []
    for sub in _parsers(build_parser()):
        fees += [a.default for a in sub._actions if "--fee" in a.option_strings]
    assert len(fees) >= 4 and set(fees) == {DEFAULT_FEE}


def test_testnet_up_json(tmp_path):
    env = env_for(tmp_path)
    home = tmp_path / "tn"
    try:
        done = cli("testnet", "up", "--validators", "1", "--json", "--home", str(home), env=env)
        info = json.loads(done.stdout)
        assert info["chain_id"] == "dekube-testnet" and len(info["validators"]) == 1
        port = int(info["validators"][0]["rpc"].rsplit(":", 1)[1])
        assert rpc(port, "dkb_blockNumber") >= 1
        assert "created a 1-validator testnet" in done.stderr
    finally:
        cli("testnet", "down", "--home", str(home), env=env, check=False)


def test_compute_node_pointed_at_a_non_validator_says_so_once(tmp_path):
    """A compute node whose ledger URL answers no dkb_* method (here: its own HTTP server) logs one
    warning naming the fix, not one per poll (poll_interval 0.5 s)."""
    pytest.importorskip("torch")
    p2p, http = free_ports(2)
    env = env_for(tmp_path)
    home = tmp_path / "c"
    cli("init", "--home", str(home), env=env)
    proc = start(["start", "--home", str(home), "--role", "compute", "--listen", f"/ip4/127.0.0.1/tcp/{p2p}",
                  "--rpc-port", str(http), "--set", f"compute.rpc_url=http://127.0.0.1:{http}"], env)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                status = json.loads(urllib.request.urlopen(f"http://127.0.0.1:{http}/status", timeout=5).read())
                if "not a validator" in json.dumps(status):
                    break
            except OSError:
                pass
            time.sleep(0.5)
        time.sleep(3.0)  # six more polls
    finally:
        log = stop(proc)
    warnings = [line for line in log.splitlines() if "WARNING" in line and "dkb_getStake" in line]
    assert len(warnings) == 1, log[-3000:]
    assert "is not a validator's JSON-RPC" in warnings[0] and "[ledger] rpc_urls" in warnings[0]
