"""The GPT-style decoder of devtools/gpt_decoder.py as a user's task on the product path (issue 23 item 5):
a local devnet (1 validator, 3 compute node processes on loopback TCP, sharing this machine's cores;
``--workers`` of them train), the owner's node holding the exported ``.pt2`` and a token file, a task in
streaming DiLoCo int4 (two fragments, the outer all-reduce overlapped) cut into ``--epochs`` epochs. The
workers fetch the inputs from the owner, dry-run the archive, train with their all-reduce over TCP and
commit each epoch's records and state; the ledger's verifiers replay drawn segments; the task is paid
epoch by epoch; the owner fetches the weights from the workers (checked against the ledger's result),
loads them strictly into its own ``GPT`` and evaluates them on the held-out tokens.

``--config big`` is the ~100M model (12 layers, width 768; ``--context`` tokens per window), ``tiny`` the CI
size that tests/models/test_gpt_task_e2e.py runs. Prints one JSON object: parameters, archive bytes, the
status, slots' outcomes, payouts, each worker's utilization and seconds per step (dkb_taskProgress), the
owner's held-out loss of the initial and the fetched weights, and the wall times.

    python bench/gpt_task.py                                   # tiny: about a minute
    python bench/gpt_task.py --config big --context 64 --workers 2 --steps 16 --inner-steps 4 --batch 1 \
        --lr 3e-4 --train-windows 64 --expected-s 900          # the ~100M model: 2 workers, the third verifies
"""
from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
from safetensors.torch import load_file  # noqa: E402

from bench.crew_change import FINAL, devnet_crew, seat_usage, slot_outcomes, submit  # noqa: E402
from bench.gpt_decoder import tokens  # noqa: E402
from cli.client_node import client_node  # noqa: E402
from devtools.devnet import ComputeDevnet  # noqa: E402
from devtools.gpt_decoder import BIG, GPT, TINY, GPTConfig, export_archive  # noqa: E402
from ml.train.spec import TrainSpec  # noqa: E402

CONFIGS = {"tiny": TINY, "big": BIG}


def held_out_loss(model: GPT, path: Path, context: int) -> float:
    """The mean next-token cross entropy of ``model`` over the windows of the token file at ``path``."""
    stream = load_file(str(path))["tokens"]
    windows = (len(stream) - 1) // context
    x = stream[:windows * context].view(windows, context)
    y = stream[1:windows * context + 1].view(windows, context)
    with torch.no_grad():
        logits = model(x)
        return float(torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1)))


def task_spec(ids: dict[str, str], args) -> TrainSpec:
    return TrainSpec(model="pt2", dataset="file", model_artifact=ids["model"], dataset_artifact=ids["train"],
                     eval_artifact=ids["eval"], mode="streaming-diloco", codec="int4", optimizer="adamw", lr=args.lr,
                     steps=args.steps, inner_steps=args.inner_steps, fragments=2, overlap_steps=1,
                     warmup_steps=args.inner_steps, batch_size=args.batch, report_every=args.inner_steps, seed=5)


