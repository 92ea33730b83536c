"""Write (or check) the test vectors of docs/spec/ from the code that defines the wire formats.

The inputs (seeds, fields) are fixed here; every output (keys, peer IDs, canonical bytes,
signatures, hashes, frames) is computed by the product code. ed25519 signatures are
deterministic, so the files are stable. `python scripts/spec_vectors.py` rewrites
docs/spec/vectors/*.json; `--check` exits 1 if a file differs from what the code gives now.
tests/spec/test_vectors.py recomputes every vector from the files' inputs, so a change to a
wire format fails there until the spec and its vectors are updated together.

Values in the JSON files use one notation (docs/spec/README.md): a JSON string is text, a JSON
number an integer, ``{"bytes": HEX}`` a byte string, ``{"int": "DECIMAL"}`` an integer of any
size, ``{"map": {...}}`` a map, a JSON array a list, and null/true/false themselves.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from consensus import encoding, tx  # noqa: E402
from consensus.messages import (  # noqa: E402
    DoubleProposalEvidence,
    DoubleVoteEvidence,
    Proposal,
    Vote,
    VoteType,
    encode_proposal,
    encode_vote,
    sign_proposal,
    sign_vote,
)
from ml.allreduce import wire  # noqa: E402
from node.identity import Identity  # noqa: E402
from relay import receipts  # noqa: E402
from relay.messages import frame as relay_frame  # noqa: E402

VECTOR_DIR = ROOT / "docs" / "spec" / "vectors"
CHAIN_ID = "dekube-spec-1"

# Fixed test keys: the 32-byte ed25519 seeds (RFC 8032 private keys).
SEEDS = {
    "alice": bytes(range(32)),
    "bob": bytes([0x42] * 32),
    "carol": hashlib.sha256(b"dekube spec vector carol").digest(),
}


# ---- the JSON value notation --------------------------------------------------------------

def to_json(value: Any) -> Any:
    """A canonical-encoding value in the vector files' notation."""
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, int):
        return value if abs(value) < 2**53 else {"int": str(value)}
    if isinstance(value, (bytes, bytearray, memoryview)):
        return {"bytes": bytes(value).hex()}
    if isinstance(value, str):
        return value
    if isinstance(value, (list, tuple)):
        return [to_json(v) for v in value]
    if isinstance(value, dict):
        return {"map": {k: to_json(v) for k, v in value.items()}}
    raise TypeError(f"no notation for {type(value).__name__}")


def from_json(value: Any) -> Any:
    """Inverse of ``to_json``."""
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, list):
        return [from_json(v) for v in value]
    if isinstance(value, dict) and len(value) == 1:
        (kind, inner), = value.items()
        if kind == "bytes":
            return bytes.fromhex(inner)
        if kind == "int":
            return int(inner)
        if kind == "map":
            return {k: from_json(v) for k, v in inner.items()}
    raise ValueError(f"not a vector value: {value!r}")


def identity(name: str) -> Identity:
    return Identity.from_seed(SEEDS[name])


# ---- identity -----------------------------------------------------------------------------

def identity_vectors() -> dict[str, Any]:
    keys = []
    for name, seed in SEEDS.items():
        ident = Identity.from_seed(seed)
        keys.append({
            "name": name,
            "seed": seed.hex(),
            "public_key": ident.public_key.hex(),
            "public_key_protobuf": ident.public_key_protobuf.hex(),
            "peer_id_bytes": ident.peer_id_bytes.hex(),
            "peer_id": ident.peer_id,
        })
    return {"spec": "docs/spec/identity.md", "keys": keys}


# ---- canonical encoding -------------------------------------------------------------------

ENCODING_VALUES: list[Any] = [
    None, False, True, 0, 1, 127, 128, 300, 2**64, 2**256 - 1, -1, -128, -(2**256),
    b"", b"\x00\xff", bytes(range(130)), "", "dekube", "Grüße", "🙂",
    [], [1, "a", b"\x01", None], [[[]]],
    {}, {"b": 1, "a": 2, "ab": 3, "B": 4}, {"é": True, "z": False},
]

