"""``task watch|wait``, ``task fetch``, ``task cancel`` and ``task stop`` on an existing task.

``watch`` reads the task once; a task still running is followed live (ledger ``tasks`` events, and
the workers' progress over p2p from a client node) until it ends, then its payouts or the reason
it failed are printed. ``fetch`` downloads the trained weights (cli.task_fetch). ``cancel`` sends
cancel_task and reports the refund (the ledger accepts it while the task is not assigned). ``stop``
sends stop_task: a running task cut into epochs ends at the next epoch boundary, its closed epochs
audited and paid, the rest refunded; ``fetch`` then gets the last closed epoch's weights (docs/adr/0211).
"""
from __future__ import annotations

import argparse
import asyncio
import json
from pathlib import Path

from cli.errors import CliError
from cli.task_ledger import FINAL, call, client_identity, ledger_pool, owner_identity
from cli.task_report import decode_task, report_final
from cli.task_view import TaskView
from cli.tx_sender import send_tx
from consensus.state.retention import unknown_task_message
from consensus.task_info import TaskInfo, TaskStatus
from node.identity import Identity
from node.ledger.jsonrpc import ValidatorPool


def parse_task_id(text: str) -> str:
    key = (text[2:] if text[:2] in ("0x", "0X") else text).lower()
    try:
        if len(bytes.fromhex(key)) == 32:
            return key
    except ValueError:
        pass
    raise CliError(f"{text!r} is not a task id (64 hex digits)")


def progress_available() -> bool:
    try:
        import ml.compute.progress_protocol  # noqa: F401
    except ImportError:
        return False
    return True


def run_watch(args: argparse.Namespace) -> int:
    return asyncio.run(watch(args, parse_task_id(args.task_id)))


async def watch(args: argparse.Namespace, task_id: str) -> int:
    from cli.task_follow import follow_task

    async with ledger_pool(args.rpc) as pool:
        doc = await call(pool, "dkb_getTask", task_id)
        if doc is None:
            raise CliError(unknown_task_message(task_id))
        task = decode_task(doc)
        if task.status not in FINAL:
            view = TaskView(task_id, quiet=args.json)
            if progress_available():
                from cli.client_node import client_node

                client = await client_identity(args, pool, owner_identity(args))
                async with client_node(client, bootstrap=args.bootstrap or (),
                                       relays=args.relay or ()) as node:
                    task = await follow_task(pool, task_id, view, node=node, timeout=args.timeout)
            else:
                task = await follow_task(pool, task_id, view, timeout=args.timeout)
    return report_final(task, as_json=args.json)


def run_fetch(args: argparse.Namespace) -> int:
    return asyncio.run(fetch(args, parse_task_id(args.task_id), Path(args.out)))


async def fetch(args: argparse.Namespace, task_id: str, out: Path) -> int:
    from cli.client_node import client_node
    from cli.task_fetch import fetch_result

    say = (lambda _text: None) if args.json else print
    async with ledger_pool(args.rpc) as pool:
        client = await client_identity(args, pool, owner_identity(args))
        async with client_node(client, bootstrap=args.bootstrap or (), relays=args.relay or ()) as node:
            fetched = await fetch_result(pool, node, task_id, out, say=say, epoch=args.epoch)
    if args.json:
        print(json.dumps(fetched))
        return 0
    source = (f"the state of epoch {fetched['epoch']}, artifact {fetched['result']}" if "epoch" in fetched
              else f"artifact {fetched['result']}, as the ledger's result")
    print(f"weights: {fetched['weights']} ({source})")
    print(f"metrics: {fetched['metrics']}  final {fetched['final_metrics']}")
    print(f"load them: {fetched['load']}")
    return 0


def run_cancel(args: argparse.Namespace, identity: Identity) -> int:
    return asyncio.run(cancel(args, parse_task_id(args.task_id), identity))


async def owned_task(pool: ValidatorPool, task_id: str, identity: Identity) -> TaskInfo:
    """The task, if ``identity`` owns it (CliError otherwise, or when there is no such task)."""
    doc = await call(pool, "dkb_getTask", task_id)
    if doc is None:
        raise CliError(unknown_task_message(task_id))
    task = decode_task(doc)
    if task.owner != identity.peer_id:
        raise CliError(f"task {task_id} belongs to {task.owner}, not to {identity.peer_id}")
    return task


async def cancel(args: argparse.Namespace, task_id: str, identity: Identity) -> int:
    async with ledger_pool(args.rpc) as pool:
        task = await owned_task(pool, task_id, identity)
        if task.status != TaskStatus.CREATED:
            raise CliError(f"task {task_id} is {task.status}: only a task not assigned yet can be cancelled")
        sent = await send_tx(pool.urls, identity, "cancel_task", {"task_id": bytes.fromhex(task_id)}, fee=args.fee)
        tx_hash, receipt = sent.tx_hash, sent.receipt
        assert receipt is not None   # waited for
        cancelled = await call(pool, "dkb_getTask", task_id)
    if args.json:
        print(json.dumps({"task_id": task_id, "tx_hash": tx_hash, "height": receipt["height"], "task": cancelled}))
    else:
        print(f"task {task_id} cancelled in block {receipt['height']}; {task.escrow or task.price} tokens back to "
              "the owner")   # the escrow: the price and any audit surcharge (docs/adr/0212)
    return 0


def run_stop(args: argparse.Namespace, identity: Identity) -> int:
    return asyncio.run(stop(args, parse_task_id(args.task_id), identity))


async def stop(args: argparse.Namespace, task_id: str, identity: Identity) -> int:
    """Ask the ledger to end a running task at the next epoch boundary (stop_task, docs/adr/0211)."""
    async with ledger_pool(args.rpc) as pool:
        await owned_task(pool, task_id, identity)
        sent = await send_tx(pool.urls, identity, "stop_task", {"task_id": bytes.fromhex(task_id)}, fee=args.fee)
        stopping = decode_task(await call(pool, "dkb_getTask", task_id))
    assert sent.receipt is not None   # waited for
    progress = stopping.epochs
    at = progress.stop_at if progress is not None and progress.stop_at is not None else None
    total = stopping.spec_field("epochs", 0)
    if args.json:
        print(json.dumps({"task_id": task_id, "tx_hash": sent.tx_hash, "height": sent.receipt["height"],
                          "stops_after_epoch": None if at is None else at + 1, "epochs": total}))
    elif at is not None:
        print(f"task {task_id} stops at the end of epoch {at + 1} of {total}: its closed epochs are audited and "
              f"paid, the rest is refunded; then `dekube-node task fetch {task_id} --out DIR` gets that epoch's "
              "weights")
    return 0
