"""The ledger's JSON-RPC methods (``dkb_*``), registered by the validator role.

Addresses are peer IDs (``12D3KooW...``), hashes and task IDs hex (an optional ``0x`` prefix is
accepted), amounts integers. ``dkb_sendRawTransaction`` maps a rejection onto the server codes of
ADR 0021 (-32001 nonce too low, -32002 nonce too high, -32003 insufficient funds, -32004 bad
signature, -32005 already known, -32000 anything else) with ``data = {"code": <TxCode name>,
"tx_code": <int>}``. ``dkb_getTransactionReceipt`` is null while the transaction is pending.
``dkb_getSupply`` (beyond the issue's list) gives the supply breakdown for invariant checks,
``dkb_getParams`` the chain's parameters (what a server must bond to be paid, for instance).
Reads that touch RocksDB run in a thread, reads that iterate the ledger state in the ledger worker
thread (which mutates it), single lookups on the event loop.
"""
from __future__ import annotations

import asyncio
import dataclasses
from typing import TYPE_CHECKING, Any

from consensus.state import serve_disputes, serving, staking
from consensus.state.supply import supply_breakdown
from consensus.txcodes import TxError
from node.identity import is_valid_peer_id
from node.rpc.errors import InvalidParams, RpcError

if TYPE_CHECKING:
    from consensus.validator.role import ValidatorRole

MAX_RAW_TX_HEX = 2 * 64 * 1024
MAX_LIST_TASKS = 1000
MAX_LIST_STAKES = 10_000


def parse_hex(value: str, name: str, length: int | None = None, max_chars: int = MAX_RAW_TX_HEX) -> bytes:
    text = value[2:] if value[:2] in ("0x", "0X") else value
    if len(text) > max_chars:
        raise InvalidParams(f"{name}: longer than {max_chars} hex characters")
    try:
        raw = bytes.fromhex(text)
    except ValueError:
        raise InvalidParams(f"{name}: not a hex string") from None
    if length is not None and len(raw) != length:
        raise InvalidParams(f"{name}: expected {length} bytes, got {len(raw)}")
    return raw


def check_address(address: str) -> str:
    if not is_valid_peer_id(address):
        raise InvalidParams(f"address {address[:80]!r} is not a valid peer ID")
    return address


MAX_HEIGHT = 2**63 - 1          # heights are stored as 8-byte keys; anything above is no block, and a bad request
MAX_HEIGHT_CHARS = 2 + 16       # "0x" + 16 hex digits, or 19 decimal digits


def parse_height(number: int | str, latest: int) -> int:
    """A block number (int, decimal or 0x-hex text, or a tag) as a height in 0..MAX_HEIGHT; anything
    else is InvalidParams (-32602 / HTTP 400), never an internal error."""
    if type(number) is int:
        height = number
    elif type(number) is not str:
        raise InvalidParams("block number must be an integer, a hex string or 'latest'")
    elif number in ("latest", "finalized", "safe"):
        height = latest
    elif number == "earliest":
        height = 0
    else:
        if len(number) > MAX_HEIGHT_CHARS + 1:
            raise InvalidParams(f"block number must be in 0..{MAX_HEIGHT}")
        try:
            height = int(number, 16) if number[:2] in ("0x", "0X") else int(number, 10)
        except ValueError:
            raise InvalidParams("block number must be an integer, a hex string or 'latest'") from None
    if not 0 <= height <= MAX_HEIGHT:
        raise InvalidParams(f"block number must be in 0..{MAX_HEIGHT}, got {str(height)[:40]}")
    return height


def tx_rejection(exc: TxError) -> RpcError:
    return RpcError(f"transaction rejected: {exc.message}", data={"code": exc.code.name, "tx_code": int(exc.code)},
                    code=exc.code.rpc_code)


