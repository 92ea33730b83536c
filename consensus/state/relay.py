"""Relay usage receipts: a relay submits a receipt co-signed by both endpoints to get paid.

A receipt carries cumulative totals for one session (relay, src, dst, session id); the
ledger remembers what it already paid per session, pays only the increase, and refuses a
receipt that does not increase the amount (replay protection). Without a task id the payer
(one of the endpoints) pays from its balance; with one, the amount is claimed from the
task's relay budget and paid when the task is finalized.
"""
from __future__ import annotations

import hashlib

from consensus.encoding import encode
from consensus.genesis import Params
from consensus.state.accounts import debit
from consensus.state.context import BlockContext
from consensus.state.records import RelayChannel, TaskStatus
from consensus.state.store import CHANNEL, TASK, LedgerState
from consensus.state.tasks import claim_relay_budget, get_task
from consensus.tx import Tx, public_key_for, relay_receipt_signing_bytes, verify_signature
from consensus.txcodes import TxCode, TxError


def channel_id(receipt: dict) -> bytes:
    key = [receipt["relay"], receipt["src"], receipt["dst"], receipt["session"]]
    return hashlib.sha256(b"dekube/relay-channel\x00" + encode(key)).digest()


def apply_relay_receipt(state: LedgerState, params: Params, ctx: BlockContext, tx: Tx) -> None:
    receipt, src_sig, dst_sig = tx.payload["receipt"], tx.payload["src_sig"], tx.payload["dst_sig"]
    src_key, dst_key = public_key_for(receipt["src"]), public_key_for(receipt["dst"])
    relay, src, dst, payer = receipt["relay"], receipt["src"], receipt["dst"], receipt["payer"]
    if tx.sender != relay:
        raise TxError(TxCode.UNAUTHORIZED, "only the relay named in a receipt can submit it")
    node = state.nodes.get(relay)
    if node is None or "relay" not in node.roles:
        raise TxError(TxCode.UNAUTHORIZED, "sender is not a registered relay")
    stake = state.stakes.get(relay)
    bonded = stake.bonded if stake is not None else 0
    if bonded < params.min_relay_stake:
        raise TxError(TxCode.UNAUTHORIZED, f"relay has {bonded} bonded; receipts are paid to relays with at "
                                           f"least min_relay_stake = {params.min_relay_stake} (ADR 0165)")
    if src == dst or relay in (src, dst):
        raise TxError(TxCode.BAD_PAYLOAD, "a receipt needs two distinct endpoints other than the relay")
    message = relay_receipt_signing_bytes(tx.chain_id, receipt)
    if src_key is None or dst_key is None or not (verify_signature(src_key, message, src_sig)
                                                  and verify_signature(dst_key, message, dst_sig)):
        raise TxError(TxCode.BAD_SIGNATURE, "receipt is not signed by both endpoints")
    chan_id = channel_id(receipt)
    channel = state.channels.get(chan_id) or RelayChannel()
    amount = receipt["amount_total"] - channel.amount_paid
    if amount <= 0 or receipt["bytes_total"] < channel.bytes_paid:
        raise TxError(TxCode.REPLAYED, "receipt does not exceed what this session already paid")
    task_id = receipt["task_id"]
    if task_id:
        task = get_task(state, task_id)
        if task.status not in TaskStatus.ACTIVE:
            raise TxError(TxCode.BAD_STATE, f"task is {task.status}")
        if payer != task.owner:
            raise TxError(TxCode.BAD_PAYLOAD, "payer of a task receipt must be the task owner")
        if src not in task.workers and dst not in task.workers:
            raise TxError(TxCode.UNAUTHORIZED, "neither endpoint is a worker of the task")
        claim_relay_budget(task, params, relay, amount)
        state.touch(TASK, task_id)
    else:
        if payer not in (src, dst):
            raise TxError(TxCode.BAD_PAYLOAD, "payer must be one of the endpoints")
        debit(state, payer, amount)
        state.credit(relay, amount)
    channel.amount_paid = receipt["amount_total"]
    channel.bytes_paid = receipt["bytes_total"]
    state.channels[chan_id] = channel
    state.touch(CHANNEL, chan_id)
