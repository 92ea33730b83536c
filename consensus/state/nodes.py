"""Node registry: register_node creates or updates a node's roles, addresses and hardware.

Re-registering keeps the reputation and the count of active tasks the ledger tracks.
"""
from __future__ import annotations

from consensus.genesis import Params
from consensus.state.context import BlockContext
from consensus.state.records import NodeRecord
from consensus.state.store import NODE, LedgerState
from consensus.tx import Tx
from consensus.txcodes import TxCode, TxError


def apply_register_node(state: LedgerState, params: Params, ctx: BlockContext, tx: Tx) -> None:
    p = tx.payload
    for entry in p["hardware"].get("serving", ()):
        if "height" in entry and not ctx.height - params.serve_announce_ttl <= entry["height"] <= ctx.height:
            raise TxError(TxCode.BAD_PAYLOAD, f"a served range's height must be within serve_announce_ttl "
                                              f"({params.serve_announce_ttl}) blocks before {ctx.height}")
    node = state.nodes.get(tx.sender)
    if node is None:
        state.nodes[tx.sender] = NodeRecord(p["roles"], p["listen_addrs"], p["relay_addrs"], p["hardware"],
                                            registered_height=ctx.height)
    else:
        node.roles, node.listen_addrs, node.relay_addrs, node.hardware = (
            p["roles"], p["listen_addrs"], p["relay_addrs"], p["hardware"])
    state.touch(NODE, tx.sender)
