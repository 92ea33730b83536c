"""Wrong activations slashed (ADR 0176): a lying server is caught by the client's spot check, disputed on
chain, refereed by two honest servers that fetch the step bundle from the client and recompute it,
and slashed (in plain sessions and in sessions with the client's adapter or deep prompts); the bundle's
checks refuse tampering, and an honest step recomputes to the signed answer."""
import asyncio
import functools
import hashlib
from dataclasses import astuple

import pytest
import torch

from consensus.genesis import Params
from consensus.state.serve_disputes import dispute_json, list_open_disputes
from devtools.ledger_chain import Chain, ident
from ml.serve.adapters import ClientParams
from ml.serve.billing import spot_evidence
from ml.serve.client import RemoteGenerator
from ml.serve.dispute import (
    BUNDLE_PROTOCOL,
    BundleStore,
    Claim,
    DisputeError,
    dispute_payload,
    encode_bundle,
    fetch_bundle,
    file_dispute,
    make_bundle_handler,
    referee_duty,
    referee_verdict,
)
from ml.serve.evidence import Inbox, deliver_bundle
from ml.serve.server import BlockServer
from ml.serve.transcript import ZERO
from ml.serve.wire import MAX_FRAME, encode_frame
from node.p2p.host import Host
from tests.serve.test_billing import PRICE, PaidNetwork, payer
from tests.serve.test_generation import CONFIG, PROMPT, random_build

PROFILE = "cpu-x86-64-avx2/torch-2.13.0"
RANGES = [(0, 3), (3, 6), (3, 6), (3, 6)]   # servers ident(1..4); ident(2) lies; ident(3), ident(4) referee
CLIENT, LIAR = ident(9), ident(2)


class ChainGateway:
    """The gateway calls a client's claim and a referee's duty make, against an in-process chain."""

    def __init__(self, chain: Chain, identity):
        self.chain, self.identity = chain, identity

    async def call(self, method: str, *params):
        state = self.chain.ledger.state
        if method == "dkb_getNode":
            return self.chain.ledger.node_info(*params)
        if method == "dkb_getServeDispute":
            return dispute_json(state, bytes.fromhex(params[0]))
        assert method == "dkb_listServeDisputes"
        return list_open_disputes(state, *params)

    async def send(self, tx_type: str, payload: dict) -> dict:
        return self.chain.ok(self.identity, tx_type, payload).to_json()


async def filed(chain: Chain):
    """Wait for the client's dispute to reach the ledger, then make the blocks until its referees are
    drawn from a later beacon (ADR 0210); ``(dispute id, record)``."""
    while not chain.ledger.state.serve_disputes:
        await asyncio.sleep(0.02)
    ((ident_, record),) = chain.ledger.state.serve_disputes.items()
    for _ in range(chain.params.beacon_delay):
        if record.referees:
            break
        chain.block()
    return ident_, chain.ledger.state.serve_disputes[ident_]


def ledger(model: str) -> Chain:
    chain = Chain(params=Params(task_min_s=12, task_slack_s=0, audit_window_s=2,
                                min_fee=0, referees=2,
                                serve_referee_s=10, serve_dispute_bond=100, slash_serve_bps=2_000,
                                serve_referee_fee=10))
    txs = []
    for index, (start, end) in enumerate(RANGES):
        who = ident(index + 1)
        hardware = {"cpu_cores": 2, "ram_mb": 1000, "gpu": "", "gpu_mem_mb": 0, "bandwidth_mbps": 50,
                    "profiles": [PROFILE], "serving": [{"model": model, "start": start, "end": end,
                                                        "tokens_per_s": 10, "profile": PROFILE, "price": PRICE}]}
        txs += [chain.tx(who, "register_node", {"roles": ["compute"], "listen_addrs": [], "relay_addrs": [],
                                                "hardware": hardware}),
                chain.tx(who, "bond", {"amount": 500})]
    txs.append(chain.tx(CLIENT, "serve_deposit", {"amount": 10_000}))
    chain.block(txs)
    return chain


