"""The whole network on the emulated internet: validators and relays on public hosts, compute nodes
behind NAT routers, each a real ``dekube-node start`` process in its namespace.

Layout (``TaskNet.build``): public hosts ``val`` (the validators, one address, a port pair each),
``relay1`` and ``relay2`` (``--role relay`` nodes that admit ledger-registered peers); homes 1, 2
and 4 behind endpoint-independent NATs (hole punching works), home 3 behind a symmetric NAT
(its links stay relayed); compute node ``cI`` lives in home I+1, reserves on both relays and
publishes the relayed addresses in its ledger record, which is how the others reach it.
The test process lives outside the lab: ``cli`` runs ``dekube-node`` inside the validators'
namespace and ``rpc`` makes one JSON-RPC call from there.
"""
from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from devtools.devnet import COMPUTE_STAKE, FAST_TASK_PARAMS
from devtools.testnet import REPO_ROOT, Testnet
from node.config import load_config
from node.identity import Identity
from node.keystore import KEY_FILE_NAME, save_identity

from .lab import Lab

VALIDATOR_BASE_PORT = 26600
PORT = 4001
RPC_PORT = 8645
FUNDS = 10**7
HOME_NATS = ["eim", "eim", "symmetric", "eim"]
# A NAT'd verifier first tries the workers' private addresses, then relays and hole punches before it
# can fetch segments: give it ~1 min to answer its audit slot (a task whose slots all resolved is
# paid at once; the deadlines only bound how long a silent verifier holds it up).
TASK_PARAMS = {**FAST_TASK_PARAMS, "audit_window_s": 60, "audit_answer_s": 75}


@dataclass
class Member:
    name: str
    ns: str
    home: Path
    peer_id: str
    proc: subprocess.Popen | None = None


