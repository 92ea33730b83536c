"""The fuzz targets: every decoder that reads bytes from a peer or a client, with its contract.

A target's ``load()`` imports the decoder (so the runner can instrument it as it is imported) and
returns a ``Loaded``: ``run(data)`` feeds one input to the decoder and checks what it returned,
``allowed`` are the documented error classes it may raise, ``seeds()`` builds valid encodings
that seed the corpus. Any other exception (IndexError, struct.error, UnicodeDecodeError,
RecursionError, an AssertionError from a broken invariant) is a crash; so is a hang.

Targets whose decoder is a state machine take parameters from the first input byte (chunk size,
which side), and their seeds carry that byte too.
"""
from __future__ import annotations

import hashlib
import os
from collections.abc import Callable
from dataclasses import dataclass

SEED_A = b"\x0a" * 32
SEED_B = b"\x0b" * 32
CHAIN = "fuzz-chain"


@dataclass(frozen=True)
class Loaded:
    run: Callable[[bytes], object]
    allowed: tuple[type[BaseException], ...]
    seeds: Callable[[], list[bytes]]


@dataclass(frozen=True)
class Target:
    name: str
    packages: tuple[str, ...]  # top-level packages atheris instruments while ``load`` imports
    load: Callable[[], Loaded]
    max_len: int = 4096


TARGETS: dict[str, Target] = {}


def target(name: str, packages: tuple[str, ...], max_len: int = 4096):
    def register(load: Callable[[], Loaded]) -> Callable[[], Loaded]:
        TARGETS[name] = Target(name, packages, load, max_len)
        return load
    return register


def check_one(loaded: Loaded, data: bytes) -> None:
    """Run one input; swallow the documented errors, let anything else escape (a crash)."""
    try:
        loaded.run(data)
    except loaded.allowed:
        pass


def _identities():
    from node.identity import Identity
    return Identity.from_seed(SEED_A), Identity.from_seed(SEED_B)


def _strip_uvarint_prefix(framed: bytes) -> bytes:
    from node.p2p.varint import decode_uvarint
    decoded = decode_uvarint(framed)
    assert decoded is not None
    length, pos = decoded
    return framed[pos:pos + length]


# ------------------------------------------------------------------ transport (node.p2p)
@target("varint", ("node",), max_len=32)
def _varint() -> Loaded:
    from node.p2p.varint import VarintError, decode_uvarint, decode_uvarint_complete, encode_uvarint

    def run(data: bytes) -> None:
        decode_uvarint(data)
        decode_uvarint_complete(data)

    return Loaded(run, (VarintError,), lambda: [encode_uvarint(n) for n in (0, 1, 127, 128, 300, 2**32, 2**63 - 1)])


@target("protobuf", ("node",), max_len=1024)
def _protobuf() -> Loaded:
    from node.p2p.protobuf import ProtobufError, decode_fields, field_bytes, field_varint

    def seeds() -> list[bytes]:
        return [field_varint(1, 5) + field_bytes(2, b"abc"), field_bytes(3, field_varint(1, 2**40)), b""]

    return Loaded(decode_fields, (ProtobufError,), seeds)


@target("multiaddr_bytes", ("node",), max_len=512)
def _multiaddr_bytes() -> Loaded:
    from node.p2p.multiaddr import Multiaddr, MultiaddrError

    def run(data: bytes) -> None:
        addr = Multiaddr.from_bytes(data)
        str(addr)

    def seeds() -> list[bytes]:
        alice, _ = _identities()
        texts = [f"/ip4/127.0.0.1/tcp/4001/p2p/{alice.peer_id}", "/ip6/::1/udp/9/quic-v1",
                 f"/dns4/example.com/tcp/443/wss/p2p/{alice.peer_id}/p2p-circuit", "/ip4/1.2.3.4/tcp/5"]
        return [Multiaddr.parse(t).to_bytes() for t in texts]

    return Loaded(run, (MultiaddrError,), seeds)


@target("multiaddr_text", ("node",), max_len=512)
def _multiaddr_text() -> Loaded:
    from node.p2p.multiaddr import Multiaddr, MultiaddrError

    def run(data: bytes) -> None:
        addr = Multiaddr.parse(data.decode("utf-8", "replace"))
        Multiaddr.from_bytes(addr.to_bytes())

    def seeds() -> list[bytes]:
        alice, _ = _identities()
        return [t.encode() for t in (f"/ip4/127.0.0.1/tcp/4001/p2p/{alice.peer_id}", "/ip6/::1/tcp/1",
                                     "/dns/example.com/tcp/443/wss", f"/p2p/{alice.peer_id}/p2p-circuit")]

    return Loaded(run, (MultiaddrError,), seeds)


