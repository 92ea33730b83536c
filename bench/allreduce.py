"""Benchmark: 4 peers averaging 25M fp32 values over 100 Mbit/s tbf links in network namespaces.

Measures ours (fp32, fp16, int8, int4; PowerSGD rank 4), torch.distributed gloo (fp32)
and hivemind 1.1.12's DecentralizedAverager (fp32, fp16, 8-bit, from the venv at $HIVEMIND_PYTHON,
default /tmp/hm/bin/python) in the same run, plus ours vs gloo over loopback. Per system: seconds
per round (the slowest peer, mean over timed rounds after a warm-up round), MB sent per peer (the
interface's tx bytes, headers included) and the relative error vs the exact mean. Needs root.

Every record names the transport it ran over. Ours runs over `--transport host` by default: the
node's `HostTransport` (ml/compute/host_transport.py), i.e. the product path: a p2p Host per peer,
noise-encrypted and peer-authenticated, yamux-multiplexed, one dedicated bulk connection per peer
(`ours_host`). `--transport tcp` runs it over the plain, unauthenticated `TcpTransport` instead
(`ours_tcp`); `--transport host,tcp` measures both in one run. gloo runs over its own plain TCP
(`gloo-tcp`), hivemind over its libp2p daemon with TLS 1.3 (`libp2p-tls`).
Ours runs in the mode `--ours-mode auto` picks per codec: the ring for float codecs (fp32, fp16,
bf16: two flows per link, the bytes forwarded unchanged) and the butterfly for quantizing ones
(each value quantized once per leg, ADR 0034); where auto picks the ring, the butterfly is measured
too (`ours_<transport>_butterfly`). Prints one JSON object as its last line.

    python bench/allreduce.py [--transport host,tcp] [--numel 25000000] [--rounds 2]
                              [--codecs fp32,int8] [--skip hivemind,gloo,butterfly,loopback]

Run as `bench/allreduce.py peer ...` it is one peer process (started by the driver).
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PEERS = 4
OUR_PORT = 7100
GLOO_PORT = 29511
ROUND_TIMEOUT_S = 300.0
TRANSPORTS = ("host", "tcp")  # ours: the node's HostTransport (the product path) or plain TcpTransport
# what each record's "transport" names: ours over "host" or "tcp", gloo and hivemind over their own
SYSTEM_TRANSPORT = {"gloo": "gloo-tcp", "hivemind": "libp2p-tls"}


# ----------------------------------------------------------------------------- peer side

def _contribution(index: int, numel: int):
    import torch
    return torch.randn(numel, generator=torch.Generator().manual_seed(index))


def _exact_mean(n: int, numel: int):
    acc = _contribution(0, numel)
    for i in range(1, n):
        acc.add_(_contribution(i, numel))
    return acc.div_(n)


def _rel_err(result, n: int, numel: int) -> float:
    exact = _exact_mean(n, numel)
    return float((result.reshape(-1)[:numel] - exact).norm() / exact.norm())


def _say(tag: str, payload=None) -> None:
    print(tag if payload is None else f"{tag} {json.dumps(payload)}", flush=True)


def _await_go() -> None:
    line = sys.stdin.readline()
    if line.strip() != "GO":
        raise SystemExit(f"expected GO, got {line!r}")


def _bench_identity(index: int):
    """Peer ``index``'s node identity: every peer derives all of them, so no ids are exchanged."""
    import hashlib

    from node.identity import Identity
    return Identity.from_seed(hashlib.sha256(f"dekube-bench-peer{index}".encode()).digest())


async def _start_transport(args, addrs: list[str]):
    """(transport, member names, stop): the node's HostTransport or the plain TcpTransport."""
    def port(i: int) -> int:
        return args.port + (i if args.loopback else 0)

    if args.transport == "host":
        from ml.compute.host_transport import HostTransport
        from node.p2p.host import Host

        ids = [_bench_identity(i).peer_id for i in range(args.n)]
        host = Host(_bench_identity(args.index), [f"/ip4/{addrs[args.index]}/tcp/{port(args.index)}"])
        await host.start()
        for i, peer in enumerate(ids):
            if i != args.index:
                host.peerbook.add_addrs(peer, [f"/ip4/{addrs[i]}/tcp/{port(i)}"])
        transport = HostTransport(host)

        async def stop() -> None:
            await transport.close()
            await host.stop()
        return transport, ids, stop
    from ml.allreduce import TcpTransport

    names = [f"peer{i}" for i in range(args.n)]
    transport = TcpTransport(names[args.index], addrs[args.index], port(args.index),
                             {p: (addrs[i], port(i)) for i, p in enumerate(names)})
    await transport.start()
    return transport, names, transport.close


