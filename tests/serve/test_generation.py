"""Serving over real Hosts on 127.0.0.1: greedy generation through chained block servers equals the
whole model run locally (bit-exact mode), also with a server killed mid-way and replaced; lossy
codecs stay close; prompt tuning through the servers lowers a loss; the server protocol refuses junk."""
import asyncio
import struct

import pytest
import torch

from ml.registry.models import CharTransformer
from ml.serve import protocol
from ml.serve.adapters import AdapterError, ClientParams
from ml.serve.client import NoChain, RemoteGenerator, ServerInfo, local_generate, measure, plan_chain
from ml.serve.delta import DeltaBook, DeltaError, check_ids
from ml.serve.handler import ServeHandler
from ml.serve.model import DecoderConfig, ServeDecoder, config_from_state, random_decoder
from ml.serve.protocol import RemoteError, SpanClient
from ml.serve.server import BlockServer
from ml.serve.tuner import RemoteTuner
from ml.serve.wire import decode_frame, encode_frame, frame_length, roundtrip
from node.identity import Identity
from node.p2p.host import Host

CONFIG = DecoderConfig(vocab_size=48, context=128, width=32, layers=6, heads=4)
SEED = 7
PROMPT = [3, 14, 15, 9, 2, 6, 5, 35, 8, 9]


def char_model_state():
    torch.manual_seed(0)
    return CharTransformer(40, 64, width=64, layers=3).state_dict()


class Network:
    """Block servers on their own Hosts plus a client Host that knows their addresses."""

    def __init__(self, build, ranges, server_classes=None):
        self.build, self.ranges = build, ranges
        self.server_classes = server_classes or {}
        self.hosts: list[Host] = []
        self.servers: list[ServerInfo] = []
        self.client = Host(Identity.generate())

    async def __aenter__(self):
        for index, (start, end) in enumerate(self.ranges):
            host = Host(Identity.generate())
            server = self.server_classes.get(index, BlockServer)(self.build((start, end), False))
            host.set_handler(protocol.PROTOCOL, ServeHandler(server, "test-model", host=host))
            await host.start()
            self.hosts.append(host)
            self.servers.append(ServerInfo(host.peer_id, start, end))
        await self.client.start()
        for host in self.hosts:
            self.client.peerbook.add_addrs(host.peer_id, host.listen_addrs)
        return self

    async def __aexit__(self, *exc):
        for host in [self.client, *self.hosts]:
            await host.stop()


def random_build(block_range, ends):
    return random_decoder(CONFIG, SEED, block_range, ends)


def test_char_transformer_weights_load_and_match_the_registry_model():
    torch.manual_seed(0)
    reference = CharTransformer(40, 64, width=64, layers=3)
    model = ServeDecoder(config_from_state(reference.state_dict()))
    model.load_parts(reference.state_dict())
    tokens = torch.randint(0, 40, (2, 30))
    assert torch.equal(model(tokens), reference(tokens))
    part = ServeDecoder(model.config, (1, 2), ends=False)
    part.load_parts(reference.state_dict())
    assert torch.equal(part.blocks["1"].attn.qkv.weight, reference.blocks[1].attn.qkv.weight)


def test_random_parts_have_the_whole_models_weights():
    whole = random_decoder(CONFIG, SEED).state_dict()
    part = random_decoder(CONFIG, SEED, (2, 4), ends=False).state_dict()
    assert part and all(torch.equal(whole[k], v) for k, v in part.items())
    other = random_decoder(CONFIG, SEED + 1, (2, 4), ends=False).state_dict()
    assert not torch.equal(other["blocks.2.attn.qkv.weight"], part["blocks.2.attn.qkv.weight"])


