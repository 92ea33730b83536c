"""Transactions: signing, strict decoding, payload schemas, junk never crashes."""
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_ledger_kit import CHAIN, ident

from consensus.encoding import decode, encode
from consensus.tx import PAYLOAD_SCHEMAS, build_tx, decode_tx
from consensus.txcodes import TxCode, TxError

A, B = ident(1), ident(2)


def test_build_decode_verify_round_trip():
    tx = build_tx(A, CHAIN, 7, "transfer", {"to": B.peer_id, "amount": 5}, fee=2)
    again = decode_tx(tx.raw, chain_id=CHAIN)
    assert again == tx
    assert (tx.sender, tx.nonce, tx.fee, tx.type) == (A.peer_id, 7, 2, "transfer")
    assert tx.verify_signature()
    assert len(tx.hash) == 32


def test_tampered_fields_break_the_signature():
    tx = build_tx(A, CHAIN, 0, "transfer", {"to": B.peer_id, "amount": 5})
    fields = decode(tx.raw)
    for index, value in ((3, 1), (6, 9), (5, {"to": B.peer_id, "amount": 6}), (1, "other-chain")):
        forged = list(fields)
        forged[index] = value
        assert not decode_tx(encode(forged)).verify_signature()
    stolen = list(fields)
    stolen[2] = B.peer_id  # claim another sender
    assert not decode_tx(encode(stolen)).verify_signature()


@pytest.mark.parametrize("mutate, code", [
    (lambda f: f[:7], TxCode.BAD_ENCODING),
    (lambda f: [2] + f[1:], TxCode.BAD_ENCODING),
    (lambda f: f[:3] + [-1] + f[4:], TxCode.BAD_ENCODING),
    (lambda f: f[:7] + [b"short"], TxCode.BAD_ENCODING),
    (lambda f: f[:4] + ["mint"] + f[5:], TxCode.UNKNOWN_TYPE),
    (lambda f: f[:5] + [{"to": B.peer_id}] + f[6:], TxCode.BAD_PAYLOAD),
    (lambda f: f[:5] + [{"to": B.peer_id, "amount": 0}] + f[6:], TxCode.BAD_PAYLOAD),
    (lambda f: f[:5] + [{"to": "12D3KooWnope", "amount": 1}] + f[6:], TxCode.BAD_PAYLOAD),
    (lambda f: f[:5] + [{"to": B.peer_id, "amount": 1, "x": 1}] + f[6:], TxCode.BAD_PAYLOAD),
    (lambda f: f[:2] + ["not-a-peer"] + f[3:], TxCode.BAD_PAYLOAD),
])
def test_malformed_transactions_get_clear_codes(mutate, code):
    fields = decode(build_tx(A, CHAIN, 0, "transfer", {"to": B.peer_id, "amount": 5}).raw)
    with pytest.raises(TxError) as info:
        decode_tx(encode(mutate(fields)))
    assert info.value.code == code


def test_wrong_chain_and_oversize():
    tx = build_tx(A, "other", 0, "transfer", {"to": B.peer_id, "amount": 5})
    with pytest.raises(TxError) as info:
        decode_tx(tx.raw, chain_id=CHAIN)
    assert info.value.code == TxCode.WRONG_CHAIN
    with pytest.raises(TxError) as info:
        decode_tx(tx.raw, max_bytes=len(tx.raw) - 1)
    assert info.value.code == TxCode.OVERSIZED


NO_FIELDS = {"unjail", "serve_unlock"}   # payload-less types: the sender is the whole request


def test_every_type_has_a_schema_that_rejects_an_empty_or_unknown_payload():
    for tx_type in PAYLOAD_SCHEMAS:
        if tx_type in NO_FIELDS:
            build_tx(A, CHAIN, 0, tx_type, {})
            with pytest.raises(TxError) as info:
                build_tx(A, CHAIN, 0, tx_type, {"extra": 1})
        else:
            with pytest.raises(TxError) as info:
                build_tx(A, CHAIN, 0, tx_type, {})
        assert info.value.code == TxCode.BAD_PAYLOAD


def test_register_node_serving_ranges_are_bounded():
    hw = {"cpu_cores": 4, "ram_mb": 8000, "gpu": "", "gpu_mem_mb": 0, "bandwidth_mbps": 100}
    served = {"model": "random:12x768", "start": 0, "end": 4, "tokens_per_s": 120,
              "profile": "cpu-x86-64-avx2/torch-2.13.0", "price": 5}
    ok = {"roles": ["compute"], "listen_addrs": [], "relay_addrs": [], "hardware": {**hw, "serving": [served]}}
    build_tx(A, CHAIN, 0, "register_node", ok)
    for bad in ([{**served, "start": 4}], [served] * 5, [{**served, "profile": "CPU"}],
                [{**served, "extra": 1}], [{**served, "end": 2000}], "x"):
        with pytest.raises(TxError) as info:
            build_tx(A, CHAIN, 0, "register_node", {**ok, "hardware": {**hw, "serving": bad}})
        assert info.value.code == TxCode.BAD_PAYLOAD


