"""Serving disputes, the parties' side (ADR 0176): the client's claim and step bundle, the referee's check.

A failed spot check gives evidence (billing.spot_evidence): the countersigned receipt whose transcript
ends at the wrong step, the prior transcript, the step's link and answer digest, and the steps up to
it. The client packs the steps into a **bundle** (one wire frame: a JSON header naming the model and
each step's blocks, codec, chunk lengths, "all" flag, answer digest and setup digest, one f32 tensor
"h" with every step's inputs as the server decoded them, back to back, and, for a session opened with
the client's adapter or deep prompts, those as the server decoded them: "lora_a", "lora_b",
"prompts", which must hash to the setup digest every link commits to), files `serve_dispute` with the
bundle's sha256 as `inputs` (`dispute_payload`) and the addresses a referee can dial it on (none
wildcard, its relayed ones too), serves the bundle to whoever asks for that hash over
`/dekube/serve-dispute/1.0.0` (`BundleStore`, `make_bundle_handler`) and, since a client behind NAT
or listening on no reachable address cannot be fetched from, also delivers it to each drawn referee
until they voted (ml/serve/evidence.py, ADR 0182).

A drawn referee takes the bundle the client delivered (its `Inbox`) or else fetches it from the client
(`fetch_bundle`, hash checked) and calls `referee_verdict`: the bundle must chain to the dispute's
prior transcript and link, on the blocks and model disputed, its last answer digest must be the
disputed one; then the referee reruns every step through its own copy of those blocks with fresh KV
caches, the session's deep prompts added to the first chunk and its adapter at every chunk (what the
server's session did), and votes `valid` with the digest of its own answer to the last step, after
the codec. A bundle that is malformed or does not check out is voted invalid (the claim then fails
and the client loses its bond); a bundle the referee neither got nor could fetch is no verdict: it
tries again at its next duty round until the dispute closes, and abstains if it never gets it (ADR
0178: an honest client's claim must not depend on load).

A tuning pass (billing.pass_evidence) is disputed the same way with a pass bundle
(ml/serve/pass_check.py, ADR 0183): the referee checks it hashes to the disputed link and recomputes
that one pass, forward or backward.
"""
from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
from dataclasses import dataclass

import torch

from consensus.state.serve_disputes import dispute_id
from ml.serve.billing import StepRecord
from ml.serve.evidence import (
    BUNDLE_PROTOCOL,
    STREAM_ERRORS,
    Delivery,
    Inbox,
    read_header,
    receive,
    transfer_timeout,
)
from ml.serve.model import ServeDecoder
from ml.serve.pass_check import PASS_BUNDLE, encode_pass_bundle, pass_bundle_output
from ml.serve.transcript import ZERO, chain, setup_digest, step_link, tensor_digest
from ml.serve.wire import CODECS, Message, WireError, decode_frame, encode_frame, frame_length, roundtrip
from node.ledger.record import dialable

log = logging.getLogger(__name__)

MAX_BUNDLES = 64
FETCH_TIMEOUT_S = 30.0


class DisputeError(ValueError):
    """Evidence that cannot make a claim."""


SETUP_TENSORS = ("lora_a", "lora_b", "prompts")


def _setup_of(tensors: dict[str, torch.Tensor]) -> tuple[tuple[torch.Tensor, torch.Tensor] | None, torch.Tensor | None]:
    """(LoRA (A, B) | None, deep prompts | None) from a session's setup tensors."""
    if ("lora_a" in tensors) != ("lora_b" in tensors):
        raise DisputeError("a setup's adapter needs both lora_a and lora_b")
    lora = (tensors["lora_a"], tensors["lora_b"]) if "lora_a" in tensors else None
    return lora, tensors.get("prompts")


