"""``dekube-node provide --network NAME``: lend this machine to a network in one command (docs/adr/0195).

In order: resolve the network (cli/networks.py), fetch its genesis from the network's validator RPC and
check its hash, make the home and key if missing, detect the hardware and execution profiles, work
out the stake the chain asks of a compute node (genesis params) and what this key holds, show the
plan, bond the missing stake once confirmed (``--yes`` for no question), write the config (compute
role, ledger RPC, bootstrap peers, stake) and the genesis into the home, optionally a systemd user
unit (``--service``), then start the node as ``dekube-node start`` does. Each step keeps what is
already there (key, config values not named here, a bond already made), so re-running it is safe.
The upload bandwidth is measured by the running node against its peers (node/bandwidth.py) and shown
on the dashboard at ``http://127.0.0.1:<rpc port>/``.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

from cli import keyring_store
from cli.errors import CliError
from cli.home import add_home_argument, config_path, key_path, resolve_home
from cli.networks import Network, bootstrap_addrs, fetch_genesis, resolve
from cli.passphrase import add_create_arguments, given_elsewhere, new_key_passphrase, unlock_passphrase
from cli.provide_network import measure_now, probe_targets
from cli.provide_stake import describe, params_from, propose
from cli.rpc_call import rpc_call
from cli.start import apply_compute_profile, install_genesis
from cli.tx_sender import send_tx_blocking
from consensus.genesis import Genesis
from consensus.tx import DEFAULT_FEE
from ml.compute.provider_checks import clock_problem, gpu_problem, port_problem, stake_problem
from node.config import load_config
from node.identity import Identity
from node.keystore import load_identity, save_identity

DEFAULT_LISTEN = "/ip4/0.0.0.0/tcp/4011"   # a new provider home's p2p port (not the dev chain's 4001)
DEFAULT_RPC_PORT = 8650                    # and its RPC and dashboard port (not the dev chain's 8645)
UNIT_NAME = "dekube-provide.service"


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("provide", help="lend this machine's compute to a network in one step")
    parser.add_argument("--network", required=True,
                        help="a known network name (e.g. local), or a network description file or URL")
    add_home_argument(parser)
    add_create_arguments(parser)
    parser.add_argument("--yes", action="store_true", help="bond without asking")
    parser.add_argument("--no-keyring", dest="keyring", action="store_false",
                        help="do not keep a typed passphrase in the OS keyring")
    parser.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto",
                        help="what to lend: cuda (stop if no GPU works), cpu (hide any GPU), auto (default)")
    parser.add_argument("--no-measure", dest="measure", action="store_false",
                        help="do not measure bandwidth and reachability against a bootstrap peer before start")
    parser.add_argument("--no-relay", dest="relay", action="store_false",
                        help="do not run the relay role even when this machine is reachable from the internet")
    parser.add_argument("--stake", type=int, default=None,
                        help="keep this much bonded (default: enough for the largest recent task of the network)")
    parser.add_argument("--service", action="store_true",
                        help="also write a systemd user unit and print the systemctl --user commands")
    parser.add_argument("--no-start", dest="start", action="store_false",
                        help="set everything up but do not start the node")
    parser.add_argument("--listen", help=f"p2p listen multiaddr of a new home (default {DEFAULT_LISTEN})")
    parser.add_argument("--rpc-port", type=int,
                        help=f"RPC and dashboard port of a new home (default {DEFAULT_RPC_PORT})")
    parser.add_argument("--fee", type=int, default=DEFAULT_FEE,
                        help=f"fee of the bond transaction (default {DEFAULT_FEE})")
    parser.set_defaults(handler=run)


def _rpc(url: str, method: str, *params):
    return rpc_call(url, method, *params, name_url=True)


def ensure_key(home: Path, args: argparse.Namespace) -> tuple[Identity, Callable[[], bytes], bool]:
    """The home's identity (made with a new key if there is none), an unlock function, and whether it is
    new. A passphrase typed at the prompt is kept in the OS keyring where there is one (not with
    ``--no-keyring``), so that later starts ask nothing."""
    key_file = key_path(home)
    prompted = not given_elsewhere(args)
    if key_file.exists():
        ask = unlock_passphrase(args, key_file)
        asked: list[bytes] = []

        def unlock() -> bytes:   # asked once: the node's start reuses it
            if not asked:
                asked.append(ask())
            return asked[0]
        identity = load_identity(key_file, unlock)
        if asked and prompted and args.keyring and keyring_store.load(key_file) != asked[0]:
            remember(key_file, asked[0])
        return identity, unlock, False
    passphrase = new_key_passphrase(args)
    home.mkdir(parents=True, exist_ok=True, mode=0o700)
    identity = Identity.generate()
    save_identity(key_file, identity, passphrase=passphrase)
    if passphrase is not None and prompted and args.keyring:
        remember(key_file, passphrase)
    return identity, (lambda: passphrase or b""), True


def remember(key_file: Path, passphrase: bytes) -> None:
    if keyring_store.store(key_file, passphrase):
        print(f"kept the key's passphrase in the OS keyring ({type(keyring_store.backend()).__name__}): "
              "later starts ask nothing", flush=True)
    else:
        print("no OS keyring here: later starts ask for the passphrase (or give --passphrase-file FILE)",
              flush=True)


def config_overrides(home: Path, network: Network, genesis: Genesis, rpc_url: str, stake: int,
                     args: argparse.Namespace) -> dict[tuple[str, str], str]:
    """The settings provide owns; a new home also gets its listen and RPC ports. Everything else in an
    existing config is kept."""
    existing = config_path(home).exists()
    current = load_config(config_path(home) if existing else None, env={})
    roles = list(dict.fromkeys([*current.get("node", "roles"), "compute"]))
    overrides = {
        ("node", "roles"): ",".join(roles),
        ("consensus", "chain_id"): genesis.chain_id,
        ("ledger", "rpc_urls"): ",".join(dict.fromkeys([rpc_url, *network.rpc])),
        ("p2p", "bootstrap"): ",".join(bootstrap_addrs(network, genesis)),
        ("compute", "stake"): str(stake),
    }
    if args.listen or not existing:
        overrides[("p2p", "listen")] = args.listen or DEFAULT_LISTEN
    if args.rpc_port is not None or not existing:
        overrides[("rpc", "port")] = str(args.rpc_port if args.rpc_port is not None else DEFAULT_RPC_PORT)
    return overrides


def write_config(home: Path, overrides: dict[tuple[str, str], str]) -> bool:
    """Write the merged config; False if it already said all this (nothing written)."""
    file = config_path(home)
    current = load_config(file, env={}) if file.exists() else None
    merged = load_config(file if current is not None else None, env={}, overrides=overrides)
    if current is not None and current.to_toml() == merged.to_toml():
        return False
    tmp = file.with_name(f".{file.name}.tmp-{os.getpid()}")
    tmp.write_text(merged.to_toml(), encoding="utf-8")
    os.replace(tmp, file)
    return True


def detect_hardware(config) -> dict:
    """GPU, memory, a short benchmark and the execution profiles (ml/hardware.py), under the same CPU
    profile settings the node will train with (set before torch loads)."""
    apply_compute_profile(config, ["compute"], os.environ)
    try:
        from ml import hardware
        return hardware.detect()
    except Exception as exc:   # no torch, a broken driver: the node registers CPU-only, as the role does
        return {"gpu": "", "gpu_mem_mb": 0, "gpu_tflops": 0.0, "cuda_devices": 0, "profiles": [], "error": str(exc)}


def describe_hardware(found: dict) -> str:
    if found.get("gpu"):
        text = (f"{found['gpu']} ({found['gpu_mem_mb']} MiB, {found['gpu_tflops']} TFLOPS fp32, "
                f"{found['cuda_devices']} CUDA device(s))")
    else:
        text = "no GPU found: this machine computes on its CPU" + (f" ({found['error']})" if found.get("error") else "")
    profiles = ", ".join(found.get("profiles") or []) or "none"
    return f"{text}; execution profiles: {profiles}"


def confirm(args: argparse.Namespace, question: str) -> bool:
    if args.yes:
        return True
    if not sys.stdin.isatty():
        raise CliError("bonding needs a confirmation: run in a terminal, or pass --yes")
    return input(f"{question} [y/N] ").strip().lower() in ("y", "yes")


def bond(url: str, identity: Identity, amount: int, fee: int) -> dict:
    receipt = send_tx_blocking(url, identity, "bond", {"amount": amount}, fee=fee).receipt
    assert receipt is not None
    return receipt


def service_unit(home: Path) -> str:
    """A systemd user unit starting this home's node (the passphrase, if any, from a file next to it)."""
    command = f"{sys.executable} -m cli.main start --home {home}"
    passphrase_file = home / "passphrase"
    if passphrase_file.exists():
        command += f" --passphrase-file {passphrase_file}"
    package_root = Path(__file__).resolve().parents[1]
    return (f"# written by dekube-node provide (docs/adr/0195); the node's dashboard: see the RPC port in "
            f"{config_path(home)}\n"
            "[Unit]\nDescription=dekube provider node (compute)\nWants=network-online.target\n"
            "After=network-online.target\n\n[Service]\nType=exec\n"
            f"Environment=PYTHONPATH={package_root}\nEnvironment=DEKUBE_NODE_LOG_FORMAT=json\n"
            f"ExecStart={command}\nKillSignal=SIGTERM\nTimeoutStopSec=30\nRestart=on-failure\nRestartSec=5\n"
            "NoNewPrivileges=true\n\n[Install]\nWantedBy=default.target\n")


