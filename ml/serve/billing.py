"""Usage receipts for serving (ADR 0174): what a client and a server co-sign during a session, sans I/O.

A billing server offers, when a stream opens a session or runs its first pass, a 16-byte session id,
its price (per GFLOP, rounded up) and how many tokens it serves ahead of payment (`credit_tokens`).
Every compute reply reports the stream's cumulative usage {tokens, flops} and `transcript`: a hash
chain over the inference steps and tuning passes (sha256(previous || link), a link committing to the
step's or pass's inputs and answer: ml/serve/transcript.py, ADR 0183).
The client checks the tokens against its own count and the FLOPs against a bound, extends its own
transcript from the answers it received, and signs a cumulative receipt {session, server, client,
model, tokens, flops, amount, seq, transcript}, sent with its next request (or alone, "receipt",
before it closes). The server accepts only a receipt equal to what it last reported, priced at
least at its price, countersigns it and keeps the newest per session (`ReceiptBook`) to claim on
chain (`serve_receipt`, consensus/state/serving.py). A server refuses to compute while more than
`credit_tokens` are unsigned, so a client that stops signing costs it at most that.

Because the server signed a transcript that commits to every input and answer, a failed spot check
(client.py) yields evidence (`spot_evidence`): the co-signed receipt whose transcript ends at the wrong
step, the steps up to it (inputs as the server decoded them) and its link, which referees holding the
blocks check and recompute (ADR 0176, ml/serve/dispute.py); for a tuning pass kept for checking,
`pass_evidence` (ADR 0183).
"""
from __future__ import annotations

import math
import secrets
import threading
import time
from dataclasses import dataclass

import torch

from consensus.tx import public_key_for, serve_receipt_signing_bytes, verify_signature
from ml.serve.transcript import ZERO, chain, extend, grads_digest, pass_link, step_link, tensor_digest

MAX_RECEIPTS = 4096
DEFAULT_CREDIT_TOKENS = 1024


class BillingError(ValueError):
    """A receipt or offer the other party refuses."""


def max_flops_per_token(config, blocks: int) -> int:
    """A bound on the FLOPs a server may bill per token on `blocks` blocks (a backward at full context)."""
    return 3 * blocks * (2 * config.block_params() + 4 * config.width * config.context)


def amount_due(flops: int, price_per_gflop: int) -> int:
    """What `flops` cost at `price_per_gflop`, rounded up, at least 1."""
    return max(1, math.ceil(flops * price_per_gflop / 1e9))


def receipt_to_json(receipt: dict) -> dict:
    return {**receipt, "session": receipt["session"].hex(), "transcript": receipt["transcript"].hex()}


def receipt_from_json(value: object) -> dict:
    """A receipt from a request header, shape-checked (the ledger checks it again)."""
    names = ("session", "server", "client", "model", "tokens", "flops", "amount", "seq", "transcript")
    if not isinstance(value, dict) or set(value) != set(names):
        raise BillingError(f"a receipt has exactly the fields {list(names)}")
    try:
        session, transcript = bytes.fromhex(value["session"]), bytes.fromhex(value["transcript"])
    except (TypeError, ValueError):
        raise BillingError("receipt session and transcript are hex") from None
    if len(session) != 16 or len(transcript) != 32:
        raise BillingError("receipt session is 16 bytes, transcript 32")
    for name in ("tokens", "flops", "amount", "seq"):
        if type(value[name]) is not int or value[name] < 0:
            raise BillingError(f"receipt {name} is a non-negative integer")
    return {**value, "session": session, "transcript": transcript}


def _hex_sig(value: object) -> bytes:
    try:
        sig = bytes.fromhex(value) if isinstance(value, str) else b""
    except ValueError:
        sig = b""
    if len(sig) != 64:
        raise BillingError("a signature is 64 bytes of hex")
    return sig