def test_kv_cache_steps_match_a_full_forward():
    model = random_decoder(CONFIG, SEED)
    tokens = torch.randint(0, CONFIG.vocab_size, (1, 20))
    caches = model.new_caches(1, 20)
    with torch.no_grad():
        pieces = [model.run_blocks(model.embed_tokens(tokens[:, :12]), caches)]
        pieces += [model.run_blocks(model.embed_tokens(tokens[:, i:i + 1], i), caches) for i in range(12, 20)]
        torch.testing.assert_close(model.logits(torch.cat(pieces, 1)), model(tokens), atol=1e-5, rtol=1e-5)


def test_plan_chain_tiles_blocks_and_skips_dead_servers():
    servers = [ServerInfo("a", 0, 3), ServerInfo("b", 3, 6), ServerInfo("c", 0, 2), ServerInfo("d", 2, 6),
               ServerInfo("e", 3, 6)]
    assert [s.peer_id for s in plan_chain(servers, 6)] == ["a", "b"]
    assert [s.peer_id for s in plan_chain(servers, 6, dead={"b"})] == ["a", "e"]
    assert [s.peer_id for s in plan_chain(servers, 6, dead={"a"})] == ["c", "d"]
    speed = {"a": 5.0, "b": 1.0, "c": 5.0, "d": 5.0, "e": 9.0}
    assert [s.peer_id for s in plan_chain(servers, 6, speed=speed)] == ["a", "e"]     # 0.31 s vs 0.4 and 1.2
    speed["e"] = 0.0     # unreachable when measured
    assert [s.peer_id for s in plan_chain(servers, 6, speed=speed)] == ["c", "d"]     # 0.4 s beats 1.2 s
    assert [s.peer_id for s in plan_chain(servers, 6, start=3)] == ["b"]
    with pytest.raises(NoChain):
        plan_chain(servers, 6, dead={"a", "c"})


@pytest.mark.parametrize("ranges", [[(0, 2), (2, 4), (4, 6)], [(0, 4), (4, 6)]])
def test_greedy_generation_through_servers_equals_local(ranges):
    expected = local_generate(random_decoder(CONFIG, SEED), PROMPT, 24)

    async def scenario():
        async with Network(random_build, ranges) as net:
            generator = RemoteGenerator(net.client, random_build((0, 0), True), net.servers, codec="f32")
            return await generator.generate(PROMPT, 24), generator.stats

    tokens, stats = asyncio.run(scenario())
    assert tokens == expected and stats.replays == 0 and stats.steps == 24


def test_char_transformer_generation_through_servers_equals_local():
    state = char_model_state()
    config = config_from_state(state)

    def build(block_range, ends):
        model = ServeDecoder(config, block_range, ends)
        model.load_parts(state)
        return model

    expected = local_generate(build(None, True), [1, 2, 3, 4, 5], 20)

    async def scenario():
        async with Network(build, [(0, 1), (1, 3)]) as net:
            return await RemoteGenerator(net.client, build((0, 0), True), net.servers).generate([1, 2, 3, 4, 5], 20)

    assert asyncio.run(scenario()) == expected


def test_a_server_killed_mid_generation_is_replaced_and_the_output_continues():
    expected = local_generate(random_decoder(CONFIG, SEED), PROMPT, 90)

    async def scenario():
        # the middle range has two servers; the one in use dies after 70 tokens (a 70-chunk replay)
        async with Network(random_build, [(0, 2), (2, 4), (2, 4), (4, 6)]) as net:
            generator = RemoteGenerator(net.client, random_build((0, 0), True), net.servers, codec="f32")
            original_step = generator._through_chain

            async def step_and_kill(hidden):
                if generator.stats.steps == 70:
                    victim = generator.chain[1].peer_id
                    await next(h for h in net.hosts if h.peer_id == victim).stop()
                return await original_step(hidden)

            generator._through_chain = step_and_kill
            tokens = await generator.generate(PROMPT, 90)
            return tokens, generator.stats, generator.dead, net.servers

    tokens, stats, dead, servers = asyncio.run(scenario())
    assert tokens == expected
    assert stats.replays == 1 and dead == {servers[1].peer_id}


