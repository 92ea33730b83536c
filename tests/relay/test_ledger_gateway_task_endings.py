"""The node's ``tasks`` topic carries the task endings of ADR 0151 to a ledger gateway subscriber:
``rejection`` and ``rejected`` (a worker's reject_task), ``expired`` (no workers in time)."""
import asyncio

from ledger_testnet import LedgerTestnet

from consensus.state.tasks import task_id_for
from node.identity import Identity
from node.ledger import RESYNC

CPU, GPU = "cpu-x86-64-avx2/torch-2.13.0", "cuda-nvidia-h100-cc9.0-cuda12.8/torch-2.13.0"
SPEC = {"model": "m", "dataset": "d", "hyperparams": {}, "sync_mode": "allreduce", "codec": "fp16", "price": 100,
        "profile": CPU, "segments": 4}
HW = {"cpu_cores": 2, "ram_mb": 1000, "gpu": "", "gpu_mem_mb": 0, "bandwidth_mbps": 50, "profiles": [CPU]}


async def next_event(stream, name: str, timeout: float = 20.0) -> dict:
    async def find():
        async for event in stream:
            if event is not RESYNC and event.get("event") == name:
                return event
    return await asyncio.wait_for(find(), timeout)


def test_tasks_topic_carries_rejected_and_expired(tmp_path):
    owner, worker = Identity.generate(), Identity.generate()
    net = LedgerTestnet(tmp_path, 1, {owner.peer_id: 10**6, worker.peer_id: 10**6},
                        params={"task_assign_s": 3, "reject_fee": 10, "audits_per_worker": 0})  # no verifier here

    async def main():
        await net.start()
        gateway, working = net.client(owner), net.client(worker)
        tasks = gateway.subscribe("tasks")
        try:
            assert await anext(tasks) is RESYNC
            await working.send("register_node", {"roles": ["compute"], "listen_addrs": [], "relay_addrs": [],
                                                 "hardware": HW})
            await working.send("bond", {"amount": 500})
            # a GPU task on a chain without GPUs: expires with the reason
            await gateway.send("submit_task", {**SPEC, "workers": 1, "device": "cuda", "profile": GPU})
            expired = await next_event(tasks, "expired")
            assert expired["task_id"] == task_id_for(owner.peer_id, 0).hex()
            assert f"needs 1 compute node for device cuda running profile {GPU}; 0 eligible" in expired["reason"]
            assert (await gateway.call("dkb_getTask", expired["task_id"]))["status"] == "expired"
            # a CPU task: assigned to the worker, which rejects it
            await gateway.send("submit_task", {**SPEC, "workers": 1})
            task_id = task_id_for(owner.peer_id, 1).hex()
            assigned = await next_event(tasks, "assigned")
            assert assigned["task_id"] == task_id and assigned["workers"] == [worker.peer_id]
            await working.send("reject_task", {"task_id": bytes.fromhex(task_id), "reason": "NaN loss at step 1"})
            rejection = await next_event(tasks, "rejection")
            assert rejection["worker"] == worker.peer_id and rejection["reason"] == "NaN loss at step 1"
            rejected = await next_event(tasks, "rejected")
            assert rejected["rejections"] == {worker.peer_id: "NaN loss at step 1"}
            # a lone rejecter's rejection is not corroborated: no fee, the owner gets it all (ADR 0192)
            assert rejected["payouts"] == {owner.peer_id: 100}
            info = await gateway.call("dkb_getTask", task_id)
            assert info["status"] == "rejected" and info["rejections"] == rejected["rejections"]
        finally:
            await tasks.aclose()
            await net.stop()

    asyncio.run(asyncio.wait_for(main(), 90))
