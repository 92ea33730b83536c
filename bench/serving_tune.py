"""Steering a served char model toward one play (issue 14, item 3), measured.

The network's registry `char-transformer` is trained here on the Shakespeare corpus (all 42 texts'
first 90%), saved as the safetensors file `dekube-node serve --model FILE` takes, and split over
`--servers` block servers (Hosts on 127.0.0.1, each loading only its blocks through
`ml.serve.catalog.parse_model(FILE).load_part`, as the CLI does). A client holding only the ends
then fine-tunes parameters it owns (`RemoteTuner`: a soft prompt with deep prompts and rank-r LoRA
adapters on every block) on windows of one play's training text; the servers run the forward and
backward passes and never change their weights (checked: their state is hashed before and after).

Measured, on held-out text (each play's last 10%, never trained or tuned on):
- target_loss_before / _after: next-character loss (nats/char) on the target play;
- control_loss_before / _after: the same on another play (the adapter specializes, so the target
  gains more than the control);
- tune_step_s: one forward + backward step through the servers (batch x context chars);
- sample_before / sample_after: `--sample` characters generated greedily through the servers (at
  most what the context holds after the prompt), untuned and with the tuned parameters applied.

Prints one JSON object. Usage: python bench/serving_tune.py [--target macbeth] [--control twelfth_night]
[--train-steps 1500] [--tune-steps 150] [--servers 2]
"""
from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402
from safetensors.torch import save_file  # noqa: E402

from ml.registry import shakespeare  # noqa: E402
from ml.registry.models import CharTransformer  # noqa: E402
from ml.serve import protocol  # noqa: E402
from ml.serve.catalog import parse_model  # noqa: E402
from ml.serve.client import RemoteGenerator, ServerInfo  # noqa: E402
from ml.serve.handler import ServeHandler  # noqa: E402
from ml.serve.server import MAX_BATCH, BlockServer  # noqa: E402
from ml.serve.tuner import RemoteTuner  # noqa: E402
from node.identity import Identity  # noqa: E402
from node.p2p.host import Host  # noqa: E402


def train_char_model(args) -> CharTransformer:
    """The registry char-transformer trained on the whole corpus with AdamW."""
    torch.manual_seed(0)
    data = shakespeare.ShakespeareDataset(context=args.context)
    model = CharTransformer(data.vocab_size, context=args.context, width=args.width, layers=args.layers,
                            heads=args.heads)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, args.train_steps)
    for step in range(args.train_steps):
        inputs, targets = data.train_batch(step, 0, 1, args.batch, seed=0)
        loss = data.loss(model(inputs), targets)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        schedule.step()
    return model.eval()


