"""Serving throughput on one machine: generation through chained block servers vs layer-by-layer
offloading from disk, recovery from a killed server, and a prompt-tuning step.

Servers and client are Hosts in this process on 127.0.0.1 (real Noise/yamux streams, no added
latency or bandwidth limit: bench/serving_netlab.py is the version with NAT'd servers and delay
lines). The model is `random_decoder` at the given size (default 12 blocks of width 768, ~86M
parameters), split evenly over `--servers` servers plus one spare for the middle range.

- tokens_per_s: greedy generation of `--new` tokens after a `--prompt`-token prompt, bit-exact mode.
- identical_output: those tokens equal `local_generate` on the whole model (same_tokens_as_local:
  how many positions agree, for the lossy codecs); wire_bytes_per_token: frames both ways.
- offload_tokens_per_s: the same model run locally, each block's weights read from its own
  safetensors file for every step, as a user with too little memory would, with each file's pages
  dropped from the page cache after every read so the reads hit the disk (bench/offload.py;
  offload_warm_tokens_per_s: the same with the page cache warm; offload_disk_read_MB: what the
  kernel fetched from storage, the check that the cold reads were real); over `--offload-new` tokens.
- recover_s: the time from the failed step to the replacement's answer (open + prefix replay) when
  the middle server is stopped half-way through a generation.
- tune_step_s, tune_loss_before/after: `--tune-steps` steps of fitting a rank-4 LoRA adapter (the
  client's, on every block) to a repeating 16-byte text, batch 4 x 64, forward + backward through
  the servers (the spare-less chain left after the kill); the loss is measured on that batch.

`--device auto|cpu|cuda` (default auto: CUDA when torch sees it) is where the servers, the client's
ends, the local reference and the tuner compute (docs/adr/0179), recorded as "device" with the
execution "profile"; offloading stays on the CPU (its point is a machine without the memory), so
on CUDA offload_identical_prefix compares CPU tokens with the CUDA reference and may be false.

Prints one JSON object. Usage: python bench/serving.py [--layers 12 --width 768 --heads 12]
[--servers 3] [--prompt 64] [--new 128] [--offload-new 16] [--codec f32] [--tune-steps 10] [--device auto]
"""
from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from bench.offload import offload_figures  # noqa: E402
from ml.serve import protocol  # noqa: E402
from ml.serve.client import RemoteGenerator, ServerInfo, local_generate  # noqa: E402
from ml.serve.device import prepare_device, serving_profile  # noqa: E402
from ml.serve.handler import ServeHandler  # noqa: E402
from ml.serve.model import DecoderConfig, random_decoder  # noqa: E402
from ml.serve.server import BlockServer  # noqa: E402
from ml.serve.tuner import time_lora_tuning  # noqa: E402
from node.identity import Identity  # noqa: E402
from node.p2p.host import Host  # noqa: E402

SEED = 1


async def run(args) -> dict:
    device = prepare_device(args.device)
    profile = serving_profile(device)
    config = DecoderConfig(vocab_size=256, context=max(512, args.prompt + args.new + 8), width=args.width,
                           layers=args.layers, heads=args.heads)
    bounds = [round(i * config.layers / args.servers) for i in range(args.servers + 1)]
    ranges = list(zip(bounds, bounds[1:]))
    middle = ranges[len(ranges) // 2]
    hosts, infos = [], []
    for start, end in ranges + [middle]:
        host = Host(Identity.generate())
        server = BlockServer(random_decoder(config, SEED, (start, end), ends=False).to(device), profile=profile)
        host.set_handler(protocol.PROTOCOL, ServeHandler(server, config.model_id(SEED)))
        await host.start()
        hosts.append(host)
        infos.append(ServerInfo(host.peer_id, start, end))
    client = Host(Identity.generate())
    await client.start()
    for host in hosts:
        client.peerbook.add_addrs(host.peer_id, host.listen_addrs)
    ends = random_decoder(config, SEED, (0, 0), ends=True).to(device)
    prompt = [int(t) for t in torch.randint(0, 256, (args.prompt,), generator=torch.Generator().manual_seed(3))]
    result: dict = {"setting": "in-process Hosts on 127.0.0.1, no added latency", "layers": config.layers,
                    "width": config.width, "servers": args.servers, "prompt": args.prompt, "new": args.new,
                    "codec": args.codec, "threads": torch.get_num_threads(), "device": device, "profile": profile}
    try:
        generator = RemoteGenerator(client, ends, infos, codec=args.codec)
        began = time.perf_counter()
        tokens = await generator.generate(prompt, args.new)
        result["tokens_per_s"] = round(args.new / (time.perf_counter() - began), 2)
        result["wire_bytes_per_token"] = round((generator.stats.bytes_sent + generator.stats.bytes_received)
                                               / args.new)

        whole = random_decoder(config, SEED)
        began = time.perf_counter()
        expected = await asyncio.to_thread(local_generate, whole, prompt, args.new, None, device)
        result["local_tokens_per_s"] = round(args.new / (time.perf_counter() - began), 2)
        result["identical_output"] = tokens == expected
        result["same_tokens_as_local"] = sum(a == b for a, b in zip(tokens, expected))

        with tempfile.TemporaryDirectory(dir=args.offload_dir) as folder:
            result |= await asyncio.to_thread(offload_figures, whole.cpu(), Path(folder), prompt, args.offload_new,
                                              expected)
        del whole

        victim_index = len(ranges) // 2
        generator = RemoteGenerator(client, ends, infos, codec=args.codec)
        original = generator._through_chain

        async def step_and_kill(hidden):
            if generator.stats.steps == args.new // 2:
                await hosts[victim_index].stop()
            return await original(hidden)

        generator._through_chain = step_and_kill
        recovered = await generator.generate(prompt, args.new)
        result["recover_s"] = round(generator.stats.recover_s[0], 4) if generator.stats.recover_s else None
        result["recovered_identical_output"] = recovered == expected
        result["replays"] = generator.stats.replays

        live = [info for i, info in enumerate(infos) if i != victim_index]
        # fine-tuning a LoRA adapter (rank 4) on a repeating 16-byte text through the servers
        result |= await time_lora_tuning(client, ends, live, args.codec, args.tune_lr, args.tune_steps)
    finally:
        for host in [client, *hosts]:
            await host.stop()
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--width", type=int, default=768)
    parser.add_argument("--heads", type=int, default=12)
    parser.add_argument("--servers", type=int, default=3)
    parser.add_argument("--prompt", type=int, default=64)
    parser.add_argument("--new", type=int, default=128)
    parser.add_argument("--offload-new", type=int, default=16)
    parser.add_argument("--offload-dir", help="disk-backed directory for the offloaded block files (default: $TMPDIR)")
    parser.add_argument("--codec", default="f32", choices=["f32", "f16", "int8", "int4"])
    parser.add_argument("--tune-steps", type=int, default=10)
    parser.add_argument("--tune-lr", type=float, default=1e-2)
    parser.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"],
                        help="where servers, ends and the local reference compute (auto: CUDA when present)")
    args = parser.parse_args()
    print(json.dumps(asyncio.run(run(args))))


if __name__ == "__main__":
    main()
