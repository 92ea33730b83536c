"""Serving disputes (ADR 0176): a client's fraud claim against a server's signed answer, refereed.

A billing server countersigns receipts whose ``transcript`` is a hash chain over the steps it
served; each link commits to one step (block range, codec, chunk lengths, the digest of the hidden
states it was given and of the answer it returned: ml/serve/transcript.py). A client whose spot check
finds a wrong answer sends ``serve_dispute`` with the countersigned receipt whose transcript ends at
that step (``transcript == sha256(prior || link)``), the answer digest, the content hash of the step
bundle (the session's inputs up to that step and the links before it) and a bond of at least
``serve_dispute_bond``. The ledger draws ``referees`` servers stake-weighted among the compute nodes
with ``min_serve_stake`` bonded that announce the same model and profile over a range covering the
disputed blocks (not the client, not the server), at the end of the block ``beacon_delay`` blocks after
the dispute, from that block's random beacon (ADR 0210: the dispute's own proposer, who may choose to
include it or not, cannot know the panel; until then ``referees`` is empty and ``deadline`` is the draw
height; nobody eligible then: undecided, the bond back). Each fetches the bundle from the client, checks
it against the hash and the link, recomputes the step and sends ``serve_referee_vote`` {dispute,
valid, output}. When every referee voted, or at the deadline (``serve_referee_s`` seconds of block time
after the draw: recomputing a step is work, which a block count of a chain whose block rate follows its
load cannot bound, ADR 0241), the (valid, output) most votes agree on, leading every other strictly,
decides:

- valid and output != answer: **guilty**. ``slash_serve_bps`` of the server's stake is slashed; from
  it the client gets back what the session paid the server (at most the slash), each referee that
  voted with the majority ``serve_referee_fee``, the rest is burned; the bond returns to the client
  and the session's later receipts pay nothing.
- otherwise (the bundle did not check out, or the answer was right): **rejected**. The bond pays each
  majority referee ``serve_referee_fee`` and the rest goes to the server.
- a tie or no vote: **undecided**, the bond returns to the client.
- a referee whose vote the decision contradicts is slashed ``slash_false_audit_bps`` (ADR 0188).

One dispute per session (its id is a hash of the session's channel id); bonds count in the supply.
A session whose server claimed a receipt at height h may be disputed until h + ``serve_dispute_window``
(its last claim counts; a session never claimed may be disputed any time, ADR 0178).
"""
from __future__ import annotations

import hashlib
from typing import Any

from consensus.genesis import Params
from consensus.state import deadlines
from consensus.state.accounts import debit
from consensus.state.audits import draw_distinct
from consensus.state.context import BlockContext
from consensus.state.records import ServeDispute
from consensus.state.serving import GUILTY, dispute_id_for_channel, fresh_serving, serve_channel_id
from consensus.state.staking import slash
from consensus.state.store import SERVE_DISPUTE, LedgerState
from consensus.tx import Tx, public_key_for, serve_receipt_signing_bytes, verify_signature
from consensus.txcodes import TxCode, TxError

OPEN, REJECTED, UNDECIDED = "open", "rejected", "undecided"


def dispute_id(receipt: dict[str, Any]) -> bytes:
    """The id of the (only) dispute a session may have."""
    return dispute_id_for_channel(serve_channel_id(receipt))


def serves(hardware: dict[str, Any], model: str, profile: str, start: int, end: int, height: int, ttl: int) -> bool:
    """Whether a node announces ``model`` in ``profile`` over a range covering blocks start..end,
    refreshed within ``ttl`` blocks of ``height`` (ADR 0177)."""
    return any(r.get("model") == model and r.get("profile") == profile and r.get("start", 0) <= start
               and r.get("end", 0) >= end for r in fresh_serving(hardware, height, ttl))


def eligible_referees(state: LedgerState, params: Params, model: str, profile: str, start: int, end: int,
                      excluded: set[str]) -> list[tuple[str, int]]:
    """``(peer_id, bonded)`` of the servers that may referee a dispute, by peer ID."""
    out = []
    for peer_id in sorted(state.nodes):
        node = state.nodes[peer_id]
        stake = state.stakes.get(peer_id)
        if (peer_id not in excluded and stake is not None and stake.bonded >= params.min_serve_stake
                and "compute" in node.roles
                and serves(node.hardware, model, profile, start, end, state.height, params.serve_announce_ttl)):
            out.append((peer_id, stake.bonded))
    return out


def _server_profiles(state: LedgerState, server: str, model: str) -> set[str]:
    node = state.nodes.get(server)
    if node is None:
        return set()
    announced = {r.get("profile") for r in node.hardware.get("serving", ()) if r.get("model") == model}
    return {p for p in announced | set(node.hardware.get("profiles", ())) if isinstance(p, str)}


