"""The verification adversaries on a devnet of real processes (1 validator, 6 compute nodes): each
scenario restarts one compute node with an adversary mode (`DEKUBE_COMPUTE_FAULT_INJECT`), submits a
task that all five portable-profile nodes work on, waits until it is paid and reads from the chain who
was found guilty and whose stake went down.

Two nodes stay special throughout: one is started with `ATEN_CPU_CAPABILITY=avx512` in its environment
(the honest verifier "on another kernel capability" of issue 11: the portable profile overrides it, so
its replays give the workers' bits), and one runs native kernels (`[compute] portable_cpu = false`): it
publishes no portable profile, so the ledger never draws it to train or judge a portable task.
bench/verification.py --devnet prints what `run_devnet_scenarios` returns (`python -m
devtools.verification_devnet` from an environment without the portable profile's variables: the
nodes apply it themselves, and the native node must not inherit it).
"""
from __future__ import annotations

import tempfile
import time
from pathlib import Path

from consensus.state.tasks import task_id_for
from consensus.tx import build_tx
from devtools.devnet import ComputeDevnet
from ml.compute.task_spec import submit_payload
from ml.profiles import portable_cpu_profile, torch_release
from ml.train.spec import TrainSpec
from node.ledger import jsonrpc

PRICE = 100_000
WORKERS = 5
SCENARIOS: tuple[tuple[str, int | None, str], ...] = (   # name, compute node index, fault_inject
    ("honest", None, ""), ("lazy", 1, "lazy"), ("poison_zero", 2, "poison_zero"), ("copycat", 3, "copycat"),
    ("partial_q0.5", 1, "partial:0.5"), ("false_accuser", 0, "false_accuser"), ("rubber_stamp", 0, "rubber_stamp"))
CROSS, NATIVE = 4, 5          # compute node indices with the special environments
PARAMS = {"audit_answer_s": 45, "dispute_s": 20, "audit_window_s": 12}   # seconds of block time (ADR 0187)


def _rpc(net: ComputeDevnet, method: str, *params):
    return jsonrpc.call(net.rpc_url, method, *params)


def _submit(net: ComputeDevnet, spec: TrainSpec, profile: str) -> str:
    faucet = net.testnet.faucet()
    nonce = _rpc(net, "dkb_getTransactionCount", faucet.peer_id, "pending")
    tx = build_tx(faucet, net.testnet.chain_id, nonce, "submit_task", submit_payload(spec, WORKERS, PRICE, profile))
    _rpc(net, "dkb_sendRawTransaction", tx.raw.hex())
    return task_id_for(faucet.peer_id, nonce).hex()


def _wait_paid(net: ComputeDevnet, task_id: str, timeout: float) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        task = _rpc(net, "dkb_getTask", task_id)
        if task is not None and task["status"] in ("paid", "expired", "rejected", "failed"):
            return task
        time.sleep(0.5)
    raise TimeoutError(f"task {task_id} not paid in {timeout:g} s: {_rpc(net, 'dkb_getTask', task_id)}")


def _stakes(net: ComputeDevnet) -> dict[str, int]:
    return {n.peer_id: _rpc(net, "dkb_getStake", n.peer_id)["bonded"] for n in net.compute}


def _restart(net: ComputeDevnet, index: int, env: dict[str, str]) -> None:
    node = net.compute[index]
    net.testnet.stop_node(node)
    net.start_compute(node, env)
    net.wait_registered([node], 120)


def _base_env(index: int) -> dict[str, str]:
    if index == CROSS:
        return {"ATEN_CPU_CAPABILITY": "avx512"}
    if index == NATIVE:
        return {"DEKUBE_COMPUTE_PORTABLE_CPU": "false"}
    return {}


def run_devnet_scenarios(root: Path | None = None, steps: int = 60, segment_steps: int = 5,
                         timeout: float = 400) -> dict:
    """Run every scenario once; a JSON-able summary."""
    spec = TrainSpec(steps=steps, segment_steps=segment_steps, report_every=steps)
    profile = portable_cpu_profile(torch_release())
    with tempfile.TemporaryDirectory(prefix="dekube-vdevnet-") as tmp:
        net = ComputeDevnet.create(Path(root or tmp), validators=1, compute=6, params=PARAMS)
        results: dict = {}
        try:
            net.testnet.up(wait_height=1, timeout=120)
            for i, node in enumerate(net.compute):
                net.start_compute(node, _base_env(i))
            net.wait_registered(net.compute, 180)
            cross, native = net.compute[CROSS].peer_id, net.compute[NATIVE].peer_id
            for name, index, mode in SCENARIOS:
                if index is not None:
                    _restart(net, index, {**_base_env(index), "DEKUBE_COMPUTE_FAULT_INJECT": mode})
                before = _stakes(net)
                started = time.monotonic()
                task = _wait_paid(net, _submit(net, spec, profile), timeout)
                after = _stakes(net)
                adversary = net.compute[index].peer_id if index is not None else None
                slots = task.get("slots") or []
                slashed = sorted(p for p in before if after[p] < before[p])
                judges = {v["verifier"] for s in slots for v in s["verifiers"] if v.get("answer")}
                judges |= {r["referee"] for s in slots for r in s.get("referees") or [] if r.get("vote")}
                results[name] = {
                    "status": task["status"], "seconds": round(time.monotonic() - started, 1),
                    "caught": adversary is not None and (adversary in slashed),
                    "slashed": len(slashed), "honest_slashed": len([p for p in slashed if p != adversary]),
                    "guilty_slots": sum(s["outcome"] == "guilty" for s in slots), "slots": len(slots),
                    "cross_capability_judged": cross in judges, "cross_capability_slashed": cross in slashed,
                    "native_assigned": native in task["workers"] or native in judges,
                }
                if index is not None:
                    _restart(net, index, _base_env(index))
        finally:
            net.down(timeout=10)
    results["honest_slashed_cross_capability"] = sum(r["cross_capability_slashed"] for r in results.values()
                                                      if isinstance(r, dict))
    return results


if __name__ == "__main__":
    import json

    print(json.dumps(run_devnet_scenarios()))