@target("multistream_listener", ("node",), max_len=1024)
def _multistream_listener() -> Loaded:
    from node.p2p.multistream import ListenerNegotiator, MultistreamError, encode_message

    def run(data: bytes) -> None:
        if not data:
            return
        chunk, data = 1 + data[0] % 64, data[1:]
        negotiator = ListenerNegotiator(["/noise", "/yamux/1.0.0"])
        for i in range(0, len(data), chunk):
            if negotiator.done:
                break
            negotiator.receive_data(data[i:i + chunk])
            negotiator.data_to_send()

    def seeds() -> list[bytes]:
        proposal = encode_message("/multistream/1.0.0") + encode_message("/noise")
        return [b"\x3f" + proposal, b"\x00" + proposal, b"\x3f" + encode_message("/multistream/1.0.0")
                + encode_message("ls") + encode_message("/yamux/1.0.0")]

    return Loaded(run, (MultistreamError,), seeds)


@target("multistream_dialer", ("node",), max_len=1024)
def _multistream_dialer() -> Loaded:
    from node.p2p.multistream import DialerNegotiator, MultistreamError, encode_message

    def run(data: bytes) -> None:
        negotiator = DialerNegotiator(["/noise", "/tls/1.0.0"])
        negotiator.data_to_send()
        negotiator.receive_data(data)
        negotiator.data_to_send()

    def seeds() -> list[bytes]:
        header = encode_message("/multistream/1.0.0")
        return [header + encode_message("/noise"), header + encode_message("na") + encode_message("/tls/1.0.0")]

    return Loaded(run, (MultistreamError,), seeds)


def _handshake_messages(alice, bob) -> tuple[bytes, bytes, bytes]:
    from node.p2p.noise import NoiseHandshake
    a, b = NoiseHandshake(alice, True), NoiseHandshake(bob, False)
    m1 = a.data_to_send()
    b.receive_data(m1)
    m2 = b.data_to_send()
    a.receive_data(m2)
    return m1, m2, a.data_to_send()


@target("noise_msg1", ("node",), max_len=1024)
def _noise_msg1() -> Loaded:
    from node.p2p.noise import NoiseError, NoiseHandshake
    alice, bob = _identities()

    def run(data: bytes) -> None:
        NoiseHandshake(bob, False).receive_data(data)

    return Loaded(run, (NoiseError,), lambda: [_handshake_messages(alice, bob)[0]])


@target("noise_msg2", ("node",), max_len=1024)
def _noise_msg2() -> Loaded:
    from node.p2p.noise import NoiseError, NoiseHandshake
    alice, bob = _identities()

    def run(data: bytes) -> None:
        NoiseHandshake(alice, True, expected_peer=bob.peer_id).receive_data(data)

    return Loaded(run, (NoiseError,), lambda: [_handshake_messages(alice, bob)[1]])


@target("noise_msg3", ("node",), max_len=1024)
def _noise_msg3() -> Loaded:
    from node.p2p.noise import NoiseError, NoiseHandshake
    alice, bob = _identities()

    def run(data: bytes) -> None:
        a, b = NoiseHandshake(alice, True), NoiseHandshake(bob, False)
        b.receive_data(a.data_to_send())
        b.data_to_send()
        try:
            b.receive_data(data)
        except NoiseError:
            return
        assert not b.complete, "a message 3 not answering our message 2 completed the handshake"

    return Loaded(run, (NoiseError,), lambda: [_handshake_messages(alice, bob)[2]])


@target("noise_payload", ("node",), max_len=1024)
def _noise_payload() -> Loaded:
    """The signed identity payload inside messages 2 and 3: behind the AEAD, so a mutated message
    never reaches it, but a peer that runs the handshake honestly can send any payload."""
    from node.p2p.noise import NoiseError, encode_handshake_payload, verify_handshake_payload
    alice, _ = _identities()
    static_public = bytes([9]) + bytes(31)  # fixed, so the kept corpus stays valid across runs

    def run(data: bytes) -> None:
        assert verify_handshake_payload(data, static_public) == alice.peer_id, "a payload signed by nobody verified"

    return Loaded(run, (NoiseError,), lambda: [encode_handshake_payload(alice, static_public)])


