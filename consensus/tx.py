"""Ledger transactions: build, sign, encode/decode and verify (stateless checks only).

Wire form: ``encode([VERSION, chain_id, from, nonce, type, payload, fee, signature])``.
The signature covers ``SIGN_DOMAIN + encode([VERSION, chain_id, from, nonce, type, payload,
fee])``; ``from`` is the sender's peer ID (the account address) and its embedded ed25519
key verifies the signature. The tx hash is sha256 of the wire bytes. Payload shapes are
checked here (exact keys, types, ranges); checks that need state live in consensus.state.
"""
from __future__ import annotations

import functools
import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NoReturn

import nacl.bindings
import nacl.exceptions

from consensus.encoding import EncodingError, decode, encode, encode_uvarint
from consensus.txcodes import TxCode, TxError
from node.identity import Identity, InvalidPeerId, public_key_from_peer_id
from node.p2p.multiaddr import Multiaddr, MultiaddrError

VERSION = 1
SIGN_DOMAIN = b"dekube/tx/v1\x00"
DEFAULT_MAX_TX_BYTES = 16 * 1024
DEFAULT_FEE = 1   # the genesis default min_fee, and what clients pay unless told otherwise (ADR 0135)
MAX_EVIDENCE_BYTES = 8192
_SIGNATURE_SUFFIX = b"\x05\x40"  # bytes tag + length 64: how the signature field starts

ROLES = frozenset({"validator", "compute", "relay", "verifier"})
SYNC_MODES = frozenset({"allreduce", "diloco", "streaming"})
DEVICES = frozenset({"cpu", "cuda", "any"})   # what a task asks to train on ("any": the scheduler picks)
DEFAULT_DEVICE = "cpu"


@functools.lru_cache(maxsize=65536)
def public_key_for(peer_id: str) -> bytes | None:
    """The ed25519 key inside a peer ID, or None when it is not a valid ed25519 peer ID."""
    try:
        return public_key_from_peer_id(peer_id)
    except InvalidPeerId:
        return None


def verify_signature(public_key: bytes, message: bytes, signature: bytes) -> bool:
    """ed25519 verify via libsodium (releases the GIL, so it scales in a thread pool)."""
    try:
        nacl.bindings.crypto_sign_open(signature + message, public_key)
    except (nacl.exceptions.BadSignatureError, nacl.exceptions.ValueError, ValueError, TypeError):
        return False
    return True


@dataclass(frozen=True, slots=True)
class Tx:
    chain_id: str
    sender: str
    nonce: int
    type: str
    payload: dict[str, Any]
    fee: int
    signature: bytes
    raw: bytes
    hash: bytes

    @property
    def size(self) -> int:
        return len(self.raw)

    def signing_bytes(self) -> bytes:
        # The unsigned body is the wire list minus its last item: re-tag the count as 7.
        return SIGN_DOMAIN + b"\x07\x07" + self.raw[2:-66]

    def verify_signature(self) -> bool:
        public_key = public_key_for(self.sender)
        return public_key is not None and verify_signature(public_key, self.signing_bytes(), self.signature)

    def to_json(self) -> dict[str, Any]:
        """A JSON-friendly view (bytes as hex) for RPC responses."""
        return {
            "hash": self.hash.hex(), "chain_id": self.chain_id, "from": self.sender,
            "nonce": self.nonce, "type": self.type, "payload": _jsonable(self.payload), "fee": self.fee,
        }


def _jsonable(value: Any) -> Any:
    if isinstance(value, bytes):
        return value.hex()
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_jsonable(v) for v in value]
    return value


def unsigned_body(chain_id: str, sender: str, nonce: int, tx_type: str, payload: dict[str, Any],
                  fee: int) -> bytes:
    return encode([VERSION, chain_id, sender, nonce, tx_type, payload, fee])


def build_tx(identity: Identity, chain_id: str, nonce: int, tx_type: str, payload: dict[str, Any],
             fee: int = DEFAULT_FEE) -> Tx:
    """Sign a transaction with ``identity`` (its peer ID is the sender) and return it decoded."""
    sender = identity.peer_id
    body = unsigned_body(chain_id, sender, nonce, tx_type, payload, fee)
    signature = identity.sign(SIGN_DOMAIN + body)
    raw = b"\x07\x08" + body[2:] + _SIGNATURE_SUFFIX + signature
    return decode_tx(raw, max_bytes=max(len(raw), DEFAULT_MAX_TX_BYTES))


