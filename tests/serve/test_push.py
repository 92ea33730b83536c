"""Server-to-server push (ADR 0181) over real Hosts on 127.0.0.1: pushed generation equals local in f32 and
the client-driven run in every codec, survives a server killed mid-way, falls back when a push cannot
be delivered, and a server takes pushes only from the peer the session's client named."""
import asyncio

import pytest
import torch

from ml.serve import protocol
from ml.serve.client import RemoteGenerator, local_generate
from ml.serve.model import random_decoder
from ml.serve.push import Inbox, Pushed, PushLink, Target
from ml.serve.server import ServeError
from ml.serve.transcript import tensor_digest
from ml.serve.wire import decode_frame, encode_frame
from node.identity import Identity
from node.p2p.host import Host
from tests.serve.test_generation import CONFIG, PROMPT, SEED, Network, random_build

THREE = [(0, 2), (2, 4), (4, 6)]


def generate(ranges, new, codec="f32", push=True, kill_at=None, victim=1, **options):
    """Tokens and the generator of one generation (`kill_at`: stop span `victim`'s server before that
    step)."""
    async def scenario():
        async with Network(random_build, ranges) as net:
            generator = RemoteGenerator(net.client, random_build((0, 0), True), net.servers, codec=codec, push=push,
                                        **options)
            original = generator._through_chain

            async def step(hidden):
                if generator.stats.steps == kill_at:
                    peer = generator.chain[victim].peer_id
                    await next(h for h in net.hosts if h.peer_id == peer).stop()
                return await original(hidden)

            generator._through_chain = step
            tokens = await generator.generate(PROMPT, new)
            return tokens, generator

    return asyncio.run(scenario())


@pytest.mark.parametrize("ranges", [THREE, [(0, 4), (4, 6)]])
def test_pushed_generation_equals_local_and_every_answer_is_recorded(ranges):
    expected = local_generate(random_decoder(CONFIG, SEED), PROMPT, 20)
    tokens, pushed = generate(ranges, 20)
    _, driven = generate(ranges, 20, push=False)
    assert tokens == expected
    assert pushed.stats.pushed == 20 * (len(ranges) - 1) and pushed.stats.push_fallbacks == 0
    assert pushed.stats.bytes_sent < driven.stats.bytes_sent   # the client uploads only the first span's input
    for index, (start, end) in enumerate(ranges):
        assert all(torch.equal(a, b) for a, b in zip(pushed.history[index], driven.history[index], strict=True))
        assert pushed.spot_check(index, random_build((start, end), False)).ok


@pytest.mark.parametrize("codec", ["f16", "int8", "int4"])
def test_lossy_codecs_decode_the_same_input_pushed_or_sent(codec):
    tokens, pushed = generate(THREE, 8, codec=codec)
    expected, driven = generate(THREE, 8, codec=codec, push=False)
    assert tokens == expected and pushed.stats.pushed == 16
    for index in range(3):   # what each server ran and answered is the same in both modes
        assert all(torch.equal(a, b) for a, b in zip(pushed.history[index], driven.history[index], strict=True))
        assert all(torch.equal(a[1], b[1]) for a, b in zip(pushed.outputs[index], driven.outputs[index], strict=True))


@pytest.mark.parametrize("victim", [0, 1, 2])
def test_a_server_killed_mid_pushed_generation_is_replaced_and_the_output_continues(victim):
    expected = local_generate(random_decoder(CONFIG, SEED), PROMPT, 40)
    ranges = [(0, 2), (2, 4), (4, 6)]
    tokens, generator = generate(ranges + [ranges[victim]], 40, kill_at=25, victim=victim)
    assert tokens == expected and generator.stats.replays == 1 and len(generator.dead) == 1
    assert generator.stats.pushed > 2 * 25   # pushes resumed on the new chain


def test_a_server_that_cannot_reach_the_next_one_leaves_that_hop_to_the_client(monkeypatch):
    original = Host.open_stream
    refused: list[str] = []

    async def open_stream(self, peer_id, proto):   # the first server cannot dial the second
        if self.peer_id == first[0] and peer_id == second[0]:
            refused.append(peer_id)
            raise OSError("unreachable")
        return await original(self, peer_id, proto)

    async def scenario():
        async with Network(random_build, THREE) as net:
            first.append(net.servers[0].peer_id)
            second.append(net.servers[1].peer_id)
            monkeypatch.setattr(Host, "open_stream", open_stream)
            generator = RemoteGenerator(net.client, random_build((0, 0), True), net.servers, push=True)
            return await generator.generate(PROMPT, 10), generator

    first: list[str] = []
    second: list[str] = []
    tokens, generator = asyncio.run(scenario())
    assert tokens == local_generate(random_decoder(CONFIG, SEED), PROMPT, 10)
    assert refused and generator.stats.pushed == 10 and generator.stats.push_fallbacks == 0   # hop 2->3 pushed


