"""Serving payments (ADR 0174): a client's serving escrow, and servers paid from it by co-signed receipts.

A client moves tokens into its escrow (``serve_deposit``). To take them back it first sends
``serve_unlock``; ``serve_unlock_blocks`` later it may ``serve_withdraw`` (a deposit locks the escrow
again). Servers claim from the escrow all the while, so a client cannot empty it under a server
that has just served it. A receipt carries the cumulative usage of one session (session id, server,
client) with a sequence number; both parties sign it. The server submits it (``serve_receipt``) and is
paid the increase of ``amount`` over what the session was already paid. A receipt whose sequence,
amount, tokens or FLOPs do not exceed (or equal, for tokens and FLOPs) the last paid one pays
nothing (REPLAYED); a claim larger than the escrow fails whole (INSUFFICIENT_FUNDS) and can be sent
again after the client tops up.
"""
from __future__ import annotations

import hashlib

from consensus.encoding import encode
from consensus.genesis import Params
from consensus.state.accounts import debit
from consensus.state.context import BlockContext
from consensus.state.records import ServeChannel, ServeEscrow
from consensus.state.store import SERVE_CHANNEL, SERVE_ESCROW, LedgerState
from consensus.tx import Tx, public_key_for, serve_receipt_signing_bytes, verify_signature
from consensus.txcodes import TxCode, TxError


def serve_channel_id(receipt: dict) -> bytes:
    key = [receipt["session"], receipt["server"], receipt["client"]]
    return hashlib.sha256(b"dekube/serve-channel\x00" + encode(key)).digest()


GUILTY = "guilty"   # a serving dispute's verdict against the server (ADR 0176, serve_disputes.py)


def dispute_id_for_channel(channel_id: bytes) -> bytes:
    """The id of the one dispute a session (its channel) may have."""
    return hashlib.sha256(b"dekube/serve-dispute\x00" + channel_id).digest()


def is_convicted(state: LedgerState, channel_id: bytes) -> bool:
    """Whether the session of ``channel_id`` was found to have served a wrong answer (ADR 0176)."""
    dispute = state.serve_disputes.get(dispute_id_for_channel(channel_id))
    return dispute is not None and dispute.status == GUILTY


def _escrow(state: LedgerState, client: str) -> ServeEscrow:
    escrow = state.serve_escrows.get(client)
    if escrow is None:
        escrow = state.serve_escrows[client] = ServeEscrow()
    return escrow


def apply_serve_deposit(state: LedgerState, params: Params, ctx: BlockContext, tx: Tx) -> None:
    amount = tx.payload["amount"]
    debit(state, tx.sender, amount)
    escrow = _escrow(state, tx.sender)
    escrow.balance += amount
    escrow.unlock_height = 0
    state.touch(SERVE_ESCROW, tx.sender)


def apply_serve_unlock(state: LedgerState, params: Params, ctx: BlockContext, tx: Tx) -> None:
    escrow = state.serve_escrows.get(tx.sender)
    if escrow is None or escrow.balance == 0:
        raise TxError(TxCode.NOT_FOUND, "no serving escrow to unlock")
    if escrow.unlock_height:
        raise TxError(TxCode.BAD_STATE, f"escrow already unlocks at height {escrow.unlock_height}")
    escrow.unlock_height = ctx.height + params.serve_unlock_blocks
    state.touch(SERVE_ESCROW, tx.sender)


def apply_serve_withdraw(state: LedgerState, params: Params, ctx: BlockContext, tx: Tx) -> None:
    amount = tx.payload["amount"]
    escrow = state.serve_escrows.get(tx.sender)
    if escrow is None or escrow.balance == 0:
        raise TxError(TxCode.NOT_FOUND, "no serving escrow")
    if not escrow.unlock_height:
        raise TxError(TxCode.BAD_STATE, "send serve_unlock first (servers may claim until it matures)")
    if ctx.height < escrow.unlock_height:
        raise TxError(TxCode.BAD_STATE, f"escrow unlocks at height {escrow.unlock_height}, now {ctx.height}")
    if amount > escrow.balance:
        raise TxError(TxCode.INSUFFICIENT_FUNDS, f"escrow {escrow.balance} < {amount}")
    escrow.balance -= amount
    if escrow.balance == 0:
        escrow.unlock_height = 0
    state.credit(tx.sender, amount)
    state.touch(SERVE_ESCROW, tx.sender)


