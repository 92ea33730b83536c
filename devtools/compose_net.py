"""The docker-compose testnet (deploy/docker-compose.yml): node homes for its containers, and its client.

``python -m devtools.compose_net init ROOT`` (the one-shot ``init`` service) writes, once, into the
shared volume ROOT: the genesis and faucet key (devtools.testnet), the validator homes ``v0..``,
the relay homes ``relay1``/``relay2`` and the compute homes ``c0..``, every address a fixed IP of
the compose networks below. ``python -m devtools.compose_net client ROOT`` (the one-shot ``client``
service) waits until every compute node is registered with relayed addresses, submits a task,
waits until it is paid, reads the relays' traffic from their /metrics and prints one JSON line;
its exit status is 0 only if the task was paid and the relays carried bytes.

Addresses: the "backbone" network 10.77.0.0/24 holds validators (.11, .12, ...), relays (.21,
.22), NAT routers (.31, ...) and the client; compute node I sits alone on 10.78.I.0/24 (at .10)
behind its router (at .254), which masquerades it and lets nothing in (deploy/nat-router.sh).
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from devtools.devnet import COMPUTE_STAKE, FAST_TASK_PARAMS
from devtools.testnet import MANIFEST, Testnet
from node.config import load_config
from node.identity import Identity
from node.keystore import KEY_FILE_NAME, load_identity, save_identity
from node.ledger import jsonrpc
from node.ledger.errors import LedgerUnavailable, RpcAnswerError

CHAIN_ID = "dekube-compose"
VALIDATOR_BASE_PORT = 26600
PORT = 4001
RPC_PORT = 8645
FUNDS = 10**7
RELAYS = 2
# a NAT'd verifier needs time to reach the workers through relays before it can replay (tests/netlab)
TASK_PARAMS = {**FAST_TASK_PARAMS, "audit_window_s": 60}


def validator_ip(i: int) -> str:
    return f"10.77.0.{11 + i}"


def relay_ip(i: int) -> str:
    return f"10.77.0.{21 + i}"


def compute_ip(i: int) -> str:
    return f"10.78.{i}.10"


def write_network(root: Path, validators: int, compute: int) -> bool:
    """Write every home under ``root`` unless a network is there already; True if it wrote one."""
    if (root / MANIFEST).exists():
        return False
    relay_ids = [Identity.generate() for _ in range(RELAYS)]
    compute_ids = [Identity.generate() for _ in range(compute)]
    # one validator per container: each listens on its own IP; Testnet.create writes one host for all,
    # so the homes are fixed up below (listen address, bootstrap peers and genesis addresses agree)
    testnet = Testnet.create(root, validators, chain_id=CHAIN_ID, base_port=VALIDATOR_BASE_PORT,
                             host="0.0.0.0", params=TASK_PARAMS,
                             balances={i.peer_id: FUNDS for i in relay_ids + compute_ids})
    addrs = [f"/ip4/{validator_ip(i)}/tcp/{n.p2p_port}/p2p/{n.peer_id}" for i, n in enumerate(testnet.nodes)]
    genesis = testnet.genesis()
    genesis_obj = genesis.to_obj()
    for v, addr in zip(genesis_obj["validators"], addrs):
        v["listen_addrs"] = [addr]
    genesis_text = json.dumps(genesis_obj, indent=2, sort_keys=True)
    (root / "genesis.json").write_text(genesis_text)
    rpc_urls = [f"http://{validator_ip(i)}:{RPC_PORT}" for i in range(validators)]
    for i, node in enumerate(testnet.nodes):
        (node.home / "genesis.json").write_text(genesis_text)
        _write_config(node.home, {
            ("node", "roles"): "validator",
            ("p2p", "listen"): f"/ip4/{validator_ip(i)}/tcp/{node.p2p_port}",
            ("p2p", "bootstrap"): ",".join(a for a in addrs if a != addrs[i]),
            ("rpc", "host"): "0.0.0.0", ("rpc", "port"): str(RPC_PORT)})
    relay_addrs = []
    for i, ident in enumerate(relay_ids):
        _write_home(root / f"relay{i + 1}", ident, {
            ("node", "roles"): "relay", ("p2p", "listen"): f"/ip4/{relay_ip(i)}/tcp/{PORT}",
            ("rpc", "host"): "0.0.0.0", ("rpc", "port"): str(RPC_PORT), ("relay", "ledger_rpc"): rpc_urls[0]})
        relay_addrs.append(f"/ip4/{relay_ip(i)}/tcp/{PORT}/p2p/{ident.peer_id}")
    for i, ident in enumerate(compute_ids):
        _write_home(root / f"c{i}", ident, {
            ("node", "roles"): "compute", ("p2p", "listen"): f"/ip4/{compute_ip(i)}/tcp/{PORT}",
            ("rpc", "host"): "0.0.0.0", ("rpc", "port"): str(RPC_PORT),
            ("compute", "rpc_url"): rpc_urls[i % len(rpc_urls)], ("compute", "stake"): str(COMPUTE_STAKE),
            ("relay", "relays"): ",".join(relay_addrs), ("relay", "reserve"): "true"})
    manifest = json.loads((root / MANIFEST).read_text())
    manifest["compose"] = {"relays": [{"name": f"relay{i + 1}", "ip": relay_ip(i), "peer_id": r.peer_id}
                                      for i, r in enumerate(relay_ids)],
                           "compute": [{"name": f"c{i}", "ip": compute_ip(i), "peer_id": c.peer_id}
                                       for i, c in enumerate(compute_ids)],
                           "rpc_urls": rpc_urls}
    (root / MANIFEST).write_text(json.dumps(manifest, indent=2))
    return True


def _write_config(home: Path, overrides: dict[tuple[str, str], str]) -> None:
    overrides = {**overrides, ("consensus", "chain_id"): CHAIN_ID, ("node", "log_level"): "info"}
    (home / "config.toml").write_text(load_config(None, env={}, overrides=overrides).to_toml())


def _write_home(home: Path, ident: Identity, overrides: dict[tuple[str, str], str]) -> None:
    home.mkdir(mode=0o700, parents=True)
    save_identity(home / KEY_FILE_NAME, ident)
    _write_config(home, overrides)


# ---------------------------------------------------------------- the client


def _rpc(url: str, method: str, *params):
    try:
        return jsonrpc.call(url, method, *params, timeout=5.0)
    except (LedgerUnavailable, RpcAnswerError):
        return None


def _poll(check, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise SystemExit(f"client: no {what} within {timeout:g} s")
        time.sleep(1.0)


def relay_bytes(ip: str) -> int:
    """The bytes a relay carried, from its /metrics (``dekube_relay_bytes`` or ``..._total``)."""
    text = urllib.request.urlopen(f"http://{ip}:{RPC_PORT}/metrics", timeout=10).read().decode()
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if name in ("dekube_relay_bytes", "dekube_relay_bytes_total"):
            return int(float(value))
    raise SystemExit(f"client: no dekube_relay_bytes in the /metrics of {ip}")


def run_client(root: Path, steps: int, price: int, timeout: float) -> int:
    manifest = json.loads((root / MANIFEST).read_text())["compose"]
    url = manifest["rpc_urls"][0]
    started = time.monotonic()
    _poll(lambda: (_rpc(url, "dkb_blockNumber") or 0) >= 1, timeout, "block from the validators")

    def ready(member: dict) -> bool:
        info = _rpc(url, "dkb_getNode", member["peer_id"])
        stake = _rpc(url, "dkb_getStake", member["peer_id"]) or {}
        return bool(info and "compute" in info.get("roles", ()) and len(info.get("relay_addrs") or ()) == RELAYS
                    and stake.get("bonded", 0) > 0)

    _poll(lambda: all(ready(m) for m in manifest["compute"]), timeout,
          "compute nodes registered with relayed addresses")
    print(f"client: {len(manifest['compute'])} compute nodes registered behind NAT "
          f"({time.monotonic() - started:.0f} s); submitting mlp on digits", file=sys.stderr, flush=True)
    faucet = root / "faucet_key.json"
    load_identity(faucet)  # a clear error if the volume is damaged
    done = subprocess.run([sys.executable, "-m", "cli.main", "task", "submit", "--rpc", url, "--key", str(faucet),
                           "--model", "mlp", "--dataset", "digits", "--workers", "3", "--codec", "int8",
                           "--steps", str(steps), "--price", str(price), "--wait", "--timeout", str(timeout),
                           "--json"], capture_output=True, text=True, timeout=timeout + 60)
    if done.returncode != 0:
        print(done.stderr[-3000:], file=sys.stderr)
        return 1
    task = json.loads(done.stdout)
    relayed = {r["name"]: relay_bytes(r["ip"]) for r in manifest["relays"]}
    summary = {"task_id": task["task_id"], "status": task["status"], "payouts": task.get("payouts", {}),
               "relay_bytes": relayed, "seconds": round(time.monotonic() - started, 1)}
    print(json.dumps(summary), flush=True)
    return 0 if task["status"] == "paid" and sum(relayed.values()) > 0 else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m devtools.compose_net", description=__doc__.splitlines()[0])
    actions = parser.add_subparsers(dest="command", required=True)
    init = actions.add_parser("init", help="write the homes (once)")
    init.add_argument("root", type=Path)
    init.add_argument("--validators", type=int, default=2)
    init.add_argument("--compute", type=int, default=4)
    client = actions.add_parser("client", help="submit a task and wait until it is paid")
    client.add_argument("root", type=Path)
    client.add_argument("--steps", type=int, default=30)
    client.add_argument("--price", type=int, default=100_000)
    client.add_argument("--timeout", type=float, default=600.0)
    args = parser.parse_args(argv)
    if args.command == "init":
        wrote = write_network(args.root, args.validators, args.compute)
        print(f"{'wrote' if wrote else 'kept'} the compose testnet in {args.root}", flush=True)
        return 0
    return run_client(args.root, args.steps, args.price, args.timeout)


if __name__ == "__main__":
    sys.exit(main())