def apply_serve_dispute(state: LedgerState, params: Params, ctx: BlockContext, tx: Tx) -> None:
    p = tx.payload
    receipt = p["receipt"]
    client, server = receipt["client"], receipt["server"]
    if tx.sender != client:
        raise TxError(TxCode.UNAUTHORIZED, "only the client named in the receipt can dispute it")
    if server == client:
        raise TxError(TxCode.BAD_PAYLOAD, "a server cannot serve itself")
    message = serve_receipt_signing_bytes(tx.chain_id, receipt)
    client_key, server_key = public_key_for(client), public_key_for(server)
    if client_key is None or server_key is None or not (
            verify_signature(client_key, message, p["client_sig"]) and verify_signature(server_key, message,
                                                                                        p["server_sig"])):
        raise TxError(TxCode.BAD_SIGNATURE, "receipt is not signed by both the client and the server")
    if hashlib.sha256(p["prior"] + p["link"]).digest() != receipt["transcript"]:
        raise TxError(TxCode.BAD_PAYLOAD, "the receipt's transcript is not sha256(prior || link)")
    if p["start"] >= p["end"]:
        raise TxError(TxCode.BAD_PAYLOAD, "start must be below end")
    if p["bond"] < params.serve_dispute_bond:
        raise TxError(TxCode.BAD_PAYLOAD, f"a dispute bond is at least {params.serve_dispute_bond}")
    if p["profile"] not in _server_profiles(state, server, receipt["model"]):
        raise TxError(TxCode.BAD_PAYLOAD, "the server does not announce that profile")
    ident = dispute_id(receipt)
    if ident in state.serve_disputes:
        raise TxError(TxCode.REPLAYED, "this session was already disputed")
    channel = state.serve_channels.get(serve_channel_id(receipt))
    closes = channel.claimed_height + params.serve_dispute_window if channel is not None else 0
    if channel is not None and channel.claimed_height and ctx.height > closes:
        raise TxError(TxCode.BAD_STATE, f"too late: the session was last claimed at height {channel.claimed_height}, "
                                        f"its disputes closed at {closes} (serve_dispute_window), now {ctx.height}")
    if not eligible_referees(state, params, receipt["model"], p["profile"], p["start"], p["end"], {client, server}):
        raise TxError(TxCode.NOT_FOUND, "no eligible referee serves that model, profile and range")
    debit(state, client, p["bond"])
    draw_at = ctx.height + params.beacon_delay   # referees come from a later beacon (ADR 0210)
    state.serve_disputes[ident] = ServeDispute(
        client, server, receipt["session"], receipt["model"], p["profile"], p["start"], p["end"], p["prior"], p["link"],
        p["answer"], p["inputs"], p["bond"], [], draw_at, OPEN, list(p.get("addrs", [])))
    state.open_serve_disputes.add(ident)
    state.touch(SERVE_DISPUTE, ident)
    state.events.append({"type": "serve_dispute_opened", "dispute": ident, "client": client, "server": server,
                         "model": receipt["model"], "profile": p["profile"], "start": p["start"], "end": p["end"],
                         "prior": p["prior"], "link": p["link"], "answer": p["answer"], "inputs": p["inputs"],
                         "referees": [], "draw_at": draw_at, "addrs": list(p.get("addrs", []))})


def _draw_referees(state: LedgerState, params: Params, ctx: BlockContext, ident: bytes, dispute: ServeDispute) -> None:
    """The dispute's referees, from this block's beacon (``beacon_delay`` blocks after the dispute: nobody
    knew it when the dispute became final, ADR 0210); nobody eligible left: undecided, the bond back."""
    pool = eligible_referees(state, params, dispute.model, dispute.profile, dispute.start, dispute.end,
                             {dispute.client, dispute.server})
    chosen = draw_distinct(b"dekube/serve-referees\x00" + ident + ctx.beacon, pool, params.referees)
    if not chosen:
        _decide(state, params, ident, dispute)
        return
    dispute.referees = [[peer_id, None] for peer_id in chosen]
    dispute.deadline = ctx.time_ms + params.serve_referee_s * 1000   # a block time from now on (ADR 0241)
    state.touch(SERVE_DISPUTE, ident)
    state.events.append({"type": "serve_referees_drawn", "dispute": ident, "referees": chosen,
                         "deadline": dispute.deadline})


