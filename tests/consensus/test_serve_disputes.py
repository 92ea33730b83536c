"""Serving disputes (ADR 0176): a client's fraud claim, referees drawn among servers of the same model and
profile, majority verdicts, slashing with refunds, bonds lost, deadlines, supply conserved."""
from __future__ import annotations

import hashlib

from consensus.genesis import Params
from consensus.state.serve_disputes import dispute_id
from consensus.state.store import LedgerState
from consensus.tx import serve_receipt_signing_bytes
from consensus.txcodes import TxCode
from devtools.ledger_chain import Chain, ident

SERVER, CLIENT = ident(1), ident(2)
REFEREES = [ident(3), ident(4), ident(5)]
OTHER_PROFILE = ident(6)
MODEL, PROFILE = "random:4x32", "cpu-x86-64-avx2/torch-2.13.0"
PRIOR, LINK = b"\x07" * 32, b"\x08" * 32
ANSWER, INPUTS = b"\x0a" * 32, b"\x0b" * 32


def hardware(profile: str = PROFILE, start: int = 0, end: int = 4) -> dict:
    return {"cpu_cores": 2, "ram_mb": 1000, "gpu": "", "gpu_mem_mb": 0, "bandwidth_mbps": 50, "profiles": [profile],
            "serving": [{"model": MODEL, "start": start, "end": end, "tokens_per_s": 10, "profile": profile,
                         "price": 1}]}


def dispute_chain(referees=REFEREES, ttl: int = 600, window: int = 1_000) -> Chain:
    chain = Chain(balance=100_000, params=Params(task_min_s=12, task_slack_s=0, audit_window_s=2,
                                                  min_fee=0,
                                                  serve_unlock_blocks=5, referees=3, serve_referee_s=5,
                                                  serve_dispute_bond=100, slash_serve_bps=2_000, serve_referee_fee=10,
                                                  serve_announce_ttl=ttl, serve_dispute_window=window))
    txs = []
    for who in [SERVER, *referees]:
        txs += [chain.tx(who, "register_node", {"roles": ["compute"], "listen_addrs": [], "relay_addrs": [],
                                                "hardware": hardware()}),
                chain.tx(who, "bond", {"amount": 500})]
    txs += [chain.tx(OTHER_PROFILE, "register_node", {"roles": ["compute"], "listen_addrs": [], "relay_addrs": [],
                                                      "hardware": hardware("cpu-other/torch-2.13.0")}),
            chain.tx(OTHER_PROFILE, "bond", {"amount": 500}),
            chain.tx(CLIENT, "serve_deposit", {"amount": 1_000})]
    chain.block(txs)
    return chain


def receipt(seq: int = 1, amount: int = 60, transcript: bytes | None = None) -> dict:
    return {"session": b"s" * 16, "server": SERVER.peer_id, "client": CLIENT.peer_id, "model": MODEL,
            "tokens": 10 * seq, "flops": 1000 * seq, "amount": amount, "seq": seq,
            "transcript": transcript if transcript is not None else hashlib.sha256(PRIOR + LINK).digest()}


def signed(chain: Chain, rec: dict) -> dict:
    message = serve_receipt_signing_bytes(chain.chain_id, rec)
    return {"receipt": rec, "client_sig": CLIENT.sign(message), "server_sig": SERVER.sign(message)}


def claim(chain: Chain, rec: dict | None = None, **fields) -> dict:
    return {**signed(chain, rec or receipt()), "prior": PRIOR, "link": LINK, "answer": ANSWER, "inputs": INPUTS,
            "start": 0, "end": 4, "profile": PROFILE, "bond": 200, **fields}


def balance(chain: Chain, who) -> int:
    acct = chain.ledger.state.accounts.get(who.peer_id)
    return acct.balance if acct else 0


def bonded(chain: Chain, who) -> int:
    return chain.ledger.state.stakes[who.peer_id].bonded


