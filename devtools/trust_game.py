"""Issue 24's adversaries that know the protocol, played on the real ledger (devtools/ledger_chain.py):
a grinding proposer with colluding verifiers and referees, unbonders, a raw client sending a
profile-less task to a mixed crew, and a copier verifier. The parties' judgements are what a replay
would say (a faked segment mismatches, an honest one matches): these adversaries attack the ledger's
rules (draws, stake holds, schemas, commit-reveal), not the replay, which the verification lab
(devtools/verification_lab.py) plays for real. bench/verification.py runs them with the lab's.

`play(name, seed)` runs one task and returns an `Outcome`: whether the adversary was caught (slashed,
or its transaction refused), the honest parties slashed, and whether the cheater was paid.
"""
from __future__ import annotations

import copy
import hashlib
from dataclasses import dataclass, field

from consensus.genesis import Params
from consensus.state.tasks import task_id_for
from consensus.tx import _SIGNATURE_SUFFIX, SIGN_DOMAIN, unsigned_body
from consensus.txcodes import TxCode
from devtools.ledger_chain import Chain, ident
from node.identity import Identity

PROFILE = "cpu-x86-64-avx2/torch-2.13.0"
SEGMENTS = 4
PRICE = 10_000
MATCH, MISMATCH = b"\xe0" * 32, b"\xf0" * 32      # the evidence of an honest / a contradicting replay
SPEC = {"model": "mlp", "dataset": "digits", "hyperparams": {"steps": 40}, "workers": 3, "sync_mode": "allreduce",
        "codec": "int8", "price": PRICE}
GRIND_TRIES = 24
MAX_BLOCKS = 300
OWNER = ident(1)
WORKERS = [ident(2), ident(3), ident(4)]
VERIFIERS = [ident(i) for i in range(5, 13)]
NATIVES = [ident(i) for i in range(13, 16)]        # native kernels: no profile published
CHEATER = WORKERS[2]
COLLUDERS = VERIFIERS[:2]                           # a verifier and a referee on the cheater's side


def game_params(**overrides) -> Params:
    base = {"task_min_s": 12, "task_slack_s": 0, "audit_window_s": 2, "min_fee": 0, "audits_per_worker": 2,
            "audit_double_bps": 5000, "audit_answer_s": 8, "dispute_s": 3, "referees": 3, "stake_cover_bps": 0,
            "beacon_delay": 2, "audit_reveal_s": 4, "max_audit_share_bps": 10_000}   # payouts without surcharge
    return Params(**{**base, **overrides})


@dataclass
class Outcome:
    caught: bool
    honest_slashed: list[str]
    cheater_paid: bool
    engaged: bool = True          # the adversary got to act (drawn where it must be drawn to cheat)


@dataclass
class Game:
    """One task and the parties' policies: who fakes which segments, who colludes, who copies."""
    chain: Chain
    task_id: bytes
    faked: dict[str, set[int]] = field(default_factory=dict)      # worker -> segments it faked
    colluders: set[str] = field(default_factory=set)               # say "match" for the cheater, always
    accusers: set[str] = field(default_factory=set)                # say "mismatch" for everyone, always
    copiers: set[str] = field(default_factory=set)                 # commit the first verifier's commitment
    grinder: bool = False         # the proposer grinds every block that carries a transaction

    def truth(self, slot: dict) -> bool:
        return slot["segment"] not in self.faked.get(slot["worker"], set())

    def says(self, who: str, slot: dict) -> bool:
        if who in self.accusers:
            return False
        if who in self.colluders and slot["worker"] in self.faked:
            return True
        return self.truth(slot)


def _identity(peer: str) -> Identity:
    return next(i for i in [OWNER, *WORKERS, *VERIFIERS, *NATIVES] if i.peer_id == peer)


def _register(chain: Chain, who: Identity, role: str, bond: int, profiles=(PROFILE,)) -> None:
    chain.ok(who, "register_node", {"roles": [role], "listen_addrs": [], "relay_addrs": [],
                                    "hardware": {"cpu_cores": 4, "ram_mb": 8000, "gpu": "", "gpu_mem_mb": 0,
                                                 "bandwidth_mbps": 100, "profiles": list(profiles)}})
    chain.ok(who, "bond", {"amount": bond})