def signed_tx_bytes(identity: Identity, chain_id: str, nonce: int, tx_type: str, payload: dict[str, Any],
                    fee: int = DEFAULT_FEE) -> bytes:
    """The wire bytes of ``build_tx`` (the node's ledger gateway encoder); ValueError for a
    transaction whose type or payload the ledger would refuse."""
    try:
        return build_tx(identity, chain_id, nonce, tx_type, payload, fee).raw
    except TxError as exc:
        raise ValueError(f"{exc.code.name.lower()}: {exc.message}") from None


def decode_tx(raw: bytes | bytearray | memoryview, max_bytes: int = DEFAULT_MAX_TX_BYTES,
              chain_id: str | None = None) -> Tx:
    """Decode and check a wire transaction's shape; the signature is NOT verified here.

    Raises TxError with OVERSIZED, BAD_ENCODING, WRONG_CHAIN, UNKNOWN_TYPE or BAD_PAYLOAD.
    """
    if not isinstance(raw, (bytes, bytearray, memoryview)):
        raise TxError(TxCode.BAD_ENCODING, "transaction must be bytes")
    raw = bytes(raw)
    if len(raw) > max_bytes:
        raise TxError(TxCode.OVERSIZED, f"{len(raw)} bytes exceeds the limit of {max_bytes}")
    try:
        fields = decode(raw, max_size=max_bytes)
    except EncodingError as exc:
        raise TxError(TxCode.BAD_ENCODING, str(exc)) from None
    if type(fields) is not list or len(fields) != 8:
        raise TxError(TxCode.BAD_ENCODING, "a transaction is a list of 8 fields")
    version, tx_chain, sender, nonce, tx_type, payload, fee, signature = fields
    if version != VERSION or type(version) is not int:
        raise TxError(TxCode.BAD_ENCODING, f"unsupported transaction version {version!r}")
    if type(tx_chain) is not str or type(sender) is not str or type(tx_type) is not str:
        raise TxError(TxCode.BAD_ENCODING, "chain_id, from and type must be text")
    if type(nonce) is not int or type(fee) is not int or nonce < 0 or fee < 0:
        raise TxError(TxCode.BAD_ENCODING, "nonce and fee must be non-negative integers")
    if type(signature) is not bytes or len(signature) != 64:
        raise TxError(TxCode.BAD_ENCODING, "signature must be 64 bytes")
    if type(payload) is not dict:
        raise TxError(TxCode.BAD_PAYLOAD, "payload must be a map")
    if chain_id is not None and tx_chain != chain_id:
        raise TxError(TxCode.WRONG_CHAIN, f"transaction is for chain {tx_chain!r}, not {chain_id!r}")
    if public_key_for(sender) is None:
        raise TxError(TxCode.BAD_PAYLOAD, "from is not a valid ed25519 peer ID")
    schema = PAYLOAD_SCHEMAS.get(tx_type)
    if schema is None:
        raise TxError(TxCode.UNKNOWN_TYPE, f"unknown transaction type {tx_type!r}")
    _check_fields(payload, schema, "payload")
    limit = MAX_PAYLOAD_BYTES.get(tx_type)
    if limit is not None and len(encode(payload)) > limit:
        _fail("payload", f"a {tx_type} payload is at most {limit} bytes encoded")
    return Tx(tx_chain, sender, nonce, tx_type, payload, fee, signature, raw, hashlib.sha256(raw).digest())


# ---- payload schemas: field name -> checker(value) raising TxError -----------------------

Check = Callable[[Any, str], None]  # checks one value at a path; raises TxError(BAD_PAYLOAD)


@dataclass(frozen=True, slots=True)
class OptionalField:
    """A payload field that may be left out; when present, ``check`` applies."""

    check: Check


Schema = dict[str, "Check | OptionalField"]


def _fail(path: str, why: str) -> NoReturn:
    raise TxError(TxCode.BAD_PAYLOAD, f"{path}: {why}")


def _check_fields(value: Any, schema: Schema, path: str) -> None:
    if type(value) is not dict:
        _fail(path, "must be a map")
    required = {name for name, check in schema.items() if not isinstance(check, OptionalField)}
    if not required <= value.keys() <= schema.keys():
        missing = sorted(required - value.keys())
        extra = sorted(value.keys() - schema.keys())
        _fail(path, f"missing fields {missing}, unexpected fields {extra}")
    for name, check in schema.items():
        if isinstance(check, OptionalField):
            if name in value:
                check.check(value[name], f"{path}.{name}")
        else:
            check(value[name], f"{path}.{name}")


