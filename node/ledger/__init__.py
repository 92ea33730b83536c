"""The node's one ledger gateway: every read, transaction, node-record update and ledger event
subscription of a node goes through ``node.ledger`` (a ``LedgerGateway``), whatever its roles
(docs/adr/0100). node/ imports no consensus, relay or ml code: a validator role in the same
process hands the gateway a ``LocalLedger``, and transactions are encoded by a callable named by
a "module:function" string.

Modules: ``gateway`` (the gateway), ``jsonrpc`` (validator URLs with failover), ``nonces`` (the
sender's nonce book), ``record`` (the merged node record), ``events`` (topic streams), ``errors``.
"""
from .errors import LedgerUnavailable, RpcAnswerError, TxFailed
from .events import RESYNC, TopicRefused
from .gateway import LedgerGateway, LocalLedger, SentTx
from .record import RecordPublisher, merge_record

__all__ = [
    "RESYNC",
    "LedgerGateway",
    "LedgerUnavailable",
    "LocalLedger",
    "RecordPublisher",
    "RpcAnswerError",
    "SentTx",
    "TopicRefused",
    "TxFailed",
    "merge_record",
]
