"""``dekube-node serve``, ``generate`` and ``tune``: serve a range of a decoder's blocks, generate
text through servers that together hold all of them, fine-tune parameters the client owns through
them (ml/serve, ADR 0171).

``serve --model SPEC --blocks A:B|auto:N [--known MULTIADDR ...] [--listen MULTIADDR]`` (auto: the
N blocks the known servers cover least, by measured throughput) starts a bare p2p Host with the
``/dekube/serve/1.0.0`` handler, prints one JSON line {"peer_id", "addrs", "model", "blocks"} and
serves until interrupted. ``generate --model SPEC --server MULTIADDR=A:B ... --prompt TEXT
[--max-tokens N] [--codec f32|f16|i8|i4] [--check-local] [--adapter FILE]`` chains the servers (a
second server with a range already covered is a spare used if the first one fails) and prints JSON
{"text", "tokens", "replays", "tokens_per_s"} (plus "identical_to_local" with --check-local);
``--adapter`` applies what ``tune`` wrote. ``tune ... --text FILE [--steps N] [--lora-rank R]
[--prompt-length P] --out FILE`` fits a LoRA adapter and/or prompts to the text's next-token loss
(measured on one fixed batch before and after) and writes them as safetensors. Discovery through
the ledger and payment are not wired yet: servers are named on the command line.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path

from cli.errors import CliError
from node.extras import require_compute


def register(subparsers: argparse._SubParsersAction) -> None:
    serve = subparsers.add_parser("serve", help="serve a range of a decoder's blocks to generating clients")
    serve.add_argument("--model", required=True, help="random:<layers>x<width>[:heads][@seed], random:large, "
                                                      "or a char-transformer .safetensors file")
    serve.add_argument("--blocks", help="A:B, the blocks to serve (default: all), or auto:N to take the N blocks "
                                        "the --known servers cover least")
    serve.add_argument("--known", action="append", default=[], metavar="MULTIADDR",
                       help="a server of the same model (for --blocks auto:N; repeat)")
    serve.add_argument("--listen", default="/ip4/127.0.0.1/tcp/0", help="p2p listen multiaddr")
    serve.add_argument("--max-sessions", type=int, default=64)
    serve.set_defaults(handler=run_serve)
    generate = subparsers.add_parser("generate", help="generate text through block servers")
    generate.add_argument("--model", required=True, help="the same model spec the servers use")
    generate.add_argument("--server", action="append", required=True, metavar="MULTIADDR=A:B",
                          help="a server's multiaddr ending in /p2p/<peer id>, and its blocks (repeat)")
    generate.add_argument("--prompt", required=True)
    generate.add_argument("--max-tokens", type=int, default=32)
    generate.add_argument("--codec", choices=["f32", "f16", "i8", "i4"], default="f32",
                          help="hidden-state encoding (f32 is bit-exact)")
    generate.add_argument("--check-local", action="store_true",
                          help="also run the whole model locally and report whether the tokens are identical")
    generate.add_argument("--adapter", type=Path, help="parameters written by `tune` (LoRA adapter and/or prompts) "
                                                       "for the servers to apply")
    generate.set_defaults(handler=run_generate)
    tune = subparsers.add_parser("tune", help="fine-tune a LoRA adapter / prompts through block servers")
    tune.add_argument("--model", required=True, help="the same model spec the servers use")
    tune.add_argument("--server", action="append", required=True, metavar="MULTIADDR=A:B",
                      help="a server's multiaddr ending in /p2p/<peer id>, and its blocks (repeat)")
    tune.add_argument("--text", type=Path, required=True, help="a text file to fit (next-token loss)")
    tune.add_argument("--steps", type=int, default=20)
    tune.add_argument("--batch", type=int, default=4)
    tune.add_argument("--length", type=int, default=64, help="tokens per example")
    tune.add_argument("--lora-rank", type=int, default=4)
    tune.add_argument("--prompt-length", type=int, default=0, help="deep prompt positions (0: none)")
    tune.add_argument("--lr", type=float, default=1e-2)
    tune.add_argument("--codec", choices=["f32", "f16", "i8", "i4"], default="f32")
    tune.add_argument("--out", type=Path, required=True, help="where to write the tuned parameters (.safetensors)")
    tune.set_defaults(handler=run_tune)


def _spec(text: str, command: str):
    require_compute(f"dekube-node {command}")
    from ml.serve.catalog import ModelSpecError, parse_model

    try:
        return parse_model(text)
    except ModelSpecError as exc:
        raise CliError(str(exc)) from None


def run_serve(args: argparse.Namespace) -> int:
    spec = _spec(args.model, "serve")
    from ml.serve.catalog import ModelSpecError, parse_blocks

    auto = None
    if args.blocks and args.blocks.startswith("auto:"):
        count = args.blocks[5:]
        if not count.isdigit() or not 1 <= int(count) <= spec.config.layers:
            raise CliError(f"--blocks auto:N needs 1 <= N <= {spec.config.layers}")
        auto = int(count)
    try:
        blocks = (None if auto else parse_blocks(args.blocks, spec.config.layers) if args.blocks
                  else (0, spec.config.layers))
    except ModelSpecError as exc:
        raise CliError(str(exc)) from None
    return asyncio.run(_serve(spec, blocks, auto, args))


async def _coverage(host, spec, known: list[str]) -> list[tuple[int, int, float]]:
    """(start, end, measured tokens/s) of the known servers of this model that answer."""
    from ml.serve.client import ServerInfo, measure
    from ml.serve.protocol import RemoteError, SpanClient, SpanUnavailable

    coverage = []
    for addr in known:
        try:
            peer_id = await asyncio.wait_for(host.connect(addr), 15)
            span = SpanClient(host, peer_id, 0, 0, timeout=15)
            try:
                info = await span.info()
            finally:
                await span.close()
        except (OSError, ValueError, TimeoutError, ConnectionError, SpanUnavailable, RemoteError) as exc:
            print(f"dekube-node: known server {addr} unreachable: {exc}", file=sys.stderr)
            continue
        start, end = info.get("start"), info.get("end")
        if info.get("model") != spec.model_id or not isinstance(start, int) or not isinstance(end, int):
            continue
        server = ServerInfo(peer_id, start, end)
        speed = (await measure(host, [server], spec.config.width))[peer_id]
        if speed > 0 and 0 <= start < end <= spec.config.layers:
            coverage.append((start, end, speed))
    return coverage


async def _serve(spec, blocks: tuple[int, int] | None, auto: int | None, args: argparse.Namespace) -> int:
    from ml.serve import protocol
    from ml.serve.balance import choose_blocks
    from ml.serve.server import BlockServer
    from node.identity import Identity
    from node.p2p.host import Host

    host = Host(Identity.generate(), [args.listen])
    try:
        await host.start()
    except OSError as exc:
        raise CliError(f"cannot listen on {args.listen}: {exc}") from None
    try:
        if blocks is None:   # fill the gap in what the known servers cover
            blocks = choose_blocks(spec.config.layers, auto, await _coverage(host, spec, args.known))
        model = await asyncio.to_thread(spec.load_part, blocks, False)
        server = BlockServer(model, max_sessions=args.max_sessions)
        host.set_handler(protocol.PROTOCOL, protocol.make_handler(server, spec.model_id))
        addrs = [f"{addr}/p2p/{host.peer_id}" for addr in host.listen_addrs]
        print(json.dumps({"peer_id": host.peer_id, "addrs": addrs, "model": spec.model_id,
                          "blocks": f"{blocks[0]}:{blocks[1]}"}), flush=True)
        while True:
            await asyncio.sleep(60)
            server.expire()
    finally:
        await host.stop()


def _parse_server(text: str, layers: int) -> tuple[str, tuple[int, int]]:
    from ml.serve.catalog import ModelSpecError, parse_blocks

    addr, sep, blocks = text.rpartition("=")
    if not sep or "/p2p/" not in addr:
        raise CliError(f"--server needs MULTIADDR/p2p/<peer id>=A:B, got {text!r}")
    try:
        return addr, parse_blocks(blocks, layers)
    except ModelSpecError as exc:
        raise CliError(str(exc)) from None


def run_generate(args: argparse.Namespace) -> int:
    spec = _spec(args.model, "generate")
    from ml.serve.catalog import ModelSpecError

    servers = [_parse_server(s, spec.config.layers) for s in args.server]
    try:
        prompt = spec.encode(args.prompt)
    except ModelSpecError as exc:
        raise CliError(str(exc)) from None
    if not prompt or args.max_tokens < 1 or len(prompt) + args.max_tokens > spec.config.context:
        raise CliError(f"need a non-empty prompt and 1 <= prompt + max-tokens <= {spec.config.context}")
    tuned = _load_adapter(args.adapter, spec.config) if args.adapter else None
    if tuned is not None and tuned.prompt_length + len(prompt) + args.max_tokens > spec.config.context:
        raise CliError(f"prompt + soft prompt + max-tokens exceed the context of {spec.config.context}")
    print(json.dumps(asyncio.run(_generate(spec, servers, prompt, args, tuned))))
    return 0


def _load_adapter(path: Path, config):
    from ml.serve.adapters import AdapterError, ClientParams

    try:
        return ClientParams.load(path, config)
    except AdapterError as exc:
        raise CliError(str(exc)) from None


async def _connect_servers(host, servers) -> list:
    from ml.serve.client import ServerInfo

    infos = []
    for addr, (start, end) in servers:
        try:
            peer_id = await asyncio.wait_for(host.connect(addr), 15)
        except (OSError, ValueError, TimeoutError, ConnectionError) as exc:
            print(f"dekube-node: server {addr} unreachable: {exc}", file=sys.stderr)
            continue
        infos.append(ServerInfo(peer_id, start, end))
    return infos


async def _generate(spec, servers, prompt: list[int], args: argparse.Namespace, tuned) -> dict:
    from ml.serve.client import NoChain, RemoteGenerator, local_generate
    from node.identity import Identity
    from node.p2p.host import Host

    host = Host(Identity.generate())
    await host.start()
    try:
        infos = await _connect_servers(host, servers)
        ends = await asyncio.to_thread(spec.load_part, (0, 0), True)
        generator = RemoteGenerator(host, ends, infos, codec=args.codec, tuned=tuned)
        began = time.perf_counter()
        try:
            tokens = await generator.generate(prompt, args.max_tokens)
        except NoChain as exc:
            raise CliError(str(exc)) from None
        result = {"text": spec.decode(tokens), "tokens": tokens, "replays": generator.stats.replays,
                  "tokens_per_s": round(len(tokens) / (time.perf_counter() - began), 2)}
        if args.check_local:
            whole = await asyncio.to_thread(spec.load_part, None, True)
            local = await asyncio.to_thread(local_generate, whole, prompt, args.max_tokens, tuned)
            result["identical_to_local"] = local == tokens
        return result
    finally:
        await host.stop()


def run_tune(args: argparse.Namespace) -> int:
    spec = _spec(args.model, "tune")
    from ml.serve.catalog import ModelSpecError

    servers = [_parse_server(s, spec.config.layers) for s in args.server]
    try:
        tokens = spec.encode(args.text.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ModelSpecError) as exc:
        raise CliError(f"cannot use {args.text}: {exc}") from None
    if not 1 <= args.length <= spec.config.context - args.prompt_length - 1 or len(tokens) < args.length + 2:
        raise CliError(f"need 1 <= length <= {spec.config.context - args.prompt_length - 1} and a text longer "
                       "than one example")
    if args.steps < 1 or not 1 <= args.batch <= 16 or args.lora_rank < 0 or args.prompt_length < 0 \
            or args.lora_rank + args.prompt_length == 0:
        raise CliError("need steps >= 1, batch 1..16, and lora-rank > 0 or prompt-length > 0")
    result = asyncio.run(_tune(spec, servers, tokens, args))
    print(json.dumps(result))
    return 0


async def _tune(spec, servers, tokens: list[int], args: argparse.Namespace) -> dict:
    import torch

    from ml.serve.client import NoChain
    from ml.serve.tuner import RemoteTuner
    from node.identity import Identity
    from node.p2p.host import Host

    data = torch.tensor(tokens)
    gen = torch.Generator().manual_seed(0)

    def batch() -> torch.Tensor:
        offsets = torch.randint(0, len(tokens) - args.length - 1, (args.batch,), generator=gen)
        return torch.stack([data[o:o + args.length + 1] for o in offsets.tolist()])

    host = Host(Identity.generate())
    await host.start()
    try:
        infos = await _connect_servers(host, servers)
        ends = await asyncio.to_thread(spec.load_part, (0, 0), True)
        try:
            tuner = RemoteTuner(host, ends, infos, prompt_length=args.prompt_length, lora_rank=args.lora_rank,
                                codec=args.codec, lr=args.lr)
            held_out = batch()
            before = await tuner.loss(held_out)
            began = time.perf_counter()
            for _ in range(args.steps):
                await tuner.step(batch())
            step_s = (time.perf_counter() - began) / args.steps
            after = await tuner.loss(held_out)
            await tuner.close()
        except NoChain as exc:
            raise CliError(str(exc)) from None
        await asyncio.to_thread(tuner.tuned.save, args.out, {"model": spec.model_id})
        return {"loss_before": round(before, 4), "loss_after": round(after, 4), "steps": args.steps,
                "step_s": round(step_s, 4), "failovers": tuner.failovers, "out": str(args.out)}
    finally:
        await host.stop()