def uint(minimum: int = 0, maximum: int = 2**128) -> Check:
    def check(value: Any, path: str) -> None:
        if type(value) is not int or not minimum <= value <= maximum:
            _fail(path, f"must be an integer in [{minimum}, {maximum}]")
    return check


def text(max_len: int, allowed: frozenset[str] | None = None, min_len: int = 0) -> Check:
    def check(value: Any, path: str) -> None:
        if type(value) is not str or not min_len <= len(value) <= max_len:
            _fail(path, f"must be text of {min_len}..{max_len} characters")
        if allowed is not None and value not in allowed:
            _fail(path, f"must be one of {sorted(allowed)}")
    return check


def blob(*lengths: int) -> Check:
    allowed = frozenset(lengths)
    shown = f"{min(lengths)}..{max(lengths)}" if len(lengths) > 4 else " or ".join(map(str, lengths))

    def check(value: Any, path: str) -> None:
        if type(value) is not bytes or len(value) not in allowed:
            _fail(path, f"must be bytes of length {shown}")
    return check


def peer_id(value: Any, path: str) -> None:
    if type(value) is not str or public_key_for(value) is None:
        _fail(path, "must be an ed25519 peer ID")


def boolean(value: Any, path: str) -> None:
    if type(value) is not bool:
        _fail(path, "must be a boolean")


def text_list(max_items: int, max_len: int, allowed: frozenset[str] | None = None,
              sorted_unique: bool = False) -> Check:
    item_check = text(max_len, allowed, min_len=1)

    def check(value: Any, path: str) -> None:
        if type(value) is not list or len(value) > max_items:
            _fail(path, f"must be a list of at most {max_items} items")
        for i, item in enumerate(value):
            item_check(item, f"{path}[{i}]")
        if sorted_unique and any(a >= b for a, b in zip(value, value[1:])):
            _fail(path, "must be sorted and without duplicates")
    return check


def peer_uint_map(max_items: int, maximum: int) -> Check:
    """A map of at most ``max_items`` entries from ed25519 peer IDs to integers in [0, ``maximum``]."""
    value_check = uint(0, maximum)

    def check(value: Any, path: str) -> None:
        if type(value) is not dict or len(value) > max_items:
            _fail(path, f"must be a map of at most {max_items} entries")
        for key, item in value.items():
            peer_id(key, f"{path} key")
            value_check(item, f"{path}[{key[:16]}..]")
    return check


def blob_list(max_items: int, length: int) -> Check:
    """A list of at most ``max_items`` byte strings of ``length`` bytes each (a Merkle audit path)."""
    item_check = blob(length)

    def check(value: Any, path: str) -> None:
        if type(value) is not list or len(value) > max_items:
            _fail(path, f"must be a list of at most {max_items} items")
        for i, item in enumerate(value):
            item_check(item, f"{path}[{i}]")
    return check


PROFILE_CHARS = frozenset("abcdefghijklmnopqrstuvwxyz0123456789._/+-")
MAX_PROFILE_CHARS = 96
MAX_NODE_PROFILES = 8


def profile_id(min_len: int = 0) -> Check:
    """An execution profile id (ml/profiles.py): ``[a-z0-9._/+-]``, ``min_len``..96 characters."""
    def check(value: Any, path: str) -> None:
        if type(value) is not str or not min_len <= len(value) <= MAX_PROFILE_CHARS:
            _fail(path, f"must be text of {min_len}..{MAX_PROFILE_CHARS} characters")
        if not all(ch in PROFILE_CHARS for ch in value):
            _fail(path, "must use only a-z, 0-9 and . _ / + -")
    return check


def profile_list(value: Any, path: str) -> None:
    """The profiles a node runs: at most 8 distinct non-empty profile ids."""
    if type(value) is not list or len(value) > MAX_NODE_PROFILES:
        _fail(path, f"must be a list of at most {MAX_NODE_PROFILES} profile ids")
    item_check = profile_id(min_len=1)
    for i, item in enumerate(value):
        item_check(item, f"{path}[{i}]")
    if len(set(value)) != len(value):
        _fail(path, "must not repeat a profile")


