"""Top-k and sign with error feedback over real all-reduce groups (`AllGatherAverager`): the same
bits as the in-process simulation round after round, residuals kept across rounds and through
checkpoints, a member dying mid-broadcast, and training jobs over worker processes that end exactly
where the simulation does."""
import asyncio

import loopback_groups
import pytest
import torch
from loopback_groups import close_all, ids

from ml.allreduce import DeadlinePolicy
from ml.allreduce.wire import Kind
from ml.compute.local_job import run_local_job
from ml.train.allreduce_averager import AllGatherAverager, averager_for_group, group_codec
from ml.train.averaging import LocalAveragingGroup
from ml.train.recipes import recipe
from ml.train.simulation import train_simulated

FAST = DeadlinePolicy(floor_s=0.5, initial_s=1.0, first_frame_grace_s=0.5, ceiling_s=5.0)
SHAPES = [(64, 32), (32,), (10, 32)]


async def make_groups(n, **kwargs):
    return await loopback_groups.make_groups(n, chunk_numel=1024, **kwargs)


def gradients(rank, round_id):
    gen = torch.Generator().manual_seed(100 * round_id + rank)
    return [torch.randn(shape, generator=gen) for shape in SHAPES]


@pytest.mark.parametrize("codec,options", [("topk", {"ratio": 0.05}), ("sign", {})])
def test_network_averages_and_residuals_equal_the_simulations_round_after_round(codec, options):
    world, rounds = 3, 4

    async def main():
        groups, transports = await make_groups(world)
        averagers = [AllGatherAverager(g, codec, options) for g in groups]
        simulated = LocalAveragingGroup(world, codec, options)
        try:
            for round_id in range(rounds):
                grads = [gradients(rank, round_id) for rank in range(world)]
                real = await asyncio.gather(*(a.average(g, round_id) for a, g in zip(averagers, grads)))
                sim = await asyncio.gather(*(simulated.member(r).average(grads[r], round_id) for r in range(world)))
                for r in range(world):
                    assert all(torch.equal(a, b) for a, b in zip(real[r].tensors, sim[r].tensors))
                    assert real[r].participants == tuple(ids(world))
                    assert torch.equal(averagers[r].compressor.residual, simulated.member(r).compressor.residual)
                assert averagers[0].compressor.residual.abs().sum() > 0  # something was held back
            state = averagers[1].state_dict()
        finally:
            await close_all(groups, transports)
        restored = AllGatherAverager(None, codec, options)
        restored.load_state_dict(state)
        assert torch.equal(restored.compressor.residual, averagers[1].compressor.residual)

    asyncio.run(asyncio.wait_for(main(), 90))


def test_top_k_and_sign_train_over_fp32_groups_through_the_all_gather_averager():
    spec = recipe("digits-data-parallel", codec="topk", codec_options={"ratio": 0.01})
    assert group_codec(spec) == "fp32" and group_codec(recipe("digits-data-parallel", codec="sign+lz4")) == "fp32"
    assert isinstance(averager_for_group(spec, group=None), AllGatherAverager)


def test_a_member_dying_mid_broadcast_leaves_survivors_with_the_same_result_over_the_reported_set():
    codec, options, world = "topk", {"ratio": 0.01}, 4

    async def main():
        groups, transports = await make_groups(world, deadlines=FAST)
        averagers = [AllGatherAverager(g, codec, options) for g in groups]
        victim = groups[3]
        real_send = victim._links.send
        died = asyncio.Event()

        async def send_to_peer0_then_die(peer, frame):
            if frame.kind == Kind.PART and peer != "peer0":
                await asyncio.sleep(3600)  # it dies before this goes out
            await real_send(peer, frame)
            if frame.kind == Kind.PART:
                await asyncio.sleep(0.05)  # let it reach the wire
                died.set()

        victim._links.send = send_to_peer0_then_die
        grads = [gradients(rank, 0) for rank in range(world)]
        victim_task = asyncio.ensure_future(averagers[3].average(grads[3], 0))
        survivors = asyncio.gather(*(a.average(g, 0) for a, g in zip(averagers[:3], grads)))
        await died.wait()
        victim_task.cancel()
        await victim.close(linger_s=0)
        await transports[3].close()
        try:
            results = await survivors
        finally:
            await close_all(groups[:3], transports[:3])
        return results, averagers

    results, averagers = asyncio.run(asyncio.wait_for(main(), 60))
    participants = results[0].participants
    assert {"peer0", "peer1", "peer2"} <= set(participants)
    for r in results:
        assert r.participants == participants
        assert all(torch.equal(a, b) for a, b in zip(r.tensors, results[0].tensors))
    # the result is the mean of exactly the reported participants' encodings
    members = [int(p[4:]) for p in participants]
    simulated = LocalAveragingGroup(len(members), codec, options)

    async def reference():
        return await asyncio.gather(*(simulated.member(i).average(gradients(rank, 0), 0)
                                      for i, rank in enumerate(members)))

    expected = asyncio.run(reference())[0]
    assert all(torch.equal(a, b) for a, b in zip(results[0].tensors, expected.tensors))


@pytest.mark.parametrize("codec,options,world", [
    ("topk", {"ratio": 0.01}, 2),
    pytest.param("sign", {}, 3, marks=pytest.mark.slow),
])
def test_a_job_over_worker_processes_ends_bit_for_bit_where_the_simulation_does(codec, options, world):
    """So the simulated convergence figures (tests/ml/test_train_convergence.py) hold over the network."""
    spec = recipe("digits-data-parallel", codec=codec, codec_options=options, steps=20, segment_steps=5,
                  report_every=10)
    results = asyncio.run(run_local_job(spec, world, transport="tcp", timeout=300))
    simulated = train_simulated(spec, world)
    assert [r["participants"] for r in results] == [[f"worker-{i}" for i in range(world)]] * world
    assert {r["params_hash"] for r in results} == {simulated.trainers[0].params_hash()}
    assert results[0]["segment_hashes"] == simulated.trainers[0].segment_hashes
    assert results[0]["bytes_sent"] < simulated.trainers[0].bytes_sent * 1.3  # all-gather + frame headers


@pytest.mark.slow
def test_top_k_job_over_four_processes_converges():
    spec = recipe("digits-data-parallel", codec="topk", codec_options={"ratio": 0.01}, steps=300)
    results = asyncio.run(run_local_job(spec, 4, transport="tcp", timeout=600))
    assert len({r["params_hash"] for r in results}) == 1
    assert results[0]["metrics"]["accuracy"] > 93