def encoding_rejects() -> list[dict[str, str]]:
    """Inputs the decoder must reject, each checked against the decoder here."""
    cases = [
        ("", "truncated (no tag)"),
        ("030000", "trailing byte after uint 0"),
        ("038000", "non-minimal varint (0x80 0x00 for 0)"),
        ("09", "unknown tag 0x09"),
        ("0502ff", "bytes length runs past the end"),
        ("0601ff", "text that is not UTF-8"),
        ("08020162030001610300", "map keys not sorted (b before a)"),
        ("08020161030001610301", "duplicate map key"),
        ("0701" * 25 + "00", "lists nested 25 deep (the limit is 24)"),
        ("03" + "ff" * 36 + "7f", "integer of 2**259 or more (over 256 bits)"),
    ]
    out = []
    for hex_input, why in cases:
        try:
            encoding.decode(bytes.fromhex(hex_input))
        except encoding.EncodingError:
            out.append({"hex": hex_input, "why": why})
            continue
        raise AssertionError(f"decoder accepted {hex_input} ({why})")
    return out


def encoding_vectors() -> dict[str, Any]:
    return {
        "spec": "docs/spec/encoding.md",
        "values": [{"value": to_json(v), "hex": encoding.encode(v).hex()} for v in ENCODING_VALUES],
        "rejects": encoding_rejects(),
    }


# ---- transactions -------------------------------------------------------------------------

def _tx_inputs() -> list[dict[str, Any]]:
    alice, bob, carol = identity("alice"), identity("bob"), identity("carol")
    receipt = {
        "relay": carol.peer_id, "src": alice.peer_id, "dst": bob.peer_id, "payer": alice.peer_id,
        "session": bytes(range(16)), "bytes_total": 10 * 2**20, "amount_total": 50, "task_id": b"",
    }
    receipt_message = tx.relay_receipt_signing_bytes(CHAIN_ID, receipt)
    return [
        {"signer": "alice", "nonce": 0, "type": "transfer", "fee": 10,
         "payload": {"to": bob.peer_id, "amount": 1000}},
        {"signer": "bob", "nonce": 7, "type": "bond", "fee": 0, "payload": {"amount": 2**70}},
        {"signer": "alice", "nonce": 1, "type": "register_node", "fee": 5,
         "payload": {"roles": ["compute", "relay"], "listen_addrs": ["/ip4/203.0.113.7/tcp/4001"],
                     "relay_addrs": [],
                     "hardware": {"cpu_cores": 16, "ram_mb": 65536, "gpu": "H100", "gpu_mem_mb": 81920,
                                  "bandwidth_mbps": 1000}}},
        {"signer": "carol", "nonce": 3, "type": "relay_receipt", "fee": 1,
         "payload": {"receipt": receipt, "src_sig": alice.sign(receipt_message),
                     "dst_sig": bob.sign(receipt_message)}},
        {"signer": "alice", "nonce": 2, "type": "submit_task", "fee": 1,
         "payload": {"model": "pt2", "dataset": "file", "workers": 3, "sync_mode": "allreduce",
                     "codec": "int8", "price": 5000, "device": "any", "profile": "cpu-x86-64-avx2/torch-2.13.0",
                     "segments": 20,
                     "sources": ["/ip4/203.0.113.7/tcp/4001/p2p/" + alice.peer_id],
                     "hyperparams": {"model_artifact": "7f" * 32, "dataset_artifact": "3c" * 32,
                                     "loss": "cross_entropy", "lr": "0.001", "steps": 200, "seed": -1}}},
        {"signer": "carol", "nonce": 9, "type": "unjail", "fee": 1, "payload": {}},
        {"signer": "bob", "nonce": 8, "type": "reject_task", "fee": 1,
         "payload": {"task_id": hashlib.sha256(b"dekube spec vector task").digest(),
                     "reason": "Untrainable: aten::fft_rfft is not supported\nNaN — loss"}},
    ]


def tx_vector(chain_id: str, signer: str, nonce: int, tx_type: str, payload: dict, fee: int) -> dict[str, Any]:
    """Every intermediate value of one signed transaction, from the product code."""
    ident = identity(signer)
    built = tx.build_tx(ident, chain_id, nonce, tx_type, payload, fee)
    body = tx.unsigned_body(chain_id, ident.peer_id, nonce, tx_type, payload, fee)
    return {
        "signer": signer,
        "chain_id": chain_id,
        "from": ident.peer_id,
        "nonce": to_json(nonce),
        "type": tx_type,
        "payload": to_json(payload),
        "fee": to_json(fee),
        "unsigned_body": body.hex(),
        "signing_bytes": built.signing_bytes().hex(),
        "signature": built.signature.hex(),
        "wire": built.raw.hex(),
        "hash": built.hash.hex(),
        "rpc_request": {"jsonrpc": "2.0", "id": 1, "method": "dkb_sendRawTransaction",
                        "params": ["0x" + built.raw.hex()]},
    }