def encode_bundle(model: str, steps: list[StepRecord], setup: dict[str, torch.Tensor] | None = None) -> bytes:
    """The bundle of `steps` (one session's, in order) as one wire frame, length prefix included, with the
    session's `setup` tensors (lora_a, lora_b, prompts as the server decoded them) when it had any: the
    steps' links commit to their digest (transcript.setup_digest)."""
    if not steps:
        raise DisputeError("a bundle needs at least one step")
    setup = {name: t for name, t in (setup or {}).items() if name in SETUP_TENSORS}
    digest = setup_digest(*_setup_of(setup))
    if any(s.setup != digest for s in steps):
        raise DisputeError("the setup tensors do not match the steps' setup digest")
    header = {"type": "dispute-bundle", "model": model,
              "steps": [{"start": s.start, "end": s.end, "codec": s.codec, "chunks": list(s.chunks),
                         "all": s.all_outputs, "answer": s.answer.hex(), "setup": s.setup.hex()} for s in steps]}
    return encode_frame(header, {"h": torch.cat([s.inputs for s in steps], 1), **setup}, "f32")


def dispute_payload(evidence: dict, bundle: bytes, profile: str, bond: int) -> dict:
    """The `serve_dispute` payload for spot-check `evidence` whose steps (or tuning pass) are packed in
    `bundle`."""
    step = evidence["pass"] if "pass" in evidence else evidence["steps"][-1]
    receipt = dict(evidence["receipt"])
    receipt["session"], receipt["transcript"] = bytes.fromhex(receipt["session"]), bytes.fromhex(receipt["transcript"])
    return {"receipt": receipt, "client_sig": bytes.fromhex(evidence["client_sig"]),
            "server_sig": bytes.fromhex(evidence["server_sig"]), "prior": bytes.fromhex(evidence["prior"]),
            "link": bytes.fromhex(evidence["link"]), "answer": bytes.fromhex(evidence["answer"]),
            "inputs": hashlib.sha256(bundle).digest(), "start": step.start, "end": step.end, "profile": profile,
            "bond": bond}


@dataclass(frozen=True)
class Claim:
    """What a referee checks a bundle against (from the `serve_dispute_opened` event or dkb_getServeDispute)."""
    model: str
    start: int
    end: int
    prior: bytes
    link: bytes
    answer: bytes
    inputs: bytes

    @classmethod
    def from_event(cls, event: dict) -> Claim:
        return cls(event["model"], event["start"], event["end"], event["prior"], event["link"], event["answer"],
                   event["inputs"])

    @classmethod
    def from_json(cls, record: dict) -> Claim:
        """From dkb_getServeDispute / dkb_listServeDisputes (hex fields)."""
        return cls(record["model"], record["start"], record["end"], *(bytes.fromhex(record[name]) for name in
                                                                      ("prior", "link", "answer", "inputs")))


@dataclass(frozen=True)
class Bundle:
    """A bundle's contents, checked against a claim."""
    steps: list[dict]
    inputs: torch.Tensor
    lora: tuple[torch.Tensor, torch.Tensor] | None
    prompts: torch.Tensor | None


def _message(bundle: bytes, claim: Claim) -> Message:
    """The bundle's frame, checked against the claim's hash."""
    if hashlib.sha256(bundle).digest() != claim.inputs:
        raise DisputeError("bundle does not hash to the claim's inputs")
    try:
        if len(bundle) < 8 or frame_length(bundle[:4]) != len(bundle) - 4:
            raise DisputeError("bundle length prefix is wrong")
        return decode_frame(bundle[4:])
    except WireError as exc:
        raise DisputeError(f"malformed bundle: {exc}") from None