@target("noise_transport", ("node",), max_len=8192)
def _noise_transport() -> Loaded:
    from node.p2p.noise import CipherState, NoiseError, NoiseTransport
    key = b"\x07" * 32
    plain = b"hello world" * 50

    def run(data: bytes) -> None:
        transport = NoiseTransport(CipherState(b"\0" * 32), CipherState(key))
        out = bytes(transport.receive_data(data))
        assert out in (b"", plain), "a frame not sealed with the key decrypted"

    def seeds() -> list[bytes]:
        return [bytes(NoiseTransport(CipherState(key), CipherState(key)).encrypt(data)) for data in (plain, b"")]

    return Loaded(run, (NoiseError,), seeds)


@target("yamux", ("node",), max_len=8192)
def _yamux() -> Loaded:
    from node.p2p.yamux import DataReceived, YamuxError, YamuxSession

    def run(data: bytes) -> None:
        if not data:
            return
        initiator, chunk, data = bool(data[0] & 1), 1 + (data[0] >> 1) * 37, data[1:]
        session = YamuxSession(initiator, max_streams=8)
        for i in range(0, len(data), chunk):
            for event in session.receive_data(data[i:i + chunk], i / 1000):
                if type(event) is DataReceived and session.has_stream(event.stream_id):
                    session.acknowledge_received(event.stream_id, len(event.data), i / 1000)
            session.data_to_send()

    def seeds() -> list[bytes]:
        a, b = YamuxSession(True), YamuxSession(False)
        s1, s3, s5 = a.open_stream(), a.open_stream(), a.open_stream()
        a.send_data(s1, b"hello" * 20)
        a.send_data(s3, bytes(300))
        a.send_ping(0.0)
        first = a.data_to_send()
        b.receive_data(first, 0.0)
        a.end_stream(s3)
        a.reset_stream(s5)
        b.acknowledge_received(s1, 100, 0.0)
        a.receive_data(b.data_to_send(), 0.0)
        a.go_away()
        transcript = first + a.data_to_send()
        return [b"\xff" + transcript, b"\x00" + transcript, b"\x01" + b.data_to_send()]

    return Loaded(run, (YamuxError,), seeds)


@target("identify", ("node",), max_len=2048)
def _identify() -> Loaded:
    from node.p2p.identify import IdentifyError, IdentifyInfo, decode_identify, encode_identify
    from node.p2p.multiaddr import Multiaddr

    def run(data: bytes) -> None:
        decode_identify(data).peer_id  # noqa: B018  (derives the peer id: may raise IdentifyError)

    def seeds() -> list[bytes]:
        alice, _ = _identities()
        info = IdentifyInfo(public_key=alice.public_key_protobuf,
                            listen_addrs=[Multiaddr.parse("/ip4/1.2.3.4/tcp/5")],
                            protocols=["/ipfs/ping/1.0.0", "/yamux/1.0.0"],
                            observed_addr=Multiaddr.parse("/ip4/5.6.7.8/tcp/9"))
        return [encode_identify(info)]

    return Loaded(run, (IdentifyError,), seeds)


# ------------------------------------------------------------------ JSON-RPC
@target("jsonrpc", ("node",), max_len=4096)
def _jsonrpc() -> Loaded:
    import asyncio
    import json
    import logging
    from typing import Any

    from node.rpc.dispatcher import Dispatcher
    from node.rpc.errors import InvalidParams

    dispatcher_log = logging.getLogger("node.rpc.dispatcher")
    dispatcher = Dispatcher(max_body_bytes=4096, max_batch=8)

    async def echo(value: Any = None) -> Any:
        return value

    async def add(a: int, b: int = 0) -> int:
        return a + b

    async def get(name: str, verbose: bool | None = None, tags: list[str] | None = None,
                  extra: dict[str, int] | None = None) -> dict:
        if name == "missing":
            raise InvalidParams("no such thing")
        return {"name": name, "verbose": verbose, "tags": tags, "extra": extra}

    async def fail(x: float = 0.0) -> None:
        raise RuntimeError("an internal failure")

    for name, func in (("dkb_echo", echo), ("dkb_add", add), ("dkb_get", get), ("dkb_fail", fail)):
        dispatcher.register(name, func)
    loop = asyncio.new_event_loop()

    def run(data: bytes) -> None:
        dispatcher_log.disabled = True   # dkb_fail's traceback per input is noise; only while a target runs
        try:
            answer = loop.run_until_complete(dispatcher.handle(data))
        finally:
            dispatcher_log.disabled = False
        if answer is not None:
            doc = json.loads(answer)
            assert isinstance(doc, (dict, list)), f"not a JSON-RPC response: {answer[:80]!r}"

    def seeds() -> list[bytes]:
        docs = [
            {"jsonrpc": "2.0", "id": 1, "method": "dkb_add", "params": [1, 2]},
            {"jsonrpc": "2.0", "id": "x", "method": "dkb_get", "params": {"name": "a", "tags": ["t"]}},
            [{"jsonrpc": "2.0", "method": "dkb_echo", "params": [[1.5, None]]},
             {"jsonrpc": "2.0", "id": None, "method": "dkb_fail"}],
            {"jsonrpc": "2.0", "id": 2, "method": "dkb_nope"},
        ]
        return [json.dumps(d).encode() for d in docs]

    return Loaded(run, (), seeds)


