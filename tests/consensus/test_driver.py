"""Asyncio consensus driver: commits over an in-memory network and over real Hosts on 127.0.0.1,
persist-before-send, block sync of a late node, junk frames."""
import asyncio
import contextlib
import struct
import threading

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from consensus.committee import ValidatorSet
from consensus.driver import (
    PROTOCOL,
    ConsensusDriver,
    FrameError,
    decode_sync_block,
    decode_sync_request,
    encode_sync_block,
    frame,
)
from consensus.messages import MessageError, Vote, VoteType, decode_message, sign_vote, value_id
from consensus.signer import SignerGuard
from consensus.tendermint import Commit, TendermintCore, TimeoutConfig
from node.identity import Identity

CHAIN = "driver-test"
IDS = [Identity.from_seed(bytes([40 + i]) * 32) for i in range(4)]
VS = ValidatorSet({ident.peer_id: 1 for ident in IDS})
FAST = TimeoutConfig(propose=0.4, propose_delta=0.2, prevote=0.2, prevote_delta=0.1,
                     precommit=0.2, precommit_delta=0.1)


class FakeStream:
    def __init__(self, net, src, dst, incoming, outgoing):
        self.net, self.src, self.dst = net, src, dst
        self.remote_peer = dst
        self._in, self._out = incoming, outgoing

    async def read(self, n=-1):
        return await self._in.read(n)

    async def readexactly(self, n):
        return await self._in.readexactly(n)

    async def write(self, data):
        if self.net.down(self.src) or self.net.down(self.dst):
            raise ConnectionError("peer down")
        self.net.on_write(self.src, data)
        self._out.feed_data(data)

    async def close(self):
        if not self._out.at_eof():
            self._out.feed_eof()


class FakeHost:
    def __init__(self, net, peer_id):
        self.net, self.peer_id, self.handlers = net, peer_id, {}

    def set_handler(self, protocol, handler):
        self.handlers[protocol] = handler

    def remove_handler(self, protocol):
        self.handlers.pop(protocol, None)

    async def open_stream(self, peer_id, protocol):
        remote = self.net.hosts.get(peer_id)
        if remote is None or self.net.down(peer_id) or protocol not in remote.handlers:
            raise ConnectionError(f"cannot reach {peer_id}")
        a, b = asyncio.StreamReader(), asyncio.StreamReader()
        local = FakeStream(self.net, self.peer_id, peer_id, incoming=b, outgoing=a)
        far = FakeStream(self.net, peer_id, self.peer_id, incoming=a, outgoing=b)
        far.remote_peer = self.peer_id
        self.net.tasks.add(asyncio.get_running_loop().create_task(remote.handlers[protocol](far)))
        return local


class FakeNet:
    def __init__(self):
        self.hosts = {}
        self.stopped = set()
        self.tasks = set()
        self.write_hook = None

    def down(self, peer_id):
        return peer_id in self.stopped

    def on_write(self, src, data):
        if self.write_hook:
            self.write_hook(src, data)


class Node:
    """A validator: core + driver + a dict block store as the 'application'."""

    def __init__(self, host, ident, peers, timeouts=FAST, signer_state=b"", blocks=None):
        self.ident = ident
        self.blocks: dict[int, Commit] = dict(blocks or {})
        self.persisted: list[bytes] = []
        self.validated_on: set[int] = set()  # thread ids that ran is_valid
        self.core = TendermintCore(CHAIN, SignerGuard.restore(ident, signer_state),
                                   get_value=lambda h: b"block %d by " % h + ident.peer_id.encode(),
                                   is_valid=self._is_valid, timeouts=timeouts)
        self.driver = ConsensusDriver(host, self.core, peers=lambda: peers, persist=self._persist,
                                      commit=self._commit, get_block=self.blocks.get,
                                      gossip_interval=0.2, sync_delay=0.2)

    def _is_valid(self, height, value):
        self.validated_on.add(threading.get_ident())
        return value.startswith(b"block %d " % height)

    async def _persist(self, state):
        self.persisted.append(state)

    async def _commit(self, commit):
        assert commit.height not in self.blocks
        self.blocks[commit.height] = commit
        return VS