def apply_serve_receipt(state: LedgerState, params: Params, ctx: BlockContext, tx: Tx) -> None:
    receipt, client_sig, server_sig = tx.payload["receipt"], tx.payload["client_sig"], tx.payload["server_sig"]
    server, client = receipt["server"], receipt["client"]
    if tx.sender != server:
        raise TxError(TxCode.UNAUTHORIZED, "only the server named in a receipt can submit it")
    if server == client:
        raise TxError(TxCode.BAD_PAYLOAD, "a server cannot bill itself")
    node = state.nodes.get(server)
    if node is None or "compute" not in node.roles:
        raise TxError(TxCode.UNAUTHORIZED, "sender is not a registered compute node")
    stake = state.stakes.get(server)
    bonded = stake.bonded if stake is not None else 0
    if bonded < params.min_serve_stake:
        raise TxError(TxCode.UNAUTHORIZED, f"server has {bonded} bonded; receipts are paid to servers with at "
                                           f"least min_serve_stake = {params.min_serve_stake} (ADR 0174)")
    message = serve_receipt_signing_bytes(tx.chain_id, receipt)
    client_key, server_key = public_key_for(client), public_key_for(server)
    if client_key is None or server_key is None or not (
            verify_signature(client_key, message, client_sig) and verify_signature(server_key, message, server_sig)):
        raise TxError(TxCode.BAD_SIGNATURE, "receipt is not signed by both the client and the server")
    chan_id = serve_channel_id(receipt)
    if is_convicted(state, chan_id):
        raise TxError(TxCode.UNAUTHORIZED, "referees found this session's server answered wrongly (ADR 0176)")
    channel = state.serve_channels.get(chan_id) or ServeChannel()
    if (receipt["seq"] <= channel.seq or receipt["amount"] <= channel.amount_paid
            or receipt["tokens"] < channel.tokens or receipt["flops"] < channel.flops):
        raise TxError(TxCode.REPLAYED, f"receipt does not exceed what this session already paid "
                                       f"(seq {channel.seq}, amount {channel.amount_paid})")
    owed = receipt["amount"] - channel.amount_paid
    escrow = state.serve_escrows.get(client)
    available = escrow.balance if escrow is not None else 0
    if escrow is None or available < owed:
        raise TxError(TxCode.INSUFFICIENT_FUNDS, f"client's serving escrow {available} < {owed} owed")
    escrow.balance -= owed
    if escrow.balance == 0:
        escrow.unlock_height = 0
    state.credit(server, owed)
    state.touch(SERVE_ESCROW, client)
    channel.seq, channel.tokens, channel.flops = receipt["seq"], receipt["tokens"], receipt["flops"]
    channel.amount_paid, channel.claimed_height = receipt["amount"], ctx.height
    state.serve_channels[chan_id] = channel
    state.touch(SERVE_CHANNEL, chan_id)
    state.events.append({"type": "serve_paid", "server": server, "client": client, "session": receipt["session"],
                         "amount": owed, "tokens": receipt["tokens"]})


def serve_escrow_json(state: LedgerState, client: str) -> dict:
    """A client's escrow as RPC shows it."""
    escrow = state.serve_escrows.get(client) or ServeEscrow()
    return {"client": client, **escrow.to_json()}


MAX_LIST_NODES = 1000


def is_fresh(entry: dict, height: int, ttl: int) -> bool:
    """Whether a served range still counts at ``height``: refreshed within ``ttl`` blocks (ADR 0177).
    A range without a height (written before heights existed) counts."""
    return "height" not in entry or entry["height"] + ttl >= height


def fresh_serving(hardware: dict, height: int, ttl: int) -> list[dict]:
    return [r for r in hardware.get("serving", ()) if is_fresh(r, height, ttl)]


def list_nodes(state: LedgerState, role: str | None = None, model: str | None = None,
               limit: int = 100, ttl: int | None = None) -> list[dict]:
    """Node records (sorted by peer id) with ``role``, or announcing a served range of ``model``
    (``hardware.serving``), at most ``limit``: how clients and servers find each other (ADR 0174).
    With ``ttl``, ranges not refreshed within ``ttl`` blocks are left out of the records shown, and a
    node whose ranges of ``model`` are all stale is not listed for it (ADR 0177)."""
    out = []
    for peer_id in sorted(state.nodes):
        node = state.nodes[peer_id]
        if role is not None and role not in node.roles:
            continue
        shown = node.to_json()
        if ttl is not None and "serving" in node.hardware:
            shown["hardware"] = {**shown["hardware"], "serving": fresh_serving(shown["hardware"], state.height, ttl)}
        if model is not None and not any(r.get("model") == model for r in shown["hardware"].get("serving", ())):
            continue
        out.append({"peer_id": peer_id, **shown})
        if len(out) >= limit:
            break
    return out