def peer_ours(args, addrs: list[str]) -> None:
    import asyncio

    import torch

    sys.path.insert(0, str(REPO))
    from ml.allreduce import AllReduceGroup, PowerSGDAllReduce

    torch.set_num_threads(1)
    if os.environ.get("DEKUBE_BENCH_LOG"):
        import logging
        logging.basicConfig(filename=f"{os.environ['DEKUBE_BENCH_LOG']}/peer{args.index}.log", level=logging.INFO,
                            format="%(asctime)s %(name)s %(message)s")

    async def main():
        transport, names, stop_transport = await _start_transport(args, addrs)
        me = names[args.index]
        powersgd = args.codec.startswith("powersgd")
        group = AllReduceGroup(transport, me, names, mode=args.mode, codec="fp32" if powersgd else args.codec,
                               workers=2, **({"chunk_numel": args.chunk_numel} if args.chunk_numel else {}))
        await group.start()
        x = _contribution(args.index, args.numel)
        reducer = (PowerSGDAllReduce(group, [tuple(x.shape)], rank=int(args.codec[len("powersgd"):]))
                   if powersgd else group)
        loop = asyncio.get_running_loop()
        _say("READY0")
        result = None
        for round_id in range(args.rounds + 1):
            await loop.run_in_executor(None, _await_go)
            start = time.perf_counter()
            result = await reducer.allreduce([x], round_id)
            _say("DONE", {"s": time.perf_counter() - start, "sent": result.bytes_sent,
                          "participants": len(result.participants), "attempts": result.attempts,
                          "excluded": result.excluded, "rates": group.upload_rates})
        if args.check:
            rel_err = await loop.run_in_executor(None, _rel_err, result.tensors[0], args.n, args.numel)
            _say("CHECK", {"rel_err": rel_err})
        # stay up until the driver has every peer's last round (it closes our stdin): a peer that
        # exits early closes connections others may still be reading its last frames from
        await loop.run_in_executor(None, sys.stdin.read)
        await group.close()
        await stop_transport()

    asyncio.run(main())


def peer_gloo(args, addrs: list[str]) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    os.environ["GLOO_SOCKET_IFNAME"] = "lo" if args.loopback else args.iface
    dist.init_process_group("gloo", init_method=f"tcp://{addrs[0]}:{args.port}", rank=args.index,
                            world_size=args.n)
    x = _contribution(args.index, args.numel)
    _say("READY0")
    t = None
    for _ in range(args.rounds + 1):
        _await_go()
        t = x.clone()
        start = time.perf_counter()
        dist.all_reduce(t)
        t.div_(args.n)
        _say("DONE", {"s": time.perf_counter() - start})
    if args.check:
        _say("CHECK", {"rel_err": _rel_err(t, args.n, args.numel)})
    dist.destroy_process_group()