def transaction_vectors() -> dict[str, Any]:
    return {
        "spec": "docs/spec/transactions.md",
        "sign_domain": tx.SIGN_DOMAIN.hex(),
        "transactions": [tx_vector(CHAIN_ID, i["signer"], i["nonce"], i["type"], i["payload"], i["fee"])
                         for i in _tx_inputs()],
    }


# ---- consensus messages -------------------------------------------------------------------

BLOCK_VALUE = b"an opaque block value: the proposal signs its sha256"


def vote_vector(chain_id: str, signer: str, vote_type: int, height: int, round_: int,
                value_id: bytes) -> dict[str, Any]:
    ident = identity(signer)
    vote = sign_vote(ident, chain_id, Vote(VoteType(vote_type), height, round_, value_id, ident.peer_id))
    return {
        "signer": signer, "chain_id": chain_id, "validator": ident.peer_id, "vote_type": vote_type,
        "height": height, "round": round_, "value_id": value_id.hex(),
        "sign_bytes": vote.sign_bytes(chain_id).hex(),
        "signature": vote.signature.hex(),
        "wire": encode_vote(vote).hex(),
    }


def proposal_vector(chain_id: str, signer: str, height: int, round_: int, pol_round: int,
                    value: bytes) -> dict[str, Any]:
    ident = identity(signer)
    proposal = sign_proposal(ident, chain_id, Proposal(height, round_, pol_round, value, ident.peer_id))
    return {
        "signer": signer, "chain_id": chain_id, "proposer": ident.peer_id, "height": height,
        "round": round_, "pol_round": pol_round, "value": value.hex(),
        "value_id": proposal.value_id.hex(),
        "sign_bytes": proposal.sign_bytes(chain_id).hex(),
        "signature": proposal.signature.hex(),
        "wire": encode_proposal(proposal).hex(),
    }


def consensus_vectors() -> dict[str, Any]:
    block_id = hashlib.sha256(BLOCK_VALUE).digest()
    other_id = hashlib.sha256(b"another block").digest()
    votes = [
        vote_vector(CHAIN_ID, "alice", 1, 5, 0, block_id),
        vote_vector(CHAIN_ID, "alice", 2, 5, 0, b""),
        vote_vector(CHAIN_ID, "bob", 2, 2**40, 3, block_id),
        vote_vector(CHAIN_ID, "bob", 2, 2**40, 3, other_id),
    ]
    proposals = [
        proposal_vector(CHAIN_ID, "carol", 5, 0, -1, BLOCK_VALUE),
        proposal_vector(CHAIN_ID, "carol", 6, 2, 1, b""),
    ]
    ident = identity("bob")
    pair = [sign_vote(ident, CHAIN_ID, Vote(VoteType.PRECOMMIT, 2**40, 3, vid, ident.peer_id))
            for vid in (block_id, other_id)]
    evidence = DoubleVoteEvidence(pair[0], pair[1])
    carol = identity("carol")
    twin = [sign_proposal(carol, CHAIN_ID, Proposal(5, 0, -1, value, carol.peer_id))
            for value in (BLOCK_VALUE, b"another block")]
    proposal_evidence = DoubleProposalEvidence.of(twin[0], twin[1])
    return {
        "spec": "docs/spec/consensus.md",
        "votes": votes,
        "proposals": proposals,
        "evidence": [{"votes": [2, 3], "wire": evidence.encode().hex(),
                      "evidence_id": evidence.evidence_id.hex()}],
        "proposal_evidence": [{"chain_id": CHAIN_ID, "proposer": carol.peer_id,
                               "values": [BLOCK_VALUE.hex(), b"another block".hex()],
                               "wire": proposal_evidence.encode().hex(),
                               "evidence_id": proposal_evidence.evidence_id.hex()}],
    }


