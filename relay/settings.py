"""The relay role's and relay client's config section, ``[relay]`` (ADR 0201: each role owns its section;
cli/assembly.py hands it to the node's config). Its limits default to `RelayLimits`, the relay's one
Config (relay/policy.py); `limits(settings)` is the RelayLimits a section asks for, with the circuit
limit (duration and/or data per direction) configurable."""
from __future__ import annotations

from typing import Any

from node.config import Key, check_non_negative, check_peer_multiaddr, check_positive, check_rpc_url, each

from .messages import Limit
from .policy import RelayLimits

_LIMITS = RelayLimits()

SECTIONS: dict[str, dict[str, Key]] = {
    "relay": {
        "allow_list": Key(list, [], "peer IDs admitted to reserve and relay without a ledger registration"),
        "min_stake": Key(int, 0, "stake a ledger-registered peer needs to be admitted by this relay"),
        "min_client_balance": Key(int, 1, "balance that admits an account with no node record (a task owner's "
                                          "command-line client) where min_stake is 0; 0 admits none",
                                  check_non_negative),
        "stake": Key(int, 100, "stake the relay keeps bonded (bonds the difference at start; the ledger pays "
                               "receipts only to relays with the chain's min_relay_stake)", check_non_negative),
        "reservation_ttl": Key(int, _LIMITS.reservation_ttl, "seconds a reservation and its voucher last",
                               check_positive),
        "max_reservations": Key(int, _LIMITS.max_reservations, "reservations held at once in all", check_positive),
        "max_reservations_per_ip": Key(int, _LIMITS.max_reservations_per_ip,
                                       "reservations held at once by peers behind one IP", check_positive),
        "max_circuits": Key(int, _LIMITS.max_circuits, "circuits open through this relay at once", check_positive),
        "max_circuits_per_peer": Key(int, _LIMITS.max_circuits_per_peer,
                                     "circuits one peer may have open through this relay", check_positive),
        "circuit_limit_seconds": Key(int, 0, "the duration limit announced on (and enforced for) each circuit, in "
                                     "seconds; 0: none (with circuit_limit_bytes 0: unlimited circuits, ADR 0143)",
                                     check_non_negative),
        "circuit_limit_bytes": Key(int, 0, "the data limit per direction announced on (and enforced for) each "
                                   "circuit; 0: none", check_non_negative),
        "receipt_interval_bytes": Key(int, _LIMITS.receipt_interval_bytes,
                                      "bytes relayed on a circuit between two usage receipts", check_positive),
        "price_per_mib": Key(int, _LIMITS.price_per_mib, "price per relayed MiB written into usage receipts",
                             check_positive),
        "receipt_rpc": Key(str, "",
                           "legacy: one more validator JSON-RPC URL for the node's ledger gateway (see [ledger] "
                           "rpc_urls)", check_rpc_url),
        "ledger_rpc": Key(str, "",
                          "legacy: a validator JSON-RPC URL for the node's ledger gateway, tried before [compute] "
                          "rpc_url (see [ledger] rpc_urls)", check_rpc_url),
        "lookup_ttl": Key(float, 10.0, "seconds a ledger admission lookup over JSON-RPC is cached", check_positive),
        "relays": Key(list, [],
                      "relays this node reserves on when it needs to (.../tcp/N/p2p/<relay id>); empty: no relay "
                      "client", each(check_peer_multiaddr)),
        "reserve": Key(bool, False,
                       "reserve on [relay] relays even when reachable; false: only when AutoNAT through them says "
                       "private"),
        "reservations": Key(int, 2,
                            "relays reserved on at once (those with the lowest round-trip time)", check_positive),
        "max_price_per_mib": Key(int, 1,
                                 "highest price per relayed MiB this node co-signs in usage receipts", check_positive),
        "hole_punch": Key(bool, True,
                          "with [relay] relays: upgrade relayed connections to direct ones by DCUtR hole punching"),
    },
}


def limits(settings: dict[str, Any]) -> RelayLimits:
    """The relay's limits as the ``[relay]`` section `settings` sets them."""
    seconds, data = settings["circuit_limit_seconds"], settings["circuit_limit_bytes"]
    return RelayLimits(
        reservation_ttl=settings["reservation_ttl"], max_reservations=settings["max_reservations"],
        max_reservations_per_ip=settings["max_reservations_per_ip"], max_circuits=settings["max_circuits"],
        max_circuits_per_peer=settings["max_circuits_per_peer"],
        receipt_interval_bytes=settings["receipt_interval_bytes"], price_per_mib=settings["price_per_mib"],
        circuit_limit=Limit(duration=seconds or None, data=data or None) if seconds or data else None)