@dataclass(frozen=True)
class StepRecord:
    """One inference step as the client saw it: blocks start..end ran `chunks` (lengths) of `inputs`
    (the hidden states as the server decoded them) in `codec`, answering states with digest `answer`."""
    start: int
    end: int
    codec: str
    chunks: tuple[int, ...]
    all_outputs: bool
    inputs: torch.Tensor
    answer: bytes
    link: bytes
    setup: bytes = ZERO    # the session's adapter and deep prompts (transcript.setup_digest)

    @classmethod
    def of(cls, start: int, end: int, codec: str, chunks: list[int], all_outputs: bool, inputs: torch.Tensor,
           answer: torch.Tensor, setup: bytes = ZERO) -> StepRecord:
        """The record of a step (hashes the tensors: call it off the event loop for big ones)."""
        answer_hash = tensor_digest(answer)
        link = step_link(start, end, codec, chunks, all_outputs, tensor_digest(inputs), answer_hash, setup)
        return cls(start, end, codec, tuple(chunks), all_outputs, inputs, answer_hash, link, setup)


@dataclass(frozen=True)
class PassRecord:
    """One tuning pass as the client saw it (ADR 0183): its kind, blocks start..end, codec, and the
    digests of the inputs the server resolved, the output gradient (ZERO for a forward), the setup
    sent with it and the answer as the client resolved it; `link` is what the transcript extends by."""
    kind: str
    start: int
    end: int
    codec: str
    inputs: bytes
    grad: bytes
    setup: bytes
    answer: bytes
    link: bytes
    # kept for a pass to spot check (RemoteTuner check_passes): what the server decoded ("h" resolved,
    # "grad", "prompts", "lora_a", "lora_b"; "base": a delta forward's answer base) and what came back
    sent: dict[str, torch.Tensor] | None = None
    received: dict[str, torch.Tensor] | None = None

    @classmethod
    def of(cls, kind: str, start: int, end: int, codec: str, inputs: torch.Tensor, grad: torch.Tensor | None,
           setup: bytes, answer: torch.Tensor | dict[str, torch.Tensor], base: bytes = ZERO,
           sent: dict[str, torch.Tensor] | None = None) -> PassRecord:
        """The record of a pass (hashes the tensors: call it off the event loop; `base`: the digest of a
        delta forward's answer base); with `sent`, it keeps those tensors and the answer for a spot check."""
        digests = (tensor_digest(inputs), ZERO if grad is None else tensor_digest(grad),
                   grads_digest(answer) if isinstance(answer, dict) else tensor_digest(answer))
        link = pass_link(kind, start, end, codec, digests[0], digests[1], digests[2], setup, base)
        received = None if sent is None else (dict(answer) if isinstance(answer, dict) else {"h": answer})
        return cls(kind, start, end, codec, digests[0], digests[1], setup, digests[2], link, sent, received)


@dataclass(frozen=True)
class SignedReceipt:
    receipt: dict
    client_sig: bytes
    server_sig: bytes

    def payload(self) -> dict:
        """The `serve_receipt` transaction payload."""
        return {"receipt": dict(self.receipt), "client_sig": self.client_sig, "server_sig": self.server_sig}