def test_no_replacement_means_a_clear_error():
    async def scenario():
        async with Network(random_build, [(0, 3), (3, 6)]) as net:
            generator = RemoteGenerator(net.client, random_build((0, 0), True), net.servers)
            original_step = generator._through_chain

            async def step_and_kill(hidden):
                if generator.stats.steps == 3:
                    await net.hosts[1].stop()
                return await original_step(hidden)

            generator._through_chain = step_and_kill
            await generator.generate(PROMPT, 10)

    with pytest.raises(NoChain, match="3:6"):
        asyncio.run(scenario())


@pytest.mark.parametrize("codec,bound", [("f16", 2e-2), ("int8", 1e-1), ("int4", 4e-1)])
def test_lossy_codecs_keep_hidden_states_close(codec, bound):
    local = random_decoder(CONFIG, SEED)
    tokens = torch.tensor([PROMPT])

    async def scenario():
        async with Network(random_build, [(0, 3), (3, 6)]) as net:
            hidden = local.embed_tokens(tokens)
            spans = [SpanClient(net.client, s.peer_id, s.start, s.end) for s in net.servers]
            for span in spans:
                hidden = await span.forward(hidden, None, codec)
            sent = sum(span.bytes_sent for span in spans)
            for span in spans:
                await span.close()
            return hidden, sent

    with torch.no_grad():
        reference = local.run_blocks(local.embed_tokens(tokens))
    remote, sent = asyncio.run(scenario())
    error = float((remote - reference).abs().max() / reference.abs().max())
    assert 0 < error < bound
    assert sent < 2 * 4 * reference.numel()   # compressed below fp32


def local_tuning_grads(params: dict, batch: torch.Tensor, prompt_length: int) -> dict:
    """The gradients of the tuning loss by local autograd through the whole model."""
    local = random_decoder(CONFIG, SEED)
    for param in local.parameters():
        param.requires_grad_(False)
    leaves = {name: p.detach().clone().requires_grad_(True) for name, p in params.items()}
    hidden = local.embed_tokens(batch[:, :-1], offset=prompt_length)
    prompts = lora = None
    if prompt_length:
        soft = (leaves["input_prompt"] + local.position[:prompt_length]).expand(batch.shape[0], -1, -1)
        hidden = torch.cat([soft, hidden], 1)
        prompts = leaves["deep_prompts"].unsqueeze(1).expand(-1, batch.shape[0], -1, -1)
    if "lora_a" in leaves:
        lora = (leaves["lora_a"], leaves["lora_b"])
    logits = local.logits(local.run_blocks(hidden, prompts=prompts, lora=lora))[:, prompt_length:]
    torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), batch[:, 1:].reshape(-1)).backward()
    return {name: leaf.grad for name, leaf in leaves.items()}


@pytest.mark.parametrize("prompt_length,lora_rank,steps,lr", [(8, 0, 40, 3e-2), (0, 4, 30, 1e-2), (4, 2, 30, 1e-2)],
                         ids=["prompts", "lora", "both"])