def generate_with_pushes_to(monkeypatch, target, change, new, **options):
    """Generate through three servers with every push to span `target`'s server passed through
    `change(frame)` (which may raise: the push is lost): tokens, generator, servers."""
    original = PushLink.send
    peers: list[str] = []

    async def send(self, frame, read_reply):
        if self.peer == peers[0]:
            frame = change(frame)
        return await original(self, frame, read_reply)

    monkeypatch.setattr(PushLink, "send", send)

    async def scenario():
        async with Network(random_build, THREE) as net:
            peers.append(net.servers[target].peer_id)
            generator = RemoteGenerator(net.client, random_build((0, 0), True), net.servers, push=True, **options)
            return await generator.generate(PROMPT, new), generator, net.servers

    return asyncio.run(scenario())


def test_a_push_that_does_not_arrive_falls_back_once(monkeypatch):
    dropped: list[int] = []

    def lose(frame):   # pushes to the last server are lost on the way
        dropped.append(1)
        raise ConnectionError("lost")

    tokens, generator, _ = generate_with_pushes_to(monkeypatch, 2, lose, 10, push_wait_s=0.5)
    assert tokens == local_generate(random_decoder(CONFIG, SEED), PROMPT, 10)
    assert dropped == [1] and generator.stats.push_fallbacks == 1 and generator.stats.pushed == 10
    assert generator.pushes == [True, False, False]


def test_a_server_that_pushes_another_answer_than_it_gives_is_caught_and_not_used_to_push(monkeypatch):
    altered: list[int] = []

    def alter(frame):   # the first server pushes something else than it answers
        msg = decode_frame(frame[4:])
        if "h" not in msg.tensors:
            return frame
        altered.append(msg.header["step"])
        return encode_frame(msg.header, {"h": msg.tensors["h"] + 1.0}, msg.header["codec"])

    tokens, generator, servers = generate_with_pushes_to(monkeypatch, 1, alter, 12)
    assert tokens == local_generate(random_decoder(CONFIG, SEED), PROMPT, 12)
    assert altered == [0] and generator.mispushed == {servers[0].peer_id}   # caught at once, never used again
    # span 2 ran the altered input and pushed its answer on: both are replayed in fresh sessions
    assert generator.stats.replays == 2 and generator.stats.push_fallbacks == 2 and not generator.dead
    assert generator.stats.pushed == 11   # hop 2->3 from step 1 on, hop 1->2 never again
    assert generator.spot_check(1, random_build((2, 4), False)).ok   # the record is what the servers ran


def test_only_the_named_peer_can_push_and_bad_pushes_leave_the_session_usable():
    async def scenario():
        async with Network(random_build, [(0, 3), (3, 6)]) as net:
            intruder = Host(Identity.generate())
            await intruder.start()
            try:
                addrs = {h.peer_id: h.listen_addrs for h in net.hosts}
                for host in (intruder, net.hosts[0]):
                    host.peerbook.add_addrs(net.servers[1].peer_id, addrs[net.servers[1].peer_id])
                span = protocol.SpanClient(net.client, net.servers[1].peer_id, 3, 6)
                await span.open(64)
                assert await span.route(net.servers[0].peer_id, None) is False   # named: server 0
                hidden = torch.randn(1, 4, CONFIG.width)

                async def push(host, header, tensors):
                    stream = await host.open_stream(net.servers[1].peer_id, protocol.PROTOCOL)
                    await stream.write(encode_frame({"type": "push", "session": span.session, "codec": "f32",
                                                     **header}, tensors))
                    reply = await protocol.read_frame(stream, 10)
                    await stream.close()
                    return reply.header

                good = {"step": 0, "chunks": [4]}
                errors = [
                    (await push(intruder, good, {"h": hidden}))["error"],
                    (await push(net.hosts[0], good | {"session": "nope"}, {"h": hidden}))["error"],
                    (await push(net.hosts[0], good, {"h": torch.randn(1, 4, CONFIG.width + 1)}))["error"],
                    (await push(net.hosts[0], good | {"chunks": [3]}, {"h": hidden}))["error"],
                    (await push(net.hosts[0], good | {"step": -1}, {"h": hidden}))["error"],
                    (await push(net.hosts[0], good, {}))["error"],
                ]
                assert (await push(net.hosts[0], good, {"h": hidden}))["type"] == "pushed"
                duplicate = (await push(net.hosts[0], good, {"h": hidden}))["error"]
                reply = await span.pushed_step(hidden.shape, "f32", 0, 5.0)
                out = await span.finish_pushed(reply, "f32", hidden)
                stale = (await push(net.hosts[0], good, {"h": hidden}))["error"]
                nowhere = {"peer": Identity.generate().peer_id, "session": "x",
                           "addrs": ["junk", f"/ip4/127.0.0.1/tcp/1/p2p/{intruder.peer_id}", "/ip4/127.0.0.1/tcp/1"]}
                unreachable = await span.route(net.servers[0].peer_id, nowhere)   # junk skipped, the dial fails
                with pytest.raises(protocol.RemoteError, match="names this server"):
                    await span.route(net.servers[0].peer_id, {"peer": net.servers[1].peer_id, "session": "x"})
                assert unreachable is False
                missing = await span.pushed_step(torch.Size([1, 1, CONFIG.width]), "f32", 1, 0.2)
                after = await span.step([torch.randn(1, 1, CONFIG.width)], "f32", step=1)
                await span.close()
                return errors, duplicate, stale, reply, out, missing, after, hidden
            finally:
                await intruder.stop()

    errors, duplicate, stale, reply, out, missing, after, hidden = asyncio.run(scenario())
    assert "was not named to push" in errors[0]
    assert "session this server holds" in errors[1]
    assert "width" in errors[2] and "chunks" in errors[3] and "step id" in errors[4] and "hidden" in errors[5]
    assert "already settled" in duplicate and "already settled" in stale
    assert reply.header["input"] == tensor_digest(hidden).hex()   # it ran the pushed input
    blocks = random_build((3, 6), False)
    with torch.no_grad():
        assert torch.equal(out, blocks.run_blocks(hidden, blocks.new_caches(1, 64)))
    assert missing is None and after.shape == (1, 1, CONFIG.width)


