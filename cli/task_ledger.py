"""The ledger as the task commands see it, asynchronously: one validator pool, the client node's
identity (funded by one transfer, sent by ``cli.tx_sender``), and a task's lifecycle through the
``tasks`` topic.

A task's status changes arrive as websocket notifications (``node.ledger.events``), and the state
is read once per notification about the task (and once after each (re)subscription, when events
may have been missed).
"""
from __future__ import annotations

import contextlib
import hashlib
from collections.abc import AsyncIterator

from cli.errors import CliError
from cli.tx_sender import send_tx
from consensus.ledger_events import TASKS_TOPIC
from consensus.state.tasks import task_id_for
from consensus.task_info import TaskInfo, TaskStatus
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
        await send_tx(pool.urls, owner, "transfer", {"to": client.peer_id, "amount": CLIENT_FUNDS - balance})
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