def _steps(message: Message, claim: Claim) -> Bundle:
    """The bundle's steps, inputs and session setup, checked against the claim's chain, blocks and
    answer (the setup tensors against the digest every link commits to)."""
    header, inputs = message.header, message.tensors.get("h")
    steps = header.get("steps")
    if header.get("model") != claim.model or not isinstance(steps, list) or not steps or inputs is None:
        raise DisputeError("bundle names another model, or lacks steps or inputs")
    if inputs.dim() != 3:
        raise DisputeError("bundle inputs are (batch, length, width)")
    lora, prompts = _setup_of({name: t for name, t in message.tensors.items() if name in SETUP_TENSORS})
    if set(message.tensors) - {"h", *SETUP_TENSORS}:
        raise DisputeError("bundle carries tensors other than its inputs and setup")
    digest = setup_digest(lora, prompts)
    links, offset = [], 0
    for step in steps:
        chunks = step.get("chunks") if isinstance(step, dict) else None
        if (not isinstance(step, dict) or step.get("start") != claim.start or step.get("end") != claim.end
                or step.get("codec") not in CODECS or not isinstance(step.get("all"), bool)
                or not isinstance(chunks, list) or not chunks
                or not all(type(n) is int and n >= 1 for n in chunks) or not isinstance(step.get("answer"), str)):
            raise DisputeError("bundle step is malformed or on other blocks")
        try:
            answer, setup = bytes.fromhex(step["answer"]), bytes.fromhex(str(step.get("setup", "")))
        except ValueError:
            raise DisputeError("bundle answer or setup is not hex") from None
        if setup != digest:
            raise DisputeError("the bundle's adapter or prompts are not those its steps commit to")
        length = sum(chunks)
        if offset + length > inputs.shape[1]:
            raise DisputeError("bundle steps run past its inputs")
        links.append(step_link(claim.start, claim.end, step["codec"], chunks, step["all"],
                               tensor_digest(inputs[:, offset:offset + length]), answer, setup))
        offset += length
    if offset != inputs.shape[1]:
        raise DisputeError("bundle inputs are longer than its steps")
    if chain(links[:-1]) != claim.prior or links[-1] != claim.link or answer != claim.answer:
        raise DisputeError("bundle does not chain to the disputed transcript")
    return Bundle(steps, inputs, lora, prompts)


def _blocks(part: ServeDecoder, start: int, end: int) -> ServeDecoder:
    """Blocks start..end of `part` (which must hold them) as a decoder of their own."""
    if not part.start <= start < end <= part.end:
        raise DisputeError(f"referee holds blocks {part.start}:{part.end}, not {start}:{end}")
    if (part.start, part.end) == (start, end):
        return part
    sub = ServeDecoder(part.config, (start, end), ends=False)
    sub.blocks.load_state_dict({k: v for k, v in part.blocks.state_dict().items()
                                if start <= int(k.split(".")[0]) < end})
    return sub.to(part.device).eval()   # the referee computes where its own blocks are (ADR 0179)


def referee_verdict(bundle: bytes, claim: Claim, part: ServeDecoder) -> tuple[bool, bytes]:
    """(valid, output): whether the bundle (fetched, hashing to the claim's inputs or not) checks out, and
    the digest of the referee's own answer to its last step after the codec (blocking: torch; run it in
    a worker thread). Raises DisputeError when `part` does not hold the disputed blocks (the referee
    cannot judge: it abstains)."""
    blocks = _blocks(part, claim.start, claim.end)
    try:
        message = _message(bundle, claim)
        if message.header.get("type") == PASS_BUNDLE:   # a tuning pass (ADR 0183)
            try:
                return True, pass_bundle_output(message.header, message.tensors, claim, blocks)
            except ValueError as exc:
                raise DisputeError(str(exc)) from None
        return True, _replay(blocks, _steps(message, claim))
    except DisputeError as exc:
        log.warning("dispute bundle refused: %s", exc)
        return False, ZERO


def _replay(blocks: ServeDecoder, bundle: Bundle) -> bytes:
    """Rerun the bundle's steps as the server's session did (fresh KV caches, the deep prompts added to
    the first chunk, the adapter at every chunk); the digest of the last step's answer after its codec."""
    inputs, config = bundle.inputs, blocks.config
    if inputs.shape[1] > config.context or inputs.shape[2] != config.width:
        raise DisputeError("bundle inputs do not fit the model")
    caches = blocks.new_caches(inputs.shape[0], inputs.shape[1])
    inputs = inputs.to(blocks.device)
    offset, out = 0, inputs[:, :0]
    prompts = None if bundle.prompts is None else bundle.prompts.to(blocks.device)
    lora = None if bundle.lora is None else (bundle.lora[0].to(blocks.device), bundle.lora[1].to(blocks.device))
    try:
        with torch.no_grad():
            for step in bundle.steps:
                outs = []
                for length in step["chunks"]:
                    chunk = inputs[:, offset:offset + length]
                    outs.append(blocks.run_blocks(chunk, caches, prompts=prompts if offset == 0 else None, lora=lora))
                    offset += length
                out = torch.cat(outs, 1) if step["all"] else outs[-1]
    except (RuntimeError, ValueError, IndexError) as exc:   # setup shapes that do not fit (torch's errors)
        raise DisputeError(f"bundle does not run on the blocks: {str(exc)[:200]}") from None
    return tensor_digest(roundtrip(out.cpu(), bundle.steps[-1]["codec"]))


