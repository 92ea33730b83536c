"""The test vectors of docs/spec/ hold for the code, and for the spec read on its own.

Each vector's inputs are taken from docs/spec/vectors/*.json and its outputs recomputed twice: by
the product code, and by the small reference implementation below, written from the spec text
only (what a wallet in another language would do). Both must give the recorded bytes, so neither
the code nor the spec can drift without a test failing here.
"""
import hashlib
import importlib.util
import json
import struct
from pathlib import Path

import nacl.signing
import pytest

from consensus import encoding, tx
from consensus.messages import (
    DoubleProposalEvidence,
    DoubleVoteEvidence,
    Proposal,
    Vote,
    VoteType,
    decode_evidence,
    decode_message,
    encode_proposal,
    encode_vote,
    sign_proposal,
    sign_vote,
)
from ml.allreduce import wire
from node.identity import Identity, b58decode
from relay import receipts
from relay.messages import frame as relay_frame

ROOT = Path(__file__).resolve().parents[2]
VECTORS = ROOT / "docs" / "spec" / "vectors"


def load(name):
    return json.loads((VECTORS / name).read_text(encoding="utf-8"))


def from_json(value):
    """The vector files' value notation (docs/spec/README.md) -> Python values."""
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, list):
        return [from_json(v) for v in value]
    (kind, inner), = value.items()
    return {"bytes": bytes.fromhex, "int": int,
            "map": lambda m: {k: from_json(v) for k, v in m.items()}}[kind](inner)


SEEDS = {key["name"]: bytes.fromhex(key["seed"]) for key in load("identity.json")["keys"]}


# ---- reference implementation, from docs/spec only ----------------------------------------

B58 = "123456789ABCDEFGHJKLMNPQRSTUVWXYZabcdefghijkmnopqrstuvwxyz"


def ref_base58(data: bytes) -> str:
    n = int.from_bytes(data, "big")
    out = ""
    while n:
        n, r = divmod(n, 58)
        out = B58[r] + out
    return "1" * (len(data) - len(data.lstrip(b"\0"))) + out


def ref_uvarint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def ref_encode(value) -> bytes:
    if value is None:
        return b"\x00"
    if value is False:
        return b"\x01"
    if value is True:
        return b"\x02"
    if isinstance(value, int):
        return b"\x03" + ref_uvarint(value) if value >= 0 else b"\x04" + ref_uvarint(-1 - value)
    if isinstance(value, bytes):
        return b"\x05" + ref_uvarint(len(value)) + value
    if isinstance(value, str):
        raw = value.encode("utf-8")
        return b"\x06" + ref_uvarint(len(raw)) + raw
    if isinstance(value, list):
        return b"\x07" + ref_uvarint(len(value)) + b"".join(ref_encode(v) for v in value)
    if isinstance(value, dict):
        keys = sorted((k.encode("utf-8"), k) for k in value)
        return b"\x08" + ref_uvarint(len(value)) + b"".join(
            ref_uvarint(len(raw)) + raw + ref_encode(value[k]) for raw, k in keys)
    raise TypeError(type(value))


def ref_sign(signer: str, message: bytes) -> bytes:
    return nacl.signing.SigningKey(SEEDS[signer]).sign(message).signature


def ref_peer_id_bytes(signer: str) -> bytes:
    public_key = bytes(nacl.signing.SigningKey(SEEDS[signer]).verify_key)
    return bytes([0x00, 0x24, 0x08, 0x01, 0x12, 0x20]) + public_key


# ---- identity ------------------------------------------------------------------------------

@pytest.mark.parametrize("key", load("identity.json")["keys"], ids=lambda k: k["name"])
def test_identity_vectors(key):
    ident = Identity.from_seed(bytes.fromhex(key["seed"]))
    assert ident.public_key.hex() == key["public_key"]
    assert ident.public_key_protobuf.hex() == key["public_key_protobuf"]
    assert ident.peer_id_bytes.hex() == key["peer_id_bytes"]
    assert ident.peer_id == key["peer_id"]
    assert ref_peer_id_bytes(key["name"]).hex() == key["peer_id_bytes"]
    assert ref_base58(bytes.fromhex(key["peer_id_bytes"])) == key["peer_id"]
    assert b58decode(key["peer_id"]).hex() == key["peer_id_bytes"]