def apply_serve_referee_vote(state: LedgerState, params: Params, ctx: BlockContext, tx: Tx) -> None:
    ident = tx.payload["dispute"]
    dispute = state.serve_disputes.get(ident)
    if dispute is None:
        raise TxError(TxCode.NOT_FOUND, "no such serving dispute")
    if dispute.status != OPEN or (dispute.referees and deadlines.passed(dispute.deadline, ctx)):
        raise TxError(TxCode.BAD_STATE, "the dispute is no longer open for votes")
    entry = next((e for e in dispute.referees if e[0] == tx.sender), None)
    if entry is None:
        raise TxError(TxCode.UNAUTHORIZED, "sender is not a referee of this dispute")
    if entry[1] is not None:
        raise TxError(TxCode.REPLAYED, "referee already voted")
    entry[1] = [tx.payload["valid"], tx.payload["output"]]
    state.touch(SERVE_DISPUTE, ident)
    if all(e[1] is not None for e in dispute.referees):
        _decide(state, params, ident, dispute)


def advance_disputes(state: LedgerState, params: Params, ctx: BlockContext) -> None:
    """At the end of a block: draw the referees of the disputes whose draw height it is; decide the open
    disputes whose vote deadline has passed."""
    for ident in sorted(state.open_serve_disputes):
        dispute = state.serve_disputes[ident]
        if dispute.referees:   # the vote deadline: a block time
            if deadlines.passed(dispute.deadline, ctx, closing=True):
                _decide(state, params, ident, dispute)
        elif ctx.height >= dispute.deadline:   # the draw: a height (the beacon's block)
            _draw_referees(state, params, ctx, ident, dispute)


def _decide(state: LedgerState, params: Params, ident: bytes, dispute: ServeDispute) -> None:
    tally: dict[tuple[bool, bytes], int] = {}
    for _, vote in dispute.referees:
        if vote is not None:
            key = (bool(vote[0]), bytes(vote[1]))
            tally[key] = tally.get(key, 0) + 1
    ranked = sorted(tally.items(), key=lambda item: -item[1])
    bond, dispute.bond = dispute.bond, 0
    paid: dict[str, int] = {}
    if not ranked or (len(ranked) > 1 and ranked[0][1] == ranked[1][1]):
        dispute.status = UNDECIDED
        state.credit(dispute.client, bond)
    else:
        valid, output = ranked[0][0]
        agreeing = [peer for peer, vote in dispute.referees
                    if vote is not None and (bool(vote[0]), bytes(vote[1])) == (valid, output)]
        if valid and output != dispute.answer:
            dispute.status = GUILTY
            slashed = slash(state, dispute.server, params.slash_serve_bps)
            channel = state.serve_channels.get(serve_channel_id(
                {"session": dispute.session, "server": dispute.server, "client": dispute.client}))
            refund = min(channel.amount_paid if channel is not None else 0, slashed)
            pot = slashed - refund
            for peer in agreeing:
                fee = min(params.serve_referee_fee, pot)
                pot -= fee
                paid[peer] = fee
            state.burned -= slashed - pot            # what was handed out is not burned
            state.credit(dispute.client, refund + bond)
            paid[dispute.client] = refund
        else:
            dispute.status = REJECTED
            for peer in agreeing:
                fee = min(params.serve_referee_fee, bond)
                bond -= fee
                paid[peer] = fee
            state.credit(dispute.server, bond)
        for peer, amount in paid.items():
            if amount and peer != dispute.client:
                state.credit(peer, amount)
        _slash_minority(state, params, dispute, (valid, output))
    state.open_serve_disputes.discard(ident)
    state.touch(SERVE_DISPUTE, ident)
    state.touch_meta()
    state.events.append({"type": "serve_dispute_decided", "dispute": ident, "server": dispute.server,
                         "client": dispute.client, "status": dispute.status, "paid": paid})


def _slash_minority(state: LedgerState, params: Params, dispute: ServeDispute, decided: tuple[bool, bytes]) -> None:
    """Every referee whose vote the decision contradicts loses ``slash_false_audit_bps`` of its stake,
    as a contradicted audit answer does (ADR 0188: every judge has skin in the game)."""
    for peer, vote in dispute.referees:
        if vote is not None and (bool(vote[0]), bytes(vote[1])) != decided:
            slash(state, peer, params.slash_false_audit_bps)


def dispute_json(state: LedgerState, ident: bytes) -> dict | None:
    """A dispute as RPC shows it."""
    dispute = state.serve_disputes.get(ident)
    return None if dispute is None else {"dispute": ident.hex(), **dispute.to_json()}


MAX_LIST_DISPUTES = 100


def list_open_disputes(state: LedgerState, referee: str | None = None, limit: int = MAX_LIST_DISPUTES) -> list[dict]:
    """Open disputes (by id), or those where ``referee`` was drawn and has not voted yet: a referee's to-do."""
    out = []
    for ident in sorted(state.open_serve_disputes):
        dispute = state.serve_disputes[ident]
        if referee is not None and not any(peer == referee and vote is None for peer, vote in dispute.referees):
            continue
        out.append({"dispute": ident.hex(), **dispute.to_json()})
        if len(out) >= limit:
            break
    return out