def play_parts(name: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(training tokens, held-out tokens) of one play, split as the corpus splits it."""
    vocab = shakespeare.ShakespeareDataset().vocab
    text = (shakespeare._texts_dir() / f"{name}_gut.txt").read_text(encoding="ascii", errors="replace")
    tokens = torch.tensor([vocab.index(ch) for ch in text])
    cut = int(len(text) * (1 - shakespeare.VALIDATION_FRACTION))
    return tokens[:cut], tokens[cut:]


def windows(tokens: torch.Tensor, count: int, length: int, generator: torch.Generator | None = None) -> torch.Tensor:
    """`count` windows of `length` tokens: evenly spaced, or at random offsets with `generator`."""
    span = len(tokens) - length
    if generator is None:
        offsets = torch.linspace(0, span, count).long()
    else:
        offsets = torch.randint(0, span, (count,), generator=generator)
    return torch.stack([tokens[o:o + length] for o in offsets.tolist()])


async def held_out_loss(tuner: RemoteTuner, batch: torch.Tensor) -> float:
    """Mean next-character loss over `batch`, sent in pieces a server takes (MAX_BATCH windows)."""
    pieces = batch.split(MAX_BATCH)
    return round(sum([await tuner.loss(piece) * len(piece) for piece in pieces]) / len(batch), 4)


def state_digest(servers: list[BlockServer]) -> str:
    digest = hashlib.sha256()
    for server in servers:
        for key, tensor in sorted(server.model.state_dict().items()):
            digest.update(key.encode() + tensor.numpy().tobytes())
    return digest.hexdigest()


async def run(args) -> dict:
    began = time.perf_counter()
    model = await asyncio.to_thread(train_char_model, args)
    result: dict = {"setting": f"in-process Hosts on 127.0.0.1, {args.servers} servers, CPU",
                    "model": f"char-transformer {args.layers}x{args.width}, context {args.context}",
                    "train_steps": args.train_steps, "train_s": round(time.perf_counter() - began, 1),
                    "target": args.target, "control": args.control, "tune_steps": args.tune_steps,
                    "tune_batch": args.tune_batch, "lora_rank": args.lora_rank, "prompt_length": args.prompt_length}
    target_train, target_held = play_parts(args.target)
    _, control_held = play_parts(args.control)
    length = args.context - args.prompt_length   # the soft prompt takes positions of the context
    target_eval = windows(target_held, args.eval_windows, length + 1)
    control_eval = windows(control_held, args.eval_windows, length + 1)
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "char.safetensors"
        save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(path))
        spec = parse_model(str(path), heads=args.heads)
        bounds = [round(i * spec.config.layers / args.servers) for i in range(args.servers + 1)]
        hosts, infos, servers = [], [], []
        for start, end in zip(bounds, bounds[1:]):
            server = BlockServer(spec.load_part((start, end), ends=False))
            host = Host(Identity.generate())
            host.set_handler(protocol.PROTOCOL, ServeHandler(server, spec.model_id))
            await host.start()
            hosts.append(host)
            servers.append(server)
            infos.append(ServerInfo(host.peer_id, start, end))
        ends = spec.load_part((0, 0), ends=True)
    client = Host(Identity.generate())
    await client.start()
    for host in hosts:
        client.peerbook.add_addrs(host.peer_id, host.listen_addrs)
    before_digest = state_digest(servers)
    prompt = [shakespeare.ShakespeareDataset().vocab.index(ch) for ch in "\n\n"]
    sample_length = min(args.sample, args.context - len(prompt) - args.prompt_length)   # what the context holds
    try:
        sample = await RemoteGenerator(client, ends, infos).generate(prompt, sample_length)
        result["sample_before"] = spec.decode(sample)
        tuner = RemoteTuner(client, ends, infos, prompt_length=args.prompt_length, lora_rank=args.lora_rank,
                            lr=args.tune_lr, seed=1)
        result["target_loss_before"] = await held_out_loss(tuner, target_eval)
        result["control_loss_before"] = await held_out_loss(tuner, control_eval)
        gen = torch.Generator().manual_seed(7)
        losses, started = [], time.perf_counter()
        for _ in range(args.tune_steps):
            losses.append(await tuner.step(windows(target_train, args.tune_batch, length + 1, gen)))
        result["tune_step_s"] = round((time.perf_counter() - started) / args.tune_steps, 4)
        result["tune_train_loss_first_last"] = [round(losses[0], 4), round(losses[-1], 4)]
        result["target_loss_after"] = await held_out_loss(tuner, target_eval)
        result["control_loss_after"] = await held_out_loss(tuner, control_eval)
        tuned = tuner.tuned
        await tuner.close()
        sample = await RemoteGenerator(client, ends, infos, tuned=tuned).generate(prompt, sample_length)
        result["sample_after"] = spec.decode(sample)
        result["server_weights_unchanged"] = state_digest(servers) == before_digest
    finally:
        for host in [client, *hosts]:
            await host.stop()
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--target", default="macbeth", help="play to steer toward (a text name, no _gut.txt)")
    parser.add_argument("--control", default="twelfth_night")
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--width", type=int, default=128)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--context", type=int, default=128)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--train-steps", type=int, default=1500)
    parser.add_argument("--servers", type=int, default=2)
    parser.add_argument("--prompt-length", type=int, default=8)
    parser.add_argument("--lora-rank", type=int, default=8)
    parser.add_argument("--tune-steps", type=int, default=150)
    parser.add_argument("--tune-batch", type=int, default=16)
    parser.add_argument("--tune-lr", type=float, default=3e-3)
    parser.add_argument("--eval-windows", type=int, default=64)
    parser.add_argument("--sample", type=int, default=118, help="characters generated before and after tuning")
    args = parser.parse_args()
    for name in (args.target, args.control):
        if f"{name}_gut.txt" not in shakespeare.text_names():
            parser.error(f"no text {name!r}; one of: {', '.join(n[:-8] for n in shakespeare.text_names())}")
    print(json.dumps(asyncio.run(run(args))))


if __name__ == "__main__":
    main()