MAX_SERVED_RANGES = 4
MAX_SERVED_LAYERS = 1024
SERVED_RANGE: Schema = {  # one announced range of a model's blocks (ADR 0174)
    "model": text(128, min_len=1), "start": uint(0, MAX_SERVED_LAYERS - 1), "end": uint(1, MAX_SERVED_LAYERS),
    "tokens_per_s": uint(0, 10**9), "profile": profile_id(), "price": uint(0, 2**64),
    "height": OptionalField(uint(0, 2**63)),   # the height it was announced or refreshed at (ADR 0177)
}


def serving_list(value: Any, path: str) -> None:
    """The model block ranges a node serves: at most 4 maps, each with ``start < end``."""
    if type(value) is not list or len(value) > MAX_SERVED_RANGES:
        _fail(path, f"must be a list of at most {MAX_SERVED_RANGES} served ranges")
    for i, item in enumerate(value):
        _check_fields(item, SERVED_RANGE, f"{path}[{i}]")
        if item["start"] >= item["end"]:
            _fail(f"{path}[{i}]", "start must be below end")


def printable(max_len: int) -> Check:
    """Text of printable ASCII (no control characters), at most ``max_len`` characters."""
    def check(value: Any, path: str) -> None:
        if type(value) is not str or len(value) > max_len or not all(" " <= ch <= "~" for ch in value):
            _fail(path, f"must be printable ASCII text of at most {max_len} characters")
    return check


def _multiaddr(value: str, path: str) -> Multiaddr:
    try:
        return Multiaddr.parse(value)
    except (MultiaddrError, ValueError) as exc:
        _fail(path, f"not a multiaddr ({str(exc)[:80]})")


def multiaddr_list(max_items: int, max_len: int, relayed: bool = False) -> Check:
    """A list of distinct multiaddrs; ``relayed``: each ``<relay addr>/p2p/<relay>/p2p-circuit[/p2p/<node>]``."""
    def check(value: Any, path: str) -> None:
        if type(value) is not list or len(value) > max_items:
            _fail(path, f"must be a list of at most {max_items} multiaddrs")
        if len(set(value)) != len(value):
            _fail(path, "must not repeat an address")
        for i, item in enumerate(value):
            item_path = f"{path}[{i}]"
            if type(item) is not str or not 1 <= len(item) <= max_len or not all(" " < ch <= "~" for ch in item):
                _fail(item_path, f"must be a multiaddr of 1..{max_len} printable ASCII characters")
            names = [name for name, _ in _multiaddr(item, item_path).parts]
            if relayed and ("p2p-circuit" not in names or "p2p" not in names[:names.index("p2p-circuit")]):
                _fail(item_path, "must be a relayed address <relay addr>/p2p/<relay id>/p2p-circuit")
    return check


def reason_text(max_len: int) -> Check:
    """Non-empty UTF-8 text of at most ``max_len`` characters with no control characters but
    newline and tab (a human-readable reason, shown as is by explorers and the CLI)."""
    def check(value: Any, path: str) -> None:
        if type(value) is not str or not 1 <= len(value) <= max_len:
            _fail(path, f"must be text of 1..{max_len} characters")
        if any((ch < " " and ch not in "\n\t") or "\x7f" <= ch <= "\x9f" for ch in value):
            _fail(path, "must not contain control characters")
    return check


def params_map(max_items: int, max_key: int, max_text: int, max_bytes: int) -> Check:
    """A map of at most ``max_items`` entries: keys are names (``[a-z0-9_]``, 1..``max_key``
    characters), values integers of 64 bits or text of at most ``max_text`` characters; at most
    ``max_bytes`` encoded."""
    def check(value: Any, path: str) -> None:
        if type(value) is not dict or len(value) > max_items:
            _fail(path, f"must be a map of at most {max_items} entries")
        for key, item in value.items():
            if not 1 <= len(key) <= max_key or not all(ch in _NAME_CHARS for ch in key):
                _fail(path, f"key {key[:40]!r} must be 1..{max_key} characters of a-z, 0-9 and _")
            if type(item) is int:
                if not -2**63 <= item < 2**63:
                    _fail(f"{path}.{key}", "integers must fit in 64 bits")
            elif type(item) is not str or len(item) > max_text:
                _fail(f"{path}.{key}", f"must be an integer or text of at most {max_text} characters")
        if len(encode(value)) > max_bytes:
            _fail(path, f"larger than {max_bytes} bytes")
    return check


_NAME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyz0123456789_")


def fields(schema: Schema) -> Check:
    def check(value: Any, path: str) -> None:
        _check_fields(value, schema, path)
    return check