def setup(seed: int, stakes: dict[str, int] | None = None, natives: bool = False, **overrides) -> Chain:
    """A chain (its id varies with `seed`, hence every draw) with the workers and verifiers registered."""
    people = [OWNER, *WORKERS, *VERIFIERS, *NATIVES]
    chain = Chain({p.peer_id: 1_000_000 for p in people}, params=game_params(**overrides),
                  chain_id=f"dekube-trust-{seed}")
    stakes = stakes or {}
    for who in WORKERS:
        _register(chain, who, "compute", stakes.get(who.peer_id, 3_000))
    for who in VERIFIERS:
        _register(chain, who, "verifier", stakes.get(who.peer_id, 1_000))
    if natives:
        for who in NATIVES:
            _register(chain, who, "compute", 50_000, profiles=())
    return chain


def submit(chain: Chain, payload: dict | None = None) -> bytes:
    nonce = chain.ledger.nonce(OWNER.peer_id)
    chain.ok(OWNER, "submit_task", payload or {**SPEC, "profile": PROFILE, "segments": SEGMENTS})
    return task_id_for(OWNER.peer_id, nonce)


def _commit_tx(chain: Chain, who: Identity, task_id: bytes):
    return chain.tx(who, "commit_result", {"task_id": task_id, "segments_root": b"\x11" * 32,
                                           "result_hash": b"\x22" * 32, "segments": SEGMENTS})


def _score(game: Game, chain: Chain) -> int:
    """How well a candidate chain's draws suit the cheater: its slots that spare it, colluding referees."""
    task = chain.ledger.state.tasks[game.task_id]
    score = 0
    for slot in task.slots:
        if slot["worker"] not in game.faked:
            continue
        verifiers = {v["verifier"] for v in slot["verifiers"]}
        score += 2 * (game.truth(slot) or verifiers <= game.colluders)
        score += sum(r["referee"] in game.colluders for r in slot.get("referees") or [])
    return score


def _pending_draw(chain: Chain, task_id: bytes) -> bool:
    return any(slot.get("draw") for slot in chain.ledger.state.tasks[task_id].slots)


def _block(game: Game, txs: list) -> None:
    """The next block; a grinding proposer tries GRIND_TRIES block times and orders for it and the blocks
    up to the draws it schedules, and keeps the candidate chain that suits the cheater best."""
    chain = game.chain
    if not game.grinder or not txs:
        _check(chain.block(txs))
        return
    best, best_score = None, -1
    for i in range(GRIND_TRIES):
        candidate = copy.deepcopy(chain)
        candidate.block_ms = chain.block_ms + 37 * i
        if _failed(candidate.block(_reordered(txs, i))):
            continue              # a time past one of the transactions' deadlines: not a candidate
        candidate.block_ms = chain.block_ms + 11 * i   # and the times of the blocks up to the draw
        while _pending_draw(candidate, game.task_id):
            candidate.block()
        score = _score(game, candidate)
        if score > best_score:
            best, best_score = candidate, score
    assert best is not None
    best.block_ms = chain.block_ms
    game.chain = best


def _reordered(txs: list, salt: int) -> list:
    """`txs` with the senders in another order (each sender's own stay in nonce order)."""
    senders = sorted({t.sender for t in txs}, key=lambda s: hashlib.sha256(f"{salt}{s}".encode()).digest())
    return [t for sender in senders for t in txs if t.sender == sender]


def _failed(result) -> list:
    return [r for r in result.receipts if r.code != TxCode.OK
            and not (r.code == TxCode.BAD_STATE and "is resolved" in r.log)]   # a vote after the verdict


def _check(result) -> None:
    failed = _failed(result)
    if failed:
        raise AssertionError(f"trust game tx failed: {failed}")


def _actions(game: Game) -> list:
    """Every party's transactions for the next block: commits, copies, reveals, disputes, votes, finalize."""
    chain, task_id = game.chain, game.task_id
    task = chain.ledger.state.tasks[task_id]
    txs = []
    for slot in task.slots:
        if slot["outcome"] != "pending" or slot.get("draw"):
            continue
        committed = [v for v in slot["verifiers"] if v.get("commitment") is not None]
        for v in slot["verifiers"]:
            who = v["verifier"]
            if v.get("commitment") is not None or v.get("unrevealed") or slot.get("reveal_deadline"):
                continue
            if who in game.copiers:
                if committed and committed[0]["verifier"] != who:   # all it can see: another's hash
                    txs.append(chain.tx(_identity(who), "audit_commit", {
                        "task_id": task_id, "slot": slot["slot"], "commitment": committed[0]["commitment"]}))
                continue
            match = game.says(who, slot)
            txs.append(chain.seal(_identity(who), task_id, slot["slot"], match, MATCH if match else MISMATCH,
                                  0 if match else 1))
        if slot.get("dispute_deadline") and not slot.get("dispute") and not slot.get("referees"):
            txs.append(chain.tx(_identity(slot["worker"]), "dispute", {"task_id": task_id, "slot": slot["slot"]}))
        for r in slot.get("referees") or []:
            if r.get("vote") is None and r.get("commitment") is None and not slot.get("referee_reveal_deadline"):
                match = game.says(r["referee"], slot)
                txs.append(chain.seal_vote(_identity(r["referee"]), task_id, slot["slot"], match,
                                           MATCH if match else MISMATCH))
    reveals = [t for t in chain.reveals(task_id)
               if t.sender not in game.copiers]                     # a copier holds nothing it can open
    return txs + reveals


