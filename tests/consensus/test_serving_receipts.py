"""Serving payments (ADR 0174): escrow deposit/unlock/withdraw, co-signed receipts paid once, bounded."""
from __future__ import annotations

import pytest

from consensus.genesis import Params
from consensus.state.serving import serve_channel_id
from consensus.tx import serve_receipt_signing_bytes
from consensus.txcodes import TxCode, TxError
from devtools.ledger_chain import Chain, ident

SERVER, CLIENT, OTHER = ident(1), ident(2), ident(3)
HW = {"cpu_cores": 2, "ram_mb": 1000, "gpu": "", "gpu_mem_mb": 0, "bandwidth_mbps": 50}


def serving_chain(bond: int = 500) -> Chain:
    chain = Chain(balance=100_000, params=Params(task_min_s=12, task_slack_s=0, audit_window_s=2,
                                                  min_fee=0,
                                                  serve_unlock_blocks=5))
    chain.block([chain.tx(SERVER, "register_node", {"roles": ["compute"], "listen_addrs": [], "relay_addrs": [],
                                                    "hardware": HW}),
                 chain.tx(SERVER, "bond", {"amount": bond})])
    return chain


def receipt(seq: int, amount: int, tokens: int = 10, flops: int = 1000, session: bytes = b"s" * 16,
            client=CLIENT, server=SERVER) -> dict:
    return {"session": session, "server": server.peer_id, "client": client.peer_id, "model": "random:4x32",
            "tokens": tokens, "flops": flops, "amount": amount, "seq": seq, "transcript": b"\x01" * 32}


def signed(chain: Chain, rec: dict, client=CLIENT, server=SERVER) -> dict:
    message = serve_receipt_signing_bytes(chain.chain_id, rec)
    return {"receipt": rec, "client_sig": client.sign(message), "server_sig": server.sign(message)}


def balance(chain: Chain, who) -> int:
    acct = chain.ledger.state.accounts.get(who.peer_id)
    return acct.balance if acct else 0


def escrow(chain: Chain, who=CLIENT) -> int:
    record = chain.ledger.state.serve_escrows.get(who.peer_id)
    return record.balance if record else 0


def test_cumulative_receipts_pay_the_increase_once():
    chain = serving_chain()
    chain.ok(CLIENT, "serve_deposit", {"amount": 1_000})
    assert escrow(chain) == 1_000 and balance(chain, CLIENT) == 99_000
    before = balance(chain, SERVER)
    chain.ok(SERVER, "serve_receipt", signed(chain, receipt(1, 100, tokens=10)))
    chain.ok(SERVER, "serve_receipt", signed(chain, receipt(3, 250, tokens=25)))
    assert balance(chain, SERVER) == before + 250 and escrow(chain) == 750
    # the same receipt again, an older one, or one with a higher seq but no more amount: nothing paid
    for rec in (receipt(3, 250, tokens=25), receipt(2, 200, tokens=20), receipt(4, 250, tokens=30),
                receipt(5, 300, tokens=20)):
        assert chain.run(SERVER, "serve_receipt", signed(chain, rec)).code == TxCode.REPLAYED
    assert balance(chain, SERVER) == before + 250
    channel = chain.ledger.state.serve_channels[serve_channel_id(receipt(3, 250))]
    assert (channel.seq, channel.tokens, channel.amount_paid) == (3, 25, 250)
    # another session of the same pair is a separate channel
    chain.ok(SERVER, "serve_receipt", signed(chain, receipt(1, 50, session=b"t" * 16)))
    assert escrow(chain) == 700


def test_receipt_needs_both_signatures_and_the_server_as_sender():
    chain = serving_chain()
    chain.ok(CLIENT, "serve_deposit", {"amount": 1_000})
    rec = receipt(1, 100)
    forged = signed(chain, rec, client=OTHER)
    assert chain.run(SERVER, "serve_receipt", forged).code == TxCode.BAD_SIGNATURE
    unsigned_by_server = {**signed(chain, rec), "server_sig": OTHER.sign(serve_receipt_signing_bytes(
        chain.chain_id, rec))}
    assert chain.run(SERVER, "serve_receipt", unsigned_by_server).code == TxCode.BAD_SIGNATURE
    assert chain.run(OTHER, "serve_receipt", signed(chain, rec)).code == TxCode.UNAUTHORIZED
    wrong_chain = {"receipt": rec, "client_sig": CLIENT.sign(serve_receipt_signing_bytes("other", rec)),
                   "server_sig": SERVER.sign(serve_receipt_signing_bytes("other", rec))}
    assert chain.run(SERVER, "serve_receipt", wrong_chain).code == TxCode.BAD_SIGNATURE
    self_bill = receipt(1, 100, client=SERVER)
    assert chain.run(SERVER, "serve_receipt", signed(chain, self_bill, client=SERVER)).code == TxCode.BAD_PAYLOAD
    assert escrow(chain) == 1_000


def test_server_must_be_a_bonded_compute_node():
    chain = serving_chain(bond=10)
    chain.ok(CLIENT, "serve_deposit", {"amount": 1_000})
    code = chain.run(SERVER, "serve_receipt", signed(chain, receipt(1, 100))).code
    assert code == TxCode.UNAUTHORIZED
    rec = receipt(1, 100, server=OTHER)   # not registered at all
    assert chain.run(OTHER, "serve_receipt", signed(chain, rec, server=OTHER)).code == TxCode.UNAUTHORIZED


