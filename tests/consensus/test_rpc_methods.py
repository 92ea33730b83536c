"""Parameter parsing and rejection mapping of the ledger's JSON-RPC methods."""
import pytest

from consensus.txcodes import TxCode, TxError
from consensus.validator.rpc_methods import parse_height, parse_hex, tx_rejection
from node.rpc.errors import InvalidParams


def test_parse_hex():
    assert parse_hex("0xabcd", "x") == b"\xab\xcd" == parse_hex("ABCD", "x")
    assert parse_hex("00" * 32, "hash", 32) == bytes(32)
    for bad, kwargs in (("abc", {}), ("zz", {}), ("00" * 31, {"length": 32}), ("00" * 10, {"max_chars": 8})):
        with pytest.raises(InvalidParams):
            parse_hex(bad, "x", **kwargs)


def test_parse_height():
    assert parse_height(5, 9) == 5
    assert parse_height("latest", 9) == 9 == parse_height("finalized", 9)
    assert parse_height("earliest", 9) == 0
    assert parse_height("0x10", 9) == 16 == parse_height("16", 9)
    for bad in (-1, "-3", "soon", ""):
        with pytest.raises(InvalidParams):
            parse_height(bad, 9)


@pytest.mark.parametrize("code, rpc_code", [
    (TxCode.NONCE_TOO_LOW, -32001), (TxCode.NONCE_TOO_HIGH, -32002), (TxCode.INSUFFICIENT_FUNDS, -32003),
    (TxCode.BAD_SIGNATURE, -32004), (TxCode.ALREADY_KNOWN, -32005), (TxCode.MEMPOOL_FULL, -32000),
    (TxCode.BAD_ENCODING, -32000),
])
def test_rejections_carry_server_code_and_tx_code(code, rpc_code):
    error = tx_rejection(TxError(code, "why")).to_json()
    assert error["code"] == rpc_code
    assert error["data"] == {"code": code.name, "tx_code": int(code)}
    assert "why" in error["message"]