def settle(game: Game) -> None:
    """Blocks until the task is paid (or failed), each party acting as its policy says."""
    for _ in range(MAX_BLOCKS):
        doc = game.chain.ledger.task_info(game.task_id)
        if doc["status"] in ("paid", "failed"):
            return
        txs = _actions(game) or _finalize(game.chain, game.task_id)
        _block(game, txs)
        game.chain.nonces.clear()
    raise AssertionError(f"task not settled: {game.chain.ledger.task_info(game.task_id)}")


def _finalize(chain: Chain, task_id: bytes) -> list:
    """The owner's finalize once every slot is resolved (none while one is pending)."""
    task = chain.ledger.state.tasks[task_id]
    if chain.ledger.task_info(task_id)["status"] not in ("verified", "committed", "disputed") \
            or any(slot["outcome"] == "pending" for slot in task.slots):
        return []
    return [chain.tx(OWNER, "finalize", {"task_id": task_id})]


def _slashed(chain: Chain, peer: str) -> int:
    return chain.ledger.stake_info(peer)["slashed"]


def _outcome(game: Game, cheaters: set[str]) -> Outcome:
    """Caught: every cheater slashed; honest: everyone neither cheating nor colluding."""
    chain = game.chain
    payouts = chain.ledger.state.tasks[game.task_id].payouts
    honest = [p.peer_id for p in [*WORKERS, *VERIFIERS] if p.peer_id not in cheaters | game.colluders]
    worker_ids = {w.peer_id for w in WORKERS}
    # workers also earn a little for judging: a cheating worker is paid when it gets half an honest one's pay
    share = min([payouts.get(w, 0) for w in worker_ids - cheaters], default=0) // 2
    return Outcome(caught=all(_slashed(chain, c) > 0 for c in cheaters),
                   honest_slashed=[p for p in honest if _slashed(chain, p) > 0],
                   cheater_paid=any(payouts.get(c, 0) > (0 if c not in worker_ids else share) for c in cheaters))


def grinding_proposer(seed: int, grinder: bool = True) -> Outcome:
    """A proposer that makes every block grinds the times and transaction orders of those that carry a
    transaction (the closing commit, answers, disputes, votes) and of the blocks up to the draws they
    schedule, for a worker that faked 3 of its 4 segments, with a colluding verifier and referee at
    ordinary stake. On this one-validator chain it knows every future beacon: it holds every proposer
    slot, beyond ADR 0202's assumption. `grinder=False`: the same parties on an honest proposer's chain
    (the catch rate the audit gives anyway)."""
    chain = setup(seed)
    task_id = submit(chain)
    game = Game(chain, task_id, faked={CHEATER.peer_id: {1, 2, 3}}, colluders={c.peer_id for c in COLLUDERS},
                grinder=grinder)
    chain.block([_commit_tx(chain, w, task_id) for w in WORKERS[:2]])
    _block(game, [_commit_tx(game.chain, CHEATER, task_id)])
    settle(game)
    return _outcome(game, {CHEATER.peer_id})


def unbonder_worker(seed: int) -> Outcome:
    """A worker that faked every segment unbonds all its stake before committing."""
    chain = setup(seed, unbonding_period=6, evidence_max_age=5, serve_dispute_window=4, serve_referee_s=1,
                  dispute_blocks=1, referee_rounds=1)
    task_id = submit(chain)
    chain.ok(CHEATER, "unbond", {"amount": chain.ledger.stake_info(CHEATER.peer_id)["bonded"]})
    game = Game(chain, task_id, faked={CHEATER.peer_id: set(range(SEGMENTS))})
    chain.block([_commit_tx(chain, w, task_id) for w in WORKERS])
    settle(game)
    return _outcome(game, {CHEATER.peer_id})


