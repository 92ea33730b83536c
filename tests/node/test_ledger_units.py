"""The ledger gateway's sans-I/O pieces: the sender's nonce book and the merged node record."""
import pytest

from node.ledger.nonces import NonceBook
from node.ledger.record import merge_record

RELAY_ADDR = ("/ip4/10.0.0.1/tcp/4001/p2p/12D3KooWScSTsN2tXx2GxXTXAw9Z3rEMKP4wbSvvPKWC3nhJQqP3/p2p-circuit/p2p/"
              "12D3KooWAkiNXhZutPFvPzpgEuFyczezxiteCX45X1R9g7N1Gk3s")


def test_nonces_are_taken_locally_after_one_sync_and_refused_ones_are_reused_first():
    book = NonceBook()
    assert book.needs_sync
    with pytest.raises(RuntimeError):
        book.take()
    book.sync(7)
    assert [book.take() for _ in range(3)] == [7, 8, 9]
    book.sync(100)                       # ignored while the book is valid
    for n in (7, 9):
        book.accepted(n)
    book.give_back(8)                    # refused: the next transaction fills the gap
    assert book.take() == 8 and book.take() == 10


def test_a_resync_never_goes_below_a_nonce_still_being_submitted():
    book = NonceBook()
    book.sync(0)
    first, second = book.take(), book.take()
    book.accepted(first)
    book.invalidate(first)               # e.g. a nonce error elsewhere
    book.sync(1)                         # the ledger has seen only the first; the second is on its way
    assert book.take() == second + 1


def test_the_record_merges_every_contribution_and_keeps_what_nobody_contributes():
    fresh = merge_record(None, {"relay": {"roles": {"relay", "not-a-ledger-role"},
                                          "listen_addrs": ["/ip4/0.0.0.0/tcp/4001", "/ip4/1.2.3.4/tcp/4001"]}})
    assert fresh["roles"] == ["relay"] and fresh["listen_addrs"] == ["/ip4/1.2.3.4/tcp/4001"]
    assert fresh["relay_addrs"] == [] and fresh["hardware"]["cpu_cores"] >= 1
    current = {"roles": ["validator"], "listen_addrs": ["/ip4/5.6.7.8/tcp/1"], "relay_addrs": [],
               "hardware": {"cpu_cores": 8, "ram_mb": 1, "gpu": "x", "gpu_mem_mb": 2, "bandwidth_mbps": 3},
               "reputation": 4}
    hardware = {**current["hardware"], "bandwidth_mbps": 100}
    contributions = {"compute": {"roles": {"compute", "verifier"}, "hardware": hardware},
                     "relay_client": {"roles": {"compute"}, "relay_addrs": [RELAY_ADDR]}}
    update = merge_record(current, contributions)
    assert update == {"roles": ["compute", "validator", "verifier"], "listen_addrs": ["/ip4/5.6.7.8/tcp/1"],
                      "relay_addrs": [RELAY_ADDR], "hardware": hardware}
    assert merge_record({**current, **update}, contributions) is None      # nothing to send
    dropped = {**current, **update, "roles": ["compute"], "relay_addrs": []}  # another writer replaced it
    assert merge_record(dropped, contributions) == {**update, "roles": ["compute", "verifier"]}  # ours come back
    assert len(merge_record(None, {"x": {"relay_addrs": [RELAY_ADDR] * 12}})["relay_addrs"]) == 8


def test_hardware_contributions_merge_key_by_key():
    """The serving service adds `serving` to the compute role's hardware instead of replacing it (ADR 0177)."""
    machine = {"cpu_cores": 8, "ram_mb": 1, "gpu": "x", "gpu_mem_mb": 2, "bandwidth_mbps": 3, "profiles": ["p"]}
    serving = [{"model": "m", "start": 0, "end": 2, "tokens_per_s": 1, "profile": "p", "price": 0, "height": 5}]
    for order in (("compute", "serve"), ("serve", "compute")):
        parts = {"compute": {"roles": {"compute"}, "hardware": machine}, "serve": {"hardware": {"serving": serving}}}
        payload = merge_record(None, {name: parts[name] for name in order})
        assert payload["hardware"] == {**machine, "serving": serving}
    alone = merge_record(None, {"serve": {"hardware": {"serving": serving}}})
    assert alone["hardware"]["serving"] == serving and "cpu_cores" in alone["hardware"]