async def run_task(net: ComputeDevnet, config: GPTConfig, args, root: Path) -> dict:
    """Export the model, submit it as the owner's task, follow it to its end, fetch and check the weights."""
    started = time.monotonic()
    user = await asyncio.to_thread(export_archive, config, root / "gpt.pt2")
    train = tokens(root / "train.safetensors", config.vocab, args.train_windows * config.context + 1, 0)
    held_out = tokens(root / "eval.safetensors", config.vocab, 4 * config.context + 1, 1)
    initial_loss = await asyncio.to_thread(held_out_loss, user, held_out, config.context)
    crew = devnet_crew(net)
    async with client_node(net.testnet.faucet(), listen="/ip4/127.0.0.1/tcp/0", data_dir=root / "owner") as owner:
        ids = {name: await owner.artifacts.add_file(path)
               for name, path in (("model", root / "gpt.pt2"), ("train", train), ("eval", held_out))}
        spec = task_spec(ids, args)
        sources = [a if "/p2p/" in a else f"{a}/p2p/{owner.peer_id}" for a in owner.host.listen_addrs
                   if "/0.0.0.0/" not in a]
        task_id = await asyncio.to_thread(submit, crew, spec, args.epochs, args.expected_s, args.workers,
                                          sources=sources)
        submitted = time.monotonic()

        async def task() -> dict:
            return await asyncio.to_thread(crew.call, "dkb_getTask", task_id) or {}
        deadline = submitted + args.expected_s * 4 + 900
        while (doc := await task()).get("status") not in FINAL and len(doc.get("commits", {})) < args.workers:
            if time.monotonic() > deadline:
                raise TimeoutError(f"no results in time: {doc}")
            await asyncio.sleep(2.0)
        usage = {w[:16]: await asyncio.to_thread(seat_usage, crew, w, task_id) for w in doc.get("workers", [])}
        trained = time.monotonic()
        while (doc := await task()).get("status") not in FINAL:
            if time.monotonic() > deadline + 1800:
                raise TimeoutError(f"the task did not end: {doc}")
            await asyncio.sleep(2.0)
        ended = time.monotonic()
        fetched_loss = None
        if doc["status"] == "paid":
            for worker in doc["workers"]:
                info = await asyncio.to_thread(crew.call, "dkb_getNode", worker)
                owner.host.peerbook.add_addrs(worker, info["listen_addrs"])
            path = await owner.artifacts.fetch(doc["result"], list(doc["commits"]))
            user.load_state_dict(load_file(str(path)), strict=True)   # the owner's own class takes them
            fetched_loss = await asyncio.to_thread(held_out_loss, user, held_out, config.context)
    fetched = time.monotonic()
    return {"config": args.config, "params": sum(v.numel() for v in user.state_dict().values()),
            "archive_bytes": (root / "gpt.pt2").stat().st_size, "context": config.context, "status": doc["status"],
            "steps": spec.steps, "outer_steps": spec.outer_steps, "epochs": args.epochs, "mode": spec.mode,
            "codec": spec.codec, "batch": spec.batch_size, "slots": slot_outcomes(doc), "payouts": doc.get("payouts"),
            "workers_usage": usage, "eval_loss_initial": round(initial_loss, 4),
            "eval_loss_fetched": None if fetched_loss is None else round(fetched_loss, 4),
            "train_s": round(trained - submitted, 1), "audit_s": round(ended - trained, 1),
            "fetch_s": round(fetched - ended, 1), "wall_s": round(fetched - started, 1),
            "transport": crew.transport}


def run(args) -> dict:
    sizes = {name: getattr(args, name) for name in ("context", "layers", "width", "heads") if getattr(args, name)}
    config = replace(CONFIGS[args.config], **sizes)
    with tempfile.TemporaryDirectory(prefix="dkb-gpt-task-") as folder:
        root = Path(folder)
        net = ComputeDevnet.create(root / "devnet", validators=1, compute=3)
        try:
            net.up(timeout=120)
            return asyncio.run(run_task(net, config, args, root))
        finally:
            net.down(timeout=5)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", choices=sorted(CONFIGS), default="tiny")
    parser.add_argument("--context", type=int, help="tokens per window (default: the config's)")
    for size in ("layers", "width", "heads"):
        parser.add_argument(f"--{size}", type=int, help=f"the decoder's {size} (default: the config's)")
    parser.add_argument("--steps", type=int, default=32)
    parser.add_argument("--inner-steps", type=int, default=4)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--workers", type=int, default=3, help="the crew (of 3 compute nodes; the rest verify)")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--lr", type=float, default=1e-2)
    parser.add_argument("--train-windows", type=int, default=512, help="training windows in the token file")
    parser.add_argument("--expected-s", type=int, default=60, help="the declared work (deadlines derive from it)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_arguments(parser)
    print(json.dumps(run(parser.parse_args())))


if __name__ == "__main__":
    main()
