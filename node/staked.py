"""Tag peers with bonded stake as ``STAKED`` for admission (node/admission.py, docs/adr/0197).

Every node that reaches the ledger (a validator in-process, a compute, serving or relay node over its
ledger gateway) asks it every ``STAKE_REFRESH_S`` seconds for the nodes with at least the least bond
any role needs (``dkb_listStakes``), and makes exactly those hold the ``staked`` tag of
``host.classes``: a peer that unbonds below the minimum, is slashed below it or is jailed loses the
tag at the next refresh. A ledger that cannot be read leaves the last answer in place (stake changes
slowly; dropping every staked peer to ``UNKNOWN`` whenever a validator is briefly away would hand
their capacity to a flood). ``apply`` is the pure part: the answer in, the tag out.
"""
from __future__ import annotations

import asyncio
import logging
from typing import Any

from node.admission import PeerClass, PeerClasses
from node.identity import is_valid_peer_id
from node.ledger import LedgerGateway

log = logging.getLogger(__name__)

TAG = "staked"
STAKE_REFRESH_S = 10.0
MAX_STAKED = 10_000


def apply(classes: PeerClasses, answer: Any, me: str) -> int:
    """Make the peers of a ``dkb_listStakes`` answer hold the ``staked`` tag (this node left out);
    raises ValueError on a malformed answer. Returns how many peers are tagged."""
    if not isinstance(answer, dict) or not isinstance(answer.get("stakes"), list):
        raise ValueError("dkb_listStakes answered without a stakes list")
    peers = {entry.get("peer_id") for entry in answer["stakes"][:MAX_STAKED] if isinstance(entry, dict)}
    staked = {peer for peer in peers if isinstance(peer, str) and peer != me and is_valid_peer_id(peer)}
    classes.set_tag(TAG, PeerClass.STAKED, staked)
    return len(staked)


async def refresh(classes: PeerClasses, ledger: LedgerGateway, me: str) -> int:
    return apply(classes, await ledger.call("dkb_listStakes", None, MAX_STAKED), me)


async def follow_stakes(classes: PeerClasses, ledger: LedgerGateway, me: str,
                        interval: float = STAKE_REFRESH_S) -> None:
    """Keep the ``staked`` tag current until cancelled (idle forever without a ledger)."""
    if not ledger.available:
        await asyncio.Event().wait()
    if ledger.local is not None:  # this node's validator: readable once it has caught up
        await ledger.local.ready.wait()
    failures = 0
    while True:
        try:
            tagged = await refresh(classes, ledger, me)
            if failures:
                log.info("staked peers read again", extra={"staked": tagged, "failures": failures})
            failures = 0
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a validator away or older than dkb_listStakes: keep the last answer
            failures += 1
            if failures == 1 or failures % 30 == 0:
                log.warning("cannot read staked peers: %s", exc, extra={"failures": failures})
        await asyncio.sleep(interval)