def write_service(home: Path) -> list[str]:
    unit_dir = Path(os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config") / "systemd" / "user"
    unit_dir.mkdir(parents=True, exist_ok=True)
    unit = unit_dir / UNIT_NAME
    unit.write_text(service_unit(home), encoding="utf-8")
    lines = [f"wrote {unit}; to run it now and at every login:",
             "  systemctl --user daemon-reload",
             f"  systemctl --user enable --now {UNIT_NAME}",
             f"  journalctl --user -u {UNIT_NAME} -f"]
    if not (home / "passphrase").exists():
        lines.append("  (the unit unlocks the key with the passphrase in the OS keyring of your session)"
                     if keyring_store.load(key_path(home)) is not None else
                     f"  (an encrypted key needs its passphrase in {home / 'passphrase'}, mode 0600, first line)")
    return lines


def run(args: argparse.Namespace) -> int:
    network = resolve(args.network)
    home = resolve_home(args)
    genesis, url = fetch_genesis(network)
    print(f"network {network.name}: chain {genesis.chain_id!r}, genesis {genesis.hash.hex()[:16]}... checked "
          f"(fetched from {url})", flush=True)
    genesis_target = home / load_config(config_path(home) if config_path(home).exists() else None,
                                        env={}).get("consensus", "genesis_file")
    install_genesis_check(genesis, genesis_target)
    check(clock_problem(int(_rpc(url, "dkb_getBlockByNumber", "latest", False)["time_ms"]), int(time.time() * 1000)))
    identity, unlock, new_key = ensure_key(home, args)
    print(f"{'made' if new_key else 'kept'} the key in {key_path(home)}: address {identity.peer_id}", flush=True)
    configured = (load_config(config_path(home), env={}).get("compute", "stake")
                  if config_path(home).exists() else None)
    params = params_from(_rpc(url, "dkb_getParams"))
    recent = _rpc(url, "dkb_listTasks", None, None, 100)
    plan = propose(params, recent, configured, args.stake)
    stake = plan.stake
    check(stake_problem(stake, plan.floor))
    print(f"stake: {describe(plan, params, len(recent))}", flush=True)
    overrides = config_overrides(home, network, genesis, url, stake, args)
    config = load_config(config_path(home) if config_path(home).exists() else None, env={}, overrides=overrides)
    for listen in config.get("p2p", "listen"):
        check(port_problem(listen))
    if args.measure:
        targets = probe_targets(list(network.bootstrap), [(v.peer_id, v.listen_addrs) for v in genesis.validators])
        measured = measure_now(targets, config.get("p2p", "listen")[0])
        print(f"network: {measured.describe()}", flush=True)
        if measured.reachability == "public" and args.relay:
            overrides[("node", "roles")] = ",".join(dict.fromkeys([*overrides[("node", "roles")].split(","),
                                                                    "relay"]))
        config = load_config(config_path(home) if config_path(home).exists() else None, env={},
                             overrides=overrides)
    if args.device == "cpu":   # the node started below (same process) then sees no CUDA device
        os.environ["CUDA_VISIBLE_DEVICES"] = ""
    found = detect_hardware(config)
    print(f"hardware: {describe_hardware(found)}", flush=True)
    check(gpu_problem(args.device, found))
    bonded = int(_rpc(url, "dkb_getStake", identity.peer_id)["bonded"])
    free = int(_rpc(url, "dkb_getBalance", identity.peer_id))
    missing = max(0, stake - bonded)
    print(f"stake: the network asks {stake} bonded of a compute node; {identity.peer_id} has {bonded} bonded, "
          f"{free} free", flush=True)
    if missing and free < missing + args.fee:
        raise CliError(f"{identity.peer_id} needs {missing + args.fee - free} more tokens to bond {missing} "
                       f"(plus the fee {args.fee}): fund it, e.g. 'dekube-node wallet send {identity.peer_id} "
                       f"{missing + args.fee - free} --rpc {url} --key FUNDED_KEY --wait', then run this again")
    print(f"plan: {'bond ' + str(missing) + ', ' if missing else ''}run the compute role on chain "
          f"{genesis.chain_id!r} with the validators at {', '.join(network.rpc)}, dashboard on "
          f"http://127.0.0.1:{config.get('rpc', 'port')}/", flush=True)
    if missing:
        if not confirm(args, f"bond {missing} of {identity.peer_id}'s {free} tokens?"):
            raise CliError("not bonded: nothing started (run again and answer yes, or pass --yes)")
        receipt = bond(url, identity, missing, args.fee)
        print(f"bonded {missing} in block {receipt['height']}", flush=True)
    else:
        print("stake already bonded: kept", flush=True)
    print(f"{'wrote' if write_config(home, overrides) else 'kept'} {config_path(home)}", flush=True)
    install_genesis(genesis, Path(url), genesis_target)
    if args.service:
        for line in write_service(home):
            print(line, flush=True)
    if not args.start:
        print(f"ready: start it with 'dekube-node start --home {home}'", flush=True)
        return 0
    from cli.main import build_parser
    from cli.start import run as start

    # the same path as 'dekube-node start --home HOME'
    return start(build_parser().parse_args(["start", "--home", str(home)]), unlock=unlock)


def check(problem: str | None) -> None:
    if problem is not None:
        raise CliError(problem)


def install_genesis_check(genesis: Genesis, target: Path) -> None:
    """Refuse before anything is written when the home belongs to another chain."""
    if target.exists():
        install_genesis(genesis, target, target)