TASK_ID = blob(32)
HASH32 = blob(32)
MAX_CPU_CORES = 1024
MAX_BANDWIDTH_MBPS = 10**6   # 1 Tbit/s
MAX_TASK_WORKERS = 64
MAX_TASK_RELAYS = 16         # relays one worker's task traffic went through (commit_result's relay_bytes)
MAX_RELAYED_BYTES = 2**53    # 8 PiB: one worker's relayed bytes for one task
HARDWARE: Schema = {  # declared, not proven: bounds keep records small and numbers believable
    "cpu_cores": uint(0, MAX_CPU_CORES), "ram_mb": uint(0, 2**24),        # 16 TiB
    "gpu": printable(64), "gpu_mem_mb": uint(0, 2**21),                    # 2 TiB
    "bandwidth_mbps": uint(0, MAX_BANDWIDTH_MBPS),
    "profiles": OptionalField(profile_list),                               # execution profiles it runs
    "serving": OptionalField(serving_list),                                # model blocks it serves (ADR 0174)
}
MAX_NODE_ADDRS = 8
MAX_ADDR_CHARS = 256
MAX_PAYLOAD_BYTES = {"register_node": 2048}   # the whole record, encoded
MAX_TASK_SOURCES = 8             # owner multiaddrs a task names for fetching its artifacts
MAX_REASON_CHARS = 500           # reject_task's reason
MAX_TASK_SEGMENTS = 2**20        # submit_task's declared segment count
MAX_EXPECTED_S = 366 * 86_400    # submit_task's expected duration in seconds (the chain's task_max_s bounds it)
MAX_MERKLE_PATH = 32            # audit path of one of at most 2**32 leaves (commit_result's segments)
MAX_AUDIT_SLOT = 2**16           # audit slot indexes (workers x audits_per_worker stays far below)
HYPERPARAMS = params_map(max_items=48, max_key=32, max_text=512, max_bytes=4096)
RELAY_RECEIPT: Schema = {
    "relay": peer_id, "src": peer_id, "dst": peer_id, "payer": peer_id, "session": blob(16),
    "bytes_total": uint(1, 2**64), "amount_total": uint(1), "task_id": blob(0, 32),
}
SERVE_RECEIPT: Schema = {  # cumulative usage of one serving session (ADR 0174)
    "session": blob(16), "server": peer_id, "client": peer_id, "model": text(128, min_len=1),
    "tokens": uint(0, 2**48), "flops": uint(0, 2**96), "amount": uint(1, 2**96), "seq": uint(1, 2**32),
    "transcript": HASH32,   # hash chain over the answers served (ml/serve/billing.py): evidence for spot checks
}