def tuned_params(kind: str) -> ClientParams | None:
    """The client's parameters for a session of `kind`: plain, with a LoRA adapter, or with prompts."""
    gen = torch.Generator().manual_seed(11)
    if kind == "lora":
        return ClientParams(torch.randn(CONFIG.layers, 2, CONFIG.width, generator=gen) * 0.1,
                            torch.randn(CONFIG.layers, 3 * CONFIG.width, 2, generator=gen) * 0.1)
    if kind == "prompts":
        return ClientParams(input_prompt=torch.randn(3, CONFIG.width, generator=gen),
                            deep_prompts=torch.randn(CONFIG.layers, 3, CONFIG.width, generator=gen))
    return None


@pytest.mark.parametrize("kind", ["plain", "lora", "prompts"])
def test_a_lying_server_is_spot_checked_disputed_refereed_and_slashed(kind):
    """Also in sessions with the client's adapter or deep prompts (ADR 0178): the links commit to their
    digest, the bundle carries them and referees replay with them."""
    tuned = tuned_params(kind)

    async def scenario():
        async with PaidNetwork(RANGES, server_classes={1: functools.partial(BlockServer, lie_after=5)}) as net:
            generator = RemoteGenerator(net.client, random_build((0, 0), True), net.servers[:2], payer=payer(),
                                        tuned=tuned)
            await generator.generate(PROMPT, 12)
            await asyncio.sleep(0.05)
            check = generator.spot_check(1, random_build((3, 6), False))
            assert not check.ok and check.culprit == LIAR.peer_id and check.evidence is not None
            evidence = check.evidence
            assert (evidence["steps"][0].setup == ZERO) is (tuned is None)
            carried = {"plain": set(), "lora": {"lora_a", "lora_b"}, "prompts": {"prompts"}}[kind]
            assert set(evidence["setup"]) == carried
            store = BundleStore()
            net.client.set_handler(BUNDLE_PROTOCOL, make_bundle_handler(store))

            chain = ledger(evidence["receipt"]["model"])
            claimed = net.books[1].unclaimed()[0]
            chain.ok(LIAR, "serve_receipt", claimed.payload())
            paid = claimed.receipt["amount"]
            stake_before = chain.ledger.state.stakes[LIAR.peer_id].bonded
            client_before = chain.ledger.balance(CLIENT.peer_id)
            # the client files the claim and serves the bundle until the referees decide
            filing = asyncio.create_task(file_dispute(ChainGateway(chain, CLIENT), net.client, store, evidence, 200,
                                                      wait_s=60, poll_s=0.02))
            ident_, record = await filed(chain)
            referees = [peer for peer, _ in record.referees]
            assert sorted(referees) == sorted([ident(3).peer_id, ident(4).peer_id])
            assert record.addrs == [str(addr) for addr in net.client.listen_addrs]
            bundle = store.get(record.inputs)
            assert bundle is not None
            claim = Claim(record.model, record.start, record.end, record.prior, record.link, record.answer,
                          record.inputs)
            def duty(peer):
                index = next(i for i, host in enumerate(net.hosts) if host.peer_id == peer)
                return referee_duty(ChainGateway(chain, ident(index + 1)), net.hosts[index],
                                    random_build(RANGES[index], False))

            # a client that does not answer (slow, or offline for a while) gets no vote against its claim:
            # the referees abstain and try again at their next round (ADR 0178)
            net.client.set_handler(BUNDLE_PROTOCOL, make_bundle_handler(BundleStore()))
            for _ in range(4):
                assert [await duty(peer) for peer in referees] == [0, 0]
            assert all(vote is None for _, vote in record.referees) and record.status == "open"
            net.client.set_handler(BUNDLE_PROTOCOL, make_bundle_handler(store))
            for peer in referees:   # each referee's duty: poll, fetch from the client, recompute, vote
                assert await duty(peer) == 1
            assert await filing == {"dispute": ident_.hex(), "status": "guilty"}
            votes = [vote for _, vote in record.referees]
            assert all(vote[0] and vote[1] != claim.answer for vote in votes) and votes[0] == votes[1]
            record = chain.ledger.state.serve_disputes[ident_]
            assert record.status == "guilty"
            slashed = stake_before * 2_000 // 10_000
            assert chain.ledger.state.stakes[LIAR.peer_id].bonded == stake_before - slashed
            assert chain.ledger.balance(CLIENT.peer_id) == client_before + min(paid, slashed)   # bond back + refund

            # an honest step of the same stream recomputes to the answer the server signed
            meter = next(m for m in generator.meters if m.offer and m.offer["server"] == LIAR.peer_id)
            honest = spot_evidence(meter, 2)
            honest_bundle = encode_bundle(honest["receipt"]["model"], honest["steps"], honest["setup"])
            honest_payload = dispute_payload(honest, honest_bundle, PROFILE, 200)
            honest_claim = Claim(honest["receipt"]["model"], 3, 6, honest_payload["prior"], honest_payload["link"],
                                 honest_payload["answer"], honest_payload["inputs"])
            assert referee_verdict(honest_bundle, honest_claim, random_build((0, 6), False)) == (
                True, honest_claim.answer)
            # a tampered bundle is invalid
            tampered = bundle[:-4] + bytes(4)
            assert referee_verdict(tampered, claim, random_build((3, 6), False)) == (False, ZERO)
            if tuned is not None:   # a bundle without the session's setup, or with another, is refused
                for setup in ({}, {name: t + 1 for name, t in honest["setup"].items()}):
                    with pytest.raises(DisputeError):
                        encode_bundle(honest["receipt"]["model"], honest["steps"], setup)
                    forged = bundle_without_check(honest["receipt"]["model"], honest["steps"], setup)
                    forged_claim = Claim(*astuple(honest_claim)[:-1], hashlib.sha256(forged).digest())
                    assert referee_verdict(forged, forged_claim, random_build((3, 6), False)) == (False, ZERO)
            assert await fetch_bundle(net.hosts[2], net.client.peer_id, b"\x01" * 32) is None

    asyncio.run(scenario())


