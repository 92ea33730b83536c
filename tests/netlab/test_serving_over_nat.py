"""Serving on the emulated internet with the real product (issue 14): validators and relays on public
hosts, four ``dekube-node start --role compute`` processes behind NAT routers (one symmetric) with a
``[serve]`` section each (three ranges of a 6-block model and a spare of the middle one), and a user on
a public client host who funds a serving escrow (``wallet serve-deposit``) and runs ``dekube-node
generate --ledger``. The CLI finds the servers in the ledger, reaches them only through the relayed
addresses their records carry, prints the tokens local inference gives, and the servers' node services
claim their co-signed receipts on chain; a user behind a NAT of its own (home 5) gets the same. A later
generation loses its middle server to SIGKILL mid-way: the spare takes over with exactly one replay and
the text is still the same."""
from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import time

import pytest

from devtools.netlab.lab import unavailable
from devtools.netlab.task_net import RPC_PORT, Member, TaskNet
from ml.serve.catalog import parse_model
from ml.serve.client import local_generate

pytestmark = pytest.mark.netlab

MODEL = "random:6x32:4@5"
RANGES = ["0:2", "2:4", "4:6", "2:4"]   # c0..c3; c3 (home 4) is the spare of c1's range
PRICE = 1_000_000                       # per GFLOP: a few thousand per server for a short generation
DEPOSIT = 500_000
PROMPT = "hello"
WATCH_S = 240.0
HOME_DELAY_MS = 10.0   # each way on every home's link: a token costs >= 3 hops x 20 ms RTT on any machine
KILL_AFTER_S = 1.0     # the middle server dies this long after its session opened (400 tokens take >= 24 s)
# prints "watching" once it polls, then "open" when the node's [serve] status shows a session
SESSION_WATCHER = """
import json, sys, time, urllib.request
url, deadline = sys.argv[1], time.monotonic() + float(sys.argv[2])
print("watching", flush=True)
while time.monotonic() < deadline:
    try:
        status = json.loads(urllib.request.urlopen(url, timeout=5).read())
    except OSError:
        time.sleep(0.05)
        continue
    if (status.get("serving") or {}).get("sessions"):
        print("open", flush=True)
        break
    time.sleep(0.02)
"""


@pytest.fixture(scope="module")
def serve_net(tmp_path_factory):
    why = unavailable()
    if why:
        pytest.skip(why)
    config = [{("serve", "model"): MODEL, ("serve", "blocks"): blocks, ("serve", "price"): str(PRICE),
               ("serve", "claim_every"): "1"} for blocks in RANGES]
    # a user on a public host, another at home (h5)
    with TaskNet.running(tmp_path_factory.mktemp("servenet") / "net", public=("client",), client_homes=1,
                         compute_config=config, home_delay_ms=HOME_DELAY_MS) as net:
        model_id = parse_model(MODEL).model_id
        net.poll(lambda: len(net.rpc("dkb_listNodes", None, model_id, 1000)) == len(RANGES), 180,
                 "every server's range announced on the ledger")
        yield net


def local_tokens(max_tokens: int) -> list[int]:
    spec = parse_model(MODEL)
    return local_generate(spec.load_part(None, True), spec.encode(PROMPT), max_tokens)


def generate_args(net: TaskNet, max_tokens: int) -> list[str]:
    return ["generate", "--model", MODEL, "--ledger", net.testnet.nodes[0].rpc_url,
            "--key", str(net.testnet.faucet_key), "--max-price", str(PRICE), "--prompt", PROMPT,
            "--max-tokens", str(max_tokens)]


def home_ip(net: TaskNet, member: Member) -> str:
    return net.lab.homes[net.compute.index(member)].ip


def sessions(net: TaskNet, member: Member) -> int:
    code = ("import json, sys, urllib.request; "
            "print(json.loads(urllib.request.urlopen(sys.argv[1], timeout=5).read())['serving']['sessions'])")
    done = subprocess.run(["ip", "netns", "exec", member.ns, sys.executable, "-c", code,
                           f"http://{home_ip(net, member)}:{RPC_PORT}/status"],
                          capture_output=True, text=True, timeout=30, check=True)
    return int(done.stdout)