class ReceiptBook:
    """The newest co-signed receipt of each session a server billed, and what it already claimed."""

    def __init__(self, limit: int = MAX_RECEIPTS):
        self.limit = limit
        self._lock = threading.Lock()
        self._latest: dict[bytes, SignedReceipt] = {}
        self._claimed: dict[bytes, int] = {}   # session -> seq claimed

    def record(self, signed: SignedReceipt) -> None:
        session = signed.receipt["session"]
        with self._lock:
            if len(self._latest) >= self.limit and session not in self._latest:
                done = [s for s, r in self._latest.items() if self._claimed.get(s) == r.receipt["seq"]]
                if not done:
                    raise BillingError("receipt book is full of unclaimed receipts")
                for s in done[: max(1, len(done) // 2)]:
                    self._latest.pop(s)
                    self._claimed.pop(s, None)
            self._latest[session] = signed

    def unclaimed(self) -> list[SignedReceipt]:
        with self._lock:
            return [r for s, r in self._latest.items() if self._claimed.get(s, 0) < r.receipt["seq"]]

    def mark_claimed(self, signed: SignedReceipt) -> None:
        with self._lock:
            session = signed.receipt["session"]
            self._claimed[session] = max(self._claimed.get(session, 0), signed.receipt["seq"])

    def total(self) -> int:
        with self._lock:
            return sum(r.receipt["amount"] for r in self._latest.values())


class DebtBook:
    """Tokens each client was served on streams that ended without a receipt covering them, so that
    opening a new stream does not renew a client's credit. Debts are forgotten after `ttl_s` (a
    stateless measurement costs a few tokens), and the book holds at most `limit` clients."""

    def __init__(self, ttl_s: float = 600.0, limit: int = 10_000, clock=time.monotonic):
        self.ttl_s, self.limit, self._clock = ttl_s, limit, clock
        self._lock = threading.Lock()
        self._debts: dict[str, list[tuple[float, int]]] = {}

    def owed(self, client: str) -> int:
        with self._lock:
            return sum(tokens for _, tokens in self._live(client))

    def add(self, client: str, tokens: int) -> None:
        if tokens <= 0:
            return
        with self._lock:
            entries = self._live(client)
            entries.append((self._clock(), tokens))
            self._debts[client] = entries[-64:]
            while len(self._debts) > self.limit:
                self._debts.pop(next(iter(self._debts)))

    def _live(self, client: str) -> list[tuple[float, int]]:
        cutoff = self._clock() - self.ttl_s
        return [(at, tokens) for at, tokens in self._debts.get(client, []) if at >= cutoff]


class ServerMeter:
    """The server's side of one stream's billing."""

    def __init__(self, identity, chain_id: str, model: str, client: str, price_per_gflop: int,
                 book: ReceiptBook, credit_tokens: int = DEFAULT_CREDIT_TOKENS, debts: DebtBook | None = None):
        if price_per_gflop < 1:
            raise ValueError("a billing server charges at least 1 per GFLOP")
        self.identity, self.chain_id, self.model, self.client = identity, chain_id, model, client
        self.price, self.book, self.credit_tokens = price_per_gflop, book, credit_tokens
        self.debts = debts if debts is not None else DebtBook()
        self.served = 0                        # tokens served on this stream
        self.session = secrets.token_bytes(16)
        self.transcript = ZERO
        self.reported = (0, 0, ZERO)           # tokens, flops, transcript last reported to the client
        self.signed: SignedReceipt | None = None

    def offer(self) -> dict:
        return {"session": self.session.hex(), "server": self.identity.peer_id, "chain_id": self.chain_id,
                "model": self.model, "price": self.price, "credit_tokens": self.credit_tokens}

    def signed_tokens(self) -> int:
        return self.signed.receipt["tokens"] if self.signed else 0

    def guard(self, tokens: int, incoming: int) -> None:
        """Refuse a request of `incoming` tokens that would leave more than `credit_tokens` served
        without a receipt (`tokens`: served so far)."""
        unsigned = tokens - self.signed_tokens() + incoming + self.debts.owed(self.client)
        if unsigned > self.credit_tokens:
            raise BillingError(f"{unsigned} tokens would be served without a receipt; "
                               f"send one (credit {self.credit_tokens})")

    def report(self, tokens: int, flops: int, link: bytes | None) -> dict:
        """Header fields of a compute reply: cumulative usage and transcript (`link`: an inference
        step's, ml/serve/transcript.py)."""
        if link is not None:
            self.transcript = extend(self.transcript, link)
        self.reported = (tokens, flops, self.transcript)
        self.served = tokens
        return {"usage": {"tokens": tokens, "flops": flops}, "transcript": self.transcript.hex()}

    def end(self) -> None:
        """The stream ended: what it served beyond its last receipt becomes the client's debt."""
        self.debts.add(self.client, self.served - self.signed_tokens())

    def accept(self, receipt_json: object, client_sig_hex: object) -> str:
        """Check a client's receipt against what this stream last reported; countersign and keep it."""
        receipt = receipt_from_json(receipt_json)
        tokens, flops, transcript = self.reported
        expected = {"session": self.session, "server": self.identity.peer_id, "client": self.client,
                    "model": self.model, "tokens": tokens, "flops": flops, "transcript": transcript}
        wrong = [name for name, value in expected.items() if receipt[name] != value]
        if wrong:
            raise BillingError(f"receipt disagrees with the served usage on {wrong}")
        if receipt["amount"] < amount_due(flops, self.price):
            raise BillingError(f"receipt amount {receipt['amount']} < {amount_due(flops, self.price)} due")
        last = self.signed.receipt if self.signed else None
        if last is not None and (receipt["seq"] <= last["seq"] or receipt["amount"] < last["amount"]):
            raise BillingError("receipt seq must grow and amount must not shrink")
        client_sig = _hex_sig(client_sig_hex)
        message = serve_receipt_signing_bytes(self.chain_id, receipt)
        key = public_key_for(self.client)
        if key is None or not verify_signature(key, message, client_sig):
            raise BillingError("receipt is not signed by this stream's client")
        signed = SignedReceipt(receipt, client_sig, self.identity.sign(message))
        self.book.record(signed)
        self.signed = signed
        return signed.server_sig.hex()


class ClientMeter:
    """The client's side of one stream's billing: check what the server reports, sign receipts."""

    def __init__(self, identity, chain_id: str, max_price_per_gflop: int, max_flops_per_token: int):
        self.identity, self.chain_id = identity, chain_id
        self.max_price, self.max_flops_per_token = max_price_per_gflop, max_flops_per_token
        self.offer: dict | None = None
        self.tokens = 0                         # tokens this client sent
        self.transcript = ZERO
        self.steps: list[StepRecord] = []       # every inference step, in order (evidence for disputes)
        self.passes: list[PassRecord] = []      # every tuning pass, in order (digests only, ADR 0183)
        # the session's adapter and deep prompts as the server decoded them ({"lora_a", "lora_b", "prompts"},
        # the tensors sent), which its links commit to (StepRecord.setup) and referees replay with (ADR 0178)
        self.setup: dict[str, torch.Tensor] = {}
        self.receipts: list[SignedReceipt] = []  # every countersigned receipt, in order
        self.seq = 0
        self.pending: dict | None = None        # the receipt to send with the next request
        self.sent: dict | None = None           # the receipt sent, awaiting the server's signature
        self.signed: SignedReceipt | None = None

    def accept_offer(self, offer: object, server: str) -> None:
        if not isinstance(offer, dict):
            raise BillingError("billing offer is a map")
        if offer.get("server") != server or offer.get("chain_id") != self.chain_id:
            raise BillingError("billing offer names another server or chain")
        price = offer.get("price")
        if type(price) is not int or not 1 <= price <= self.max_price:
            raise BillingError(f"server asks {price} per GFLOP, the client pays at most {self.max_price}")
        if not isinstance(offer.get("session"), str) or not isinstance(offer.get("model"), str):
            raise BillingError("billing offer lacks session or model")
        if self.offer is None:
            self.offer = offer

    def on_reply(self, header: dict, tokens: int, step: StepRecord | PassRecord | None) -> None:
        """Check a compute reply's usage (`tokens`: what this request sent) and prepare the receipt
        covering it (`step`: the inference step or tuning pass it answered, if any)."""
        self.tokens += tokens
        if self.offer is None:
            return
        usage = header.get("usage")
        if not isinstance(usage, dict) or usage.get("tokens") != self.tokens:
            raise BillingError(f"server reports usage {usage}, the client sent {self.tokens} tokens")
        flops = usage.get("flops")
        if type(flops) is not int or not 0 <= flops <= self.tokens * self.max_flops_per_token:
            raise BillingError(f"server reports {flops} FLOPs for {self.tokens} tokens")
        if step is not None:
            if isinstance(step, PassRecord):
                self.passes.append(step)
            else:
                self.steps.append(step)
            self.transcript = extend(self.transcript, step.link)
        self.seq += 1
        self.pending = {"session": bytes.fromhex(self.offer["session"]), "server": self.offer["server"],
                        "client": self.identity.peer_id, "model": self.offer["model"], "tokens": self.tokens,
                        "flops": flops, "amount": amount_due(flops, self.offer["price"]), "seq": self.seq,
                        "transcript": self.transcript}

    def attach(self) -> tuple[dict, bytes]:
        """Header fields carrying the pending receipt, and the client's signature (empty if none)."""
        if self.pending is None:
            return {}, b""
        receipt, self.pending = self.pending, None
        self.sent = receipt
        signature = self.identity.sign(serve_receipt_signing_bytes(self.chain_id, receipt))
        return {"receipt": receipt_to_json(receipt), "client_sig": signature.hex()}, signature

    def on_countersign(self, header: dict, client_sig: bytes) -> None:
        if self.sent is None or "server_sig" not in header:
            return
        server_sig = _hex_sig(header["server_sig"])
        message = serve_receipt_signing_bytes(self.chain_id, self.sent)
        key = public_key_for(self.sent["server"])
        if key is None or not verify_signature(key, message, server_sig):
            raise BillingError("server's countersignature does not verify")
        self.signed = SignedReceipt(self.sent, client_sig, server_sig)
        self.receipts.append(self.signed)
        self.sent = None


def spot_evidence(meter: ClientMeter, wrong_step: int) -> dict | None:
    """Evidence that the server answered inference step `wrong_step` of its stream wrongly: its
    countersigned receipt whose transcript ends at that step (sha256(prior || link)), the prior
    transcript, the step's link and answer digest, and the steps up to it (the inputs referees
    recompute from). None without such a receipt (the client kept signing each reply's receipt with
    its next request, so every step has one)."""
    if not 0 <= wrong_step < len(meter.steps):
        return None
    prior, signed = _covering(meter, [step.link for step in meter.steps], wrong_step)
    if signed is None:
        return None
    return {"receipt": receipt_to_json(signed.receipt), "client_sig": signed.client_sig.hex(),
            "server_sig": signed.server_sig.hex(), "prior": prior.hex(), "link": meter.steps[wrong_step].link.hex(),
            "answer": meter.steps[wrong_step].answer.hex(), "wrong_step": wrong_step,
            "steps": meter.steps[:wrong_step + 1], "setup": dict(meter.setup)}


def _covering(meter: ClientMeter, links: list[bytes], index: int) -> tuple[bytes, SignedReceipt | None]:
    """The transcript before link `index` and the countersigned receipt whose transcript ends at it."""
    prior = chain(links[:index])
    covered = extend(prior, links[index])
    return prior, next((r for r in meter.receipts if r.receipt["transcript"] == covered), None)


def pass_evidence(meter: ClientMeter, wrong_pass: int) -> dict | None:
    """Evidence that the server answered tuning pass `wrong_pass` of its stream wrongly (ADR 0183): its
    countersigned receipt whose transcript ends at that pass's link, the prior transcript, the link,
    and the pass (kind, codec, what the server decoded: referees recompute from it). None without
    such a receipt or without the pass's tensors (kept only for passes chosen to check)."""
    if not 0 <= wrong_pass < len(meter.passes) or meter.passes[wrong_pass].sent is None:
        return None
    prior, signed = _covering(meter, [record.link for record in meter.passes], wrong_pass)
    if signed is None:
        return None
    record = meter.passes[wrong_pass]
    return {"receipt": receipt_to_json(signed.receipt), "client_sig": signed.client_sig.hex(),
            "server_sig": signed.server_sig.hex(), "prior": prior.hex(), "link": record.link.hex(),
            "answer": record.answer.hex(), "wrong_pass": wrong_pass, "pass": record}