def bundle_without_check(model: str, steps: list, setup: dict) -> bytes:
    """A bundle as a dishonest client could build it, with whatever setup tensors (encode_bundle refuses)."""
    header = {"type": "dispute-bundle", "model": model,
              "steps": [{"start": st.start, "end": st.end, "codec": st.codec, "chunks": list(st.chunks),
                         "all": st.all_outputs, "answer": st.answer.hex(), "setup": st.setup.hex()} for st in steps]}
    return encode_frame(header, {"h": torch.cat([st.inputs for st in steps], 1), **setup}, "f32")


def test_block_answers_do_not_depend_on_the_torch_thread_count_a_party_left():
    """ADR 0178 (why the dispute CLI test saw 'rejected'): torch's intra-op thread count is per OS thread
    and a new thread inherits the process's last setting; a client whose process was left at 1 thread
    computed other bits than servers at the machine's count, flagged an honest step and lost its claim.
    run_blocks pins the count, so a server, a client and a referee agree whatever their process set."""
    import threading

    part = random_build((3, 6), False)
    inputs = torch.randn(1, 9, part.config.width, generator=torch.Generator().manual_seed(3))
    previous = torch.get_num_threads()

    def session(threads: int, out: list) -> None:
        torch.set_num_threads(threads)   # what the party's process left for this thread
        caches = part.new_caches(1, 9)
        with torch.no_grad():
            out.append(part.run_blocks(inputs[:, :6], caches))
            out += [part.run_blocks(inputs[:, i:i + 1], caches) for i in range(6, 9)]

    answers = {}
    try:
        for threads in (1, 2, 3):
            answers[threads] = []
            worker = threading.Thread(target=session, args=(threads, answers[threads]))
            worker.start()
            worker.join()
    finally:
        torch.set_num_threads(previous)
    assert all(len(out) == 4 for out in answers.values())
    for threads in (2, 3):
        assert all(torch.equal(a, b) for a, b in zip(answers[1], answers[threads])), threads


