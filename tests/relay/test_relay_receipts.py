"""Endpoint receipt checks: an endpoint co-signs only receipts for its own circuit, from that relay,
for no more bytes than it counted (plus in-flight allowance) and at a price it accepts."""
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from consensus.encoding import encode
from consensus.tx import relay_receipt_signing_bytes
from node.identity import Identity, verify_by_peer_id
from relay.receipts import (
    MIB,
    CircuitCount,
    ReceiptError,
    ReceiptSigner,
    amount_for,
    build_receipt,
    decode_request,
    in_flight_allowance,
)

ME, PEER, RELAY, OTHER = (Identity.from_seed(bytes([i]) * 32) for i in range(1, 5))
SESSION = b"s" * 16
COUNTED = 100 * MIB


def signer(price=2):
    circuit = CircuitCount(RELAY.peer_id, PEER.peer_id, True, lambda: COUNTED)
    return ReceiptSigner(ME, "chain", {SESSION: circuit}.get, price)


def receipt(**changes):
    base = build_receipt(RELAY.peer_id, ME.peer_id, PEER.peer_id, SESSION, COUNTED, 2)
    base.update(changes)
    return base


def test_signs_a_matching_receipt():
    s = signer()
    r = receipt()
    assert s.check(RELAY.peer_id, r) is None
    assert r["amount_total"] == amount_for(COUNTED, 2) == 200
    assert verify_by_peer_id(ME.peer_id, relay_receipt_signing_bytes("chain", r), s.sign(r))


@pytest.mark.parametrize("changes, asker, reason", [
    ({"session": b"t" * 16}, RELAY, "unknown circuit"),
    ({}, OTHER, "not from the circuit's relay"),
    ({"relay": OTHER.peer_id}, OTHER, "not from the circuit's relay"),
    ({"src": PEER.peer_id, "dst": ME.peer_id}, RELAY, "endpoints do not match"),
    ({"payer": OTHER.peer_id}, RELAY, "payer"),
    ({"bytes_total": COUNTED + in_flight_allowance(COUNTED) + 1}, RELAY, "we counted"),
    ({"amount_total": 201}, RELAY, "price"),
])
def test_refusals(changes, asker, reason):
    assert reason in signer().check(asker.peer_id, receipt(**changes))


@pytest.mark.parametrize("value", [
    b"\x00", {"relay": "x"}, {**receipt(), "bytes_total": 0}, {**receipt(), "session": b"short"},
    {**receipt(), "extra": 1},
])
def test_decode_request_rejects_malformed(value):
    with pytest.raises(ReceiptError):
        decode_request(value if isinstance(value, bytes) else encode(value))


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=300))
def test_fuzz_decode_request(data):
    try:
        decode_request(data)
    except ReceiptError:
        pass
