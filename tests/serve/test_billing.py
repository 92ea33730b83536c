"""Paid serving (ADR 0174): receipts co-signed over /dekube/serve/1.0.0 pay the servers on the ledger,
a client that stops signing is cut off, and a lying server's countersigned transcript is evidence."""
import asyncio

import pytest
import torch

from consensus.genesis import Params
from consensus.txcodes import TxCode
from devtools.ledger_chain import Chain, ident
from ml.serve import protocol
from ml.serve.billing import (
    BillingError,
    ClientMeter,
    ReceiptBook,
    ServerMeter,
    StepRecord,
    amount_due,
    receipt_from_json,
    receipt_to_json,
)
from ml.serve.client import RemoteGenerator, ServerInfo, local_generate
from ml.serve.handler import ServeHandler
from ml.serve.model import random_decoder
from ml.serve.protocol import Billing, Payer, RemoteError, SpanClient, SpanUnavailable
from ml.serve.server import BlockServer
from ml.serve.transcript import chain, extend
from node.p2p.host import Host
from tests.serve.test_generation import CONFIG, PROMPT, SEED, LyingServer, random_build

CHAIN_ID = "dekube-test"
PRICE = 50_000   # per GFLOP: the 6x32 test model costs a few units per session


class PaidNetwork:
    """Billing block servers (identities 1..n) and a paying client (identity 9)."""

    def __init__(self, ranges, server_classes=None, credit_tokens=1024):
        self.ranges, self.server_classes, self.credit = ranges, server_classes or {}, credit_tokens
        self.hosts: list[Host] = []
        self.books: list[ReceiptBook] = []
        self.servers: list[ServerInfo] = []
        self.client = Host(ident(9))

    async def __aenter__(self):
        for index, (start, end) in enumerate(self.ranges):
            identity = ident(index + 1)
            host, book = Host(identity), ReceiptBook()
            server = self.server_classes.get(index, BlockServer)(random_build((start, end), False))
            host.set_handler(protocol.PROTOCOL, ServeHandler(
                server, "test-model", Billing(identity, CHAIN_ID, PRICE, book, self.credit), host))
            await host.start()
            self.hosts.append(host)
            self.books.append(book)
            self.servers.append(ServerInfo(host.peer_id, start, end))
        await self.client.start()
        for host in self.hosts:
            self.client.peerbook.add_addrs(host.peer_id, host.listen_addrs)
        return self

    async def __aexit__(self, *exc):
        for host in [self.client, *self.hosts]:
            await host.stop()


def payer(max_price=PRICE):
    return Payer(ident(9), CHAIN_ID, max_price)


@pytest.mark.parametrize("push", [False, True])
def test_paid_generation_equals_local_and_the_receipts_pay_on_chain(push):
    expected = local_generate(random_decoder(CONFIG, SEED), PROMPT, 16)

    async def scenario():
        async with PaidNetwork([(0, 3), (3, 6)]) as net:
            generator = RemoteGenerator(net.client, random_build((0, 0), True), net.servers, payer=payer(), push=push)
            tokens = await generator.generate(PROMPT, 16)
            await asyncio.sleep(0.05)
            return tokens, [book.unclaimed() for book in net.books], generator

    tokens, unclaimed, generator = asyncio.run(scenario())
    assert tokens == expected and generator.stats.pushed == (16 if push else 0)
    assert all(len(receipts) == 1 for receipts in unclaimed)
    final = [receipts[0].receipt for receipts in unclaimed]
    # every position went through both servers, and the closing receipt covers the last step
    assert [r["tokens"] for r in final] == [len(PROMPT) + 15] * 2
    assert all(r["seq"] == 16 and r["amount"] == amount_due(r["flops"], PRICE) for r in final)
    assert [m.signed.receipt for m in generator.meters] == final   # the client holds the same receipts

    chain = Chain(balance=100_000, params=Params(task_min_s=12, task_slack_s=0, audit_window_s=2,
                                                 min_fee=0))
    hw = {"cpu_cores": 2, "ram_mb": 1000, "gpu": "", "gpu_mem_mb": 0, "bandwidth_mbps": 50}
    chain.block([tx for i in (1, 2) for tx in (
        chain.tx(ident(i), "register_node", {"roles": ["compute"], "listen_addrs": [], "relay_addrs": [],
                                             "hardware": hw}),
        chain.tx(ident(i), "bond", {"amount": 200}))])
    chain.ok(ident(9), "serve_deposit", {"amount": 10_000})
    before = [chain.ledger.state.accounts[ident(i).peer_id].balance for i in (1, 2)]
    for i, receipts in enumerate(unclaimed):
        chain.ok(ident(i + 1), "serve_receipt", receipts[0].payload())
        assert chain.run(ident(i + 1), "serve_receipt", receipts[0].payload()).code == TxCode.REPLAYED
    paid = [chain.ledger.state.accounts[ident(i).peer_id].balance - b for i, b in zip((1, 2), before, strict=True)]
    assert paid == [r["amount"] for r in final] and all(p > 0 for p in paid)
    assert chain.ledger.state.serve_escrows[ident(9).peer_id].balance == 10_000 - sum(paid)