class BundleStore:
    """The bundles a client serves to referees, by content hash (the newest `limit`)."""

    def __init__(self, limit: int = MAX_BUNDLES):
        self.limit = limit
        self._bundles: dict[bytes, bytes] = {}

    def add(self, bundle: bytes) -> bytes:
        key = hashlib.sha256(bundle).digest()
        self._bundles[key] = bundle
        while len(self._bundles) > self.limit:
            self._bundles.pop(next(iter(self._bundles)))
        return key

    def get(self, key: bytes) -> bytes | None:
        return self._bundles.get(key)


def make_bundle_handler(store: BundleStore | None = None, inbox: Inbox | None = None):
    """The stream handler of BUNDLE_PROTOCOL: a client's `store` answers a request {"type": "bundle",
    "inputs": hex} with the bundle's bytes (itself a frame); a referee's `inbox` takes a client's
    {"type": "deliver", "dispute": hex} (evidence.receive). Anything else gets an error frame."""
    async def handle(stream) -> None:
        try:
            request = await read_header(stream, FETCH_TIMEOUT_S)
            if request.get("type") == "deliver" and inbox is not None:
                await receive(stream, request, inbox)
                return
            try:
                key = bytes.fromhex(str(request.get("inputs", "")))
            except ValueError:
                key = b""
            bundle = store.get(key) if request.get("type") == "bundle" and store is not None else None
            error = "this node referees no disputes" if request.get("type") == "deliver" else "no such bundle"
            await stream.write(bundle if bundle is not None else encode_frame({"type": "error", "error": error}))
            await stream.close()
        except STREAM_ERRORS:
            stream.reset()
    return handle


async def fetch_bundle(host, peer_id: str, inputs: bytes, timeout: float = FETCH_TIMEOUT_S) -> bytes | None:
    """The bundle hashing to `inputs` from `peer_id` (the disputing client), or None."""
    stream = None
    try:
        stream = await asyncio.wait_for(host.open_stream(peer_id, BUNDLE_PROTOCOL), timeout)
        await stream.write(encode_frame({"type": "bundle", "inputs": inputs.hex()}))
        prefix = await asyncio.wait_for(stream.readexactly(4), timeout)
        length = frame_length(prefix)
        body = await asyncio.wait_for(stream.readexactly(length), transfer_timeout(length, timeout))
    except STREAM_ERRORS as exc:
        log.warning("fetching dispute bundle from %s failed: %r", peer_id[:16], exc)
        return None
    finally:
        if stream is not None:
            with contextlib.suppress(Exception):
                await stream.close()
    bundle = prefix + body
    return bundle if hashlib.sha256(bundle).digest() == inputs else None