def test_a_third_opinion_names_which_of_two_disagreeing_servers_lied():
    """ADR 0178: a second server's replay that disagrees with the span's server names no liar; a third
    opinion does (another server, or the client's own blocks), with evidence against whichever lied,
    the span's server for its step or the second server for its replay, which referees convict."""
    async def scenario():
        # ident(3) lies from its first step: the replay it is asked for; ident(2) serves the span honestly
        async with PaidNetwork(RANGES, server_classes={2: functools.partial(BlockServer, lie_after=0)}) as net:
            generator = RemoteGenerator(net.client, random_build((0, 0), True), net.servers[:2], payer=payer())
            await generator.generate(PROMPT, 6)
            lying_referee, honest_third = net.servers[2], net.servers[3]
            alone = await generator.spot_check_remote(1, lying_referee)
            by_server = await generator.spot_check_remote(1, lying_referee, honest_third)
            by_local = await generator.spot_check_remote(1, lying_referee, random_build((3, 6), False))
            honest = await generator.spot_check_remote(1, honest_third, lying_referee)
            return alone, by_server, by_local, honest

    alone, by_server, by_local, honest = asyncio.run(scenario())
    assert not alone.ok and alone.first_bad_step == 5 and alone.culprit is None and alone.evidence is None
    assert honest.ok                                              # two honest servers agree: no third asked
    for check in (by_server, by_local):
        assert not check.ok and check.first_bad_step == 5 and check.culprit == ident(3).peer_id
        evidence = check.evidence
        assert evidence is not None and evidence["receipt"]["server"] == ident(3).peer_id
        # the liar's replay is one step over every chunk; referees recompute it to another answer: guilty
        bundle = encode_bundle(evidence["receipt"]["model"], evidence["steps"], evidence["setup"])
        payload = dispute_payload(evidence, bundle, PROFILE, 200)
        claim = Claim(evidence["receipt"]["model"], 3, 6, payload["prior"], payload["link"], payload["answer"],
                      payload["inputs"])
        valid, output = referee_verdict(bundle, claim, random_build((3, 6), False))
        assert valid and output != claim.answer