# ---- canonical encoding --------------------------------------------------------------------

@pytest.mark.parametrize("case", load("encoding.json")["values"], ids=lambda c: c["hex"][:24])
def test_encoding_vectors(case):
    value = from_json(case["value"])
    assert encoding.encode(value).hex() == case["hex"]
    assert ref_encode(value).hex() == case["hex"]
    decoded = encoding.decode(bytes.fromhex(case["hex"]))
    assert decoded == value and type(decoded) is type(value)


@pytest.mark.parametrize("case", load("encoding.json")["rejects"], ids=lambda c: c["why"])
def test_encoding_rejects(case):
    with pytest.raises(encoding.EncodingError):
        encoding.decode(bytes.fromhex(case["hex"]))


# ---- transactions --------------------------------------------------------------------------

TXS = load("transactions.json")


def test_sign_domain():
    assert bytes.fromhex(TXS["sign_domain"]) == tx.SIGN_DOMAIN == b"dekube/tx/v1\x00"


@pytest.mark.parametrize("case", TXS["transactions"], ids=lambda c: c["type"])
def test_transaction_vectors(case):
    chain_id, sender = case["chain_id"], case["from"]
    nonce, fee, payload = from_json(case["nonce"]), from_json(case["fee"]), from_json(case["payload"])
    ident = Identity.from_seed(SEEDS[case["signer"]])
    assert ident.peer_id == sender

    built = tx.build_tx(ident, chain_id, nonce, case["type"], payload, fee)
    assert tx.unsigned_body(chain_id, sender, nonce, case["type"], payload, fee).hex() == case["unsigned_body"]
    assert built.signing_bytes().hex() == case["signing_bytes"]
    assert built.signature.hex() == case["signature"]
    assert built.raw.hex() == case["wire"]
    assert built.hash.hex() == case["hash"]
    assert case["rpc_request"]["params"] == ["0x" + case["wire"]]

    body = ref_encode([1, chain_id, sender, nonce, case["type"], payload, fee])
    signature = ref_sign(case["signer"], tx.SIGN_DOMAIN + body)
    wire_bytes = ref_encode([1, chain_id, sender, nonce, case["type"], payload, fee, signature])
    assert body.hex() == case["unsigned_body"]
    assert (b"dekube/tx/v1\x00" + body).hex() == case["signing_bytes"]
    assert signature.hex() == case["signature"]
    assert wire_bytes.hex() == case["wire"]
    assert hashlib.sha256(wire_bytes).hexdigest() == case["hash"]

    decoded = tx.decode_tx(bytes.fromhex(case["wire"]), chain_id=chain_id)
    assert (decoded.sender, decoded.nonce, decoded.type, decoded.payload, decoded.fee) == \
        (sender, nonce, case["type"], payload, fee)
    assert decoded.verify_signature()


def test_a_changed_transaction_byte_breaks_the_signature():
    case = TXS["transactions"][0]
    raw = bytearray.fromhex(case["wire"])
    amount_at = raw.index(bytes.fromhex("03e807"))  # the amount, uint 1000
    raw[amount_at + 1] ^= 0x01  # now 1001: still a well-formed transfer
    changed = tx.decode_tx(bytes(raw))
    assert changed.payload["amount"] == 1001
    assert not changed.verify_signature()


# ---- consensus messages --------------------------------------------------------------------

CONSENSUS = load("consensus.json")


def ref_chain_id(chain_id: str) -> bytes:
    raw = chain_id.encode("utf-8")
    return bytes([len(raw)]) + raw