PAYLOAD_SCHEMAS: dict[str, Schema] = {
    "transfer": {"to": peer_id, "amount": uint(1)},
    "bond": {"amount": uint(1)},
    "unbond": {"amount": uint(1)},
    "register_node": {
        "roles": text_list(4, 16, ROLES, sorted_unique=True),
        "listen_addrs": multiaddr_list(MAX_NODE_ADDRS, MAX_ADDR_CHARS),
        "relay_addrs": multiaddr_list(MAX_NODE_ADDRS, MAX_ADDR_CHARS, relayed=True),
        "hardware": fields(HARDWARE),
    },
    "submit_task": {
        "model": text(128, min_len=1), "dataset": text(128, min_len=1), "hyperparams": HYPERPARAMS,
        "workers": uint(1, MAX_TASK_WORKERS), "sync_mode": text(16, SYNC_MODES), "codec": text(32, min_len=1),
        "price": uint(1),
        "sources": OptionalField(multiaddr_list(MAX_TASK_SOURCES, MAX_ADDR_CHARS)),
        "device": OptionalField(text(8, DEVICES)),
        "profile": profile_id(min_len=1),             # the one execution profile of its crew (ADR 0188)
        "segments": uint(1, MAX_TASK_SEGMENTS),        # the spec's fixed segment count, checked at commit
        "expected_s": OptionalField(uint(1, MAX_EXPECTED_S)),    # the work's duration (dry run; ADR 0187)
        "epochs": OptionalField(uint(1, MAX_TASK_SEGMENTS)),    # epochs the segments are cut into (ADR 0203)
        "max_workers": OptionalField(uint(1, MAX_TASK_WORKERS)),   # seats the crew may grow to (ADR 0234)
    },
    "cancel_task": {"task_id": TASK_ID},
    "stop_task": {"task_id": TASK_ID},   # the owner ends a running task at the next epoch boundary (ADR 0211)
    "reject_task": {"task_id": TASK_ID, "reason": reason_text(MAX_REASON_CHARS)},
    "commit_result": {"task_id": TASK_ID, "segments_root": HASH32, "result_hash": HASH32,
                      "segments": uint(1, 2**32),
                      # the co-workers' upload rates (Mbit/s) the all-reduce agreed (ADR 0219)
                      "peer_rates": OptionalField(peer_uint_map(MAX_TASK_WORKERS, MAX_BANDWIDTH_MBPS)),
                      # the bytes this worker's task circuits carried, per relay (ADR 0223)
                      "relay_bytes": OptionalField(peer_uint_map(MAX_TASK_RELAYS, MAX_RELAYED_BYTES))},
    "commit_epoch": {"task_id": TASK_ID, "epoch": uint(0, MAX_TASK_SEGMENTS), "segments_root": HASH32,
                     "state_digest": HASH32, "segments": uint(1, MAX_TASK_SEGMENTS)},   # progress (ADR 0203)
    "audit_commit": {"task_id": TASK_ID, "slot": uint(0, MAX_AUDIT_SLOT), "commitment": HASH32},
    "audit_result": {"task_id": TASK_ID, "slot": uint(0, MAX_AUDIT_SLOT), "match": boolean,
                     "evidence": HASH32, "step": uint(0, 2**32), "blinding": HASH32},
    "dispute": {"task_id": TASK_ID, "slot": uint(0, MAX_AUDIT_SLOT)},
    "referee_commit": {"task_id": TASK_ID, "slot": uint(0, MAX_AUDIT_SLOT), "commitment": HASH32},   # ADR 0210
    "referee_vote": {"task_id": TASK_ID, "slot": uint(0, MAX_AUDIT_SLOT), "match": boolean, "evidence": HASH32,
                     "blinding": HASH32},
    "availability_response": {  # a challenged worker's leaf and audit path of the audited segment (ADR 0207)
        "task_id": TASK_ID, "slot": uint(0, MAX_AUDIT_SLOT), "leaf": HASH32, "path": blob_list(MAX_MERKLE_PATH, 32),
    },
    "finalize": {"task_id": TASK_ID},
    "relay_receipt": {"receipt": fields(RELAY_RECEIPT), "src_sig": blob(64), "dst_sig": blob(64)},
    "serve_deposit": {"amount": uint(1)},
    "serve_unlock": {},
    "serve_withdraw": {"amount": uint(1)},
    "serve_receipt": {"receipt": fields(SERVE_RECEIPT), "client_sig": blob(64), "server_sig": blob(64)},
    "serve_dispute": {  # a client's fraud claim against a server's signed answer (ADR 0176)
        "receipt": fields(SERVE_RECEIPT), "client_sig": blob(64), "server_sig": blob(64),
        "prior": HASH32, "link": HASH32,   # transcript = sha256(prior || link); link commits to one step
        "answer": HASH32, "inputs": HASH32,   # the server's answer digest; the content hash of the step bundle
        "start": uint(0, MAX_SERVED_LAYERS - 1), "end": uint(1, MAX_SERVED_LAYERS), "profile": profile_id(),
        "bond": uint(1, 2**96),
        "addrs": OptionalField(multiaddr_list(MAX_NODE_ADDRS, MAX_ADDR_CHARS)),   # where referees fetch the bundle
    },
    "serve_referee_vote": {"dispute": HASH32, "valid": boolean, "output": HASH32},
    "evidence": {"evidence": blob(*range(1, MAX_EVIDENCE_BYTES + 1))},
    "unjail": {},
}

RECEIPT_DOMAIN = b"dekube/relay-receipt/v1\x00"


def relay_receipt_signing_bytes(chain_id: str, receipt: dict[str, Any]) -> bytes:
    """What both endpoints of a relayed connection sign for a usage receipt."""
    return RECEIPT_DOMAIN + encode_uvarint(len(chain_id.encode())) + chain_id.encode() + encode(receipt)


SERVE_RECEIPT_DOMAIN = b"dekube/serve-receipt/v1\x00"


def serve_receipt_signing_bytes(chain_id: str, receipt: dict[str, Any]) -> bytes:
    """What the client and the server of a serving session sign for a usage receipt (ADR 0174)."""
    return SERVE_RECEIPT_DOMAIN + encode_uvarint(len(chain_id.encode())) + chain_id.encode() + encode(receipt)