def test_register_node_roles_must_be_sorted_known_and_unique():
    hw = {"cpu_cores": 4, "ram_mb": 8000, "gpu": "", "gpu_mem_mb": 0, "bandwidth_mbps": 100}
    ok = {"roles": ["compute", "relay"], "listen_addrs": [], "relay_addrs": [], "hardware": hw}
    build_tx(A, CHAIN, 0, "register_node", ok)
    for roles in (["relay", "compute"], ["compute", "compute"], ["miner"]):
        with pytest.raises(TxError):
            build_tx(A, CHAIN, 0, "register_node", {**ok, "roles": roles})


RELAY = "/ip4/10.0.0.1/tcp/4001/p2p/12D3KooWRo8ndmgrMEYNfk2QE2iBMuRxPknRdRm4FKdhneAoxmu4"
HW = {"cpu_cores": 64, "ram_mb": 256_000, "gpu": "NVIDIA H100 80GB", "gpu_mem_mb": 81_920, "bandwidth_mbps": 10_000}
RECORD = {"roles": ["compute", "verifier"], "listen_addrs": ["/ip4/1.2.3.4/tcp/4001", "/dns4/n.example.org/tcp/1"],
          "relay_addrs": [f"{RELAY}/p2p-circuit", f"{RELAY}/p2p-circuit/p2p/{A.peer_id}"], "hardware": HW}


def register_error(**changes) -> str:
    """The BAD_PAYLOAD message for a register_node record with ``changes`` (hardware keys merge)."""
    record = {**RECORD, **changes, "hardware": {**HW, **changes.get("hardware", {})}}
    with pytest.raises(TxError) as info:
        build_tx(A, CHAIN, 0, "register_node", record)
    assert info.value.code == TxCode.BAD_PAYLOAD
    return info.value.message


def test_register_node_record_fields_are_validated():
    build_tx(A, CHAIN, 0, "register_node", RECORD)
    # the record: 4096 cores, 2**40 MB, relay_addrs that are not multiaddrs
    assert "cpu_cores" in register_error(hardware={"cpu_cores": 4096})
    assert "ram_mb" in register_error(hardware={"ram_mb": 2**40})
    assert "gpu_mem_mb" in register_error(hardware={"gpu_mem_mb": 2**40})
    assert "bandwidth_mbps" in register_error(hardware={"bandwidth_mbps": 10**7})
    assert "gpu" in register_error(hardware={"gpu": "H100\x1b[2J"})
    assert "not a multiaddr" in register_error(relay_addrs=["relay.example.org:4001"])
    assert "relay_addrs[0]" in register_error(relay_addrs=["/ip4/1.2.3.4/tcp/1"])            # not relayed
    assert "relay_addrs[0]" in register_error(relay_addrs=["/ip4/1.2.3.4/tcp/1/p2p-circuit"])  # no relay id
    assert "listen_addrs[0]" in register_error(listen_addrs=["/ip4/999.1.1.1/tcp/1"])
    assert "listen_addrs[0]" in register_error(listen_addrs=["/dns4/a\x00b/tcp/1"])
    assert "repeat" in register_error(listen_addrs=["/ip4/1.2.3.4/tcp/1"] * 2)
    assert "at most 8" in register_error(listen_addrs=[f"/ip4/1.2.3.4/tcp/{p}" for p in range(1, 10)])
    long_addrs = [f"/dns4/{'a' * 63}.{'b' * 63}.{'c' * 63}.{'d' * 40}/tcp/{p}" for p in range(1, 9)]
    assert "at most 2048 bytes" in register_error(listen_addrs=long_addrs)
    assert "roles" in register_error(roles=["validator", "miner"])


@settings(max_examples=400, deadline=None)
@given(st.binary(max_size=300))
def test_junk_bytes_raise_tx_error_only(junk):
    try:
        decode_tx(junk)
    except TxError as exc:
        assert exc.code in TxCode


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_bit_flips_never_crash_and_never_verify(data):
    raw = bytearray(build_tx(A, CHAIN, 3, "transfer", {"to": B.peer_id, "amount": 5}).raw)
    pos = data.draw(st.integers(0, len(raw) - 1))
    raw[pos] ^= 1 << data.draw(st.integers(0, 7))
    try:
        tx = decode_tx(bytes(raw))
    except TxError:
        return
    assert not tx.verify_signature()