# ---- all-reduce frames --------------------------------------------------------------------

FRAME_INPUTS: list[dict[str, Any]] = [
    {"kind": 1, "round_id": 12, "attempt": 0, "slot": 2, "chunk": 0,
     "meta": {"shape": [4], "numel": 4}, "payload": "0000803f000000400000404000008040"},
    {"kind": 2, "round_id": 12, "attempt": 1, "slot": 2, "chunk": 3, "meta": {}, "payload": "00ff"},
    {"kind": 3, "round_id": 2**40, "attempt": 4, "slot": 0, "chunk": 0,
     "meta": {"alive": [0, 2, 3], "why": "stall"}, "payload": ""},
    {"kind": 5, "round_id": 7, "attempt": 0, "slot": 0, "chunk": 0, "meta": {}, "payload": ""},
]


def frame_vector(kind: int, round_id: int, attempt: int, slot: int, chunk: int, meta: dict,
                 payload: str) -> dict[str, Any]:
    frame = wire.Frame(wire.Kind(kind), round_id, attempt, slot, chunk, meta, bytes.fromhex(payload))
    return {"kind": kind, "round_id": round_id, "attempt": attempt, "slot": slot, "chunk": chunk,
            "meta": meta, "payload": payload, "wire": b"".join(wire.encode_frame(frame)).hex()}


def allreduce_vectors() -> dict[str, Any]:
    return {"spec": "docs/spec/allreduce.md", "frames": [frame_vector(**f) for f in FRAME_INPUTS]}


# ---- relay receipts -----------------------------------------------------------------------

def receipt_vector(chain_id: str, relay: str, src: str, dst: str, session: bytes, bytes_total: int,
                   price_per_mib: int, task_id: bytes) -> dict[str, Any]:
    ids = {name: identity(name) for name in (relay, src, dst)}
    receipt = receipts.build_receipt(ids[relay].peer_id, ids[src].peer_id, ids[dst].peer_id, session,
                                     bytes_total, price_per_mib, task_id=task_id)
    message = tx.relay_receipt_signing_bytes(chain_id, receipt)
    src_sig, dst_sig = ids[src].sign(message), ids[dst].sign(message)
    return {
        "chain_id": chain_id, "relay": relay, "src": src, "dst": dst, "session": session.hex(),
        "bytes_total": bytes_total, "price_per_mib": price_per_mib, "task_id": task_id.hex(),
        "receipt": to_json(receipt),
        "request_frame": relay_frame(encoding.encode(receipt)).hex(),
        "signing_bytes": message.hex(),
        "src_signature": src_sig.hex(),
        "dst_signature": dst_sig.hex(),
        "src_answer_frame": relay_frame(b"\x00" + src_sig).hex(),
        "refusal_frame": relay_frame(b"\x01" + b"price too high").hex(),
    }


def receipt_vectors() -> dict[str, Any]:
    return {
        "spec": "docs/spec/relay-receipts.md",
        "receipt_domain": tx.RECEIPT_DOMAIN.hex(),
        "receipts": [
            receipt_vector(CHAIN_ID, "carol", "alice", "bob", bytes(range(16)), 10 * 2**20, 5, b""),
            receipt_vector(CHAIN_ID, "carol", "bob", "alice", b"\xaa" * 16, 1000, 1, bytes([7]) * 32),
        ],
    }


VECTOR_FILES = {
    "identity.json": identity_vectors,
    "encoding.json": encoding_vectors,
    "transactions.json": transaction_vectors,
    "consensus.json": consensus_vectors,
    "allreduce.json": allreduce_vectors,
    "relay_receipts.json": receipt_vectors,
}


def render(data: dict[str, Any]) -> str:
    return json.dumps(data, indent=1, ensure_ascii=False) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if a vector file is out of date")
    args = parser.parse_args(argv)
    stale = []
    VECTOR_DIR.mkdir(parents=True, exist_ok=True)
    for name, build in VECTOR_FILES.items():
        path = VECTOR_DIR / name
        text = render(build())
        if path.exists() and path.read_text(encoding="utf-8") == text:
            continue
        stale.append(name)
        if not args.check:
            path.write_text(text, encoding="utf-8")
    if args.check and stale:
        print(f"out of date: {', '.join(stale)} (run python scripts/spec_vectors.py)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