def opened(chain: Chain) -> tuple[bytes, list[str]]:
    """File the standard claim (after the server claimed 60 for the session); the dispute id and referees."""
    chain.ok(SERVER, "serve_receipt", signed(chain, receipt()))
    result = chain.block([chain.tx(CLIENT, "serve_dispute", claim(chain))])
    assert result.receipts[0].code == TxCode.OK, result.receipts[0]
    event = next(e for e in result.events if e["type"] == "serve_dispute_opened")
    return event["dispute"], drawn(chain)


def drawn(chain: Chain) -> list[str]:
    """The blocks until the dispute's referees are drawn from a later beacon (ADR 0210); their IDs."""
    for _ in range(chain.params.beacon_delay):
        result = chain.block()
        event = next((e for e in result.events if e["type"] == "serve_referees_drawn"), None)
        if event is not None:
            return event["referees"]
    raise AssertionError("no referees drawn")


def by_id(peer_id: str):
    return next(who for who in [*REFEREES, OTHER_PROFILE, SERVER, CLIENT] if who.peer_id == peer_id)


def vote(chain: Chain, peer_id: str, ident_: bytes, valid: bool, output: bytes):
    return chain.run(by_id(peer_id), "serve_referee_vote", {"dispute": ident_, "valid": valid, "output": output})


def test_referees_serve_the_same_model_profile_and_blocks_and_exclude_the_parties():
    chain = dispute_chain()
    ident_, referees = opened(chain)
    assert ident_ == dispute_id(receipt())
    assert sorted(referees) == sorted(r.peer_id for r in REFEREES)     # not the server, client, other profile
    record = chain.ledger.state.serve_disputes[ident_]
    assert record.status == "open" and record.bond == 200
    assert record.deadline == chain.ledger.state.last_block_time_ms + 5000   # serve_referee_s of block time


def test_referees_are_drawn_from_a_beacon_after_the_dispute():
    """ADR 0210: the dispute's block only schedules the draw; the panel comes from the beacon of the
    block beacon_delay later, which nobody knew when the dispute was included; votes before it are refused."""
    chain = dispute_chain()
    chain.ok(SERVER, "serve_receipt", signed(chain, receipt()))
    result = chain.block([chain.tx(CLIENT, "serve_dispute", claim(chain))])
    event = next(e for e in result.events if e["type"] == "serve_dispute_opened")
    ident_, filed_at = event["dispute"], chain.ledger.height
    assert event["referees"] == [] and event["draw_at"] == filed_at + chain.params.beacon_delay
    assert vote(chain, REFEREES[0].peer_id, ident_, True, ANSWER).code == TxCode.UNAUTHORIZED   # nobody drawn yet
    referees = drawn(chain)
    assert chain.ledger.height == filed_at + chain.params.beacon_delay and len(referees) == 3
    record = chain.ledger.state.serve_disputes[ident_]
    assert [r[0] for r in record.referees] == referees
    assert record.deadline == chain.ledger.state.last_block_time_ms + 5000


def test_a_dispute_whose_referees_left_by_the_draw_returns_the_bond():
    chain = dispute_chain(ttl=5)
    hw = hardware()
    hw["serving"][0]["height"] = chain.ledger.height + 1
    chain.block([chain.tx(who, "register_node", {"roles": ["compute"], "listen_addrs": [], "relay_addrs": [],
                                                 "hardware": hw}) for who in REFEREES])
    chain.ok(SERVER, "serve_receipt", signed(chain, receipt()))
    chain.empty_blocks(2)
    before = balance(chain, CLIENT)
    result = chain.block([chain.tx(CLIENT, "serve_dispute", claim(chain))])
    assert result.receipts[0].code == TxCode.OK          # the referees' announcements are still fresh
    ident_ = next(e for e in result.events if e["type"] == "serve_dispute_opened")["dispute"]
    chain.empty_blocks(chain.params.beacon_delay)         # stale by the draw: nobody to draw
    record = chain.ledger.state.serve_disputes[ident_]
    assert record.status == "undecided" and record.referees == [] and balance(chain, CLIENT) == before   # bond back