# ------------------------------------------------------------------ ledger encoding (consensus)
def _signed_tx(nonce: int = 1) -> bytes:
    from consensus.tx import signed_tx_bytes
    alice, bob = _identities()
    return signed_tx_bytes(alice, CHAIN, nonce, "transfer", {"to": bob.peer_id, "amount": 5}, fee=10)


@target("encoding", ("consensus",), max_len=4096)
def _encoding() -> Loaded:
    from consensus.encoding import EncodingError, decode, encode

    def run(data: bytes) -> None:
        value = decode(data, max_size=4096)
        assert encode(value) == data, "a second encoding of the same value was accepted"

    def seeds() -> list[bytes]:
        return [encode(v) for v in (None, True, -5, 2**200, b"ab", "text\u00e9",
                                    [1, [2, {"a": None, "b": [b"x"]}]], {"k": -(2**255) + 1})]

    return Loaded(run, (EncodingError,), seeds)


@target("tx", ("consensus", "node"), max_len=8192)
def _tx() -> Loaded:
    from consensus.tx import decode_tx
    from consensus.txcodes import TxError

    def run(data: bytes) -> None:
        decode_tx(data, chain_id=CHAIN)

    return Loaded(run, (TxError,), lambda: [_signed_tx(1), _signed_tx(2**40)])


@target("block", ("consensus",), max_len=16384)
def _block() -> Loaded:
    from consensus.block import Block, BlockError, build_block

    def run(data: bytes) -> None:
        block = Block.decode(data, max_bytes=16384)
        block.check_roots()
        assert Block.decode(block.encode(), max_bytes=16384) == block

    def seeds() -> list[bytes]:
        alice, _ = _identities()
        block = build_block(CHAIN, 7, 1_700_000_000_000, b"\x01" * 32, b"\x02" * 32, alice, b"\x03" * 32,
                            [_signed_tx(1), _signed_tx(2)], [b"evidence"], b"commit")
        empty = build_block(CHAIN, 1, 0, b"", b"\x00" * 32, alice, b"\x03" * 32, [])
        return [block.encode(), empty.encode()]

    return Loaded(run, (BlockError,), seeds)


def _votes(count: int = 2, height: int = 9):
    from consensus.messages import Vote, VoteType, sign_vote, value_id
    alice, bob = _identities()
    votes = []
    for i in range(count):
        who = (alice, bob)[i % 2]
        vote = Vote(VoteType.PREVOTE if i % 3 else VoteType.PRECOMMIT, height, 1, value_id(b"block"), who.peer_id)
        votes.append(sign_vote(who, CHAIN, vote))
    return votes


@target("consensus_message", ("consensus",), max_len=4096)
def _consensus_message() -> Loaded:
    from consensus.messages import (
        MessageError,
        Proposal,
        Vote,
        VoteType,
        decode_message,
        encode_message,
        sign_proposal,
        sign_vote,
    )

    def run(data: bytes) -> None:
        message = decode_message(data)
        assert encode_message(message) == data, "a second encoding of the same message was accepted"

    def seeds() -> list[bytes]:
        alice, _ = _identities()
        proposal = sign_proposal(alice, CHAIN, Proposal(9, 2, 1, b"a block value", alice.peer_id))
        nil = sign_vote(alice, CHAIN, Vote(VoteType.PRECOMMIT, 9, 0, b"", alice.peer_id))
        return [encode_message(proposal), encode_message(nil), encode_message(_votes(1)[0])]

    return Loaded(run, (MessageError,), seeds)


