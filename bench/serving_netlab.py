"""Serving in the netlab (issue 14's benchmark): block servers behind NAT, a client on the internet.

Layout (devtools/netlab/lab.py, namespaces named dk<pid>n..., deleted at exit): a public relay, a public
client whose link passes a userspace delay line (`--client-delay` ms each way), and four homes behind
endpoint-independent NAT routers with `--rate` Mbit/s tbf caps both ways and delay lines of 20, 35,
50 and 30 ms each way: homes 1-3 hold the model's three ranges, home 4 a spare for the middle range.
Each server is a process in its home (`--role server`): a Host listening on its private address, a
relay reservation and a hole puncher that upgrades inbound relayed connections after
`relay.node_punch.INBOUND_DEFER_S`, as nodes do (at once: the DCUtR spec's roles; the client's
dial waits for that punch before starting its own, ADR 0204). The client (`--role client`)
reaches every server through the relay and hole punching
(`relay.holepunch_dial.dial_peer`; which path each got is reported, `punched (by the server)` when
the server's punch won, and `direct_at_generation`), then measures, with the same numbers as bench/serving.py:
tokens_per_s (128 tokens after a 64-token prompt, bit-exact mode, servers pushing each step's answer to
the next server as `dekube-node generate` does by default, ADR 0181; the servers reach each other over
relay circuits, dialed with their relay client, which their hole punchers may upgrade) with
pushed_steps / push_fallbacks, tokens_per_s_client_driven (the client sends every server its input),
identical_output / identical_output_client_driven against `local_generate`, offload_tokens_per_s /
offload_warm_tokens_per_s (bench/offload.py: layer-by-layer offload from disk, page cache dropped after
every read / warm),
recover_s (pushed generation, the middle server SIGKILLed half-way: the spare takes over with one
replay, and the output is still identical; kill_step_s: that whole token step, failed request, waits
for pushes that cannot come and replay), tune_step_s (LoRA rank 4 through the servers left).

Prints one JSON object. Needs root. Usage: python bench/serving_netlab.py [--layers 12 --width 768
--heads 12] [--prompt 64] [--new 128] [--rate 100] [--client-delay 20] [--tune-steps 5]
[--offload-dir DIR (disk-backed; default $TMPDIR)] [--log-dir DIR (each process's relay/p2p log)]
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

SEED = 1
PORT = 4001
HOME_DELAYS_MS = (20.0, 35.0, 50.0, 30.0)   # homes 1-3: the three ranges; home 4: the middle range's spare


def seed(name: str) -> bytes:
    import hashlib
    return hashlib.sha256(b"dekube-serving-netlab/" + name.encode()).digest()


def identity(name: str):
    from node.identity import Identity
    return Identity.from_seed(seed(name))


def config_of(args):
    from ml.serve.model import DecoderConfig
    return DecoderConfig(vocab_size=256, context=max(512, args.prompt + args.new + 8), width=args.width,
                         layers=args.layers, heads=args.heads)


def ranges_of(layers: int) -> list[tuple[int, int]]:
    bounds = [round(i * layers / 3) for i in range(4)]
    ranges = list(zip(bounds, bounds[1:], strict=False))
    return ranges + [ranges[1]]


async def wait_stdin_closed() -> None:
    await asyncio.to_thread(sys.stdin.read)


# ---- roles (each runs in its own namespace) --------------------------------------------------------

async def role_relay(args) -> None:
    from node.p2p.host import Host
    from relay.service import Admission, RelayService

    host = Host(identity("relay"), [f"/ip4/{args.ip}/tcp/{PORT}"])
    await host.start()
    allowed = {identity(f"server{i}").peer_id for i in range(4)} | {identity("client").peer_id}
    service = RelayService(host, Admission(allowed))
    service.start()
    print("READY " + json.dumps({"peer_id": host.peer_id, "addr": f"/ip4/{args.ip}/tcp/{PORT}/p2p/{host.peer_id}"}),
          flush=True)
    await wait_stdin_closed()
    await service.stop()
    await host.stop()


async def role_server(args) -> None:
    from ml.serve import protocol
    from ml.serve.handler import ServeHandler
    from ml.serve.model import random_decoder
    from ml.serve.server import BlockServer
    from node.p2p.host import Host
    from relay.client import RelayClient
    from relay.holepunch import HolePuncher
    from relay.holepunch_inbound import upgrade_inbound
    from relay.node_punch import INBOUND_DEFER_S

    config = config_of(args)
    start, end = ranges_of(config.layers)[args.index]
    host = Host(identity(f"server{args.index}"), [f"/ip4/{args.ip}/tcp/{PORT}"])
    server = BlockServer(await asyncio.to_thread(random_decoder, config, SEED, (start, end), False))
    host.set_handler(protocol.PROTOCOL, ServeHandler(server, config.model_id(SEED), host=host))
    await host.start()
    client = RelayClient(host)
    client.start()
    # pushes to the next server (ADR 0181) go over a circuit through the relay, as the client's first dial does
    host.register_circuit_dialer(lambda maddr, bulk: client.dial([str(maddr)], bulk=bulk))
    puncher = HolePuncher(host)
    puncher.start()
    await puncher.connect_public(args.relay)
    await client.reserve(args.relay)
    # as a node does (relay/node_punch.py): the inbound side of a circuit starts DCUtR (the spec's
    # roles); the dialer waits for it rather than racing it on the same punch ports (ADR 0204)
    inbound = asyncio.ensure_future(upgrade_inbound(puncher, client, defer=INBOUND_DEFER_S))
    print("READY " + json.dumps({"peer_id": host.peer_id, "circuits": client.relayed_addrs, "start": start,
                                 "end": end}), flush=True)
    await wait_stdin_closed()
    inbound.cancel()
    await host.stop()


async def role_client(args) -> dict:
    import torch

    from bench.offload import offload_figures
    from ml.serve.client import RemoteGenerator, ServerInfo, local_generate
    from ml.serve.model import random_decoder
    from ml.serve.tuner import time_lora_tuning
    from node.p2p.host import Host
    from relay.client import RelayClient
    from relay.holepunch import HolePuncher
    from relay.holepunch_dial import dial_peer
    from relay.holepunch_inbound import has_direct

    config = config_of(args)
    servers = json.loads(args.servers)
    host = Host(identity("client"), [f"/ip4/{args.ip}/tcp/{PORT}"])
    await host.start()
    relay = RelayClient(host)
    relay.start()
    host.register_circuit_dialer(lambda maddr, bulk: relay.dial([str(maddr)], bulk=bulk))
    puncher = HolePuncher(host)
    puncher.start()
    await puncher.connect_public(args.relay)
    result: dict = {"setting": f"netlab: 3 servers + 1 spare behind NAT, {args.rate:g} Mbit/s, delay lines "
                               f"{'/'.join(f'{d:g}' for d in HOME_DELAYS_MS)} ms (homes) and {args.client_delay:g} "
                               "ms (client), each way", "layers": config.layers, "width": config.width,
                    "prompt": args.prompt, "new": args.new, "codec": "f32", "threads": torch.get_num_threads()}
    try:
        paths, infos = [], []
        for info in servers:
            host.peerbook.add_addrs(info["peer_id"], info["circuits"])
            path = await dial_peer(host, relay, puncher, info["peer_id"], [], info["circuits"], punch_wait=10.0)
            kind = path.kind
            if kind == "relayed" and await puncher.wait_direct(info["peer_id"], 2.0) is not None:
                # the server's own DCUtR (it starts one on every inbound relayed connection) won the
                # race with ours: our dials from the punch port then fail with EADDRNOTAVAIL
                kind = "punched (by the server)"
            for _ in range(2 if kind == "relayed" else 0):   # a punch that missed its timing: try again
                if await puncher.direct_connect(path.conn) is not None:
                    kind = "punched (retry)"
                    break
            paths.append(kind)
            infos.append(ServerInfo(info["peer_id"], info["start"], info["end"]))
        result["paths"] = paths
        ends = random_decoder(config, SEED, (0, 0), ends=True)
        prompt = [int(t) for t in torch.randint(0, 256, (args.prompt,), generator=torch.Generator().manual_seed(3))]
        chain = infos[:3]   # the spare is only used after the kill
        outputs: dict[str, list[int]] = {}
        rtts = []
        for info in chain:
            rtts.append(round(await host.ping(info.peer_id), 4))
        result["rtt_s"] = rtts
        result["direct_at_generation"] = [has_direct(host, info.peer_id) for info in infos]

        for push, suffix in ((False, "_client_driven"), (True, "")):
            generator = RemoteGenerator(host, ends, chain, codec="f32", push=push)
            began = time.perf_counter()
            tokens = await generator.generate(prompt, args.new)
            result[f"tokens_per_s{suffix}"] = round(args.new / (time.perf_counter() - began), 2)
            outputs[suffix] = tokens
            if push:
                result |= {"pushed_steps": generator.stats.pushed, "push_fallbacks": generator.stats.push_fallbacks}
        whole = random_decoder(config, SEED)
        expected = await asyncio.to_thread(local_generate, whole, prompt, args.new)
        result["identical_output"] = outputs[""] == expected
        result["identical_output_client_driven"] = outputs["_client_driven"] == expected
        with tempfile.TemporaryDirectory(dir=args.offload_dir) as folder:
            result |= await asyncio.to_thread(offload_figures, whole, Path(folder), prompt, args.offload_new,
                                              expected)
        del whole

        generator = RemoteGenerator(host, ends, infos, codec="f32", push=True)
        original = generator._through_chain

        async def step_and_kill(hidden):
            if generator.stats.steps != args.new // 2:
                return await original(hidden)
            victim = generator.chain[1].peer_id
            os.kill(servers[[s["peer_id"] for s in servers].index(victim)]["pid"], signal.SIGKILL)
            began = time.perf_counter()
            out = await original(hidden)
            result["kill_step_s"] = round(time.perf_counter() - began, 3)
            return out

        generator._through_chain = step_and_kill
        recovered = await generator.generate(prompt, args.new)
        result["recover_s"] = round(generator.stats.recover_s[0], 3) if generator.stats.recover_s else None
        result["recovered_identical_output"] = recovered == expected
        result["replays"] = generator.stats.replays

        live = [info for info in infos if info.peer_id not in generator.dead]
        result |= await time_lora_tuning(host, ends, live, "f32", 1e-2, args.tune_steps)
    finally:
        await host.stop()
    return result


# ---- the orchestrator (host namespace) ------------------------------------------------------------

def start_role(ns: str, role: str, args, *extra: str) -> tuple[subprocess.Popen, dict]:
    cmd = ["ip", "netns", "exec", ns, sys.executable, str(Path(__file__).resolve()), "--role", role,
           "--layers", str(args.layers), "--width", str(args.width), "--heads", str(args.heads),
           "--prompt", str(args.prompt), "--new", str(args.new), *extra]
    if args.log_dir:
        cmd += ["--log-dir", args.log_dir]
    proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=ROOT)
    line = proc.stdout.readline()
    if not line.startswith("READY "):
        proc.kill()
        raise RuntimeError(f"{role} in {ns} did not start (rc={proc.poll()}): {line!r}")
    return proc, json.loads(line[6:])


def orchestrate(args) -> dict:
    sys.path.insert(0, str(ROOT))
    from devtools.netlab.lab import BACKBONE_NET, Lab, unavailable

    why = unavailable()
    if why:
        raise SystemExit(f"bench/serving_netlab.py: {why}")
    lab = Lab(home_rate_mbit=args.rate).build(["relay"], ["eim"] * 4, list(HOME_DELAYS_MS))
    procs: list[subprocess.Popen] = []
    try:
        lab.add_public("client", f"{BACKBONE_NET}.20", args.client_delay)
        relay_proc, relay = start_role(lab.ns_of("relay"), "relay", args, "--ip", lab.public["relay"])
        procs.append(relay_proc)
        servers = []
        for index, home in enumerate(lab.homes):
            proc, info = start_role(home.ns, "server", args, "--ip", home.ip, "--index", str(index),
                                    "--relay", relay["addr"])
            procs.append(proc)
            servers.append({**info, "pid": proc.pid})
        cmd = ["ip", "netns", "exec", lab.ns_of("client"), sys.executable, str(Path(__file__).resolve()),
               "--role", "client", "--ip", lab.public["client"], "--relay", relay["addr"],
               "--servers", json.dumps(servers), "--layers", str(args.layers), "--width", str(args.width),
               "--heads", str(args.heads), "--prompt", str(args.prompt), "--new", str(args.new),
               "--offload-new", str(args.offload_new), "--tune-steps", str(args.tune_steps),
               "--rate", str(args.rate), "--client-delay", str(args.client_delay)]
        if args.log_dir:
            cmd += ["--log-dir", args.log_dir]
        if args.offload_dir:
            cmd += ["--offload-dir", args.offload_dir]
        out = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=args.timeout)
        if out.returncode != 0:
            raise RuntimeError(f"client failed (rc={out.returncode}): {out.stderr[-2000:]}")
        return json.loads(out.stdout.strip().splitlines()[-1])
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.stdin.close()
                try:
                    proc.wait(5)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(5)
        lab.teardown()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--width", type=int, default=768)
    parser.add_argument("--heads", type=int, default=12)
    parser.add_argument("--prompt", type=int, default=64)
    parser.add_argument("--new", type=int, default=128)
    parser.add_argument("--offload-new", type=int, default=16)
    parser.add_argument("--offload-dir", help="disk-backed directory for the offloaded block files (default: $TMPDIR)")
    parser.add_argument("--tune-steps", type=int, default=5)
    parser.add_argument("--rate", type=float, default=100.0, help="home links, Mbit/s each way")
    parser.add_argument("--client-delay", type=float, default=20.0, help="client link delay, ms each way")
    parser.add_argument("--timeout", type=float, default=1500.0)
    parser.add_argument("--role", choices=["relay", "server", "client"], help=argparse.SUPPRESS)
    parser.add_argument("--ip", help=argparse.SUPPRESS)
    parser.add_argument("--index", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--relay", help=argparse.SUPPRESS)
    parser.add_argument("--servers", help=argparse.SUPPRESS)
    parser.add_argument("--log-dir", help="write each process's relay/p2p log (INFO) to <dir>/<role>[<index>].log")
    args = parser.parse_args()
    if args.role and args.log_dir:
        import logging
        name = f"{args.role}{'' if args.index is None else args.index}"
        logging.basicConfig(filename=str(Path(args.log_dir) / f"{name}.log"), level=logging.INFO,
                            format="%(asctime)s.%(msecs)03d %(name)s %(levelname)s %(message)s", datefmt="%H:%M:%S")
    if args.role == "relay":
        asyncio.run(role_relay(args))
    elif args.role == "server":
        asyncio.run(role_server(args))
    elif args.role == "client":
        print(json.dumps(asyncio.run(role_client(args))), flush=True)
    else:
        print(json.dumps(orchestrate(args)), flush=True)


if __name__ == "__main__":
    main()
