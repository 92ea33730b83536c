"""The ledger as the task commands see it, asynchronously: one validator pool, transactions sent and
confirmed through the ``txs`` topic, and a task's lifecycle through the ``tasks`` topic.

Nothing here polls: a transaction's receipt and a task's status changes arrive as websocket
notifications (``node.ledger.events``), and the state is read once per notification about the
task (and once after each (re)subscription, when events may have been missed).
"""
from __future__ import annotations

import asyncio
import contextlib
import hashlib
from collections.abc import AsyncIterator

from cli.errors import CliError
from consensus.ledger_events import TASKS_TOPIC, TXS_TOPIC
from consensus.state.tasks import task_id_for
from consensus.task_info import TaskInfo, TaskStatus
from consensus.tx import DEFAULT_FEE, build_tx
from node.identity import Identity
from node.ledger import RESYNC, LedgerUnavailable
from node.ledger.errors import RpcAnswerError
from node.ledger.events import websocket_stream
from node.ledger.jsonrpc import ValidatorPool

FINAL = TaskStatus.FINAL   # the ledger has settled the task


@contextlib.asynccontextmanager
async def ledger_pool(url: str) -> AsyncIterator[ValidatorPool]:
    pool = ValidatorPool([url])
    try:
        yield pool
    finally:
        await pool.close()


async def call(pool: ValidatorPool, method: str, *params):
    try:
        return await pool.call(method, *params)
    except LedgerUnavailable as exc:
        raise CliError(f"cannot reach the node: {exc}") from None
    except RpcAnswerError as exc:
        raise CliError(f"{method}: {exc}") from None


async def send_tx(pool: ValidatorPool, identity: Identity, tx_type: str, payload: dict, *, fee: int = DEFAULT_FEE,
                  timeout: float = 60.0) -> tuple[str, int, dict]:
    """Signs and sends one transaction, waits for its receipt (``txs`` topic): (tx hash, nonce, receipt).
    A transaction that executes with an error raises CliError with the ledger's reason."""
    chain_id = await call(pool, "dkb_chainId")
    nonce = await call(pool, "dkb_getTransactionCount", identity.peer_id, "pending")
    tx = build_tx(identity, chain_id, nonce, tx_type, payload, fee)
    tx_hash = tx.hash.hex()
    stream = websocket_stream(pool, TXS_TOPIC, [identity.peer_id])
    try:
        async with contextlib.aclosing(stream), asyncio.timeout(timeout):
            sent = False
            async for note in stream:
                if note is RESYNC:
                    if not sent:   # subscribed: the receipt cannot be missed any more
                        await call(pool, "dkb_sendRawTransaction", tx.raw.hex())
                        sent = True
                        continue
                    receipt = await call(pool, "dkb_getTransactionReceipt", tx_hash)
                elif isinstance(note, dict) and note.get("tx_hash") == tx_hash:
                    receipt = note
                else:
                    continue
                if receipt is not None:
                    break
    except TimeoutError:
        raise CliError(f"{tx_type} {tx_hash}: no receipt after {timeout:g} s (still pending?)") from None
    if receipt["code"] != 0:
        raise CliError(f"{tx_type} refused by the ledger in block {receipt['height']}: {receipt['status']} "
                       f"{receipt.get('log', '')}".strip())
    return tx_hash, nonce, receipt


CLIENT_FUNDS = 10   # a derived client account is topped up to this: above relays' min_client_balance


def derived_client_identity(owner: Identity) -> Identity:
    """The owner's client-node identity: its own peer ID (never the owner's, which a node of the user's
    may be running with), the same on every command, derived from the owner's seed."""
    return Identity.from_seed(hashlib.sha256(b"dekube/client-node\x00" + owner.seed).digest())


async def client_identity(args, pool: ValidatorPool, owner: Identity | None = None) -> Identity:
    """The identity of a command's client node: ``--client-key`` (unlocked like ``--key``); else, with
    the owner's key, the derived identity, whose account is topped up to CLIENT_FUNDS from the owner's
    (one transfer, the first time) so relays admit it (docs/adr/0159); else a fresh one."""
    path = getattr(args, "client_key", None)
    if path is not None:
        from cli.passphrase import unlock_passphrase
        from node.keystore import load_identity

        return load_identity(path, unlock_passphrase(args))
    if owner is None:
        return Identity.generate()
    client = derived_client_identity(owner)
    balance = await call(pool, "dkb_getBalance", client.peer_id)
    if balance < CLIENT_FUNDS:
        await send_tx(pool, owner, "transfer", {"to": client.peer_id, "amount": CLIENT_FUNDS - balance})
    return client


def owner_identity(args) -> Identity | None:
    """The account key given with ``--key`` (unlocked), or None."""
    path = getattr(args, "key", None)
    if path is None:
        return None
    from cli.passphrase import unlock_passphrase
    from node.keystore import load_identity

    return load_identity(path, unlock_passphrase(args))


def task_id_of(owner: str, nonce: int) -> str:
    return task_id_for(owner, nonce).hex()


async def task_states(pool: ValidatorPool, task_id: str) -> AsyncIterator[TaskInfo | None]:
    """The task as dkb_getTask returns it (None: not in a block yet), each time it may have changed (``tasks``
    events), until final."""
    from cli.task_report import decode_task

    stream = websocket_stream(pool, TASKS_TOPIC, [])
    async with contextlib.aclosing(stream):
        async for event in stream:
            if event is not RESYNC and (not isinstance(event, dict) or event.get("task_id") != task_id):
                continue
            doc = await call(pool, "dkb_getTask", task_id)
            task = None if doc is None else decode_task(doc)
            yield task
            if task is not None and task.status in FINAL:
                return