def test_tuning_through_servers_lowers_the_loss_with_exact_gradients(prompt_length, lora_rank, steps, lr):
    # the tiny task: continue a fixed repeating pattern the random model does not know
    pattern = torch.tensor([5, 9, 1, 7, 3] * 5)
    batch = torch.stack([pattern[i:i + 17] for i in range(4)])

    async def scenario():
        async with Network(random_build, [(0, 3), (3, 6)]) as net:
            tuner = RemoteTuner(net.client, random_build((0, 0), True), net.servers, prompt_length=prompt_length,
                                lora_rank=lora_rank, lr=lr)
            before = await tuner.loss(batch)
            start = {name: p.detach().clone() for name, p in tuner.params.items()}
            losses = [await tuner.step(batch)]
            first_grads = {name: p.grad.clone() for name, p in tuner.params.items()}
            losses += [await tuner.step(batch) for _ in range(steps - 1)]
            after = await tuner.loss(batch)
            await tuner.close()
            return before, losses, after, start, first_grads

    before, losses, after, start, first_grads = asyncio.run(scenario())
    assert after < 0.9 * before and after < losses[steps // 2] < losses[0], (before, after)
    assert losses[0] == pytest.approx(before, rel=1e-5)
    expected = local_tuning_grads(start, batch, prompt_length)
    assert set(first_grads) == set(expected)
    for name, grad in expected.items():
        torch.testing.assert_close(first_grads[name], grad, atol=1e-6, rtol=1e-4)


@pytest.mark.parametrize("kind", ["lora", "prompts", "both"])
def test_generation_with_tuned_parameters_equals_local_and_changes_the_output(kind):
    gen = torch.Generator().manual_seed(3)
    fields = {}
    if kind in ("lora", "both"):
        fields["lora_a"] = torch.randn(CONFIG.layers, 2, CONFIG.width, generator=gen)
        fields["lora_b"] = torch.randn(CONFIG.layers, 3 * CONFIG.width, 2, generator=gen)
    if kind in ("prompts", "both"):
        fields["input_prompt"] = torch.randn(3, CONFIG.width, generator=gen)
        fields["deep_prompts"] = torch.randn(CONFIG.layers, 3, CONFIG.width, generator=gen)
    tuned = ClientParams(**fields)
    whole = random_decoder(CONFIG, SEED)
    expected = local_generate(whole, PROMPT, 30, tuned)
    assert expected != local_generate(whole, PROMPT, 30)

    async def scenario():
        # a server dies mid-way: the replay must apply the prompts to the replayed first chunk again
        async with Network(random_build, [(0, 2), (2, 6), (2, 6)]) as net:
            generator = RemoteGenerator(net.client, random_build((0, 0), True), net.servers, tuned=tuned)
            original_step = generator._through_chain

            async def step_and_kill(hidden):
                if generator.stats.steps == 12:
                    await net.hosts[1].stop()
                return await original_step(hidden)

            generator._through_chain = step_and_kill
            tokens = await generator.generate(PROMPT, 30)
            checks = [generator.spot_check(i, random_build(span, False)).ok for i, span in enumerate(generator.spans)]
            return tokens, generator.stats.replays, checks

    tokens, replays, checks = asyncio.run(scenario())
    assert tokens == expected and replays == 1 and all(checks)


def test_tuned_parameters_are_checked_and_saved(tmp_path):
    with pytest.raises(AdapterError, match="lora must be"):
        ClientParams(torch.zeros(6, 2, 32), torch.zeros(6, 96, 3)).check(CONFIG)
    with pytest.raises(AdapterError, match="input_prompt with deep_prompts"):
        ClientParams(input_prompt=torch.zeros(2, 32)).check(CONFIG)
    tuned = ClientParams(input_prompt=torch.randn(2, 32), deep_prompts=torch.randn(6, 2, 32)).check(CONFIG)
    tuned.save(tmp_path / "a.safetensors")
    loaded = ClientParams.load(tmp_path / "a.safetensors", CONFIG)
    assert torch.equal(loaded.deep_prompts, tuned.deep_prompts) and loaded.lora_a is None
    (tmp_path / "junk").write_bytes(b"junk")
    with pytest.raises(AdapterError, match="cannot read"):
        ClientParams.load(tmp_path / "junk", CONFIG)


def test_server_weights_never_change():
    server = BlockServer(random_decoder(CONFIG, SEED, (0, 3), ends=False))
    before = {k: v.clone() for k, v in server.model.state_dict().items()}
    hidden = torch.randn(2, 8, CONFIG.width)
    lora = (torch.randn(3, 2, CONFIG.width), torch.randn(3, 3 * CONFIG.width, 2))
    grads = server.backward(hidden, torch.randn_like(hidden), torch.randn(3, 2, 2, CONFIG.width), lora)
    assert sorted(grads) == ["grad_h", "grad_lora_a", "grad_lora_b", "grad_prompts"]
    assert all(torch.equal(before[k], v) for k, v in server.model.state_dict().items())
    assert all(p.grad is None for p in server.model.parameters())


async def _first_reply(net, payload: bytes) -> dict:
    stream = await net.client.open_stream(net.servers[0].peer_id, protocol.PROTOCOL)
    await stream.write(payload)
    length = frame_length(await asyncio.wait_for(stream.readexactly(4), 5))
    reply = decode_frame(await stream.readexactly(length)).header
    await stream.close()
    return reply


@pytest.mark.parametrize("payload,expect", [
    (struct.pack(">I", 1 << 30), "exceeds"),                                             # oversized
    (struct.pack(">II", 8, 100) + b"\0" * 4, "out of bounds"),                           # header overruns
    (encode_frame({"type": "step", "chunks": [2]}, {"h": torch.zeros(1, 2, CONFIG.width)}), "open a session"),
    (encode_frame({"type": "open", "max_length": 10 ** 9}), "max_length"),
    (encode_frame({"type": "nope"}), "unknown request"),
    (encode_frame({"type": "forward", "codec": "f32"}, {"h": torch.zeros(1, 2, CONFIG.width + 1)}), "hidden states"),
    (encode_frame({"type": "forward", "codec": "bf9"}, {"h": torch.zeros(1, 2, CONFIG.width)}), "unknown codec"),
    (encode_frame({"type": "forward"}, {"h": torch.zeros(1, 2, CONFIG.width), "lora_a": torch.zeros(6, 2, 32)}),
     "both lora_a and lora_b"),
    (encode_frame({"type": "forward"}, {"h": torch.zeros(1, 2, CONFIG.width), "lora_a": torch.zeros(6, 2, 32),
                                        "lora_b": torch.zeros(6, 96, 3)}), "lora must be"),
    (encode_frame({"type": "backward"}, {"h": torch.zeros(1, 2, CONFIG.width), "grad": torch.zeros(1, 3, 32)}),
     "grad must have"),
], ids=["oversized", "header-overrun", "step-before-open", "huge-session", "unknown-type", "wrong-width",
        "unknown-codec", "half-adapter", "adapter-rank-mismatch", "grad-shape"])
def test_hostile_frames_get_an_error_and_the_server_lives_on(payload, expect):
    async def scenario():
        async with Network(random_build, [(0, 6)]) as net:
            reply = await _first_reply(net, payload)
            info = await SpanClient(net.client, net.servers[0].peer_id, 0, 6).info()
            return reply, info

    reply, info = asyncio.run(scenario())
    assert reply["type"] == "error" and expect in reply["error"]
    assert info["start"] == 0 and info["end"] == 6


def test_session_limits_are_enforced():
    clock = [0.0]
    server = BlockServer(random_decoder(CONFIG, SEED, (0, 2), ends=False), max_sessions=3, max_sessions_per_owner=2,
                         max_cache_bytes=300_000, ttl_s=10, clock=lambda: clock[0], unknown_sessions=3)
    server.open_session("a", 32)
    with pytest.raises(ValueError, match="room"):
        server.open_session("b", 64, batch=16)
    server.open_session("b", 8)
    with pytest.raises(ValueError, match="per client"):
        server.open_session("c", 8)
    server.open_session("c", 8, owner="other")
    # full: a newcomer evicts an idle session of the client holding the most (ADR 0186)
    server.open_session("d", 8, owner="third")
    assert sorted(server.sessions) == ["b", "c", "d"]
    # one each now, none stale; but the first client was admitted twice recently (ADR 0197), so a
    # newcomer takes its session; then every holder was admitted once: the next one is refused
    server.open_session("e", 8, owner="fourth")
    assert sorted(server.sessions) == ["c", "d", "e"]
    with pytest.raises(ValueError, match="full"):
        server.open_session("f", 8, owner="fifth")
    with pytest.raises(ValueError, match="cannot take"):
        server.step("c", [torch.zeros(1, 9, CONFIG.width)])
    out = server.step("c", [torch.zeros(1, 5, CONFIG.width), torch.zeros(1, 1, CONFIG.width)])
    assert out.shape == (1, 1, CONFIG.width) and server.sessions["c"].usage.tokens == 6
    assert server.sessions["c"].usage.flops > 0
    clock[0] = 11.0
    assert sorted(server.expire()) == ["c", "d", "e"] and not server.sessions


def test_a_refused_open_is_a_remote_error():
    async def scenario():
        async with Network(random_build, [(0, 6)]) as net:
            span = SpanClient(net.client, net.servers[0].peer_id, 0, 6)
            try:
                await span.open(CONFIG.context + 1)
            finally:
                await span.close()

    with pytest.raises(RemoteError, match="max_length"):
        asyncio.run(scenario())


def test_step_chunks_must_cover_the_hidden_states():
    async def scenario():
        async with Network(random_build, [(0, 6)]) as net:
            span = SpanClient(net.client, net.servers[0].peer_id, 0, 6)
            await span.open(16)
            errors = []
            for chunks in ([1], [3, 0], "x", [True, 1]):
                try:
                    await span.request({"type": "step", "chunks": chunks}, {"h": torch.zeros(1, 2, CONFIG.width)})
                except RemoteError as exc:
                    errors.append(str(exc))
            out = await span.step([torch.zeros(1, 2, CONFIG.width), torch.zeros(1, 1, CONFIG.width)], "f32")
            usage = (await span.request({"type": "step", "chunks": [1]}, {"h": torch.zeros(1, 1, CONFIG.width)}))
            passes = await span.request({"type": "forward"}, {"h": torch.zeros(2, 5, CONFIG.width)})
            await span.close()
            return errors, out, usage.header["usage"], passes.header["usage"]

    errors, out, usage, passes = asyncio.run(scenario())
    assert len(errors) == 4 and all("chunks" in e for e in errors)
    assert out.shape == (1, 1, CONFIG.width)
    assert usage["tokens"] == 4 and usage["flops"] > 4 * 2 * 6 * CONFIG.block_params()
    assert passes["tokens"] == 10


def test_measured_speed_picks_live_servers_and_a_dead_one_measures_zero():
    async def scenario():
        async with Network(random_build, [(0, 3), (0, 3), (3, 6)]) as net:
            await net.hosts[0].stop()
            speed = await measure(net.client, net.servers, CONFIG.width)
            chain = plan_chain(net.servers, CONFIG.layers, speed=speed)
            generator = RemoteGenerator(net.client, random_build((0, 0), True), net.servers, speed=speed)
            tokens = await generator.generate(PROMPT, 5)
            return speed, chain, net.servers, tokens

    speed, chain, servers, tokens = asyncio.run(scenario())
    assert speed[servers[0].peer_id] == 0.0 and speed[servers[1].peer_id] > 0 and speed[servers[2].peer_id] > 0
    assert [s.peer_id for s in chain] == [servers[1].peer_id, servers[2].peer_id]
    assert tokens == local_generate(random_decoder(CONFIG, SEED), PROMPT, 5)


class LyingServer(BlockServer):
    """Answers honestly for 5 steps, then nudges one value of its output."""

    def step(self, session_id, chunks, all_outputs=False):
        out = super().step(session_id, chunks, all_outputs)
        self.steps = getattr(self, "steps", 0) + 1
        if self.steps > 5:
            out = out.clone()
            out[0, -1, 0] += 0.5
        return out


@pytest.mark.parametrize("codec", ["f32", "int8"])
def test_spot_checks_pass_honest_servers_and_name_a_lying_one(codec):
    async def scenario():
        async with Network(random_build, [(0, 3), (3, 6), (0, 3), (3, 6)], server_classes={1: LyingServer}) as net:
            generator = RemoteGenerator(net.client, random_build((0, 0), True), net.servers, codec=codec)
            await generator.generate(PROMPT, 12)
            local = random_build((3, 6), False)
            generator.remote_checks = [await generator.spot_check_remote(0, net.servers[2]),
                                       await generator.spot_check_remote(1, net.servers[3]),
                                       await generator.spot_check_remote(1, net.servers[3], local)]
            return generator, net.servers

    generator, servers = asyncio.run(scenario())
    honest = generator.spot_check(0, random_build((0, 3), False))
    referee_honest, disagreement, third_opinion = generator.remote_checks
    assert referee_honest.ok and not disagreement.ok and disagreement.first_bad_step == 5
    assert disagreement.culprit is None                     # two servers disagree: who lied needs a third opinion
    assert third_opinion.first_bad_step == 5 and third_opinion.culprit == servers[1].peer_id   # the local check
    lying = generator.spot_check(1, random_build((3, 6), False))
    assert honest.ok and honest.first_bad_step is None
    assert not lying.ok and lying.first_bad_step == 5 and lying.culprit == servers[1].peer_id
    with pytest.raises(ValueError, match="span 1"):
        generator.spot_check(1, random_build((0, 3), False))


def test_tuning_goes_on_when_a_server_dies():
    pattern = torch.tensor([5, 9, 1, 7, 3] * 5)
    batch = torch.stack([pattern[i:i + 17] for i in range(4)])

    async def scenario(kill: bool):
        async with Network(random_build, [(0, 3), (3, 6), (3, 6)]) as net:
            tuner = RemoteTuner(net.client, random_build((0, 0), True), net.servers, prompt_length=4, lr=3e-2)
            losses = [await tuner.step(batch) for _ in range(3)]
            if kill:
                await net.hosts[1].stop()
            losses += [await tuner.step(batch) for _ in range(3)]
            await tuner.close()
            return losses, tuner.failovers

    killed, failovers = asyncio.run(scenario(True))
    undisturbed, none = asyncio.run(scenario(False))
    assert failovers == 1 and none == 0 and killed == undisturbed


def test_a_failed_span_is_replaced_by_servers_with_other_boundaries():
    expected = local_generate(random_decoder(CONFIG, SEED), PROMPT, 40)

    async def scenario():
        # 0:4 dies after 25 tokens; no other 0:4 server, but 0:1 + 1:2 + 2:4 tile its blocks
        async with Network(random_build, [(0, 4), (4, 6), (0, 1), (1, 2), (2, 4)]) as net:
            generator = RemoteGenerator(net.client, random_build((0, 0), True), net.servers, codec="f32")
            original_step = generator._through_chain

            async def step_and_kill(hidden):
                if generator.stats.steps == 25:
                    await net.hosts[0].stop()
                return await original_step(hidden)

            generator._through_chain = step_and_kill
            tokens = await generator.generate(PROMPT, 40)
            return tokens, generator

    tokens, generator = asyncio.run(scenario())
    assert tokens == expected and generator.stats.replays == 1
    assert generator.spans == [(0, 1), (1, 2), (2, 4), (4, 6)]
    for index, (start, end) in enumerate(generator.spans):   # the new servers' answers check out too
        assert generator.spot_check(index, random_build((start, end), False)).ok


def test_a_server_down_at_the_start_is_planned_around():
    async def scenario():
        async with Network(random_build, [(0, 3), (0, 1), (1, 3), (3, 6)]) as net:
            await net.hosts[0].stop()
            generator = RemoteGenerator(net.client, random_build((0, 0), True), net.servers)
            tokens = await generator.generate(PROMPT, 8)
            return tokens, generator.spans, generator.dead, net.servers[0].peer_id

    tokens, spans, dead, first = asyncio.run(scenario())
    assert tokens == local_generate(random_decoder(CONFIG, SEED), PROMPT, 8)
    assert spans == [(0, 1), (1, 3), (3, 6)] and dead == {first}


@pytest.mark.parametrize("lr", [0.0, 1e-2])
def test_activation_deltas_track_full_precision_better_than_plain_int4(lr):
    pattern = torch.tensor([5, 9, 1, 7, 3] * 5)
    batch = torch.stack([pattern[i:i + 17] for i in range(4)])

    async def run(codec, ids):
        async with Network(random_build, [(0, 3), (3, 6)]) as net:
            tuner = RemoteTuner(net.client, random_build((0, 0), True), net.servers, prompt_length=0, lora_rank=2,
                                codec=codec, lr=lr)
            losses = [await tuner.step(batch, ids=ids) for _ in range(8)]
            sent = sum(span.bytes_sent for span in tuner.chain)
            await tuner.close()
            return losses, sent

    exact, _ = asyncio.run(run("f32", None))
    exact_deltas, _ = asyncio.run(run("f32", [10, 11, 12, 13]))
    plain, plain_bytes = asyncio.run(run("int4", None))
    deltas, delta_bytes = asyncio.run(run("int4", [10, 11, 12, 13]))
    assert exact_deltas == pytest.approx(exact, rel=1e-4)
    assert deltas[0] == plain[0]     # the first time an example is seen, its delta is the whole activation
    plain_gap, delta_gap = abs(plain[-1] - exact[-1]), abs(deltas[-1] - exact[-1])
    if lr == 0:   # the same forward again and again: each delta corrects the last error
        assert delta_gap < 0.1 * plain_gap, (delta_gap, plain_gap)
    else:         # training: the gradients still travel in plain int4
        assert delta_gap < plain_gap, (delta_gap, plain_gap)
    assert delta_bytes < 1.1 * plain_bytes     # the same codec: no more bytes for the better accuracy


def test_delta_books_stay_identical_and_bounded():
    sender, receiver = DeltaBook(), DeltaBook()
    gen = torch.Generator().manual_seed(0)
    value = torch.randn(2, 5, 8, generator=gen)
    for _ in range(4):
        value = value + 0.01 * torch.randn(2, 5, 8, generator=gen)
        delta = sender.delta([1, 2], value)
        mine = sender.commit([1, 2], roundtrip(delta, "int4"))
        theirs = receiver.commit([1, 2], decode_frame(encode_frame({}, {"h": delta}, "int4")[4:]).tensors["h"])
        assert torch.equal(mine, theirs)
    assert float((mine - value).abs().max()) < 0.01
    with pytest.raises(DeltaError, match="full"):
        DeltaBook(max_ids=1).commit([1, 2], torch.zeros(2, 3))
    with pytest.raises(DeltaError, match="distinct"):
        check_ids([1, 1], 2)
    with pytest.raises(DeltaError, match="no stored"):
        receiver.stored([7])


@pytest.mark.parametrize("codec", ["int8", "int4"])
def test_recovery_is_exact_in_lossy_codecs_too(codec):
    async def scenario(kill: bool):
        # a spare with the same range: another split would add a quantised hop and change the output
        async with Network(random_build, [(0, 3), (3, 6), (0, 3)]) as net:
            generator = RemoteGenerator(net.client, random_build((0, 0), True), net.servers, codec=codec)
            original_step = generator._through_chain

            async def step_and_kill(hidden):
                if kill and generator.stats.steps == 15:
                    await net.hosts[0].stop()
                return await original_step(hidden)

            generator._through_chain = step_and_kill
            return await generator.generate(PROMPT, 30), generator.stats.replays

    undisturbed, none = asyncio.run(scenario(False))
    recovered, one = asyncio.run(scenario(True))
    assert recovered == undisturbed and (none, one) == (0, 1)