def peer_hivemind(args, addrs: list[str]) -> None:
    import hivemind
    import torch
    from hivemind.compression import (
        Float16Compression,
        NoCompression,
        Uniform8BitQuantization,
    )

    torch.set_num_threads(1)
    initial = json.loads(sys.stdin.readline())
    dht = hivemind.DHT(host_maddrs=[f"/ip4/{addrs[args.index]}/tcp/0"], initial_peers=initial, start=True)
    if args.index == 0:
        _say("MADDRS", [str(m) for m in dht.get_visible_maddrs()])
    compression = {"fp32": NoCompression(), "fp16": Float16Compression(), "int8": Uniform8BitQuantization()}[args.codec]
    x = _contribution(args.index, args.numel)
    averager = hivemind.averaging.DecentralizedAverager(
        [x.clone()], dht, prefix="dekube_bench", target_group_size=args.n, min_group_size=args.n,
        min_matchmaking_time=2.0, request_timeout=10.0, compression=compression, start=True)
    _say("READY0")
    result = None
    for _ in range(args.rounds + 1):
        _await_go()
        with averager.get_tensors() as tensors:
            tensors[0].copy_(x)
        start = time.perf_counter()
        info = averager.step(timeout=ROUND_TIMEOUT_S)
        seconds = time.perf_counter() - start
        with averager.get_tensors() as tensors:
            result = tensors[0].clone()
        _say("DONE", {"s": seconds, "group": len(info) if info else 0})
    if args.check:
        _say("CHECK", {"rel_err": _rel_err(result, args.n, args.numel)})
    averager.shutdown()
    dht.shutdown()


def peer_main(argv: list[str]) -> None:
    p = argparse.ArgumentParser()
    p.add_argument("system", choices=["ours", "gloo", "hivemind"])
    p.add_argument("--codec", default="fp32")
    p.add_argument("--mode", default="butterfly", choices=["butterfly", "ring"])
    p.add_argument("--transport", default="host", choices=TRANSPORTS)
    p.add_argument("--chunk-numel", type=int, default=0)
    p.add_argument("--index", type=int, required=True)
    p.add_argument("--n", type=int, default=PEERS)
    p.add_argument("--numel", type=int, required=True)
    p.add_argument("--rounds", type=int, required=True)
    p.add_argument("--addrs", required=True)
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--iface", default="")
    p.add_argument("--loopback", action="store_true")
    p.add_argument("--check", action="store_true")
    args = p.parse_args(argv)
    addrs = args.addrs.split(",")
    {"ours": peer_ours, "gloo": peer_gloo, "hivemind": peer_hivemind}[args.system](args, addrs)


# ----------------------------------------------------------------------------- driver side

class PeerProcess:
    """One peer subprocess with a thread turning its stdout into a queue of tagged lines."""

    def __init__(self, argv: list[str]):
        env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True, env=env, cwd=REPO,
                                     start_new_session=True)  # its own process group: see stop()
        self.lines: queue.Queue = queue.Queue()
        self.stderr_tail: list[str] = []
        threading.Thread(target=self._pump, args=(self.proc.stdout, True), daemon=True).start()
        threading.Thread(target=self._pump, args=(self.proc.stderr, False), daemon=True).start()

    def _pump(self, stream, is_stdout: bool) -> None:
        for line in stream:
            if is_stdout:
                self.lines.put(line.rstrip("\n"))
            else:
                self.stderr_tail = (self.stderr_tail + [line.rstrip("\n")])[-15:]
        if is_stdout:
            self.lines.put(None)

    def expect(self, tag: str, timeout: float):
        deadline = time.monotonic() + timeout
        while True:
            try:
                line = self.lines.get(timeout=max(0.01, deadline - time.monotonic()))
            except queue.Empty:
                raise RuntimeError(f"timed out waiting for {tag}; stderr: {self.stderr_tail[-5:]}") from None
            if line is None:
                raise RuntimeError(f"peer exited before {tag}; stderr: {self.stderr_tail[-8:]}")
            if line == tag or line.startswith(tag + " "):
                rest = line[len(tag):].strip()
                return json.loads(rest) if rest else None

    def send(self, line: str) -> None:
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()

    def stop(self) -> None:
        if self.proc.poll() is None:
            try:
                self.proc.stdin.close()
                self.proc.wait(timeout=10)
            except Exception:  # noqa: BLE001 - a peer that does not exit is killed
                self.proc.kill()
                self.proc.wait()
        # whatever the peer started and left behind (hivemind's averager/DHT processes and p2pd
        # daemons outlive a killed peer) goes with its process group
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)


FLOAT_CODECS = ("fp32", "fp16", "bf16")


def auto_mode(codec: str) -> str:
    """The ring for float codecs, the butterfly for quantizing ones and PowerSGD."""
    return "ring" if codec in FLOAT_CODECS else "butterfly"


CHUNK_NUMEL = 0  # ours: values per pipelined chunk; 0: the group's default (--chunk-numel)