def register_methods(dispatcher, chain: ValidatorRole) -> dict[str, Any]:
    """Register every ``dkb_`` ledger method on ``dispatcher`` against the role ``chain``; returns
    them by name (the node's ledger gateway calls them in-process)."""

    def in_thread(fn, *args):
        return asyncio.get_running_loop().run_in_executor(None, fn, *args)

    async def dkb_chainId() -> str:
        return chain.node.config.get("consensus", "chain_id")

    async def dkb_blockNumber() -> int:
        chain.require_ready()
        return chain.ledger.height

    async def dkb_getBalance(address: str, block: str = "latest") -> int:
        chain.require_ready()
        return chain.ledger.balance(check_address(address))

    async def dkb_getTransactionCount(address: str, block: str = "latest") -> int:
        chain.require_ready()
        check_address(address)
        if block == "pending":
            return chain.pending_nonce(address)
        if block != "latest":
            raise InvalidParams("block must be 'latest' or 'pending'")
        return chain.ledger.nonce(address)

    async def dkb_sendRawTransaction(tx: str) -> str:
        raw = parse_hex(tx, "tx")
        if not raw:
            raise InvalidParams("tx: empty")
        try:
            accepted = await chain.submit(raw)
        except TxError as exc:
            raise tx_rejection(exc) from None
        return accepted.hash.hex()

    async def dkb_getTransactionReceipt(hash: str) -> dict | None:
        chain.require_ready()
        receipt = await in_thread(chain.store.storage.receipt, parse_hex(hash, "hash", 32))
        return None if receipt is None else receipt.to_json()

    async def dkb_getBlockByNumber(number: int | str = "latest", full: bool = False) -> dict | None:
        chain.require_ready()
        return await in_thread(chain.block_json, parse_height(number, chain.ledger.height), full)

    async def dkb_getValidators() -> dict[str, Any]:
        chain.require_ready()
        committee = chain.committee
        return {
            "height": chain.ledger.height + 1,
            "epoch_start": committee.start_height,
            "total_power": committee.total_power,
            "validators": [{"peer_id": pid, "power": power} for pid, power in committee.items()],
            "candidates": [{"peer_id": pid, "bonded": stake}
                           for pid, stake in await chain.read_state(chain.ledger.validators)],
        }

    async def dkb_getStake(address: str) -> dict:
        chain.require_ready()
        return chain.ledger.stake_info(check_address(address))

    async def dkb_listStakes(min_bonded: int | None = None, limit: int = MAX_LIST_STAKES) -> dict[str, Any]:
        """Unjailed nodes with at least ``min_bonded`` bonded (default: the least bond any role needs),
        highest first: what nodes tag as ``STAKED`` for admission (node/staked.py, ADR 0197)."""
        chain.require_ready()
        if min_bonded is None:
            min_bonded = staking.min_role_stake(chain.ledger.params)
        if type(min_bonded) is not int or min_bonded < 1:
            raise InvalidParams("min_bonded must be a positive integer")
        if type(limit) is not int or not 1 <= limit <= MAX_LIST_STAKES:
            raise InvalidParams(f"limit must be in 1..{MAX_LIST_STAKES}")
        stakes = await chain.read_state(staking.staked_peers, chain.ledger.state, min_bonded, limit)
        return {"height": chain.ledger.height, "min_bonded": min_bonded,
                "stakes": [{"peer_id": peer_id, "bonded": bonded} for peer_id, bonded in stakes]}

    async def dkb_getNode(address: str) -> dict | None:
        chain.require_ready()
        return chain.ledger.node_info(check_address(address))

    async def dkb_listNodes(role: str | None = None, model: str | None = None, limit: int = 100) -> list:
        """Node records, by role or by a model they serve (ADR 0174)."""
        chain.require_ready()
        if not isinstance(limit, int) or not 1 <= limit <= serving.MAX_LIST_NODES:
            raise InvalidParams(f"limit must be in 1..{serving.MAX_LIST_NODES}")
        if role is not None and not isinstance(role, str) or model is not None and not isinstance(model, str):
            raise InvalidParams("role and model are text")
        return await chain.read_state(serving.list_nodes, chain.ledger.state, role, model, limit,
                                      chain.ledger.params.serve_announce_ttl)

    async def dkb_getServeEscrow(address: str) -> dict:
        """A client's serving escrow: balance and unlock height (0: locked)."""
        chain.require_ready()
        return serving.serve_escrow_json(chain.ledger.state, check_address(address))

    async def dkb_getServeDispute(dispute: str) -> dict | None:
        """A serving dispute: parties, referees and their votes, deadline, status (ADR 0176)."""
        chain.require_ready()
        return serve_disputes.dispute_json(chain.ledger.state, parse_hex(dispute, "dispute", 32))

    async def dkb_listServeDisputes(referee: str | None = None, limit: int = 100) -> list:
        """Open serving disputes, or those awaiting ``referee``'s vote (ADR 0176)."""
        chain.require_ready()
        if not isinstance(limit, int) or not 1 <= limit <= serve_disputes.MAX_LIST_DISPUTES:
            raise InvalidParams(f"limit must be in 1..{serve_disputes.MAX_LIST_DISPUTES}")
        if referee is not None:
            check_address(referee)
        return await chain.read_state(serve_disputes.list_open_disputes, chain.ledger.state, referee, limit)

    async def dkb_getTask(task_id: str) -> dict | None:
        chain.require_ready()
        return chain.ledger.task_info(parse_hex(task_id, "task_id", 32))

    async def dkb_listTasks(status: str | None = None, owner: str | None = None, limit: int = 100) -> list:
        chain.require_ready()
        if not 1 <= limit <= MAX_LIST_TASKS:
            raise InvalidParams(f"limit must be in 1..{MAX_LIST_TASKS}")
        if owner is not None:
            check_address(owner)
        return await chain.read_state(chain.ledger.list_tasks, status, owner, limit)

    async def dkb_getSupply() -> dict[str, int]:
        chain.require_ready()
        parts = await chain.read_state(supply_breakdown, chain.ledger.state)
        return {**parts, "total": sum(parts.values()), "genesis": chain.genesis.total_supply}

    async def dkb_getParams() -> dict[str, int]:
        """The chain's parameters (genesis ``params``: stakes, shares, windows), e.g. ``min_serve_stake``."""
        chain.require_ready()
        return dataclasses.asdict(chain.ledger.params)

    async def dkb_getGenesis() -> dict[str, Any]:
        """The chain's genesis document (the file form) and its hash: what ``dekube-node provide`` fetches
        and checks against the hash its network description names (docs/adr/0195)."""
        chain.require_ready()
        return {"genesis": chain.genesis.to_obj(), "hash": chain.genesis.hash.hex()}

    for fn in (dkb_getParams, dkb_getSupply, dkb_chainId, dkb_blockNumber, dkb_getBalance, dkb_getTransactionCount,
               dkb_sendRawTransaction, dkb_getTransactionReceipt, dkb_getBlockByNumber, dkb_getValidators,
               dkb_getStake, dkb_getNode, dkb_getTask, dkb_listTasks, dkb_listNodes, dkb_getServeEscrow,
               dkb_getServeDispute, dkb_listServeDisputes, dkb_getGenesis, dkb_listStakes):
        dispatcher.register(fn.__name__, fn)
    return {fn.__name__: fn for fn in (
        dkb_getParams, dkb_getSupply, dkb_chainId, dkb_blockNumber, dkb_getBalance, dkb_getTransactionCount,
        dkb_sendRawTransaction, dkb_getTransactionReceipt, dkb_getBlockByNumber, dkb_getValidators, dkb_getStake,
        dkb_getNode, dkb_getTask, dkb_listTasks, dkb_listNodes, dkb_getServeEscrow, dkb_getServeDispute,
        dkb_listServeDisputes, dkb_getGenesis, dkb_listStakes)}