def test_a_client_that_does_not_sign_is_cut_off_after_its_credit_on_every_stream():
    async def scenario():
        async with PaidNetwork([(0, 6)], credit_tokens=4) as net:
            span = SpanClient(net.client, net.servers[0].peer_id, 0, 6)   # no meter: never signs
            await span.open(32)
            await span.step([torch.zeros(1, 3, CONFIG.width)], "f32")
            await span.step([torch.zeros(1, 1, CONFIG.width)], "f32")
            with pytest.raises(RemoteError, match="without a receipt"):
                await span.step([torch.zeros(1, 1, CONFIG.width)], "f32")
            await span.close()
            await asyncio.sleep(0.2)
            # a new stream does not renew the credit: the unpaid tokens are the client's debt
            fresh = SpanClient(net.client, net.servers[0].peer_id, 0, 6)
            with pytest.raises(RemoteError, match="without a receipt"):
                await fresh.forward(torch.zeros(1, 1, CONFIG.width), None, "f32")
            await fresh.close()

    asyncio.run(scenario())


def test_a_client_refuses_a_price_above_its_limit():
    async def scenario():
        async with PaidNetwork([(0, 6)]) as net:
            meter = ClientMeter(ident(9), CHAIN_ID, PRICE - 1, 10**12)
            span = SpanClient(net.client, net.servers[0].peer_id, 0, 6, meter=meter)
            with pytest.raises(SpanUnavailable, match="per GFLOP"):
                await span.open(32)

    asyncio.run(scenario())


def meters():
    book = ReceiptBook()
    server = ServerMeter(ident(1), CHAIN_ID, "m", ident(9).peer_id, 10, book)
    client = ClientMeter(ident(9), CHAIN_ID, 10, 10**9)
    client.accept_offer(server.offer(), ident(1).peer_id)
    return server, client, book


def test_server_accepts_only_the_usage_it_reported():
    server, client, book = meters()
    step = StepRecord.of(0, 2, "f32", [1], False, torch.zeros(1, 1, 4), torch.ones(1, 1, 4))
    header = server.report(5, 1_000, step.link)
    client.on_reply(header, 5, step)
    fields, sig = client.attach()
    tampered = {**fields["receipt"], "tokens": 4}
    with pytest.raises(BillingError, match="tokens"):
        server.accept(tampered, fields["client_sig"])
    cheap = dict(fields["receipt"], amount=0)
    with pytest.raises(BillingError):
        server.accept(cheap, fields["client_sig"])
    with pytest.raises(BillingError, match="signed"):
        server.accept(fields["receipt"], ident(3).sign(b"x").hex())
    server_sig = server.accept(fields["receipt"], fields["client_sig"])
    client.on_countersign({"server_sig": server_sig}, sig)
    assert client.signed is not None and book.unclaimed()[0] == client.signed
    with pytest.raises(BillingError, match="seq"):   # the same receipt twice
        server.accept(fields["receipt"], fields["client_sig"])
    assert receipt_from_json(receipt_to_json(client.signed.receipt)) == client.signed.receipt
    assert client.signed.receipt["transcript"] == extend(bytes(32), step.link)