async def wait_until(predicate, timeout):
    deadline = asyncio.get_running_loop().time() + timeout
    while not predicate():
        if asyncio.get_running_loop().time() > deadline:
            return False
        await asyncio.sleep(0.02)
    return True


def assert_same_chain(nodes, heights):
    for h in range(heights):
        values = {n.blocks[h].value for n in nodes}
        assert len(values) == 1, f"divergence at height {h}"
        (block,) = {n.blocks[h] for n in nodes[:1]}
        assert VS.verify_commit(CHAIN, h, value_id(block.value), block.certificate)


def test_four_drivers_commit_the_same_chain_and_persist_before_sending():
    async def main():
        net = FakeNet()
        peers = [i.peer_id for i in IDS]
        nodes = []
        for ident in IDS:
            host = net.hosts[ident.peer_id] = FakeHost(net, ident.peer_id)
            nodes.append(Node(host, ident, peers))
        by_peer = {n.ident.peer_id: n for n in nodes}
        unpersisted, checked = [], []

        def check_persisted(src, data):
            message = decode_message(data[4:]) if data[4] in (1, 2) else None
            if message is None or getattr(message, "validator", getattr(message, "proposer", None)) != src:
                return
            checked.append(message)
            last = SignerGuard.restore(by_peer[src].ident, by_peer[src].persisted[-1]).last_hrs \
                if by_peer[src].persisted else None
            step = 1 if not isinstance(message, Vote) else 1 + int(message.type)
            if last is None or last < (message.height, message.round, step):
                unpersisted.append(message)

        net.write_hook = check_persisted
        for node in nodes:
            await node.driver.start(0, VS)
        try:
            assert await wait_until(lambda: all(len(n.blocks) >= 5 for n in nodes), 30)
        finally:
            for node in nodes:
                await node.driver.stop()
        assert_same_chain(nodes, 5)
        assert len(checked) > 20 and not unpersisted
        validated_on = set().union(*(n.validated_on for n in nodes))
        assert validated_on and threading.get_ident() not in validated_on  # off the event loop
    asyncio.run(main())


def test_late_node_catches_up_by_block_sync_and_joins():
    async def main():
        net = FakeNet()
        peers = [i.peer_id for i in IDS]
        nodes = []
        for ident in IDS:
            host = net.hosts[ident.peer_id] = FakeHost(net, ident.peer_id)
            nodes.append(Node(host, ident, peers))
        late = nodes[3]
        net.stopped.add(late.ident.peer_id)
        for node in nodes[:3]:
            await node.driver.start(0, VS)
        try:
            assert await wait_until(lambda: all(len(n.blocks) >= 6 for n in nodes[:3]), 30)
            net.stopped.clear()
            await late.driver.start(0, VS)
            target = max(len(n.blocks) for n in nodes[:3]) + 2
            assert await wait_until(lambda: all(len(n.blocks) >= target for n in nodes), 30)
        finally:
            for node in nodes:
                await node.driver.stop()
        assert_same_chain(nodes, target)
    asyncio.run(main())