def test_a_majority_recomputing_another_answer_slashes_the_server_and_refunds_the_client():
    chain = dispute_chain()
    ident_, referees = opened(chain)
    client_before, stake_before = balance(chain, CLIENT), bonded(chain, SERVER)
    burned_before = chain.ledger.state.burned
    wrong = b"\x0c" * 32
    assert vote(chain, referees[0], ident_, True, wrong).code == TxCode.OK
    assert vote(chain, referees[1], ident_, True, wrong).code == TxCode.OK
    assert vote(chain, referees[2], ident_, True, ANSWER).code == TxCode.OK    # the third decides early
    record = chain.ledger.state.serve_disputes[ident_]
    assert record.status == "guilty" and record.bond == 0
    slashed = stake_before * 2_000 // 10_000
    assert bonded(chain, SERVER) == stake_before - slashed
    assert balance(chain, CLIENT) == client_before + 200 + 60        # bond back + the session's payment
    assert balance(chain, by_id(referees[0])) > balance(chain, by_id(referees[2]))   # minority unpaid
    minority = chain.ledger.stake_info(referees[2])["slashed"]      # ... and slashed (ADR 0188)
    assert minority > 0 and chain.ledger.stake_info(referees[0])["slashed"] == 0
    assert chain.ledger.state.burned == burned_before + slashed - 60 - 2 * 10 + minority
    # the convicted session's later receipts pay nothing
    assert chain.run(SERVER, "serve_receipt", signed(chain, receipt(seq=2, amount=90))).code == TxCode.UNAUTHORIZED


def test_a_claim_the_referees_reject_costs_the_client_its_bond():
    chain = dispute_chain()
    ident_, referees = opened(chain)
    client_before, server_before = balance(chain, CLIENT), balance(chain, SERVER)
    ref_before = balance(chain, by_id(referees[0]))
    for peer in referees[:2]:
        assert vote(chain, peer, ident_, True, ANSWER).code == TxCode.OK   # the server's answer was right
    chain.empty_blocks(5)                                                 # the third stays silent
    record = chain.ledger.state.serve_disputes[ident_]
    assert record.status == "rejected" and chain.ledger.state.open_serve_disputes == set()
    assert balance(chain, CLIENT) == client_before
    assert balance(chain, by_id(referees[0])) == ref_before + 10
    assert balance(chain, SERVER) == server_before + 200 - 2 * 10
    assert bonded(chain, SERVER) == 500


def test_an_unverifiable_bundle_rejects_the_claim():
    chain = dispute_chain()
    ident_, referees = opened(chain)
    for peer in referees:
        vote(chain, peer, ident_, False, bytes(32))
    assert chain.ledger.state.serve_disputes[ident_].status == "rejected"
    assert bonded(chain, SERVER) == 500


def test_a_tie_or_silence_returns_the_bond():
    chain = dispute_chain()
    ident_, referees = opened(chain)
    before = balance(chain, CLIENT)
    vote(chain, referees[0], ident_, True, b"\x0c" * 32)
    vote(chain, referees[1], ident_, True, ANSWER)
    chain.empty_blocks(5)
    assert chain.ledger.state.serve_disputes[ident_].status == "undecided"
    assert balance(chain, CLIENT) == before + 200 and bonded(chain, SERVER) == 500
    assert vote(chain, referees[2], ident_, True, ANSWER).code == TxCode.BAD_STATE   # too late


