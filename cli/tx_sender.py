"""The CLI's transactions: signed with the user's key at the fee they chose and sent by the node's one
transaction sender (``node.ledger.LedgerGateway``: nonce from the ledger's ``pending`` count,
``dkb_sendRawTransaction``, receipt), its failures turned into one-line ``CliError``s that say
what was refused and why. ``send_tx`` is the async form; ``send_tx_blocking`` the one for
synchronous commands (wallet, provide)."""
from __future__ import annotations

import asyncio
from collections.abc import Sequence

from cli.errors import CliError
from consensus.tx import DEFAULT_FEE, signed_tx_bytes
from node.identity import Identity
from node.ledger import LedgerGateway, LedgerUnavailable, SentTx, TxFailed
from node.plugins import TxEncoding

RECEIPT_WAIT_S = 60.0


async def send_tx(urls: Sequence[str], identity: Identity, tx_type: str, payload: dict, *,
                  fee: int = DEFAULT_FEE, timeout: float = RECEIPT_WAIT_S, wait: bool = True) -> SentTx:
    """Sign ``tx_type`` with ``identity``, send it to the first of ``urls`` that answers and (``wait``)
    wait up to ``timeout`` s for its receipt. A transaction the ledger refuses, or one that executes
    with an error, raises CliError with the ledger's reason."""
    if fee < 0:
        raise CliError("fee must not be negative")
    gateway = LedgerGateway(identity, list(urls), tx=TxEncoding(signed_tx_bytes, fee))
    try:
        return await gateway.send_tx(tx_type, payload, timeout, wait=wait)
    except TxFailed as exc:
        if exc.receipt is not None:
            receipt = exc.receipt
            raise CliError(f"{tx_type} {receipt['tx_hash']} refused by the ledger in block {receipt['height']}: "
                           f"{receipt['status']} {receipt.get('log', '')}".strip()) from None
        code = f" ({exc.code.upper()})" if isinstance(exc.code, str) and exc.code else ""   # the ledger's code name
        raise CliError(f"{tx_type} not accepted{code}: {exc.detail}") from None
    except LedgerUnavailable as exc:
        raise CliError(f"cannot reach the node: {exc}") from None
    finally:
        await gateway.close()


def send_tx_blocking(url: str, identity: Identity, tx_type: str, payload: dict, **options) -> SentTx:
    """``send_tx`` to ``url`` from synchronous code."""
    return asyncio.run(send_tx([url], identity, tx_type, payload, **options))