def run_system(system: str, codec: str, numel: int, rounds: int, lab=None, mode: str = "butterfly",
               transport: str = "host") -> dict:
    """Run one system/codec among PEERS processes; seconds, MB sent per peer, relative error.
    `transport` (ours only): "host" or "tcp"; every record names the transport it ran over."""
    label = transport if system == "ours" else SYSTEM_TRANSPORT[system]
    python = os.environ.get("HIVEMIND_PYTHON", "/tmp/hm/bin/python") if system == "hivemind" else sys.executable
    if lab is not None:
        addrs = [lab.address(i) for i in range(PEERS)]
    else:
        addrs = ["127.0.0.1"] * PEERS
    port = {"ours": OUR_PORT, "gloo": GLOO_PORT, "hivemind": 0}[system]
    peers = []
    try:
        for i in range(PEERS):
            argv = [python, str(Path(__file__).resolve()), "peer", system, "--codec", codec, "--index", str(i),
                    "--numel", str(numel), "--rounds", str(rounds), "--addrs", ",".join(addrs),
                    "--port", str(port)]
            argv += ["--iface", lab.ifname(i)] if lab is not None else ["--loopback"]
            argv += (["--mode", mode, "--chunk-numel", str(CHUNK_NUMEL), "--transport", transport]
                     if system == "ours" else [])
            argv += ["--check"] if i == 0 else []
            peers.append(PeerProcess((lab.exec_prefix(i) if lab is not None else []) + argv))
        if system == "hivemind":
            peers[0].send("[]")
            maddrs = peers[0].expect("MADDRS", 120)
            for peer in peers[1:]:
                peer.send(json.dumps(maddrs))
        for peer in peers:
            peer.expect("READY0", 180)
        seconds, sent, attempts, excluded = [], [], [], set()
        for round_id in range(rounds + 1):
            tx_before = [lab.tx_bytes(i) for i in range(PEERS)] if lab is not None else None
            for peer in peers:
                peer.send("GO")
            done = [peer.expect("DONE", ROUND_TIMEOUT_S) for peer in peers]
            if round_id == 0:
                continue  # warm-up: connections, allocations, first bandwidth measurement
            seconds.append(max(d["s"] for d in done))
            if os.environ.get("DEKUBE_BENCH_LOG"):
                print(json.dumps({"debug": system, "codec": codec, "done": done}), file=sys.stderr, flush=True)
            attempts.append(max(d.get("attempts", 1) for d in done))
            excluded.update(k for d in done for k in d.get("excluded", {}))
            if lab is not None:
                sent.append(sum(lab.tx_bytes(i) - tx_before[i] for i in range(PEERS)) / PEERS)
        check = peers[0].expect("CHECK", 300)
        out = {"transport": label, "s": round(sum(seconds) / len(seconds), 3),
               "rel_err": float(f"{check['rel_err']:.3g}")}
        if system == "ours":
            out["mode"] = mode
        if sent:
            out["MB_per_peer"] = round(sum(sent) / len(sent) / 1e6, 2)
        if system == "ours" and (max(attempts) > 1 or excluded):
            out["max_attempts"] = max(attempts)
            out["excluded"] = sorted(excluded)
        return out
    except Exception as exc:  # noqa: BLE001 - reported in the JSON, the run goes on
        return {"transport": label, "error": f"{type(exc).__name__}: {exc}"[:500]}
    finally:
        for peer in peers:
            peer.stop()