def test_a_client_no_referee_can_dial_delivers_its_evidence_and_the_liar_is_convicted():
    """ADR 0182: a client that listens nowhere (behind NAT, or the CLI's node on 0.0.0.0) advertises no
    address; it pushes the bundle to the drawn referees, which keep it and vote on it. A delivery that is
    unsolicited, from another peer, to a node that is no referee, or of bytes that are not the committed
    bundle is refused with a reason and changes nothing."""
    async def scenario():
        network = PaidNetwork(RANGES, server_classes={1: functools.partial(BlockServer, lie_after=5)})
        network.client = Host(ident(9), listen_addrs=())   # dials out only
        async with network as net:
            assert net.client.listen_addrs == []
            chain = ledger("test-model")
            inboxes = [Inbox(ChainGateway(chain, ident(i + 1)), host.peer_id) for i, host in enumerate(net.hosts)]
            for host, inbox in zip(net.hosts, inboxes):
                host.set_handler(BUNDLE_PROTOCOL, make_bundle_handler(inbox=inbox))

            async def evidence_of_a_new_session() -> dict:
                generator = RemoteGenerator(net.client, random_build((0, 0), True), net.servers[:2], payer=payer())
                await generator.generate(PROMPT, 8)
                await asyncio.sleep(0.05)
                check = generator.spot_check(1, random_build((3, 6), False))
                assert not check.ok and check.culprit == LIAR.peer_id and check.evidence is not None
                return check.evidence

            def duty(peer):
                index = next(i for i, host in enumerate(net.hosts) if host.peer_id == peer)
                return referee_duty(ChainGateway(chain, ident(index + 1)), net.hosts[index],
                                    random_build(RANGES[index], False), inboxes[index])

            # the CLI's path: file, deliver until the referees voted
            stake_before = chain.ledger.state.stakes[LIAR.peer_id].bonded
            filing = asyncio.create_task(file_dispute(ChainGateway(chain, CLIENT), net.client, BundleStore(),
                                                      await evidence_of_a_new_session(), 200, wait_s=60, poll_s=0.02))
            ident_, record = await filed(chain)
            assert record.addrs == []                       # nothing a referee could fetch from
            referees = [peer for peer, _ in record.referees]
            held = [inboxes[[h.peer_id for h in net.hosts].index(peer)] for peer in referees]
            for _ in range(500):
                if all(inbox.get(record.inputs) is not None for inbox in held):
                    break
                await asyncio.sleep(0.02)
            assert all(inbox.get(record.inputs) is not None for inbox in held)
            for peer in referees:
                assert await duty(peer) == 1
            assert await filing == {"dispute": ident_.hex(), "status": "guilty"}
            assert chain.ledger.state.stakes[LIAR.peer_id].bonded < stake_before
            assert all(inbox.get(record.inputs) is None for inbox in held)   # used, dropped

            # refused deliveries, against a second session's dispute filed by hand
            evidence = await evidence_of_a_new_session()
            bundle = encode_bundle(evidence["receipt"]["model"], evidence["steps"], evidence["setup"])
            payload = dispute_payload(evidence, bundle, PROFILE, 200)
            unknown = await deliver_bundle(net.client, referees[0], b"\x07" * 32, bundle)
            assert unknown == "no open dispute has that id"
            chain.ok(CLIENT, "serve_dispute", {**payload, "addrs": []})
            dispute = next(i for i in chain.ledger.state.open_serve_disputes)
            record = chain.ledger.state.serve_disputes[dispute]
            chain.empty_blocks(chain.params.beacon_delay)           # its referees, from a later beacon
            referees = [peer for peer, _ in record.referees]
            bystander = next(h for h in net.hosts if h.peer_id not in referees + [LIAR.peer_id])
            first = next(h for h in net.hosts if h.peer_id == referees[0])
            bystander.peerbook.add_addrs(referees[0], first.listen_addrs)
            refused = {
                "forged": await deliver_bundle(net.client, referees[0], dispute, bundle[:-4] + bytes(4)),
                "oversized": await deliver_bundle(net.client, referees[0], dispute,
                                                  (MAX_FRAME + 1).to_bytes(4, "big") + bytes(8)),
                "not the client": await deliver_bundle(bystander, referees[0], dispute, bundle),
                "no referee": await deliver_bundle(net.client, bystander.peer_id, dispute, bundle),
                "junk request": await deliver_bundle(net.client, referees[0], b"\x01", bundle),
            }
            assert refused == {
                "forged": "the bundle does not hash to the dispute's committed inputs",
                "oversized": f"the bundle is refused: frame of {MAX_FRAME + 1} bytes exceeds {MAX_FRAME}",
                "not the client": "only the dispute's client delivers its evidence",
                "no referee": "this node is not a referee of that dispute waiting for its evidence",
                "junk request": "a delivery names its dispute by its 32-byte id in hex"}
            assert all(inbox.get(record.inputs) is None for inbox in inboxes)
            assert [await duty(peer) for peer in referees] == [0, 0]   # nothing delivered: no vote
            assert all(vote is None for _, vote in record.referees) and record.status == "open"
            assert await deliver_bundle(net.client, referees[0], dispute, bundle) is None
            assert await deliver_bundle(net.client, referees[0], dispute, bundle) is None   # again: kept once
            assert await duty(referees[0]) == 1

    asyncio.run(scenario())