@target("evidence", ("consensus",), max_len=1024)
def _evidence() -> Loaded:
    from consensus.messages import DoubleVoteEvidence, MessageError, Vote, VoteType, sign_vote

    def seeds() -> list[bytes]:
        alice, _ = _identities()
        a, b = (sign_vote(alice, CHAIN, Vote(VoteType.PREVOTE, 3, 0, v, alice.peer_id))
                for v in (hashlib.sha256(b"x").digest(), b""))
        return [DoubleVoteEvidence(a, b).encode()]

    return Loaded(DoubleVoteEvidence.decode, (MessageError,), seeds)


@target("lock_proof", ("consensus",), max_len=4096)
def _lock_proof() -> Loaded:
    from consensus.messages import MessageError
    from consensus.tendermint import decode_lock_proof, encode_lock_proof

    return Loaded(decode_lock_proof, (MessageError,),
                  lambda: [encode_lock_proof(b"block", _votes(3)), encode_lock_proof(b"", [])])


@target("sync_request", ("consensus",), max_len=64)
def _sync_request() -> Loaded:
    from consensus.driver import decode_sync_request, encode_sync_request
    from consensus.messages import MessageError

    return Loaded(decode_sync_request, (MessageError,), lambda: [encode_sync_request(1), encode_sync_request(2**40)])


@target("sync_block", ("consensus",), max_len=8192)
def _sync_block() -> Loaded:
    from consensus.driver import decode_sync_block, encode_sync_block
    from consensus.messages import MessageError
    from consensus.tendermint import Commit

    return Loaded(decode_sync_block, (MessageError,),
                  lambda: [encode_sync_block(Commit(9, 1, b"block", tuple(_votes(3))))])


@target("txgossip", ("consensus",), max_len=8192)
def _txgossip() -> Loaded:
    from consensus.txgossip import GossipFrameError, decode_batch, encode_batch

    return Loaded(decode_batch, (GossipFrameError,),
                  lambda: [encode_batch([_signed_tx(1), _signed_tx(2)])[4:], encode_batch([b"x"])[4:]])


@target("certificate", ("consensus",), max_len=8192)
def _certificate() -> Loaded:
    from consensus.validator.chainstore import CertificateError, decode_certificate, encode_certificate

    return Loaded(decode_certificate, (CertificateError,), lambda: [encode_certificate(_votes(3))])


# ------------------------------------------------------------------ relays (relay)
@target("relay_hop", ("relay", "node"), max_len=2048)
def _relay_hop() -> Loaded:
    from node.p2p.multiaddr import Multiaddr
    from relay.messages import (
        HopMessage,
        HopType,
        Limit,
        Peer,
        RelayMessageError,
        Reservation,
        Status,
        decode_hop,
        encode_hop,
    )

    def seeds() -> list[bytes]:
        alice, _ = _identities()
        addr = Multiaddr.parse("/ip4/1.2.3.4/tcp/4001")
        return [
            encode_hop(HopMessage(HopType.CONNECT, peer=Peer(alice.peer_id, (addr,)))),
            encode_hop(HopMessage(HopType.STATUS, reservation=Reservation(2**31, (addr,), b"voucher"),
                                  limit=Limit(120, 1 << 17), status=Status.OK, session=bytes(16))),
        ]

    return Loaded(decode_hop, (RelayMessageError,), seeds)


@target("relay_stop", ("relay", "node"), max_len=2048)
def _relay_stop() -> Loaded:
    from relay.messages import Limit, Peer, RelayMessageError, Status, StopMessage, StopType, decode_stop, encode_stop

    def seeds() -> list[bytes]:
        alice, _ = _identities()
        return [encode_stop(StopMessage(StopType.CONNECT, peer=Peer(alice.peer_id), limit=Limit(60, 4096))),
                encode_stop(StopMessage(StopType.STATUS, status=Status.OK, session=bytes(16)))]

    return Loaded(decode_stop, (RelayMessageError,), seeds)


@target("dcutr", ("relay", "node"), max_len=4200)
def _dcutr() -> Loaded:
    from node.p2p.multiaddr import Multiaddr
    from relay.dcutr import DcutrError, HolePunch, HolePunchType, decode_holepunch, encode_holepunch

    def seeds() -> list[bytes]:
        addrs = (Multiaddr.parse("/ip4/1.2.3.4/tcp/4001"), Multiaddr.parse("/ip6/::1/udp/5/quic-v1"))
        return [_strip_uvarint_prefix(encode_holepunch(HolePunch(HolePunchType.CONNECT, addrs))),
                _strip_uvarint_prefix(encode_holepunch(HolePunch(HolePunchType.SYNC)))]

    return Loaded(decode_holepunch, (DcutrError,), seeds)


