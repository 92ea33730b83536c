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
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, TypeVar

from consensus.state import retention, serve_disputes, serving, staking
from consensus.state.supply import supply_breakdown
from consensus.txcodes import TxError
from node.identity import is_valid_peer_id
from node.rpc.errors import RESOURCE_NOT_FOUND, InvalidParams, RpcError

if TYPE_CHECKING:
    from consensus.validator.role import ValidatorRole
    from node.rpc.dispatcher import Dispatcher

T = TypeVar("T")

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


class LedgerMethods:
    """The ``dkb_`` ledger methods against the validator role ``role``, one method per request; each
    read takes the chain state ``role.require_ready()`` returns (ResourceUnavailable while it loads)."""

    def __init__(self, role: ValidatorRole) -> None:
        self.role = role

    def register(self, dispatcher: Dispatcher) -> dict[str, Callable[..., Awaitable[Any]]]:
        """Register every method on ``dispatcher``; returns them by name (the node's ledger gateway
        calls them in-process)."""
        methods = {name: getattr(self, name) for name in METHODS}
        for name, fn in methods.items():
            dispatcher.register(name, fn)
        return methods

    @staticmethod
    def _in_thread(fn: Callable[..., T], *args: Any) -> asyncio.Future[T]:
        return asyncio.get_running_loop().run_in_executor(None, fn, *args)

    async def dkb_chainId(self) -> str:
        return str(self.role.node.config.get("consensus", "chain_id"))

    async def dkb_blockNumber(self) -> int:
        return self.role.require_ready().ledger.height

    async def dkb_getBalance(self, address: str, block: str = "latest") -> int:
        return self.role.require_ready().ledger.balance(check_address(address))

    async def dkb_getTransactionCount(self, address: str, block: str = "latest") -> int:
        chain = self.role.require_ready()
        check_address(address)
        if block == "pending":
            return self.role.pending_nonce(address)
        if block != "latest":
            raise InvalidParams("block must be 'latest' or 'pending'")
        return chain.ledger.nonce(address)

    async def dkb_sendRawTransaction(self, tx: str) -> str:
        raw = parse_hex(tx, "tx")
        if not raw:
            raise InvalidParams("tx: empty")
        try:
            accepted = await self.role.submit(raw)
        except TxError as exc:
            raise tx_rejection(exc) from None
        return str(accepted.hash.hex())

    async def dkb_getTransactionReceipt(self, hash: str) -> dict[str, Any] | None:
        chain = self.role.require_ready()
        receipt = await self._in_thread(chain.store.storage.receipt, parse_hex(hash, "hash", 32))
        return None if receipt is None else receipt.to_json()

    async def dkb_getBlockByNumber(self, number: int | str = "latest", full: bool = False) -> dict[str, Any] | None:
        chain = self.role.require_ready()
        return await self._in_thread(self.role.block_json, parse_height(number, chain.ledger.height), full)

    async def dkb_getValidators(self) -> dict[str, Any]:
        chain = self.role.require_ready()
        committee = chain.committee
        return {
            "height": chain.ledger.height + 1,
            "epoch_start": committee.start_height,
            "total_power": committee.total_power,
            "validators": [{"peer_id": pid, "power": power} for pid, power in committee.items()],
            "candidates": [{"peer_id": pid, "bonded": stake}
                           for pid, stake in await self.role.read_state(chain.ledger.validators)],
        }

    async def dkb_getStake(self, address: str) -> dict[str, Any]:
        return self.role.require_ready().ledger.stake_info(check_address(address))

    async def dkb_getNode(self, address: str) -> dict[str, Any] | None:
        return self.role.require_ready().ledger.node_info(check_address(address))

    async def dkb_listStakes(self, min_bonded: int | None = None, limit: int = MAX_LIST_STAKES) -> dict[str, Any]:
        """Unjailed nodes with at least ``min_bonded`` bonded (default: the least bond any role needs),
        highest first: what nodes tag as ``STAKED`` for admission (node/staked.py, ADR 0197)."""
        chain = self.role.require_ready()
        if min_bonded is None:
            min_bonded = staking.min_role_stake(chain.ledger.params)
        if type(min_bonded) is not int or min_bonded < 1:
            raise InvalidParams("min_bonded must be a positive integer")
        if type(limit) is not int or not 1 <= limit <= MAX_LIST_STAKES:
            raise InvalidParams(f"limit must be in 1..{MAX_LIST_STAKES}")
        stakes = await self.role.read_state(staking.staked_peers, chain.ledger.state, min_bonded, limit)
        return {"height": chain.ledger.height, "min_bonded": min_bonded,
                "stakes": [{"peer_id": peer_id, "bonded": bonded} for peer_id, bonded in stakes]}

    async def dkb_listNodes(self, role: str | None = None, model: str | None = None,
                            limit: int = 100) -> list[dict[str, Any]]:
        """Node records, by role or by a model they serve (ADR 0174)."""
        chain = self.role.require_ready()
        if not isinstance(limit, int) or not 1 <= limit <= serving.MAX_LIST_NODES:
            raise InvalidParams(f"limit must be in 1..{serving.MAX_LIST_NODES}")
        if role is not None and not isinstance(role, str) or model is not None and not isinstance(model, str):
            raise InvalidParams("role and model are text")
        nodes: list[dict[str, Any]] = await self.role.read_state(
            serving.list_nodes, chain.ledger.state, role, model, limit, chain.ledger.params.serve_announce_ttl)
        return nodes

    async def dkb_getServeEscrow(self, address: str) -> dict[str, Any]:
        """A client's serving escrow: balance and unlock height (0: locked)."""
        chain = self.role.require_ready()
        return serving.serve_escrow_json(chain.ledger.state, check_address(address))

    async def dkb_getServeDispute(self, dispute: str) -> dict[str, Any] | None:
        """A serving dispute: parties, referees and their votes, deadline, status (ADR 0176)."""
        chain = self.role.require_ready()
        return serve_disputes.dispute_json(chain.ledger.state, parse_hex(dispute, "dispute", 32))

    async def dkb_listServeDisputes(self, referee: str | None = None, limit: int = 100) -> list[dict[str, Any]]:
        """Open serving disputes, or those awaiting ``referee``'s vote (ADR 0176)."""
        chain = self.role.require_ready()
        if not isinstance(limit, int) or not 1 <= limit <= serve_disputes.MAX_LIST_DISPUTES:
            raise InvalidParams(f"limit must be in 1..{serve_disputes.MAX_LIST_DISPUTES}")
        if referee is not None:
            check_address(referee)
        disputes: list[dict[str, Any]] = await self.role.read_state(serve_disputes.list_open_disputes,
                                                                    chain.ledger.state, referee, limit)
        return disputes

    async def dkb_getTask(self, task_id: str) -> dict[str, Any] | None:
        """The task (None: the state does not know the id); a task pruned after it ended is an error saying so,
        with its end time (docs/adr/0215)."""
        ledger = self.role.require_ready().ledger
        ident = parse_hex(task_id, "task_id", 32)
        doc = ledger.task_info(ident)
        if doc is None:
            pruned = retention.pruned_info(ledger.state, ledger.params, ident)
            if pruned is not None:
                message = pruned.pop("message")
                raise RpcError(message, data=pruned, code=RESOURCE_NOT_FOUND)
        return doc

    async def dkb_listTasks(self, status: str | None = None, owner: str | None = None,
                            limit: int = 100) -> list[dict[str, Any]]:
        chain = self.role.require_ready()
        if not 1 <= limit <= MAX_LIST_TASKS:
            raise InvalidParams(f"limit must be in 1..{MAX_LIST_TASKS}")
        if owner is not None:
            check_address(owner)
        tasks: list[dict[str, Any]] = await self.role.read_state(chain.ledger.list_tasks, status, owner, limit)
        return tasks

    async def dkb_getSupply(self) -> dict[str, int]:
        chain = self.role.require_ready()
        parts: dict[str, int] = await self.role.read_state(supply_breakdown, chain.ledger.state)
        return {**parts, "total": sum(parts.values()), "genesis": chain.genesis.total_supply}

    async def dkb_getParams(self) -> dict[str, int]:
        """The chain's parameters (genesis ``params``: stakes, shares, windows), e.g. ``min_serve_stake``."""
        return dataclasses.asdict(self.role.require_ready().ledger.params)

    async def dkb_getGenesis(self) -> dict[str, Any]:
        """The chain's genesis document (the file form) and its hash: what ``dekube-node provide`` fetches
        and checks against the hash its network description names (docs/adr/0195)."""
        genesis = self.role.require_ready().genesis
        return {"genesis": genesis.to_obj(), "hash": genesis.hash.hex()}


METHODS = tuple(name for name in vars(LedgerMethods) if name.startswith("dkb_"))