@pytest.mark.parametrize("case", CONSENSUS["votes"], ids=lambda c: f"{c['vote_type']}-{c['height']}")
def test_vote_vectors(case):
    ident = Identity.from_seed(SEEDS[case["signer"]])
    vid = bytes.fromhex(case["value_id"])
    vote = sign_vote(ident, case["chain_id"],
                     Vote(VoteType(case["vote_type"]), case["height"], case["round"], vid, ident.peer_id))
    assert vote.validator == case["validator"]
    assert vote.sign_bytes(case["chain_id"]).hex() == case["sign_bytes"]
    assert vote.signature.hex() == case["signature"]
    assert encode_vote(vote).hex() == case["wire"]
    assert decode_message(bytes.fromhex(case["wire"])) == vote

    pid = ref_peer_id_bytes(case["signer"])
    sign_bytes = (b"dekube/sdbft/vote/v1\x00" + ref_chain_id(case["chain_id"])
                  + struct.pack(">BQIB", case["vote_type"], case["height"], case["round"], len(vid)) + vid + pid)
    signature = ref_sign(case["signer"], sign_bytes)
    wire_bytes = (struct.pack(">BBQI", 0x01, case["vote_type"], case["height"], case["round"])
                  + bytes([len(vid)]) + vid + bytes([len(pid)]) + pid + signature)
    assert (sign_bytes.hex(), signature.hex(), wire_bytes.hex()) == \
        (case["sign_bytes"], case["signature"], case["wire"])


@pytest.mark.parametrize("case", CONSENSUS["proposals"], ids=lambda c: str(c["height"]))
def test_proposal_vectors(case):
    ident = Identity.from_seed(SEEDS[case["signer"]])
    value = bytes.fromhex(case["value"])
    proposal = sign_proposal(ident, case["chain_id"],
                             Proposal(case["height"], case["round"], case["pol_round"], value, ident.peer_id))
    assert proposal.value_id.hex() == case["value_id"]
    assert proposal.sign_bytes(case["chain_id"]).hex() == case["sign_bytes"]
    assert proposal.signature.hex() == case["signature"]
    assert encode_proposal(proposal).hex() == case["wire"]
    assert decode_message(bytes.fromhex(case["wire"])) == proposal

    pid = ref_peer_id_bytes(case["signer"])
    value_id = hashlib.sha256(value).digest()
    sign_bytes = (b"dekube/sdbft/proposal/v1\x00" + ref_chain_id(case["chain_id"])
                  + struct.pack(">QIi", case["height"], case["round"], case["pol_round"]) + value_id + pid)
    signature = ref_sign(case["signer"], sign_bytes)
    wire_bytes = (struct.pack(">BQIiI", 0x02, case["height"], case["round"], case["pol_round"], len(value))
                  + value + bytes([len(pid)]) + pid + signature)
    assert (sign_bytes.hex(), signature.hex(), wire_bytes.hex()) == \
        (case["sign_bytes"], case["signature"], case["wire"])


@pytest.mark.parametrize("case", CONSENSUS["evidence"])
def test_evidence_vectors(case):
    votes = [bytes.fromhex(CONSENSUS["votes"][i]["wire"]) for i in case["votes"]]
    evidence = DoubleVoteEvidence(decode_message(votes[1]), decode_message(votes[0]))  # either order
    assert evidence.encode().hex() == case["wire"]
    assert evidence.evidence_id.hex() == case["evidence_id"]
    assert evidence.verify(CONSENSUS["votes"][case["votes"][0]]["chain_id"])
    a, b = sorted(votes)
    ref = b"\x03" + struct.pack(">H", len(a)) + a + struct.pack(">H", len(b)) + b
    assert ref.hex() == case["wire"]
    assert DoubleVoteEvidence.decode(ref) == evidence


# ---- all-reduce frames ---------------------------------------------------------------------

@pytest.mark.parametrize("case", load("allreduce.json")["frames"], ids=lambda c: f"kind{c['kind']}")
def test_allreduce_frame_vectors(case):
    payload = bytes.fromhex(case["payload"])
    frame = wire.Frame(wire.Kind(case["kind"]), case["round_id"], case["attempt"], case["slot"], case["chunk"],
                       case["meta"], payload)
    raw = b"".join(wire.encode_frame(frame))
    assert raw.hex() == case["wire"]

    meta = json.dumps(case["meta"], separators=(",", ":")).encode() if case["meta"] else b""
    ref = struct.pack(">BBQIIIII", 1, case["kind"], case["round_id"], case["attempt"], case["slot"],
                      case["chunk"], len(meta), len(payload)) + meta + payload
    assert ref.hex() == case["wire"]

    header = wire.parse_header(raw[:wire.HEADER_SIZE])
    assert (header.kind, header.round_id, header.attempt, header.slot, header.chunk) == \
        (case["kind"], case["round_id"], case["attempt"], case["slot"], case["chunk"])
    body = raw[wire.HEADER_SIZE:]
    assert wire.parse_meta(body[:header.meta_len]) == case["meta"]
    assert body[header.meta_len:].hex() == case["payload"] and header.payload_len == len(payload)


