"""The dispute game with byzantine parties, played on the real ledger (docs/adr/0170).

``DisputeGame`` is sans-I/O: ``moves(state)`` reads a replica's ledger state and returns the
transactions every party would send now; the simulator (or a test) signs them with fresh nonces
and submits them, again and again, until the chain shows them. Parties: an owner; three compute
workers running ``PROFILE`` (one cheats: its segments do not replay; it disputes anyway), six honest
verifiers, a false accuser (always says mismatch, evidence made up), a rubber stamp (always says
match, evidence made up), a silent verifier (never answers) and a decoy compute node that does not
run the profile (it must never take part). Verifiers answer as their kind says; honest workers
dispute every mismatch; referees vote as their kind says; the owner finalizes once every slot is
resolved. ``check(state)`` returns the violated invariants once the task is paid:

- no honest worker or verifier slashed; every honest worker paid its full share;
- the cheater slashed unless only rubber stamps audited it (the escape ADR 0169 prices; counted);
- a false accuser that answered an honest worker's slot slashed; a rubber stamp whose answer met
  another answer or referees slashed; the silent verifier neither slashed nor paid;
- the decoy never a worker, verifier or referee.
"""
from __future__ import annotations

import hashlib
from collections import Counter
from dataclasses import dataclass
from typing import Any

from consensus.genesis import Params
from consensus.state.answers import answer_commitment, vote_commitment
from consensus.state.audits import sealed
from consensus.state.records import TaskStatus
from consensus.state.store import LedgerState
from consensus.state.tasks import task_id_for
from node.identity import Identity

PROFILE = "cpu-x86-64-avx2/torch-2.13.0"
OTHER_PROFILE = "cuda-h100-cc9.0-cuda12.4/torch-2.13.0"
HONEST, CHEAT, FALSE_ACCUSER, RUBBER_STAMP, SILENT, DECOY, OWNER = (
    "honest", "cheat", "false_accuser", "rubber_stamp", "silent", "decoy", "owner")
PRICE = 1_000          # a worker bonded 3,000 may take pay up to 300 (stake >= 10x pay, ADR 0188)
SEGMENTS = 4
BALANCE = 1_000_000
WORKER_BOND, VERIFIER_BOND, BYZANTINE_BOND, DECOY_BOND = 3_000, 1_000, 2_500, 9_000   # byzantine: drawn often
GAME_PARAMS = {"audits_per_worker": 2, "audit_double_bps": 5_000, "audit_answer_s": 40, "dispute_s": 40,
               "referees": 5, "audit_window_s": 2, "task_min_s": 40, "task_slack_s": 0}
SPEC = {"model": "mlp-digits", "dataset": "digits", "hyperparams": {"steps": 40}, "workers": 3,
        "sync_mode": "allreduce", "codec": "int8", "price": PRICE, "profile": PROFILE, "segments": SEGMENTS}

Move = tuple[Identity, str, dict[str, Any]]


def honest_evidence(salt: bytes) -> bytes:
    """What every honest replay of a slot's segment yields (the simulator's stand-in for the gradients)."""
    return hashlib.sha256(b"dekube-sim/replay\x00" + salt).digest()


def made_up_evidence(salt: bytes, peer_id: str) -> bytes:
    """What a party that did not replay sends: its own guess, equal to nobody else's."""
    return hashlib.sha256(b"dekube-sim/guess\x00" + salt + peer_id.encode()).digest()


@dataclass(frozen=True)
class Party:
    identity: Identity
    kind: str
    role: str = ""         # compute | verifier | "" (the owner registers no node)
    bond: int = 0

    @property
    def peer_id(self) -> str:
        return self.identity.peer_id


def game_params(base: Params) -> Params:
    return Params(**{**base.__dict__, **GAME_PARAMS})