def test_inbox_keeps_pushes_in_bounds():
    async def scenario():
        connected = {"a"}
        inbox = Inbox(max_pending=2, connected=connected.__contains__)
        hidden = torch.zeros(1, 1, 8)
        with pytest.raises(ServeError, match="takes no pushes"):
            inbox.put("s", "a", 0, Pushed((1,), "f32", hidden), 1, 8)
        inbox.route("s", "a")
        inbox.put("s", "a", 1, Pushed((1,), "f32", hidden), 1, 8)
        inbox.put("s", "a", 2, Pushed((1,), "f32", hidden), 1, 8)
        with pytest.raises(ServeError, match="holds 2"):
            inbox.put("s", "a", 3, Pushed((1,), "f32", hidden), 1, 8)
        with pytest.raises(ServeError, match="batch 2"):
            inbox.put("s", "a", 3, Pushed((1,), "f32", hidden), 2, 8)
        assert await inbox.take("s", 0, 0.0) is None          # not pushed: settled, later pushes refused
        with pytest.raises(ServeError, match="settled"):
            inbox.put("s", "a", 0, Pushed((1,), "f32", hidden), 1, 8)
        inbox.settle("s", 1)                                  # the client sent step 1 itself
        assert await inbox.take("s", 2, 0.0) is not None
        waiting = asyncio.ensure_future(inbox.take("s", 3, 5.0))
        await asyncio.sleep(0.01)
        inbox.put("s", "a", 3, Pushed((1,), "f32", hidden), 1, 8)
        assert (await waiting) is not None
        waiting = asyncio.ensure_future(inbox.take("s", 4, 30.0))
        await asyncio.sleep(0.01)
        inbox.sender_gone("s", "b")                           # not the named sender: nothing changes
        await asyncio.sleep(0.05)
        assert not waiting.done()
        inbox.sender_gone("s", "a")                           # its push stream ended, but it is connected
        await asyncio.sleep(0.25)
        assert not waiting.done()
        connected.clear()                                     # and now it is not: no more waiting
        await asyncio.sleep(0.25)
        assert waiting.done() and waiting.result() is None
        inbox.route("s", "a")
        waiting = asyncio.ensure_future(inbox.take("s", 5, 30.0))
        await asyncio.sleep(0.01)
        inbox.put("s", "a", 5, None, 1, 8)                    # the sender has nothing to push for step 5
        await asyncio.sleep(0.05)
        assert waiting.done() and waiting.result() is None
        waiting = asyncio.ensure_future(inbox.take("s", 6, 5.0))
        await asyncio.sleep(0.01)
        inbox.drop("s")                                       # the session closed: the wait ends
        assert (await waiting) is None

    asyncio.run(scenario())
    with pytest.raises(ServeError, match="names this server"):
        Target.parse({"peer": "me", "session": "x"}, "me")
    with pytest.raises(ServeError, match="addrs"):
        Target.parse({"peer": "p", "session": "x", "addrs": ["a"] * 9}, "me")