# ---- relay receipts ------------------------------------------------------------------------

RECEIPTS = load("relay_receipts.json")


def test_receipt_domain():
    assert bytes.fromhex(RECEIPTS["receipt_domain"]) == tx.RECEIPT_DOMAIN == b"dekube/relay-receipt/v1\x00"


@pytest.mark.parametrize("case", RECEIPTS["receipts"], ids=lambda c: c["session"][:8])
def test_relay_receipt_vectors(case):
    peer = {name: Identity.from_seed(SEEDS[name]).peer_id for name in (case["relay"], case["src"], case["dst"])}
    receipt = receipts.build_receipt(peer[case["relay"]], peer[case["src"]], peer[case["dst"]],
                                     bytes.fromhex(case["session"]), case["bytes_total"], case["price_per_mib"],
                                     task_id=bytes.fromhex(case["task_id"]))
    assert receipt == from_json(case["receipt"])
    assert receipt["amount_total"] == max(1, case["bytes_total"] * case["price_per_mib"] // 2**20)
    message = tx.relay_receipt_signing_bytes(case["chain_id"], receipt)
    assert message.hex() == case["signing_bytes"]
    assert relay_frame(encoding.encode(receipt)).hex() == case["request_frame"]

    chain = case["chain_id"].encode("utf-8")
    ref_message = b"dekube/relay-receipt/v1\x00" + ref_uvarint(len(chain)) + chain + ref_encode(receipt)
    assert ref_message.hex() == case["signing_bytes"]
    body = ref_encode(receipt)
    assert (ref_uvarint(len(body)) + body).hex() == case["request_frame"]
    src_sig, dst_sig = ref_sign(case["src"], ref_message), ref_sign(case["dst"], ref_message)
    assert (src_sig.hex(), dst_sig.hex()) == (case["src_signature"], case["dst_signature"])
    assert (ref_uvarint(65) + b"\x00" + src_sig).hex() == case["src_answer_frame"]
    refusal = b"\x01" + b"price too high"
    assert (ref_uvarint(len(refusal)) + refusal).hex() == case["refusal_frame"]

    request = bytes.fromhex(case["request_frame"])
    assert receipts.decode_request(request[len(ref_uvarint(len(body))):]) == receipt


def test_relay_receipt_transaction_carries_the_co_signed_receipt():
    case = next(t for t in TXS["transactions"] if t["type"] == "relay_receipt")
    payload = from_json(case["payload"])
    message = tx.relay_receipt_signing_bytes(case["chain_id"], payload["receipt"])
    assert payload["src_sig"] == ref_sign("alice", message)
    assert payload["dst_sig"] == ref_sign("bob", message)


# ---- the files are what the generator writes -----------------------------------------------

def test_vector_files_are_current():
    spec = importlib.util.spec_from_file_location("spec_vectors", ROOT / "scripts" / "spec_vectors.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.main(["--check"]) == 0


@pytest.mark.parametrize("case", CONSENSUS["proposal_evidence"])
def test_double_proposal_evidence_vectors(case):
    ref = bytes.fromhex(case["wire"])
    evidence = decode_evidence(ref)
    assert isinstance(evidence, DoubleProposalEvidence) and evidence.encode() == ref
    assert evidence.evidence_id.hex() == case["evidence_id"] and evidence.validator == case["proposer"]
    assert evidence.verify(case["chain_id"]) and not evidence.verify(case["chain_id"] + "x")
    assert {evidence.first.value_id, evidence.second.value_id} == {
        hashlib.sha256(bytes.fromhex(v)).digest() for v in case["values"]}