def test_referees_get_their_time_whatever_the_block_rate():
    """ADR 0241: the vote deadline is serve_referee_s of block time after the draw. At ten blocks a second
    (10x the default here) a referee that recomputes for 4 s (40 blocks) still votes in time; under the old
    deadline of 5 blocks the panel closed after half a second, the dispute undecided and the liar free."""
    chain = dispute_chain()
    chain.block_ms = 100
    ident_, referees = opened(chain)
    wrong = b"\x0c" * 32
    assert vote(chain, referees[0], ident_, True, wrong).code == TxCode.OK
    chain.empty_blocks(40)                                               # the others recompute for 4 s
    assert chain.ledger.state.serve_disputes[ident_].status == "open"
    assert vote(chain, referees[1], ident_, True, wrong).code == TxCode.OK
    chain.empty_blocks(15)                                               # the third stays silent past 5 s
    assert chain.ledger.state.serve_disputes[ident_].status == "guilty"
    assert vote(chain, referees[2], ident_, True, wrong).code == TxCode.BAD_STATE   # too late


def test_bad_claims_and_votes_are_refused():
    chain = dispute_chain()
    chain.ok(SERVER, "serve_receipt", signed(chain, receipt()))
    assert chain.run(SERVER, "serve_dispute", claim(chain)).code == TxCode.UNAUTHORIZED
    assert chain.run(CLIENT, "serve_dispute", claim(chain, link=b"\x09" * 32)).code == TxCode.BAD_PAYLOAD
    assert chain.run(CLIENT, "serve_dispute", claim(chain, bond=99)).code == TxCode.BAD_PAYLOAD
    assert chain.run(CLIENT, "serve_dispute", claim(chain, start=4, end=4)).code == TxCode.BAD_PAYLOAD
    assert chain.run(CLIENT, "serve_dispute", claim(chain, profile="cpu-other/torch-2.13.0")).code == TxCode.BAD_PAYLOAD
    assert chain.run(CLIENT, "serve_dispute", claim(chain, end=5)).code == TxCode.NOT_FOUND   # nobody serves 0:5
    forged = {**claim(chain), "server_sig": CLIENT.sign(serve_receipt_signing_bytes(chain.chain_id, receipt()))}
    assert chain.run(CLIENT, "serve_dispute", forged).code == TxCode.BAD_SIGNATURE
    assert balance(chain, CLIENT) == 100_000 - 1_000                 # no bond taken by a refused claim
    result = chain.block([chain.tx(CLIENT, "serve_dispute", claim(chain))])
    ident_ = next(e for e in result.events if e["type"] == "serve_dispute_opened")["dispute"]
    assert chain.run(CLIENT, "serve_dispute", claim(chain)).code == TxCode.REPLAYED
    drawn(chain)
    assert vote(chain, SERVER.peer_id, ident_, True, ANSWER).code == TxCode.UNAUTHORIZED
    referee = chain.ledger.state.serve_disputes[ident_].referees[0][0]
    assert vote(chain, referee, ident_, True, ANSWER).code == TxCode.OK
    assert vote(chain, referee, ident_, True, ANSWER).code == TxCode.REPLAYED
    assert vote(chain, referee, b"\x01" * 32, True, ANSWER).code == TxCode.NOT_FOUND


def test_a_dispute_after_the_window_since_the_last_claim_is_refused():
    """ADR 0178: a session may be disputed until serve_dispute_window blocks after its server's last claim."""
    chain = dispute_chain(window=6)
    chain.ok(SERVER, "serve_receipt", signed(chain, receipt()))
    first_claim = chain.ledger.height
    chain.empty_blocks(4)
    chain.ok(SERVER, "serve_receipt", signed(chain, receipt(seq=2, amount=90)))    # a later claim reopens the window
    last_claim = chain.ledger.height
    assert chain.ledger.state.serve_channels[next(iter(chain.ledger.state.serve_channels))].claimed_height == last_claim
    assert last_claim > first_claim + 1
    chain.empty_blocks(last_claim + 6 - chain.ledger.height)                      # the next block is one too late
    before = balance(chain, CLIENT)
    late = chain.run(CLIENT, "serve_dispute", claim(chain))
    assert late.code == TxCode.BAD_STATE and "serve_dispute_window" in late.log
    assert balance(chain, CLIENT) == before and chain.ledger.state.serve_disputes == {}   # no bond taken