@dataclass
class TaskNet:
    lab: Lab
    root: Path
    testnet: Testnet
    relays: list[Member]
    compute: list[Member]
    validators: list[Member] = field(default_factory=list)

    @classmethod
    @contextlib.contextmanager
    def running(cls, root: Path, **build) -> Iterator[TaskNet]:
        """The network built (``build``'s arguments) and ``up``; every member's log tail printed when
        the block fails; always closed."""
        net = cls.build(root, **build)
        try:
            net.up()
            yield net
        except BaseException:
            for member in net.compute + net.relays + net.validators:
                print(f"== {member.name}\n{net.log_tail(member)}")
            raise
        finally:
            net.close()

    @classmethod
    def build(cls, root: Path, compute: int = 4, public: tuple[str, ...] = (), client_homes: int = 0,
              compute_config: list[dict] | None = None, home_delay_ms: float | list[float] | None = None,
              mbit: float | None = None, params: dict | None = None) -> TaskNet:
        """``public``: more public hosts, ``client_homes``: more homes behind endpoint-independent NATs
        (``h5``, ... after the compute nodes' homes), both for clients; ``compute_config``: config
        overrides per compute node ({(section, key): value}, e.g. a ``[serve]`` section);
        ``home_delay_ms``: a delay line of that many ms each way on every home's WAN link (or one per
        home); ``mbit``: every home's links capped at that rate (``tc tbf``); ``params``: genesis
        parameters over TASK_PARAMS."""
        nats = HOME_NATS[:compute] + ["eim"] * client_homes
        delays = [home_delay_ms] * len(nats) if isinstance(home_delay_ms, (int, float)) else home_delay_ms
        lab = (Lab() if mbit is None else Lab(home_rate_mbit=mbit)).build(["val", "relay1", "relay2", *public], nats,
                                                                        delays)
        try:
            return cls._write(lab, Path(root), compute, compute_config or [{}] * compute, params or {})
        except BaseException:
            lab.teardown()
            raise

    @classmethod
    def _write(cls, lab: Lab, root: Path, compute: int, compute_config: list[dict], params: dict) -> TaskNet:
        relay_ids = [Identity.generate() for _ in range(2)]
        compute_ids = [Identity.generate() for _ in range(compute)]
        testnet = Testnet.create(root, 2, chain_id="dekube-netlab", host=lab.public["val"],
                                 base_port=VALIDATOR_BASE_PORT, params={**TASK_PARAMS, **params},
                                 balances={i.peer_id: FUNDS for i in relay_ids + compute_ids})
        rpc_urls = [v.rpc_url for v in testnet.nodes]
        relays, relay_addrs = [], []
        for i, ident in enumerate(relay_ids, start=1):
            ip = lab.public[f"relay{i}"]
            relays.append(cls._home(root / f"relay{i}", lab.ns_of(f"relay{i}"), ident, {
                ("node", "roles"): "relay", ("p2p", "listen"): f"/ip4/{ip}/tcp/{PORT}",
                ("rpc", "host"): ip, ("rpc", "port"): str(RPC_PORT), ("relay", "ledger_rpc"): rpc_urls[0]}))
            relay_addrs.append(f"/ip4/{ip}/tcp/{PORT}/p2p/{ident.peer_id}")
        members = []
        for i, (ident, home, extra) in enumerate(zip(compute_ids, lab.homes, compute_config)):
            members.append(cls._home(root / f"c{i}", home.ns, ident, {**extra,
                ("node", "roles"): "compute", ("p2p", "listen"): f"/ip4/{home.ip}/tcp/{PORT}",
                ("rpc", "host"): home.ip, ("rpc", "port"): str(RPC_PORT),
                ("compute", "rpc_url"): rpc_urls[i % len(rpc_urls)], ("compute", "stake"): str(COMPUTE_STAKE),
                ("relay", "relays"): ",".join(relay_addrs), ("relay", "reserve"): "true"}))
        net = cls(lab, root, testnet, relays, members)
        net.validators = [Member(v.name, lab.ns_of("val"), v.home, v.peer_id) for v in testnet.nodes]
        return net

    @staticmethod
    def _home(home: Path, ns: str, ident: Identity, overrides: dict) -> Member:
        home.mkdir(mode=0o700, parents=True)
        save_identity(home / KEY_FILE_NAME, ident)
        overrides[("consensus", "chain_id")] = "dekube-netlab"
        (home / "config.toml").write_text(load_config(None, env={}, overrides=overrides).to_toml())
        return Member(home.name, ns, home, ident.peer_id)

    # ---- processes
    def _env(self) -> dict:
        return {**os.environ,
                "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))}

    def start(self, member: Member) -> None:
        with open(member.home / "node.log", "ab") as log:
            member.proc = subprocess.Popen(
                ["ip", "netns", "exec", member.ns, sys.executable, "-m", "cli.main", "start",
                 "--home", str(member.home)],
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=self._env(), cwd=str(REPO_ROOT))

    def kill(self, member: Member) -> None:
        if member.proc is not None and member.proc.poll() is None:
            member.proc.kill()
            member.proc.wait(10)

    def up(self, timeout: float = 180.0) -> None:
        """Start validators, then relays and compute nodes; wait until every compute node is
        registered, bonded and publishes relayed addresses through every relay."""
        for member in self.validators:
            self.start(member)
        self.poll(lambda: (self.rpc("dkb_blockNumber") or 0) >= 1, timeout, "the validators' first block")
        for member in self.relays + self.compute:
            self.start(member)
        self.poll(lambda: all(self._ready(m) for m in self.compute), timeout,
                  "compute nodes registered with relayed addresses")

    def _ready(self, member: Member) -> bool:
        if member.proc is None or member.proc.poll() is not None:
            raise RuntimeError(f"{member.name} exited; see {member.home / 'node.log'}:\n{self.log_tail(member)}")
        info = self.rpc("dkb_getNode", member.peer_id)
        return bool(info and "compute" in info["roles"] and len(info.get("relay_addrs") or ()) == len(self.relays)
                    and self.rpc("dkb_getStake", member.peer_id)["bonded"] > 0)

    def log_tail(self, member: Member, lines: int = 30) -> str:
        with contextlib.suppress(OSError):
            return "\n".join((member.home / "node.log").read_text(errors="replace").splitlines()[-lines:])
        return ""

    def close(self) -> None:
        for member in self.compute + self.relays + self.validators:
            with contextlib.suppress(Exception):
                self.kill(member)
        self.lab.teardown()

    # ---- talking to the network from inside it
    def cli(self, *args: str, timeout: float = 600.0, host: str = "val") -> str:
        """``dekube-node ARGS`` inside the namespace of ``host`` (a public host or a home ``hN``; default:
        the validators'); its stdout (raises on failure)."""
        done = subprocess.run(self._cli_command(host, args), capture_output=True, text=True, env=self._env(),
                              cwd=str(REPO_ROOT), timeout=timeout)
        if done.returncode != 0:
            raise RuntimeError(f"dekube-node {' '.join(args)} failed ({done.returncode}): {done.stderr[-2000:]}")
        return done.stdout

    def cli_process(self, *args: str, host: str = "val", log: Path) -> subprocess.Popen:
        """``dekube-node ARGS`` started in ``host``'s namespace: stdout a text pipe, stderr appended to
        ``log`` (a pipe nobody reads could fill and stall it)."""
        with open(log, "ab") as err:
            return subprocess.Popen(self._cli_command(host, args), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                    stderr=err, text=True, env=self._env(), cwd=str(REPO_ROOT))

    def _cli_command(self, host: str, args) -> list[str]:
        return ["ip", "netns", "exec", self.lab.ns_of(host), sys.executable, "-m", "cli.main", *args]

    def home_rpc(self, member: Member, method: str, *params):
        """One JSON-RPC call to compute node ``member``'s own RPC, from inside its home (the homes are behind
        NATs: nobody else reaches it); raises on any failure."""
        home = self.lab.homes[self.compute.index(member)]
        answer = self._rpc_from(member.ns, f"http://{home.ip}:{RPC_PORT}", method, params)
        if answer is None:
            raise RuntimeError(f"{method} at {member.name}: its RPC is unreachable")
        return answer

    def rpc(self, method: str, *params, url: str | None = None):
        """One JSON-RPC call to a validator (or ``url``) from inside the lab; None if unreachable."""
        return self._rpc_from(self.lab.ns_of("val"), url or self.testnet.nodes[0].rpc_url, method, params)

    def _rpc_from(self, ns: str, url: str, method: str, params: tuple):
        code = ("import json, sys; from node.ledger import jsonrpc; from node.ledger.errors import LedgerUnavailable\n"
                "try: print(json.dumps(jsonrpc.call(sys.argv[1], sys.argv[2], *json.loads(sys.argv[3]))))\n"
                "except LedgerUnavailable: print('null')")
        done = subprocess.run(["ip", "netns", "exec", ns, sys.executable, "-c", code, url, method, json.dumps(params)],
                              capture_output=True, text=True, env=self._env(), cwd=str(REPO_ROOT), timeout=30)
        if done.returncode != 0:
            raise RuntimeError(f"{method} failed: {done.stderr[-1000:]}")
        return json.loads(done.stdout)

    def metric(self, member: Member, name: str) -> float:
        """A Prometheus gauge from ``member``'s /metrics (relays and validators are on the backbone)."""
        ip = self.lab.public[member.name] if member.name in self.lab.public else None
        url = f"http://{ip}:{RPC_PORT}/metrics"
        code = "import sys, urllib.request; print(urllib.request.urlopen(sys.argv[1], timeout=10).read().decode())"
        done = subprocess.run(["ip", "netns", "exec", self.lab.ns_of("val"), sys.executable, "-c", code, url],
                              capture_output=True, text=True, timeout=30, check=True)
        for line in done.stdout.splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
        raise KeyError(f"{name} not in {url}")

    @staticmethod
    def poll(check, timeout: float, what: str, every: float = 0.5) -> None:
        deadline = time.monotonic() + timeout
        while not check():
            if time.monotonic() > deadline:
                raise TimeoutError(f"no {what} within {timeout:g} s")
            time.sleep(every)