def unbonder_accuser(seed: int) -> Outcome:
    """A verifier with a large stake accuses every worker it audits and unbonds right after answering."""
    accuser = VERIFIERS[0]
    chain = setup(seed, stakes={accuser.peer_id: 20_000}, unbonding_period=6, evidence_max_age=5,
                  serve_dispute_window=4, serve_referee_s=1, dispute_blocks=1, referee_rounds=1)
    task_id = submit(chain)
    game = Game(chain, task_id, accusers={accuser.peer_id})
    chain.block([_commit_tx(chain, w, task_id) for w in WORKERS])
    unbonded = False
    for _ in range(MAX_BLOCKS):
        doc = chain.ledger.task_info(task_id)
        if doc["status"] in ("paid", "failed"):
            break
        answered = any(v["verifier"] == accuser.peer_id and v.get("commitment") is not None
                       for s in chain.ledger.state.tasks[task_id].slots for v in s["verifiers"])
        txs = _actions(game)
        if answered and not unbonded:
            txs.append(chain.tx(accuser, "unbond", {"amount": chain.ledger.stake_info(accuser.peer_id)["bonded"]}))
            unbonded = True
        _block(game, txs or _finalize(chain, task_id))
    drawn = any(v["verifier"] == accuser.peer_id for s in chain.ledger.state.tasks[task_id].slots
                for v in s["verifiers"])
    out = _outcome(game, {accuser.peer_id})
    out.engaged = drawn      # never drawn: it accused nobody and is caught by nothing
    return out


def profileless_task(seed: int) -> Outcome:
    """A raw client sends submit_task without a profile to a crew of portable and native nodes (its own
    signed bytes: the client library refuses to build it); then a task with the profile is worked."""
    chain = setup(seed, natives=True)
    payload = {**SPEC, "segments": SEGMENTS, "price": PRICE + seed}
    nonce = chain.ledger.nonce(OWNER.peer_id)
    body = unsigned_body(chain.chain_id, OWNER.peer_id, nonce, "submit_task", payload, 0)
    raw = b"\x07\x08" + body[2:] + _SIGNATURE_SUFFIX + OWNER.sign(SIGN_DOMAIN + body)
    refused = all(r.code != TxCode.OK for r in chain.block([raw]).receipts)   # the ledger's own check
    accepted_id = task_id_for(OWNER.peer_id, nonce)
    mixed = accepted_id in chain.ledger.state.tasks
    task_id = submit(chain)
    game = Game(chain, task_id)
    task = chain.ledger.state.tasks[task_id]
    native_ids = {n.peer_id for n in NATIVES}
    chain.block([_commit_tx(chain, _identity(w), task_id) for w in task.workers])
    settle(game)
    judges = {v["verifier"] for s in task.slots for v in s["verifiers"]}
    crew_mixed = bool(native_ids & (set(task.workers) | judges))
    out = _outcome(game, set())
    return Outcome(caught=refused and not mixed and not crew_mixed, honest_slashed=out.honest_slashed,
                   cheater_paid=mixed)


def copier(seed: int) -> Outcome:
    """A verifier with a large stake never replays: it commits the first verifier's commitment as its own."""
    lazy = VERIFIERS[0]
    chain = setup(seed, stakes={lazy.peer_id: 20_000}, audit_double_bps=10_000)
    task_id = submit(chain)
    game = Game(chain, task_id, copiers={lazy.peer_id})
    chain.block([_commit_tx(chain, w, task_id) for w in WORKERS])
    settle(game)
    task = chain.ledger.state.tasks[task_id]
    copied = any(v["verifier"] == lazy.peer_id and v.get("commitment") is not None
                 for s in task.slots for v in s["verifiers"])
    out = _outcome(game, {lazy.peer_id})
    out.engaged = copied     # never drawn after another verifier: it copied nothing
    return out


def honest_proposer(seed: int) -> Outcome:
    """The grinding proposer's parties on an honest proposer's chain."""
    return grinding_proposer(seed, grinder=False)


GAMES = {"grinding_proposer": grinding_proposer, "grinding_baseline": honest_proposer,
         "unbonder_worker": unbonder_worker, "unbonder_accuser": unbonder_accuser,
         "profileless_task": profileless_task, "copier": copier}


def play(name: str, seed: int) -> Outcome:
    return GAMES[name](seed)