def test_a_dispute_on_the_windows_last_block_and_on_an_unclaimed_session_is_filed():
    chain = dispute_chain(window=6)
    chain.ok(SERVER, "serve_receipt", signed(chain, receipt()))
    chain.empty_blocks(5)                                                         # the next block: claim + 6
    assert chain.run(CLIENT, "serve_dispute", claim(chain)).code == TxCode.OK
    unclaimed = dispute_chain(window=6)
    unclaimed.empty_blocks(20)                                                    # never claimed: paid nothing
    assert unclaimed.run(CLIENT, "serve_dispute", claim(unclaimed)).code == TxCode.OK


def test_open_disputes_survive_a_state_reload():
    chain = dispute_chain()
    ident_, _ = opened(chain)
    state = LedgerState.load(chain.ledger.state.items())
    assert state.serve_disputes[ident_] == chain.ledger.state.serve_disputes[ident_]
    assert state.open_serve_disputes == {ident_}


def test_stale_announcements_are_refused_hidden_and_not_drawn():
    """ADR 0177: a served range carries the height it was refreshed at; past serve_announce_ttl it is
    left out of discovery and referee draws, and a range already that old (or from the future) is refused."""
    from consensus.state.serving import list_nodes

    chain = dispute_chain(ttl=8)
    chain.empty_blocks(10)
    now = chain.ledger.height

    def announce(who, height):
        hw = hardware()
        hw["serving"][0]["height"] = height
        return chain.run(who, "register_node", {"roles": ["compute"], "listen_addrs": [], "relay_addrs": [],
                                                "hardware": hw})

    assert announce(REFEREES[0], now + 5).code == TxCode.BAD_PAYLOAD        # from the future
    assert announce(REFEREES[0], now - 9).code == TxCode.BAD_PAYLOAD        # already stale
    for who in REFEREES:
        assert announce(who, chain.ledger.height + 1).code == TxCode.OK
    listed = {n["peer_id"] for n in list_nodes(chain.ledger.state, model=MODEL, ttl=8)}
    assert {r.peer_id for r in REFEREES} <= listed
    chain.empty_blocks(10)                                                  # nobody refreshed
    state = chain.ledger.state
    listed = {n["peer_id"]: n for n in list_nodes(state, model=MODEL, ttl=8)}
    assert not {r.peer_id for r in REFEREES} & set(listed)                 # stale: hidden
    assert SERVER.peer_id in listed                                        # no height: a legacy range counts
    chain.ok(SERVER, "serve_receipt", signed(chain, receipt()))
    assert chain.run(CLIENT, "serve_dispute", claim(chain)).code == TxCode.NOT_FOUND   # no fresh referee
    assert announce(REFEREES[1], chain.ledger.height + 1).code == TxCode.OK           # one refreshes
    assert chain.run(CLIENT, "serve_dispute", claim(chain)).code == TxCode.OK
    assert drawn(chain) == [REFEREES[1].peer_id]


def test_what_rpc_shows_of_disputes():
    from consensus.state.serve_disputes import dispute_json, list_open_disputes

    chain = dispute_chain()
    ident_, referees = opened(chain)
    shown = dispute_json(chain.ledger.state, ident_)
    assert shown["dispute"] == ident_.hex() and shown["status"] == "open" and shown["link"] == LINK.hex()
    assert dispute_json(chain.ledger.state, b"\x00" * 32) is None
    assert [d["dispute"] for d in list_open_disputes(chain.ledger.state, referees[0])] == [ident_.hex()]
    vote(chain, referees[0], ident_, True, ANSWER)
    assert list_open_disputes(chain.ledger.state, referees[0]) == []          # voted: off its to-do list
    assert len(list_open_disputes(chain.ledger.state, referees[1])) == 1
    assert list_open_disputes(chain.ledger.state, SERVER.peer_id) == []