def hivemind_available() -> str | None:
    python = os.environ.get("HIVEMIND_PYTHON", "/tmp/hm/bin/python")
    if not Path(python).exists():
        return (f"no hivemind venv at {python} (python -m venv /tmp/hm && "
                "/tmp/hm/bin/pip install hivemind==1.1.12 torch==2.13.0 'numpy<2.4')")
    proc = subprocess.run([python, "-c", "import hivemind, numpy; print(hivemind.__version__, numpy.__version__)"],
                          capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        return f"hivemind does not import: {proc.stderr.strip()[-300:]}"
    version, numpy_version = proc.stdout.split()
    if version != "1.1.12":
        return f"hivemind {version} installed, 1.1.12 expected"
    if tuple(int(v) for v in numpy_version.split(".")[:2]) >= (2, 4):
        return f"numpy {numpy_version} in the hivemind venv: its 8-bit codecs fail silently with numpy >= 2.4"
    return None


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--numel", type=int, default=25_000_000)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--link-mbit", type=float, default=100.0)
    p.add_argument("--skip", default="", help="comma-separated: ours,butterfly,gloo,hivemind,loopback")
    p.add_argument("--ours-mode", default="auto", choices=["auto", "butterfly", "ring"])
    p.add_argument("--codecs", default="fp32,fp16,int8,int4,powersgd4")
    p.add_argument("--transport", default="host",
                   help="ours, comma-separated: host (the node's HostTransport: noise + yamux bulk "
                        "connections, the product path) and/or tcp (plain, unauthenticated TcpTransport)")
    p.add_argument("--chunk-numel", type=int, default=0, help="ours: values per pipelined chunk (0: default)")
    args = p.parse_args()
    global CHUNK_NUMEL
    CHUNK_NUMEL = args.chunk_numel
    skip = set(filter(None, args.skip.split(",")))
    transports = args.transport.split(",")
    if not transports or any(t not in TRANSPORTS for t in transports):
        p.error(f"--transport: comma-separated of {', '.join(TRANSPORTS)}, got {args.transport!r}")

    def mode_for(codec: str) -> str:
        return auto_mode(codec) if args.ours_mode == "auto" else args.ours_mode

    sys.path.insert(0, str(REPO))
    from devtools.netlab.lab import unavailable
    from devtools.netlab.star import Star

    report = {"peers": PEERS, "numel": args.numel, "link_mbit": args.link_mbit}
    why = unavailable(nat=False)
    if why:
        report["error"] = f"network namespaces unavailable: {why}"
    else:
        with Star(PEERS, args.link_mbit) as lab:
            codecs = args.codecs.split(",")
            for transport in transports if "ours" not in skip else ():
                key = f"ours_{transport}"
                report[key] = {c: run_system("ours", c, args.numel, args.rounds, lab, mode_for(c), transport)
                               for c in codecs}
                print(json.dumps({"progress": key, **report[key]}), flush=True)
                also = [c for c in codecs if mode_for(c) == "ring"] if "butterfly" not in skip else []
                if also:
                    report[key + "_butterfly"] = {c: run_system("ours", c, args.numel, args.rounds, lab,
                                                                transport=transport) for c in also}
                    print(json.dumps({"progress": key + "_butterfly", **report[key + "_butterfly"]}), flush=True)
            if "gloo" not in skip:
                report["gloo"] = {"fp32": run_system("gloo", "fp32", args.numel, args.rounds, lab)}
                print(json.dumps({"progress": "gloo", **report["gloo"]}), flush=True)
            if "hivemind" not in skip:
                why_not = hivemind_available()
                report["hivemind"] = {"transport": SYSTEM_TRANSPORT["hivemind"], "error": why_not} if why_not else {
                    c: run_system("hivemind", c, args.numel, args.rounds, lab) for c in ("fp32", "fp16", "int8")}
                print(json.dumps({"progress": "hivemind", **report["hivemind"]}), flush=True)
    if "loopback" not in skip:
        loopback = report["loopback"] = {"ours_mode": mode_for("fp32")}
        for transport in transports:
            ours = run_system("ours", "fp32", args.numel, args.rounds, mode=mode_for("fp32"), transport=transport)
            loopback[f"ours_{transport}_fp32_s"] = ours.get("s", ours.get("error"))
            if mode_for("fp32") != "butterfly" and "butterfly" not in skip:
                butterfly = run_system("ours", "fp32", args.numel, args.rounds, transport=transport)
                loopback[f"ours_{transport}_butterfly_fp32_s"] = butterfly.get("s", butterfly.get("error"))
        gloo = run_system("gloo", "fp32", args.numel, args.rounds)
        loopback["gloo_fp32_s"] = gloo.get("s", gloo.get("error"))
    print(json.dumps(report))


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "peer":
        peer_main(sys.argv[2:])
    else:
        main()