def test_evidence_reaches_referees_only_reachable_through_a_relay():
    """ADR 0182 across NAT: the referees can be reached only at the relayed addresses their ledger records
    carry, the client (listening nowhere) learns them from the ledger and dials them through its relay
    client; the bundle arrives over the circuits and the liar is convicted."""
    from node.p2p.peerbook import PeerBook
    from relay.client import RelayClient
    from tests.relay.relay_harness import start_relay

    class RelayedRecords(ChainGateway):
        """Node records as a NAT'd server's: no listen address, its relayed ones."""

        def __init__(self, chain, identity, relayed: dict[str, list[str]]):
            super().__init__(chain, identity)
            self.relayed = relayed

        async def call(self, method: str, *params):
            record = await super().call(method, *params)
            if method == "dkb_getNode" and record is not None:
                record = {**record, "listen_addrs": [], "relay_addrs": self.relayed.get(params[0], [])}
            return record

    async def scenario():
        network = PaidNetwork(RANGES, server_classes={1: functools.partial(BlockServer, lie_after=5)})
        network.client = Host(ident(9), listen_addrs=())
        async with network as net:
            relay = await start_relay({h.peer_id for h in [net.client, *net.hosts]})
            clients = [RelayClient(h) for h in [net.client, *net.hosts[2:]]]
            try:
                for client in clients:
                    client.start()
                net.client.register_circuit_dialer(lambda maddr, bulk: clients[0].dial([str(maddr)], bulk=bulk))
                relayed = {}
                for client in clients[1:]:
                    await client.reserve(relay.host.listen_addrs[0])
                    relayed[client.host.peer_id] = client.relayed_addrs
                net.client.peerbook = PeerBook()   # the client knows the chained servers only
                for info, host in zip(net.servers[:2], net.hosts):
                    net.client.peerbook.add_addrs(info.peer_id, host.listen_addrs)
                chain = ledger("test-model")
                inboxes = {h.peer_id: Inbox(ChainGateway(chain, ident(i + 1)), h.peer_id)
                           for i, h in enumerate(net.hosts)}
                for host in net.hosts:
                    host.set_handler(BUNDLE_PROTOCOL, make_bundle_handler(inbox=inboxes[host.peer_id]))
                generator = RemoteGenerator(net.client, random_build((0, 0), True), net.servers[:2], payer=payer())
                await generator.generate(PROMPT, 8)
                await asyncio.sleep(0.05)
                check = generator.spot_check(1, random_build((3, 6), False))
                assert check.culprit == LIAR.peer_id and check.evidence is not None
                filing = asyncio.create_task(file_dispute(RelayedRecords(chain, CLIENT, relayed), net.client,
                                                          BundleStore(), check.evidence, 200, wait_s=60, poll_s=0.02))
                ident_, record = await filed(chain)
                referees = [peer for peer, _ in record.referees]
                assert record.addrs == [] and set(referees) == set(relayed)
                for _ in range(500):
                    if all(inboxes[peer].get(record.inputs) is not None for peer in referees):
                        break
                    await asyncio.sleep(0.02)
                for peer in referees:   # reached over a circuit: a relayed connection has no remote address
                    assert inboxes[peer].get(record.inputs) is not None
                    assert [conn.remote_addr for conn in net.client.connections(peer)] == [None]
                    index = next(i for i, host in enumerate(net.hosts) if host.peer_id == peer)
                    assert await referee_duty(ChainGateway(chain, ident(index + 1)), net.hosts[index],
                                              random_build(RANGES[index], False), inboxes[peer]) == 1
                assert await filing == {"dispute": ident_.hex(), "status": "guilty"}
            finally:
                net.client.register_circuit_dialer(None)
                await relay.stop()
                await relay.host.stop()

    asyncio.run(scenario())