def test_restarted_validator_resumes_from_persisted_state_without_double_signing():
    async def main():
        net = FakeNet()
        peers = [i.peer_id for i in IDS]
        nodes = []
        for ident in IDS:
            host = net.hosts[ident.peer_id] = FakeHost(net, ident.peer_id)
            nodes.append(Node(host, ident, peers))
        victim = IDS[1].peer_id
        signed = {}
        conflicts = []

        def watch(src, data):
            if src == victim and data[4] == 1:
                vote = decode_message(data[4:])
                if vote.validator == victim:
                    key = (vote.height, vote.round, vote.type)
                    if signed.setdefault(key, vote.value_id) != vote.value_id:
                        conflicts.append(key)

        net.write_hook = watch
        for node in nodes:
            await node.driver.start(0, VS)
        try:
            assert await wait_until(lambda: all(len(n.blocks) >= 3 for n in nodes), 30)
            old = nodes[1]
            await old.driver.stop()  # "kill": only what was persisted survives
            net.stopped.add(victim)
            assert await wait_until(lambda: len(nodes[0].blocks) >= len(old.blocks) + 3, 30)
            net.stopped.clear()
            nodes[1] = Node(net.hosts[victim], IDS[1], peers, signer_state=old.persisted[-1],
                            blocks=old.blocks)
            await nodes[1].driver.start(len(old.blocks), VS)
            target = max(len(n.blocks) for n in nodes) + 3
            assert await wait_until(lambda: all(len(n.blocks) >= target for n in nodes), 30)
        finally:
            for node in nodes:
                await node.driver.stop()
        assert_same_chain(nodes, target)
        assert signed and not conflicts
    asyncio.run(main())


def test_failed_persist_stops_the_validator_before_it_sends():
    async def main():
        net = FakeNet()
        peers = [i.peer_id for i in IDS]
        nodes = []
        for ident in IDS:
            host = net.hosts[ident.peer_id] = FakeHost(net, ident.peer_id)
            nodes.append(Node(host, ident, peers))
        broken = nodes[2]
        calls = []

        async def failing_persist(state):
            calls.append(state)
            if len(calls) > 3:
                raise OSError("disk full")
            broken.persisted.append(state)

        broken.driver.persist = failing_persist
        reported = []
        broken.driver.on_failure = reported.append  # the validator role stops the node on it
        undurable = []

        def check(src, data):
            if src != broken.ident.peer_id or data[4] not in (1, 2):
                return
            message = decode_message(data[4:])
            step = 1 + int(message.type) if isinstance(message, Vote) else 1
            if getattr(message, "validator", getattr(message, "proposer", None)) == src:
                last = SignerGuard.restore(broken.ident, broken.persisted[-1]).last_hrs
                if last < (message.height, message.round, step):
                    undurable.append(message)

        net.write_hook = check
        for node in nodes:
            await node.driver.start(0, VS)
        try:
            assert await wait_until(lambda: broken.driver.failure is not None, 20)
            assert await wait_until(lambda: all(len(n.blocks) >= 5 for n in nodes if n is not broken), 30)
            await asyncio.sleep(0.5)  # gossip ticks pass
        finally:
            for node in nodes:
                await node.driver.stop()
        assert "disk full" in str(broken.driver.failure)
        assert reported == [broken.driver.failure]
        assert len(broken.persisted) == 3 and not undurable
    asyncio.run(main())


def test_follower_without_a_key_catches_up_on_request():
    async def main():
        net = FakeNet()
        peers = [i.peer_id for i in IDS]
        nodes = []
        for ident in IDS:
            host = net.hosts[ident.peer_id] = FakeHost(net, ident.peer_id)
            nodes.append(Node(host, ident, peers))
        follower_id = Identity.from_seed(b"f" * 32).peer_id
        host = net.hosts[follower_id] = FakeHost(net, follower_id)
        blocks = {}

        async def commit(c):
            blocks[c.height] = c
            return VS

        core = TendermintCore(CHAIN, None, get_value=lambda h: b"", is_valid=lambda h, v: True)
        follower = ConsensusDriver(host, core, peers=lambda: [], persist=None, commit=commit,
                                   get_block=blocks.get, sync_delay=0.05)
        for node in nodes:
            await node.driver.start(0, VS)
        try:
            assert await wait_until(lambda: all(len(n.blocks) >= 4 for n in nodes), 30)
            await follower.start(0, VS)
            follower.request_sync(IDS[0].peer_id)
            assert await wait_until(lambda: len(blocks) >= 4, 10)
        finally:
            await follower.stop()
            for node in nodes:
                await node.driver.stop()
        for h, c in blocks.items():
            assert c.value == nodes[0].blocks[h].value
    asyncio.run(main())


