"""Serving on CUDA (ADR 0179), run only where torch sees a CUDA device: greedy generation through two
CUDA block servers equals `local_generate` on CUDA bit for bit (f32, every hidden state compared by a
spot check on CUDA copies of the blocks), the servers announce their GPU's CUDA profile, a CPU client
never accuses them, a second CUDA server referees a lying one, and tuning through CUDA servers with CUDA
ends lowers the loss."""
import asyncio

import pytest
import torch

from ml.profiles import default_profile
from ml.serve import protocol
from ml.serve.client import RemoteGenerator, local_generate
from ml.serve.device import prepare_device, serving_profile
from ml.serve.model import DecoderConfig, random_decoder
from ml.serve.server import BlockServer
from ml.serve.tuner import RemoteTuner
from tests.serve.test_generation import Network

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device: torch sees none here")

CONFIG = DecoderConfig(vocab_size=64, context=128, width=64, layers=4, heads=4)
SEED = 11
PROMPT = [3, 14, 15, 9, 2, 6, 5, 35, 8, 9, 7, 9]


@pytest.fixture(scope="module")
def profile() -> str:
    assert prepare_device("cuda") == "cuda"   # deterministic cuBLAS/cuDNN, no TF32 (as training)
    return serving_profile("cuda")


def part(block_range, ends=False, device="cuda"):
    return random_decoder(CONFIG, SEED, block_range, ends).to(device)


def cuda_servers(ranges, profile: str, lie_after: dict[int, int] | None = None) -> tuple[Network, list[BlockServer]]:
    """CUDA block servers on their own Hosts (`lie_after`: index -> steps before it lies), a client Host,
    and the BlockServers as built."""
    made: list[BlockServer] = []

    def kind(index):
        def build(model):
            made.append(BlockServer(model, profile=profile, lie_after=(lie_after or {}).get(index)))
            return made[-1]
        return build

    return Network(lambda block_range, ends: part(block_range, ends), ranges,
                   {i: kind(i) for i in range(len(ranges))}), made


def test_generation_through_two_cuda_servers_equals_local_generate_on_cuda_bit_for_bit(profile):
    async def scenario():
        network, made = cuda_servers([(0, 2), (2, 4)], profile)
        async with network as net:
            span = protocol.SpanClient(net.client, net.servers[0].peer_id, 0, 2)
            info = await span.info()
            await span.close()
            generator = RemoteGenerator(net.client, part((0, 0), ends=True), net.servers, codec="f32")
            tokens = await generator.generate(PROMPT, 16)
            devices = {server.device.type for server in made}
            return info, generator, tokens, devices

    info, generator, tokens, devices = asyncio.run(scenario())
    assert devices == {"cuda"}
    assert profile.startswith("cuda-") and profile != default_profile("cpu")
    assert info["profile"] == profile and set(generator.profiles.values()) == {profile}
    whole = random_decoder(CONFIG, SEED)
    assert tokens == local_generate(whole, PROMPT, 16, device="cuda") and whole.device.type == "cuda"
    for index, span in enumerate(generator.spans):   # every answer equals a CUDA rerun, bit for bit
        check = generator.spot_check(index, part(span), profile)
        assert check.ok and check.unchecked == (), check
    for index, span in enumerate(generator.spans):   # a CPU client compares nothing and accuses no one
        check = generator.spot_check(index, part(span, device="cpu"), default_profile("cpu"))
        assert check.ok and check.culprit is None and len(check.unchecked) == 1


def test_a_second_cuda_server_referees_a_cuda_server(profile):
    async def scenario():
        ranges = [(0, 2), (2, 4), (0, 2), (2, 4)]   # the chain, then a second server of each range
        async with cuda_servers(ranges, profile, lie_after={0: 4})[0] as net:
            generator = RemoteGenerator(net.client, part((0, 0), ends=True), net.servers[:2], codec="f32")
            await generator.generate(PROMPT, 10)
            lying = await generator.spot_check_remote(0, net.servers[2], part((0, 2), ends=False), same_profile=True)
            honest = await generator.spot_check_remote(1, net.servers[3], same_profile=True)
            return net.servers, lying, honest

    infos, lying, honest = asyncio.run(scenario())
    assert honest.ok and honest.unchecked == ()
    assert not lying.ok and lying.culprit == infos[0].peer_id and lying.unchecked == ()
    assert lying.first_bad_step == 4


def test_tuning_with_cuda_ends_through_cuda_servers_lowers_the_loss(profile):
    pattern = torch.tensor([5, 9, 1, 7, 3] * 8)
    batch = torch.stack([pattern[i:i + 25] for i in range(4)])

    async def scenario():
        async with cuda_servers([(0, 2), (2, 4)], profile)[0] as net:
            tuner = RemoteTuner(net.client, part((0, 0), ends=True), net.servers, prompt_length=2, lora_rank=2,
                                lr=0.05)
            try:
                before = await tuner.loss(batch)
                for _ in range(8):
                    await tuner.step(batch)
                return before, await tuner.loss(batch), tuner.tuned
            finally:
                await tuner.close()

    before, after, tuned = asyncio.run(scenario())
    assert after < before
    assert all(t.device.type == "cpu" for t in (tuned.lora_a, tuned.lora_b, tuned.input_prompt, tuned.deep_prompts))
