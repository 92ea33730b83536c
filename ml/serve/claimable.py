"""Whether serving receipts can be claimed on chain, told before anyone is told they were paid.

The ledger pays a receipt (``serve_receipt``, ADR 0174) only to a registered compute node with at
least ``min_serve_stake`` bonded; a key without a balance cannot even send the record that announces
the server. A paid server used to start anyway (unannounced, or with every claim refused in its log
only) while its clients were told ``"paid"``.

``stake_plan`` (sans I/O) decides what a paid server does at start: nothing, bond the shortfall from
its free balance, or refuse with the reason and the command that fixes it. ``ensure_claimable`` reads
the ledger and carries the plan out. ``claimable_servers`` tells a client which of the servers it
signed receipts to can claim them: the others cannot charge its escrow.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from consensus.genesis import Params
from node.ledger.gateway import LedgerGateway

DEFAULT_MIN_SERVE_STAKE = Params().min_serve_stake


class NotClaimable(Exception):
    """A paid server whose receipts the ledger would refuse; the message says what to do."""


@dataclass(frozen=True)
class StakePlan:
    bond: int = 0        # to bond now from the free balance
    refusal: str = ""    # non-empty: cannot serve for pay, and why


def stake_plan(peer_id: str, free: int, bonded: int, min_stake: int, fee: int) -> StakePlan:
    """What a paid server holding `free` and `bonded` must do before serving: the bond transaction and
    the announcing record each cost `fee`."""
    shortfall = max(0, min_stake - bonded)
    fees = fee * (2 if shortfall else 1)
    if free >= shortfall + fees:
        return StakePlan(bond=shortfall)
    need = shortfall + fees - free
    return StakePlan(refusal=(
        f"paid serving needs the server key {peer_id} to have at least min_serve_stake = {min_stake} bonded "
        f"(the ledger refuses receipt claims below that) and {fees} for fees; it has {bonded} bonded and "
        f"{free} free: send it {need} more (dekube-node wallet send {peer_id} {need} --rpc URL --key FUNDED_KEY "
        f"--wait) and start again (it bonds the rest itself)"))


async def min_serve_stake(gateway: LedgerGateway) -> int:
    """The chain's ``min_serve_stake`` (the genesis default from a validator without dkb_getParams)."""
    from node.ledger.errors import LedgerUnavailable

    try:
        params = await gateway.call("dkb_getParams")
    except LedgerUnavailable:
        await gateway.call("dkb_chainId")   # it answers, but without dkb_getParams (an older validator)
        return DEFAULT_MIN_SERVE_STAKE
    return int(params["min_serve_stake"])


async def ensure_claimable(gateway: LedgerGateway, peer_id: str) -> int:
    """Bond what `peer_id` lacks of ``min_serve_stake`` (the amount bonded now, 0 if none was needed), or
    raise NotClaimable with the reason."""
    from node.ledger.errors import LedgerUnavailable, TxFailed

    try:
        needed = await min_serve_stake(gateway)
        plan = stake_plan(peer_id, await gateway.balance(peer_id), await gateway.bonded(peer_id), needed,
                          gateway.fee)
        if plan.refusal:
            raise NotClaimable(plan.refusal)
        if plan.bond:
            await gateway.send("bond", {"amount": plan.bond})
    except (LedgerUnavailable, TxFailed, OSError) as exc:
        raise NotClaimable(f"cannot check or bond the server's stake on the ledger: {exc}") from None
    return plan.bond


async def claimable_servers(gateway: LedgerGateway, servers: set[str]) -> dict[str, str]:
    """For each server that cannot claim its receipts, why (not a registered compute node, or too little
    bonded); servers missing from the answer can claim."""
    needed = await min_serve_stake(gateway)
    why = {}
    for peer_id in sorted(servers):
        record = await gateway.node_info(peer_id)
        bonded = await gateway.bonded(peer_id)
        if record is None or "compute" not in (record.get("roles") or []):
            why[peer_id] = "not a registered compute node"
        elif bonded < needed:
            why[peer_id] = f"{bonded} bonded < min_serve_stake {needed}"
    return why


def paid_report(signed: list[dict[str, Any]], unclaimable: dict[str, str]) -> dict[str, Any]:
    """What a client is told it paid: the amounts of its co-signed receipts (`signed`, cumulative per
    session) to servers that can claim them ("paid"), and, apart, those to servers that cannot
    ("unclaimable": server -> {"amount", "why"}; the ledger will not charge them)."""
    out: dict[str, Any] = {"paid": 0}
    for receipt in signed:
        server, amount = receipt["server"], int(receipt["amount"])
        if server in unclaimable:
            entry = out.setdefault("unclaimable", {}).setdefault(server, {"amount": 0, "why": unclaimable[server]})
            entry["amount"] += amount
        else:
            out["paid"] += amount
    return out