def test_claim_beyond_the_escrow_fails_whole_and_succeeds_after_a_top_up():
    chain = serving_chain()
    chain.ok(CLIENT, "serve_deposit", {"amount": 100})
    claim = signed(chain, receipt(1, 150))
    assert chain.run(SERVER, "serve_receipt", claim).code == TxCode.INSUFFICIENT_FUNDS
    assert escrow(chain) == 100
    chain.ok(CLIENT, "serve_deposit", {"amount": 100})
    chain.ok(SERVER, "serve_receipt", claim)
    assert escrow(chain) == 50
    assert chain.run(SERVER, "serve_receipt", signed(chain, receipt(1, 150, client=OTHER), client=OTHER)
                     ).code == TxCode.INSUFFICIENT_FUNDS   # a client without escrow


def test_withdraw_waits_for_the_unlock_and_servers_claim_meanwhile():
    chain = serving_chain()
    chain.ok(CLIENT, "serve_deposit", {"amount": 1_000})
    assert chain.run(CLIENT, "serve_withdraw", {"amount": 10}).code == TxCode.BAD_STATE   # not unlocked
    chain.ok(CLIENT, "serve_unlock", {})
    unlock_at = chain.ledger.state.serve_escrows[CLIENT.peer_id].unlock_height
    assert unlock_at == chain.ledger.height + 5
    assert chain.run(CLIENT, "serve_unlock", {}).code == TxCode.BAD_STATE
    assert chain.run(CLIENT, "serve_withdraw", {"amount": 10}).code == TxCode.BAD_STATE   # too early
    chain.ok(SERVER, "serve_receipt", signed(chain, receipt(1, 300)))
    while chain.ledger.height + 1 < unlock_at:
        chain.block()
    assert chain.run(CLIENT, "serve_withdraw", {"amount": 701}).code == TxCode.INSUFFICIENT_FUNDS
    before = balance(chain, CLIENT)
    chain.ok(CLIENT, "serve_withdraw", {"amount": 700})
    assert balance(chain, CLIENT) == before + 700
    assert CLIENT.peer_id not in chain.ledger.state.serve_escrows   # emptied records are dropped
    assert chain.run(CLIENT, "serve_unlock", {}).code == TxCode.NOT_FOUND


def test_a_deposit_locks_the_escrow_again():
    chain = serving_chain()
    chain.ok(CLIENT, "serve_deposit", {"amount": 100})
    chain.ok(CLIENT, "serve_unlock", {})
    chain.ok(CLIENT, "serve_deposit", {"amount": 1})
    assert chain.ledger.state.serve_escrows[CLIENT.peer_id].unlock_height == 0
    assert chain.run(CLIENT, "serve_deposit", {"amount": 10**9}).code == TxCode.INSUFFICIENT_FUNDS


def test_escrow_survives_a_reload_and_counts_in_the_supply():
    from consensus.state.store import LedgerState
    from consensus.state.supply import supply_breakdown
    chain = serving_chain()
    chain.ok(CLIENT, "serve_deposit", {"amount": 1_000})
    chain.ok(SERVER, "serve_receipt", signed(chain, receipt(1, 300)))
    state = chain.ledger.state
    reloaded = LedgerState.load(state.items())
    assert reloaded.serve_escrows[CLIENT.peer_id] == state.serve_escrows[CLIENT.peer_id]
    assert reloaded.serve_channels == state.serve_channels
    assert supply_breakdown(state)["serve_escrow"] == 700


@pytest.mark.parametrize("bad", [
    {"tokens": -1}, {"amount": 0}, {"seq": 0}, {"session": b"short"}, {"model": ""}, {"client": "nope"},
])
def test_malformed_receipts_are_refused(bad):
    chain = serving_chain()
    chain.ok(CLIENT, "serve_deposit", {"amount": 1_000})
    rec = {**receipt(1, 100), **bad}
    payload = {"receipt": rec, "client_sig": b"\x00" * 64, "server_sig": b"\x00" * 64}
    with pytest.raises(TxError) as err:   # refused when decoded, before any block
        chain.tx(SERVER, "serve_receipt", payload)
    assert err.value.code == TxCode.BAD_PAYLOAD


def test_served_ranges_are_listed_by_model():
    from consensus.state.serving import list_nodes
    chain = serving_chain()
    served = {"model": "random:4x32", "start": 0, "end": 2, "tokens_per_s": 50, "profile": "", "price": 3}
    chain.ok(OTHER, "register_node", {"roles": ["compute"], "listen_addrs": ["/ip4/10.0.0.3/tcp/4001"],
                                      "relay_addrs": [], "hardware": {**HW, "serving": [served]}})
    state = chain.ledger.state
    assert [n["peer_id"] for n in list_nodes(state, model="random:4x32")] == [OTHER.peer_id]
    assert list_nodes(state, model="other") == []
    assert {n["peer_id"] for n in list_nodes(state, role="compute")} == {SERVER.peer_id, OTHER.peer_id}
    assert len(list_nodes(state, limit=1)) == 1
    assert list_nodes(state, model="random:4x32")[0]["hardware"]["serving"] == [served]