def test_client_refuses_overstated_usage():
    server, client, _ = meters()
    with pytest.raises(BillingError, match="sent 3 tokens"):
        client.on_reply(server.report(4, 10, None), 3, None)
    _, client, _ = meters()
    with pytest.raises(BillingError, match="FLOPs"):
        client.on_reply(server.report(3, 10**12, None), 3, None)


@pytest.mark.parametrize("push", [False, True])
def test_a_lying_servers_countersigned_transcript_is_evidence(push):
    async def scenario():
        async with PaidNetwork([(0, 3), (3, 6)], server_classes={1: LyingServer}) as net:
            generator = RemoteGenerator(net.client, random_build((0, 0), True), net.servers, payer=payer(), push=push)
            await generator.generate(PROMPT, 12)
            await asyncio.sleep(0.05)
            return generator, net.servers

    generator, servers = asyncio.run(scenario())
    check = generator.spot_check(1, random_build((3, 6), False))
    assert not check.ok and check.culprit == servers[1].peer_id
    evidence = check.evidence
    assert evidence is not None and evidence["wrong_step"] == 5
    receipt = receipt_from_json(evidence["receipt"])
    assert receipt["server"] == servers[1].peer_id
    # the steps chain to the transcript the server signed, which ends at the wrong step
    assert chain([step.link for step in evidence["steps"]]) == receipt["transcript"]
    assert extend(bytes.fromhex(evidence["prior"]), bytes.fromhex(evidence["link"])) == receipt["transcript"]
    from consensus.tx import public_key_for, serve_receipt_signing_bytes, verify_signature
    assert verify_signature(public_key_for(receipt["server"]), serve_receipt_signing_bytes(CHAIN_ID, receipt),
                            bytes.fromhex(evidence["server_sig"]))
    assert generator.spot_check(0, random_build((0, 3), False)).evidence is None   # honest: nothing to show


def test_debts_expire_and_are_bounded():
    from ml.serve.billing import DebtBook
    now = [0.0]
    debts = DebtBook(ttl_s=10, limit=2, clock=lambda: now[0])
    debts.add("a", 5)
    debts.add("a", 3)
    debts.add("b", 0)
    assert debts.owed("a") == 8 and debts.owed("b") == 0
    now[0] = 11
    assert debts.owed("a") == 0
    for name in ("b", "c", "d"):
        debts.add(name, 1)
    assert debts.owed("b") == 0 and debts.owed("d") == 1   # the oldest client was dropped


@pytest.mark.parametrize("push", [False, True])
@pytest.mark.parametrize("codec", ["f16", "int8", "int4"])
def test_lossy_codecs_agree_on_the_transcript(codec, push):
    async def scenario():
        async with PaidNetwork([(0, 3), (3, 6)]) as net:
            generator = RemoteGenerator(net.client, random_build((0, 0), True), net.servers, codec=codec,
                                        payer=payer(), push=push)
            await generator.generate(PROMPT, 6)
            await asyncio.sleep(0.05)
            return generator, [book.unclaimed() for book in net.books]

    generator, unclaimed = asyncio.run(scenario())
    assert generator.stats.pushed == (6 if push else 0)   # the pushed input is what the server's transcript commits
    assert generator.stats.replays == 0 and all(m.signed is not None and m.signed.receipt["seq"] == 6
                                                for m in generator.meters)
    assert [r[0].receipt for r in unclaimed] == [m.signed.receipt for m in generator.meters]
