"""Limited (relay-capped) connections: which protocols may use them, and the error when one may not.

A circuit relay v2 relay may cap a circuit (HOP STATUS / STOP CONNECT ``Limit``: seconds and bytes
per direction; js-libp2p's default is 2 min and 128 KiB). Like go-libp2p's and js-libp2p's
"limited"/"transient" connections, such a connection carries signalling only: streams of the
protocols in ``LIMITED_ALLOWED`` may open on it (both directions), any other is refused with
``LimitedConnectionError``. Bulk traffic waits for a direct connection (hole punch) or an
unlimited relay. See ADR 0143.
"""
from __future__ import annotations

from typing import Protocol

# The one list of protocols allowed on a limited connection: small, bounded control exchanges.
LIMITED_ALLOWED: frozenset[str] = frozenset({
    "/ipfs/id/1.0.0",                      # identify
    "/ipfs/id/push/1.0.0",                 # identify push
    "/ipfs/ping/1.0.0",                    # ping
    "/libp2p/dcutr",                       # hole punch coordination
    "/libp2p/circuit/relay/0.2.0/hop",     # relay protocols
    "/libp2p/circuit/relay/0.2.0/stop",
    "/dekube/relay-receipt/1.0.0",         # relay usage receipts (a few hundred bytes)
    "/libp2p/autonat/1.0.0",               # reachability probes
    "/dekube/task-ready/1",                # one small readiness message per task
})


class LimitLike(Protocol):
    """relay.messages.Limit's shape (node/p2p does not import relay)."""

    @property
    def duration(self) -> int | None: ...  # seconds

    @property
    def data(self) -> int | None: ...      # bytes per direction


# A cap at least this generous is treated as no cap: py-libp2p relays always send a Limit (ours in
# the interop tests: 1 TiB, 24 h), and a bulk connection that hits such a cap is redialled like any
# lost connection. Below either threshold (js-libp2p's 128 KiB / 2 min) the circuit is limited.
UNLIMITED_DATA_BYTES = 1 << 30
UNLIMITED_DURATION_S = 3600


def is_limited(limit: LimitLike | None) -> bool:
    """Whether ``limit`` caps data or duration below what bulk traffic needs (a Limit with neither
    field set caps nothing, the spec's "unlimited")."""
    if limit is None:
        return False
    return ((limit.data is not None and limit.data < UNLIMITED_DATA_BYTES)
            or (limit.duration is not None and limit.duration < UNLIMITED_DURATION_S))


def describe_limit(limit: LimitLike | None) -> str:
    if not is_limited(limit):
        return "unlimited"
    assert limit is not None
    parts = []
    if limit.data is not None:
        parts.append(f"{limit.data} bytes" if limit.data % 1024 else f"{limit.data // 1024} KiB")
    if limit.duration is not None:
        parts.append(f"{limit.duration} s")
    return ", ".join(parts)


class LimitedConnectionError(ConnectionError):
    """A stream or bulk dial was refused because the only path is a relay-limited circuit."""

    def __init__(self, message: str, limit: LimitLike | None = None) -> None:
        super().__init__(message)
        self.limit = limit


def allowed_on_limited(protocol: str) -> bool:
    return protocol in LIMITED_ALLOWED
