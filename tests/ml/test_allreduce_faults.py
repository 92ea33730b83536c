"""A peer SIGKILLed mid-round among 4 processes over loopback: the survivors finish the round, in
bounded time, with bit-identical results over the participant set they report, and the next round
runs without the dead peer. Modes: ring and butterfly all-reduce, and "allgather" (top-k 1% with
error feedback over `allgather_mean`). Run as a script, this file is one worker process."""
import asyncio
import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[2]
PEERS = 4
NUMEL = 1 << 20
CHUNK = 1 << 15
ROUNDS = 3
KILL_ROUND = 1


TOPK = {"ratio": 0.01}


def contribution(index: int, round_id: int) -> torch.Tensor:
    return torch.randn(NUMEL, generator=torch.Generator().manual_seed(1000 * round_id + index))


def sent_contribution(index: int, round_id: int, mode: str) -> torch.Tensor:
    """What peer `index` contributes in `round_id` as everyone sees it (all-gather: the decoding of
    its top-k encoding, with the error feedback of its earlier rounds)."""
    if mode != "allgather":
        return contribution(index, round_id)
    from ml.train.compression import Compressor

    compressor = Compressor("topk", TOPK)
    for r in range(round_id + 1):
        encoded = compressor.encode(contribution(index, r))
    return compressor.decode(encoded, NUMEL)


async def worker(index: int, mode: str, codec: str, kill_after: str) -> None:
    from ml.allreduce import AllReduceError, AllReduceGroup, DeadlinePolicy, TcpTransport
    from ml.allreduce.wire import Kind

    me = f"peer{index}"
    names = [f"peer{i}" for i in range(PEERS)]
    transport = TcpTransport(me)
    host, port = await transport.start()
    policy = DeadlinePolicy(floor_s=2.0, initial_s=5.0, first_frame_grace_s=5.0)
    group = AllReduceGroup(transport, me, names, mode="butterfly" if mode == "allgather" else mode, codec=codec,
                           chunk_numel=CHUNK, deadlines=policy)
    await group.start()  # before anyone learns our port: a stream for an unset protocol is reset
    print(f"PORT {port}", flush=True)
    line = await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
    transport.addresses.update({peer: ("127.0.0.1", p) for peer, p in json.loads(line).items()})
    if kill_after:  # "part:K[:S]" or "result:K[:S]": SIGKILL ourselves S seconds (default 0.02) after
        # queuing the K-th such frame of KILL_ROUND
        kind, count, *delay = kill_after.split(":")
        delay_s = float(delay[0]) if delay else 0.02
        watched, seen = Kind[kind.upper()], [0]
        real_send = group._links.send

        async def send_then_maybe_die(peer, frame):
            await real_send(peer, frame)
            if frame.round_id == KILL_ROUND and frame.kind == watched:
                seen[0] += 1
                if seen[0] == int(count):
                    await asyncio.sleep(delay_s)  # let the writers put some of it on the wire
                    os.kill(os.getpid(), signal.SIGKILL)

        group._links.send = send_then_maybe_die
    from ml.train.compression import Compressor

    compressor = Compressor("topk", TOPK)  # all-gather mode: error feedback stays with the worker
    for round_id in range(ROUNDS):
        start = time.monotonic()
        try:
            if mode == "allgather":
                encoded = compressor.encode(contribution(index, round_id))
                result = await group.allgather_mean(encoded, compressor.codec, [(NUMEL,)], round_id)
            else:
                result = await group.allreduce([contribution(index, round_id)], round_id)
        except AllReduceError as exc:
            print("ERROR " + json.dumps({"round": round_id, "error": str(exc)}), flush=True)
            continue
        values = result.tensors[0]
        print("RESULT " + json.dumps({
            "round": round_id, "participants": list(result.participants), "attempts": result.attempts,
            "excluded": sorted(result.excluded), "seconds": time.monotonic() - start,
            "sha": hashlib.sha256(values.numpy().tobytes()).hexdigest(), "sum": float(values.double().sum()),
        }), flush=True)
    await group.close()
    await transport.close()


def run_group(mode: str, codec: str, victim: int, kill_after: str, timeout: float = 120.0):
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
    procs = [subprocess.Popen([sys.executable, __file__, str(i), mode, codec, kill_after if i == victim else ""],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env, cwd=REPO)
             for i in range(PEERS)]
    try:
        ports = {}
        for i, proc in enumerate(procs):
            line = proc.stdout.readline()
            assert line.startswith("PORT "), line
            ports[f"peer{i}"] = int(line.split()[1])
        for proc in procs:
            proc.stdin.write(json.dumps(ports) + "\n")
            proc.stdin.flush()
        deadline = time.monotonic() + timeout
        outputs = []
        for proc in procs:
            out, _ = proc.communicate(timeout=max(1.0, deadline - time.monotonic()))
            outputs.append([json.loads(line.split(" ", 1)[1]) for line in out.splitlines()
                            if line.startswith(("RESULT ", "ERROR "))])
        return procs, outputs
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def reference_sum(participants, round_id, mode):
    values = [sent_contribution(int(p[4:]), round_id, mode) for p in sorted(participants)]
    acc = values[0].clone()
    for v in values[1:]:
        acc.add_(v)
    return float(acc.div_(len(values)).double().sum())


def check_survivors(procs, outputs, victim, mode):
    assert procs[victim].returncode == -signal.SIGKILL
    survivors = [i for i in range(PEERS) if i != victim]
    for i in survivors:
        assert procs[i].returncode == 0
        assert [r["round"] for r in outputs[i]] == list(range(ROUNDS)), outputs[i]
    for round_id in range(ROUNDS):
        results = [outputs[i][round_id] for i in survivors]
        assert all("sha" in r for r in results), results
        first = results[0]
        assert all(r["sha"] == first["sha"] and r["participants"] == first["participants"] for r in results)
        expected = [f"peer{i}" for i in range(PEERS)]
        if round_id > KILL_ROUND:
            expected = [f"peer{i}" for i in survivors]
            assert f"peer{victim}" in first["excluded"]
        if round_id != KILL_ROUND:
            assert first["participants"] == expected
        else:  # the dead peer is in the set only if its contribution made it into every shard
            assert set(first["participants"]) >= {f"peer{i}" for i in survivors}
            assert max(r["seconds"] for r in results) < 15.0
        assert abs(first["sum"] - reference_sum(first["participants"], round_id, mode)) < 1e-3
    return outputs


@pytest.mark.parametrize("mode,kill_after", [
    ("butterfly", "result:4"),    # a reducer dies while broadcasting its shard (docs/adr/0090)
    ("ring", "part:4"),           # a ring member dies during the reduce-scatter
    pytest.param("butterfly", "part:10", marks=pytest.mark.slow),  # dies while sending its parts
    pytest.param("allgather", "part:1:0", marks=pytest.mark.slow),  # dies mid-send: one peer got its encoding
])
def test_sigkilled_peer_survivors_agree_and_continue(mode, kill_after):
    procs, outputs = run_group(mode, "fp32", victim=1, kill_after=kill_after)
    check_survivors(procs, outputs, victim=1, mode=mode)


@pytest.mark.slow
def test_sigkilled_peer_with_int8_codec():
    procs, outputs = run_group("butterfly", "int8", victim=2, kill_after="result:4")
    assert procs[2].returncode == -signal.SIGKILL
    for round_id in range(ROUNDS):
        shas = {outputs[i][round_id]["sha"] for i in (0, 1, 3)}
        assert len(shas) == 1


if __name__ == "__main__":
    asyncio.run(worker(int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4] if len(sys.argv) > 4 else ""))