async def referee_duty(gateway, host, part: ServeDecoder, inbox: Inbox | None = None) -> int:
    """Vote on every open dispute that drew this server as a referee (polled from the ledger): take the
    bundle the client delivered to `inbox` or else fetch it from the client, recompute, send
    `serve_referee_vote`. A bundle neither delivered nor fetched is no verdict
    on the claim (the client may be slow or the network down for a while): the dispute stays on the
    ledger's to-do list and is tried again at the next call, until it closes; a dispute on blocks this
    server no longer holds is left alone. Returns the votes sent."""
    from node.ledger.errors import LedgerUnavailable, TxFailed

    try:
        disputes = await gateway.call("dkb_listServeDisputes", host.peer_id)
    except LedgerUnavailable as exc:
        log.warning("listing serving disputes failed: %s", exc)
        return 0
    votes = 0
    for record in disputes:
        claim = Claim.from_json(record)
        if not part.start <= claim.start < claim.end <= part.end:
            continue
        bundle = inbox.get(claim.inputs) if inbox is not None else None
        if bundle is None and (record.get("addrs") or host.is_connected(record["client"])):   # else wait for it
            with contextlib.suppress(ValueError):
                host.peerbook.add_addrs(record["client"], record.get("addrs", []))
            bundle = await fetch_bundle(host, record["client"], claim.inputs)
        if bundle is None:
            continue   # no verdict without the bundle: abstain now, try again next time
        valid, output = await asyncio.to_thread(referee_verdict, bundle, claim, part)
        log.info("serving dispute %s: voting valid=%s output=%s", record["dispute"][:16], valid, output.hex()[:16])
        try:
            await gateway.send("serve_referee_vote", {"dispute": bytes.fromhex(record["dispute"]), "valid": valid,
                                                      "output": output})
            votes += 1
            if inbox is not None:
                inbox.discard(claim.inputs)
        except (LedgerUnavailable, TxFailed) as exc:
            log.warning("voting on serving dispute %s failed: %s", record["dispute"][:16], exc)
    return votes


DECIDE_POLL_S = 1.0


async def server_profile(gateway, server: str, model: str) -> str | None:
    """The profile `server` announces for `model` (the referees are drawn in it), or None."""
    record = await gateway.call("dkb_getNode", server)
    hardware = (record or {}).get("hardware") or {}
    for entry in hardware.get("serving") or []:
        if isinstance(entry, dict) and entry.get("model") == model and isinstance(entry.get("profile"), str):
            return entry["profile"]
    profiles = hardware.get("profiles") or []
    return profiles[0] if profiles and isinstance(profiles[0], str) else None


def reachable_addrs(host) -> list[str]:
    """The addresses a referee could fetch a bundle from `host` on: its listen addresses that are not
    wildcards (0.0.0.0 names no machine) and the relayed addresses it holds (ADR 0182)."""
    return dialable([*host.listen_addrs, *host.extra_addrs()])


async def file_dispute(gateway, host, store: BundleStore, evidence: dict, bond: int,
                       wait_s: float = 0.0, poll_s: float = DECIDE_POLL_S) -> dict:
    """Pack `evidence` (a failed spot check's), serve its bundle from `host` (`store` must be behind
    BUNDLE_PROTOCOL there), send `serve_dispute` with the addresses referees can reach this host on and,
    for up to `wait_s`, deliver it to the drawn referees (at least once each) and keep serving it until
    they decide. Returns {"dispute", "status"} (status "open" if not decided in time) and, when some
    referee never stored the bundle, "undelivered": {referee: last error}."""
    model = evidence["receipt"]["model"]
    profile = await server_profile(gateway, evidence["receipt"]["server"], model)
    if profile is None:
        raise DisputeError("the server announces no profile for that model: no referee could be drawn")
    if "pass" in evidence:   # a tuning pass's (billing.pass_evidence, ADR 0183)
        bundle = await asyncio.to_thread(encode_pass_bundle, model, evidence["pass"])
    else:
        bundle = await asyncio.to_thread(encode_bundle, model, evidence["steps"], evidence.get("setup"))
    store.add(bundle)
    payload = {**await asyncio.to_thread(dispute_payload, evidence, bundle, profile, bond),   # hashes the bundle
               "addrs": reachable_addrs(host)}
    await gateway.send("serve_dispute", payload)
    ident = dispute_id(payload["receipt"])
    delivery = Delivery(gateway, host, ident, bundle)
    deadline = asyncio.get_running_loop().time() + wait_s
    while True:
        record = await gateway.call("dkb_getServeDispute", ident.hex()) or {}
        status = record.get("status", "open")
        if status == "open":
            await delivery.round(record)
        if status != "open" or asyncio.get_running_loop().time() >= deadline:
            undelivered = {peer: delivery.errors[peer] for peer, vote in record.get("referees", [])
                           if vote is None and peer in delivery.errors}
            return {"dispute": ident.hex(), "status": status, **({"undelivered": undelivered} if undelivered else {})}
        await asyncio.sleep(poll_s)