def test_generate_through_nated_servers_is_local_text_and_paid_on_chain(serve_net):
    net = serve_net
    url = net.testnet.nodes[0].rpc_url
    for member in net.compute:   # nobody can dial a home: its record offers private and relayed addresses
        info = net.rpc("dkb_getNode", member.peer_id)
        assert all(addr.startswith("/ip4/192.168.") for addr in info["listen_addrs"])
        assert len(info["relay_addrs"]) == 2
        assert info["hardware"]["serving"][0]["price"] == PRICE
    net.cli("wallet", "serve-deposit", str(DEPOSIT), "--rpc", url, "--key", str(net.testnet.faucet_key),
            "--wait", "--json", host="client")
    client = net.testnet.faucet().peer_id
    assert net.rpc("dkb_getServeEscrow", client)["balance"] == DEPOSIT
    before = {m.peer_id: net.rpc("dkb_getBalance", m.peer_id) for m in net.compute}
    relayed_before = sum(net.metric(r, "dekube_relay_bytes_total") for r in net.relays)

    out = json.loads(net.cli(*generate_args(net, 48), host="client", timeout=300))
    expected = local_tokens(48)
    assert out["tokens"] == expected and out["text"] == parse_model(MODEL).decode(expected)
    assert out["replays"] == 0 and out["servers"] == len(RANGES) and out["paid"] > 0
    net.poll(lambda: net.rpc("dkb_getServeEscrow", client)["balance"] == DEPOSIT - out["paid"], 120,
             "the servers' receipt claims paid from the escrow")
    gains = {m.peer_id: net.rpc("dkb_getBalance", m.peer_id) - before[m.peer_id] for m in net.compute}
    paid = [peer for peer, gain in gains.items() if gain > 0]
    assert len(paid) == 3, gains   # one server per range was chained, and each was paid (less its fees)
    assert sum(gains[p] for p in paid) <= out["paid"]
    relayed = sum(net.metric(r, "dekube_relay_bytes_total") for r in net.relays) - relayed_before
    assert relayed > 0   # the client reached the homes through the relays (hole punching may upgrade)
    supply = net.rpc("dkb_getSupply")
    assert supply["total"] == supply["genesis"]


def test_a_client_behind_nat_generates_through_nated_servers(serve_net):
    net = serve_net
    out = json.loads(net.cli(*generate_args(net, 16), host=f"h{len(RANGES) + 1}", timeout=300))
    assert out["tokens"] == local_tokens(16) and out["replays"] == 0 and out["paid"] > 0


def test_a_server_killed_mid_generation_costs_one_replay(serve_net):
    net = serve_net
    pair = [net.compute[1], net.compute[3]]   # both serve 2:4; the client chains the one it measures faster
    net.poll(lambda: all(sessions(net, m) == 0 for m in pair), 60, "idle middle servers")
    watchers = [subprocess.Popen(["ip", "netns", "exec", m.ns, sys.executable, "-c", SESSION_WATCHER,
                                  f"http://{home_ip(net, m)}:{RPC_PORT}/status", str(WATCH_S)],
                                 stdout=subprocess.PIPE, text=True) for m in pair]
    generation = None
    try:
        for watcher in watchers:
            assert watcher.stdout.readline().strip() == "watching"
        max_tokens = 400
        log = net.root / "generate.log"
        generation = net.cli_process(*generate_args(net, max_tokens), host="client", log=log)
        deadline = time.monotonic() + WATCH_S
        victim = None
        while victim is None:
            for member, watcher in zip(pair, watchers):
                if watcher.poll() is not None and watcher.stdout.read().strip() == "open":
                    victim = member
                    break
            assert generation.poll() is None, f"generate ended before a middle server opened a session: " \
                                              f"{log.read_text()[-2000:]}"
            assert time.monotonic() < deadline, "no middle server opened a session"
            time.sleep(0.01)
        time.sleep(KILL_AFTER_S)   # let some tokens pass through it first
        assert generation.poll() is None, f"generate ended before the kill: {log.read_text()[-2000:]}"
        net.kill(victim)   # SIGKILL while the session is open and the generation goes on
        stdout, _ = generation.communicate(timeout=300)
        assert generation.returncode == 0, log.read_text()[-2000:]
        out = json.loads(stdout)
        assert out["tokens"] == local_tokens(max_tokens)
        assert out["replays"] == 1, out
    finally:
        for proc in [*watchers, generation]:
            if proc is not None and proc.poll() is None:
                proc.kill()
            with contextlib.suppress(Exception):
                if proc is not None:
                    proc.wait(10)
