"""The .pt2 exponent bomb as a soak fault (issue 22 item 1 in the soak, docs/adr/0197).

The attacker, a throwaway identity funded from the soak's faucet, serves a torch.export archive whose
input shape expression is ``2**2**2**2**5`` (before ADR 0184 a node that loaded it computed the
number exactly: 100 s at 100% CPU, 6 GB) and a small valid .npz from its own artifact host, and
submits one-worker tasks naming them, one every `BOMB_EVERY_S`, in the victim compute node's
profile. The network needs a second compute node (a worker is assigned only when another node can
audit it), so the ledger gives each task to the victim or the other node; whoever gets it fetches the
archive, checks it and rejects the task. Verdict, beside `Watch`'s (the chain commits, the victim's
``/health`` answers): within `VERDICT_S` of the last submission every bomb task given to a worker has
ended without pay (rejected or expired), and at least one was given.
"""
from __future__ import annotations

import asyncio
import contextlib
import io
import json
import sys
import tempfile
import zipfile
from pathlib import Path

from devtools.perturb.network import Member, PerturbNet
from devtools.testnet import FAUCET_KEY

BOMB_EXPR = "2**2**2**2**5"
BOMB_EVERY_S = 5.0
VERDICT_S = 60.0            # within attacks.ATTACKER_JOIN_S
RECEIPT_WAIT_S = 10.0
PRICE = 100                 # pays < 100 to its one worker: covered by a compute node's default 1,000 bond
FAILED_ENDS = ("rejected", "expired", "failed", "cancelled")


def bomb_archive(path: Path) -> Path:
    """A tiny linear model exported with a dynamic batch, its batch size rewritten to `BOMB_EXPR`."""
    import torch

    clean = path.with_suffix(".clean.pt2")
    model = torch.nn.Linear(8, 4)
    batch = {0: torch.export.Dim("batch", min=1, max=65536)}
    torch.export.save(torch.export.export(model, (torch.rand(4, 8),), dynamic_shapes=(batch,)), str(clean))
    with zipfile.ZipFile(clean) as zin, zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zout:
        for info in zin.infolist():
            data = zin.read(info.filename)
            if info.filename.split("/", 1)[-1] == "models/model.json":
                graph = json.loads(data)
                values = graph["graph_module"]["graph"]["tensor_values"]
                name = next(k for k, v in values.items() if v["sizes"] and "as_expr" in v["sizes"][0])
                values[name]["sizes"][0]["as_expr"]["expr_str"] = BOMB_EXPR
                data = json.dumps(graph).encode()
            zout.writestr(info.filename, data)
    clean.unlink()
    return path


def small_dataset() -> bytes:
    import numpy as np

    rng = np.random.default_rng(0)
    out = io.BytesIO()
    np.savez(out, x=rng.random((64, 8), dtype=np.float32), y=rng.integers(0, 4, 64).astype(np.int64))
    return out.getvalue()


def _rpc(net: PerturbNet, method: str, *params):
    from node.ledger import jsonrpc

    return jsonrpc.call(net.validators[0].spec.rpc_url, method, *params)


def _send(net: PerturbNet, identity, tx_type: str, payload: dict) -> int:
    """Send one transaction and wait for its receipt; its nonce, or RuntimeError with the ledger's reason."""
    import time

    from consensus.tx import build_tx

    nonce = _rpc(net, "dkb_getTransactionCount", identity.peer_id, "pending")
    tx = build_tx(identity, net.testnet.chain_id, nonce, tx_type, payload)
    tx_hash = _rpc(net, "dkb_sendRawTransaction", tx.raw.hex())
    deadline = time.monotonic() + RECEIPT_WAIT_S
    while (receipt := _rpc(net, "dkb_getTransactionReceipt", tx_hash)) is None:
        if time.monotonic() > deadline:
            raise RuntimeError(f"{tx_type}: no receipt in {RECEIPT_WAIT_S:g} s")
        time.sleep(0.2)
    if receipt["status"] != "ok":
        raise RuntimeError(f"{tx_type}: {receipt['status']}: {receipt['log']}")
    return nonce


