"""The validator role's metrics and its committed-block log line (ADR 0155).

``dekube_consensus_height``, ``dekube_consensus_rounds`` (rounds the last height took) and a
histogram of rounds per height, ``dekube_consensus_block_interval_seconds`` (time between
commits seen by this node), ``dekube_consensus_missed_blocks_total{validator}`` (committee members
whose precommit is not in a block's certificate), ``dekube_consensus_block_txs_total`` and
``dekube_mempool_txs``. A committed block is logged at info, at most once per ``LOG_EVERY_S``
(with how many blocks were committed since the last line), so a fast chain does not flood logs.
"""
from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable

log = logging.getLogger("consensus.validator")

LOG_EVERY_S = 10.0
INTERVAL_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.0, 3.0, 5.0, 10.0, 30.0, 60.0)
ROUND_BUCKETS = (1, 2, 3, 4, 6, 10)


class ConsensusMetrics:
    def __init__(self, registry, height: Callable[[], int], mempool_size: Callable[[], int]):
        registry.gauge("dekube_consensus_height", "Last committed block height.").set_function(height)
        registry.gauge("dekube_mempool_txs", "Transactions waiting in the mempool.").set_function(mempool_size)
        self.rounds = registry.gauge("dekube_consensus_rounds", "Rounds the last committed height took (1 = first).")
        self.rounds_hist = registry.histogram("dekube_consensus_rounds_per_height",
                                              "Rounds each committed height took.", buckets=ROUND_BUCKETS)
        self.interval = registry.histogram("dekube_consensus_block_interval_seconds",
                                           "Seconds between consecutive commits seen by this node.",
                                           buckets=INTERVAL_BUCKETS)
        self.missed = registry.counter("dekube_consensus_missed_blocks_total",
                                       "Blocks whose commit certificate lacks this committee member's precommit.",
                                       ["validator"])
        self.txs = registry.counter("dekube_consensus_block_txs_total", "Transactions in committed blocks.")
        self._last_commit: float | None = None
        self._last_log = 0.0
        self._since_log = 0

    def on_commit(self, height: int, round_: int, txs: int, committee: Iterable[str], signers: Iterable[str],
                  now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        self.rounds.set(round_ + 1)
        self.rounds_hist.observe(round_ + 1)
        if self._last_commit is not None:
            self.interval.observe(now - self._last_commit)
        self._last_commit = now
        signed = set(signers)
        for member in committee:
            if member not in signed:
                self.missed.inc(validator=member)
        self.txs.inc(txs)
        self._since_log += 1
        if now - self._last_log >= LOG_EVERY_S:
            log.info("committed block", extra={"height": height, "round": round_, "txs": txs,
                                                "blocks_since_last_line": self._since_log})
            self._last_log, self._since_log = now, 0