class DisputeGame:
    def __init__(self, seed: int) -> None:
        def party(name: str, kind: str, role: str = "", bond: int = 0) -> Party:
            identity = Identity.from_seed(hashlib.sha256(b"sim-game-%d-%s" % (seed, name.encode())).digest())
            return Party(identity, kind, role, bond)

        self.owner = party("owner", OWNER)
        self.parties = [self.owner, party("cheater", CHEAT, "compute", WORKER_BOND),
                        party("worker-a", HONEST, "compute", WORKER_BOND),
                        party("worker-b", HONEST, "compute", WORKER_BOND),
                        *(party(f"verifier-{i}", HONEST, "verifier", VERIFIER_BOND) for i in range(6)),
                        party("accuser", FALSE_ACCUSER, "verifier", BYZANTINE_BOND),
                        party("stamp", RUBBER_STAMP, "verifier", BYZANTINE_BOND),
                        party("silent", SILENT, "verifier", BYZANTINE_BOND),
                        party("decoy", DECOY, "compute", DECOY_BOND)]
        self.by_id = {p.peer_id: p for p in self.parties}
        self.task_id = task_id_for(self.owner.peer_id, 0)   # the owner's first transaction submits it

    @property
    def balances(self) -> dict[str, int]:
        return {p.peer_id: BALANCE for p in self.parties}

    def kind(self, peer_id: str) -> str:
        party = self.by_id.get(peer_id)
        return party.kind if party is not None else HONEST

    # ---- moves ---------------------------------------------------------------------------------

    def moves(self, state: LedgerState) -> list[Move]:
        """Every transaction the parties would send given ``state`` (resent until the chain shows it)."""
        out: list[Move] = []
        for p in self.parties:
            if not p.role:
                continue
            if p.peer_id not in state.nodes:
                profiles = [OTHER_PROFILE] if p.kind == DECOY else [PROFILE]
                out.append((p.identity, "register_node", {
                    "roles": [p.role], "listen_addrs": [], "relay_addrs": [],
                    "hardware": {"cpu_cores": 8, "ram_mb": 16_000, "gpu": "", "gpu_mem_mb": 0,
                                 "bandwidth_mbps": 1000, "profiles": profiles}}))
            stake = state.stakes.get(p.peer_id)
            if stake is None or (stake.bonded == 0 and not stake.slashed):
                out.append((p.identity, "bond", {"amount": p.bond}))
        if out:
            return out      # everyone registered and bonded first, so the draws see the whole cast
        task = state.tasks.get(self.task_id)
        if task is None:
            return [(self.owner.identity, "submit_task", dict(SPEC))]
        if task.status in TaskStatus.OPEN_FOR_COMMITS:
            return [self._commit(worker) for worker in task.workers if worker not in task.commits]
        if task.status not in TaskStatus.AUDITABLE:
            return []
        for slot in task.slots:
            if slot["outcome"] == "pending":
                out.extend(self._slot_moves(state.last_block_time_ms, slot))   # deadlines: block times
        if not out and all(slot["outcome"] != "pending" for slot in task.slots):
            out.append((self.owner.identity, "finalize", {"task_id": self.task_id}))
        return out

    def _commit(self, worker: str) -> Move:
        cheat = self.kind(worker) == CHEAT
        return (self.by_id[worker].identity, "commit_result", {
            "task_id": self.task_id, "segments_root": (b"\xcc" if cheat else b"\x11") * 32,
            "result_hash": (b"\xcd" if cheat else b"\x22") * 32, "segments": SEGMENTS})

    def _verdict_of(self, peer_id: str, slot: dict[str, Any]) -> tuple[bool, bytes] | None:
        """(match, evidence) as ``peer_id`` reports on ``slot``; None for a silent party."""
        kind, salt = self.kind(peer_id), slot["salt"]
        if kind == SILENT:
            return None
        if kind == FALSE_ACCUSER:
            return False, made_up_evidence(salt, peer_id)
        if kind == RUBBER_STAMP:
            return True, made_up_evidence(salt, peer_id)
        return self.kind(slot["worker"]) != CHEAT, honest_evidence(salt)

    def _slot_moves(self, now_ms: int, slot: dict[str, Any]) -> list[Move]:
        out: list[Move] = []
        base = {"task_id": self.task_id, "slot": slot["slot"]}
        if slot["referees"]:
            for entry in slot["referees"]:   # votes committed, then revealed (ADR 0210)
                verdict = self._verdict_of(entry["referee"], slot)
                if entry["vote"] is not None or verdict is None or entry["referee"] not in self.by_id:
                    continue
                identity = self.by_id[entry["referee"]].identity
                blinding = hashlib.sha256(b"vote" + identity.seed + self.task_id + bytes([slot["slot"]])).digest()
                vote = {**base, "match": verdict[0], "evidence": verdict[1], "blinding": blinding}
                if entry.get("commitment") is None and not slot.get("referee_reveal_deadline") \
                        and slot["referee_deadline"] > now_ms:
                    out.append((identity, "referee_commit", {**base, "commitment": vote_commitment(
                        self.task_id, slot["slot"], identity.peer_id, entry.get("panel", 0), verdict[0], verdict[1],
                        vote["blinding"])}))
                elif sealed(entry) and slot.get("referee_reveal_deadline", 0) > now_ms:
                    out.append((identity, "referee_vote", vote))
        elif slot["dispute_deadline"]:
            if slot["dispute"] is None:   # honest workers dispute a mismatch; the cheater tries its luck
                out.append((self.by_id[slot["worker"]].identity, "dispute", base))
        else:
            for entry in slot["verifiers"]:
                verdict = self._verdict_of(entry["verifier"], slot)
                if verdict is None or entry["verifier"] not in self.by_id or entry["answer"] is not None:
                    continue
                identity = self.by_id[entry["verifier"]].identity
                answer = {**base, "match": verdict[0], "evidence": verdict[1], "step": 0 if verdict[0] else 1,
                          "blinding": hashlib.sha256(identity.seed + self.task_id + bytes([slot["slot"]])).digest()}
                if entry.get("commitment") is None and entry["deadline"] > now_ms and not slot.get("reveal_deadline"):
                    out.append((identity, "audit_commit", {**base, "commitment": answer_commitment(
                        self.task_id, slot["slot"], identity.peer_id, answer["match"], answer["evidence"],
                        answer["step"], answer["blinding"])}))
                elif sealed(entry) and slot.get("reveal_deadline", 0) > now_ms:   # answers are committed first
                    out.append((identity, "audit_result", answer))
        return out

    # ---- invariants ----------------------------------------------------------------------------

    def finished(self, state: LedgerState) -> bool:
        task = state.tasks.get(self.task_id)
        return task is not None and task.status in TaskStatus.FINAL

    def stats(self, state: LedgerState) -> dict[str, int]:
        """What the run exercised: slot outcomes, referee panels, redraws, disputes, rubber-stamp escapes."""
        task = state.tasks.get(self.task_id)
        counts: Counter[str] = Counter()
        if task is None:
            return {}
        for slot in task.slots:
            counts[f"slot_{slot['outcome']}"] += 1
            counts["referee_panels"] += bool(slot["referees"])
            counts["disputes"] += slot["dispute"] is not None
            counts["honest_disputes"] += slot["dispute"] is not None and self.kind(slot["worker"]) == HONEST
            counts["redraws"] += sum(1 for v in slot["verifiers"] if v["redraw"])
            for v in slot["verifiers"]:
                counts[f"answers_{self.kind(v['verifier'])}"] += v["answer"] is not None
        counts["rubber_stamp_escapes"] = sum(1 for worker in task.commits
                                             if self.kind(worker) == CHEAT and self._only_stamped(task, worker))
        return dict(sorted(counts.items()))

    def _only_stamped(self, task: Any, worker: str) -> bool:
        return all(not slot["referees"] and all(self.kind(v["verifier"]) in (RUBBER_STAMP, SILENT)
                                                for v in slot["verifiers"])
                   for slot in task.slots if slot["worker"] == worker)

    def check(self, state: LedgerState, params: Params) -> list[str]:
        task = state.tasks.get(self.task_id)
        if task is None or task.status != TaskStatus.PAID:
            return [f"GAME: the task did not finish ({task.status if task else 'never submitted'})"]
        out = []
        worker_share = (PRICE - PRICE * params.verifier_share_bps // 10_000
                        - PRICE * params.relay_share_bps // 10_000) // len(task.workers)

        def slashed(peer_id: str) -> int:
            stake = state.stakes.get(peer_id)
            return stake.slashed if stake is not None else 0

        for p in self.parties:
            if p.kind == HONEST and slashed(p.peer_id):
                out.append(f"GAME: honest {p.role} {p.peer_id[-8:]} slashed {slashed(p.peer_id)}")
        for worker in task.workers:
            kind = self.kind(worker)
            if kind == HONEST and task.payouts.get(worker, 0) < worker_share:
                out.append(f"GAME: honest worker {worker[-8:]} paid {task.payouts.get(worker, 0)} < {worker_share}")
            if kind == CHEAT and not slashed(worker) and not self._only_stamped(task, worker):
                out.append(f"GAME: the cheater {worker[-8:]} was audited by more than rubber stamps, not slashed")
            if kind == CHEAT and task.payouts.get(worker, 0) >= worker_share and slashed(worker):
                out.append("GAME: the cheater was slashed and paid")
        for slot in task.slots:
            for v in slot["verifiers"]:
                kind, answered = self.kind(v["verifier"]), v["answer"] is not None
                others = [w for w in slot["verifiers"] if w is not v and w["answer"] is not None]
                if (kind == FALSE_ACCUSER and answered and self.kind(slot["worker"]) != CHEAT
                        and not slashed(v["verifier"])):
                    out.append(f"GAME: the false accuser went unslashed on slot {slot['slot']}")
                if kind == RUBBER_STAMP and answered and (others or slot["referees"]) and not slashed(v["verifier"]):
                    out.append(f"GAME: the rubber stamp went unslashed on slot {slot['slot']}")
        for p in self.parties:
            if p.kind == SILENT and (slashed(p.peer_id) or task.payouts.get(p.peer_id, 0)):
                out.append("GAME: the silent verifier was slashed or paid")
            if p.kind == DECOY and any(p.peer_id in (slot["worker"], *(v["verifier"] for v in slot["verifiers"]),
                                                     *(r["referee"] for r in slot["referees"]))
                                       for slot in task.slots):
                out.append("GAME: the decoy without the task's profile took part")
        if task.profile != PROFILE or task.segments != SEGMENTS:
            out.append(f"GAME: task profile/segments {task.profile!r}/{task.segments}")
        return out