def test_junk_frames_close_only_that_stream():
    async def main():
        net = FakeNet()
        peers = [i.peer_id for i in IDS]
        nodes = []
        for ident in IDS:
            host = net.hosts[ident.peer_id] = FakeHost(net, ident.peer_id)
            nodes.append(Node(host, ident, peers))
        attacker = FakeHost(net, Identity.from_seed(b"x" * 32).peer_id)
        for node in nodes:
            await node.driver.start(0, VS)
        try:
            target = nodes[0].ident.peer_id
            for junk in (struct.pack(">I", 2**31) + b"x", frame(b"\x7f junk"), frame(b"\x01 not a vote"),
                         frame(b"\x11" + b"\0" * 5)):
                stream = await attacker.open_stream(target, PROTOCOL)
                await stream.write(junk)
            assert await wait_until(lambda: nodes[0].driver.rejected_frames == 4, 10)
            assert await wait_until(lambda: all(len(n.blocks) >= 3 for n in nodes), 30)
        finally:
            for node in nodes:
                await node.driver.stop()
    asyncio.run(main())


def test_sync_block_codec_is_strict():
    vote = sign_vote(IDS[0], CHAIN, Vote(VoteType.PRECOMMIT, 3, 1, value_id(b"v"), IDS[0].peer_id))
    commit = Commit(3, 1, b"v", (vote,))
    data = encode_sync_block(commit)
    assert decode_sync_block(data) == commit
    for bad in (data[:-1], data + b"\0", b"\x11", b"\x10" + data[1:]):
        with pytest.raises(MessageError):  # FrameError is a MessageError
            decode_sync_block(bad)
    with pytest.raises(FrameError, match="certificate too large"):
        decode_sync_block(b"\x11" + b"\0" * 16 + b"\xff\xff")


def test_drivers_over_real_hosts_on_localhost():
    from node.p2p.host import Host

    async def main():
        hosts = [Host(ident) for ident in IDS]
        for host in hosts:
            await host.start()
        peers = [i.peer_id for i in IDS]
        nodes = [Node(host, ident, peers) for host, ident in zip(hosts, IDS)]
        try:
            for a in hosts:
                for b in hosts:
                    if a is not b:
                        a.peerbook.add_addrs(b.peer_id, [b._bound_addrs[0]])
            for node in nodes:
                await node.driver.start(0, VS)
            assert await wait_until(lambda: all(len(n.blocks) >= 3 for n in nodes), 40)
        finally:
            for node in nodes:
                await node.driver.stop()
            for host in hosts:
                await host.stop()
        assert_same_chain(nodes, 3)
    asyncio.run(main())


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=600))
def test_fuzz_sync_decoders_raise_only_message_error(data):
    for decode in (decode_sync_block, decode_sync_request):
        try:
            decode(data)
        except MessageError:
            pass


def test_single_validator_commits_many_heights_without_recursion():
    """A one-validator committee decides each height inside start_height: the driver must carry on
    iteratively (it once recursed per height and hit RecursionError after a few hundred blocks)."""
    solo = IDS[0]
    solo_set = ValidatorSet({solo.peer_id: 1})

    async def main():
        net = FakeNet()
        host = net.hosts[solo.peer_id] = FakeHost(net, solo.peer_id)
        node = Node(host, solo, [solo.peer_id])

        async def commit(c):
            node.blocks[c.height] = c
            await asyncio.sleep(0)
            return solo_set

        node.driver.commit = commit
        starting = asyncio.create_task(node.driver.start(0, solo_set))
        assert await wait_until(lambda: len(node.blocks) >= 1500 or starting.done(), 60)
        assert not starting.done() or starting.exception() is None  # no RecursionError
        assert sorted(node.blocks) == list(range(len(node.blocks)))
        starting.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await starting
        await node.driver.stop()

    asyncio.run(main())