def _bomb_payload(model: str, data: str, profile: str, source: str) -> dict:
    from ml.compute.task_spec import submit_payload
    from ml.train.spec import TrainSpec

    spec = TrainSpec(model="pt2", dataset="file", model_artifact=model, dataset_artifact=data, optimizer="sgd",
                     lr=0.1, steps=4, batch_size=8, segment_steps=2, report_every=2)
    return {**submit_payload(spec, 1, PRICE, profile), "sources": [source]}


async def pt2_bomb_attack(net: PerturbNet, victim: Member, stop: asyncio.Event, found: list[str]) -> None:
    from consensus.state.tasks import task_id_for
    from node.artifacts.service import ArtifactService
    from node.identity import Identity
    from node.keystore import load_identity
    from node.p2p.host import Host

    faucet = await asyncio.to_thread(load_identity, net.root / FAUCET_KEY)
    attacker = Identity.generate()
    with tempfile.TemporaryDirectory(prefix="pt2-bomb-") as scratch:
        bomb = await asyncio.to_thread(bomb_archive, Path(scratch) / "bomb.pt2")
        host = Host(attacker, ["/ip4/127.0.0.1/tcp/0"])
        await host.start()
        service = ArtifactService(host, Path(scratch) / "store")
        tasks: list[str] = []
        try:
            model = await service.add_bytes(bomb.read_bytes())
            data = await service.add_bytes(small_dataset())
            source = f"{host.listen_addrs[0]}/p2p/{host.peer_id}"
            node = await asyncio.to_thread(_rpc, net, "dkb_getNode", victim.spec.peer_id)
            profiles = (node or {}).get("hardware", {}).get("profiles") or []
            if not profiles:
                found.append(f"pt2 bomb: {victim.name} has no ledger record with a profile")
                return
            await asyncio.to_thread(_send, net, faucet, "transfer", {"to": attacker.peer_id, "amount": 100 * PRICE})
            refused: list[str] = []
            while not stop.is_set():
                try:
                    nonce = await asyncio.to_thread(_send, net, attacker, "submit_task",
                                                    _bomb_payload(model, data, profiles[0], source))
                    tasks.append(task_id_for(attacker.peer_id, nonce).hex())
                except Exception as exc:  # noqa: BLE001 - reported in the verdict when no task got through
                    refused.append(str(exc))
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), BOMB_EVERY_S)
            if not tasks:
                found.append(f"pt2 bomb: the ledger took no bomb task ({'; '.join(refused[:2])})")
                return
            found.extend(await _verdict(net, victim, tasks))
        finally:
            with contextlib.suppress(Exception):
                await host.stop()
            service.close()


async def _verdict(net: PerturbNet, victim: Member, tasks: list[str]) -> list[str]:
    """Wait up to `VERDICT_S` for every bomb task given to the victim to end unpaid."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + VERDICT_S
    while True:
        records = [await asyncio.to_thread(_rpc, net, "dkb_getTask", t) for t in tasks]
        given = [r for r in records if r and r.get("workers")]
        paid = [r for r in given if r["status"] == "paid"]
        held = [r for r in given if r["status"] not in FAILED_ENDS and r["status"] != "paid"]
        if paid:
            return [f"pt2 bomb: a worker was paid for {len(paid)} bomb task(s)"]
        if given and not held:
            mine = sum(victim.spec.peer_id in r["workers"] for r in given)
            ends = sorted(f"{r['status']}" + (" by its worker" if r.get("rejections") else "") for r in given)
            print(f"[pt2_bomb] {len(tasks)} bomb tasks submitted, {len(given)} given ({mine} to {victim.name}): "
                  f"{', '.join(ends)}", file=sys.stderr)
            return []
        if loop.time() > deadline:
            if not given:
                return [f"pt2 bomb: none of {len(tasks)} bomb tasks was given to a compute node"]
            return [f"pt2 bomb: {len(held)} of {len(given)} bomb tasks still open {VERDICT_S:g} s after the "
                    f"attack ({held[0]['status']})"]
        await asyncio.sleep(1.0)