@target("autonat", ("relay", "node"), max_len=4200)
def _autonat() -> Loaded:
    from node.p2p.multiaddr import Multiaddr
    from relay.reachability import (
        AutoNATError,
        DialRequest,
        DialResponse,
        ResponseStatus,
        decode_message,
        encode_request,
        encode_response,
    )

    def seeds() -> list[bytes]:
        alice, _ = _identities()
        addr = Multiaddr.parse("/ip4/1.2.3.4/tcp/4001")
        return [_strip_uvarint_prefix(encode_request(DialRequest(alice.peer_id, (addr,)))),
                _strip_uvarint_prefix(encode_response(DialResponse(ResponseStatus.OK, "ok", addr))),
                _strip_uvarint_prefix(encode_response(DialResponse(ResponseStatus.E_DIAL_ERROR, "no")))]

    return Loaded(decode_message, (AutoNATError,), seeds)


@target("relay_receipt", ("relay", "consensus"), max_len=1100)
def _relay_receipt() -> Loaded:
    from consensus.encoding import encode
    from relay.receipts import ReceiptError, build_receipt, decode_request

    def seeds() -> list[bytes]:
        alice, bob = _identities()
        return [encode(build_receipt(alice.peer_id, bob.peer_id, alice.peer_id, bytes(16), 5 << 20, 3,
                                     task_id=b"\x01" * 32))]

    return Loaded(decode_request, (ReceiptError,), seeds)


@target("voucher", ("relay", "node"), max_len=1100)
def _voucher() -> Loaded:
    from relay.voucher import VoucherError, decode_voucher, seal_voucher

    def seeds() -> list[bytes]:
        alice, bob = _identities()
        return [seal_voucher(alice, bob.peer_id, 2**31)]

    return Loaded(decode_voucher, (VoucherError,), seeds)


# ------------------------------------------------------------------ compute (ml)
@target("allreduce_header", ("ml",), max_len=64)
def _allreduce_header() -> Loaded:
    from ml.allreduce.wire import HEADER_SIZE, Frame, FrameError, Kind, encode_frame, parse_header

    def run(data: bytes) -> None:
        parse_header(data[:HEADER_SIZE] if len(data) >= HEADER_SIZE else data)

    def seeds() -> list[bytes]:
        frame = Frame(Kind.RESULT, 7, 1, 2, 3, {"m": [1, 2]}, b"payload")
        return [bytes(encode_frame(frame)[0][:HEADER_SIZE])]

    return Loaded(run, (FrameError,), seeds)


@target("allreduce_meta", ("ml",), max_len=4096)
def _allreduce_meta() -> Loaded:
    import json

    from ml.allreduce.wire import FrameError, parse_meta

    return Loaded(parse_meta, (FrameError,),
                  lambda: [json.dumps({"members": ["a", "b"], "shape": [3, 4], "codec": "int8"}).encode()])


@target("segments", ("ml",), max_len=4096)
def _segments() -> Loaded:
    from ml.compute.segment_record import SegmentRecord, StepHashes
    from ml.compute.segments_protocol import SegmentAnswer, SegmentsError, decode_answer, encode_answer

    def seeds() -> list[bytes]:
        record = SegmentRecord(0, "ab" * 32, "cd" * 32, "ef" * 32, (StepHashes("01" * 32, "02" * 32, "03" * 32),),
                               "04" * 32)
        return [encode_answer(SegmentAnswer(record, [b"\x05" * 32], 2))[4:], encode_answer(None, "unknown task")[4:]]

    return Loaded(lambda data: decode_answer(data, 0), (SegmentsError,), seeds)


# ------------------------------------------------------------------ the runner's own check
if os.environ.get("DEKUBE_FUZZ_SELFTEST") == "1":
    @target("selftest", ("devtools",), max_len=16)
    def _selftest() -> Loaded:
        """A decoder with a planted bug, so tests can see a crash reported with its reproducer."""
        def run(data: bytes) -> None:
            if data[:1] == b"!":
                raise IndexError("planted crash")
        return Loaded(run, (ValueError,), lambda: [b"!"])
