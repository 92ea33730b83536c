"""The verification protocol played in one process, many times: the real ledger (devtools/ledger_chain),
real training with per-segment records (ml.train.simulation.build_recorded, adversary modes from
ml/train/faults.py), and the node's own duty and judging code (ml/compute/duties.py,
ml/compute/verification_flow.py) -- only the network is replaced by in-memory lookups.

`run_task(scenario, seed)` trains one task with 3 workers, commits, lets every drawn verifier,
disputing worker and referee act block by block until the task is paid, and reports who was found
guilty, whose stake was slashed, and the compute spent on audits against the job's (CPU seconds and
replayed worker-steps). bench/verification.py runs the scenarios many times for the statistics the
devnet runs are too slow for.
"""
from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from consensus.genesis import Params
from consensus.state.tasks import task_id_for
from consensus.task_info import SlotOutcome, TaskInfo, TaskStatus
from devtools.ledger_chain import Chain, ident
from ml.compute.duties import AUDIT, DISPUTE, REFEREE_REVEAL, REVEAL, duties_for
from ml.compute.executor import task_signer
from ml.compute.segment_record import leaves, proof, root
from ml.compute.segments_protocol import SegmentAnswer
from ml.compute.task_spec import submit_payload, train_spec_for_task
from ml.compute.verification_flow import Sources, judge_as
from ml.profiles import default_profile
from ml.train.simulation import build_recorded, run_trainers
from ml.train.spec import TrainSpec
from node.artifacts.merkle import artifact_id_of_bytes

WORKERS = 3
VERIFIERS = 5
STAKE = 1_000
PRICE = 300          # pays each worker 85: its 1,000 bonded covers 10x that (ADR 0188)
MAX_BLOCKS = 400
LAB_PARAMS = dict(min_fee=0, task_min_s=40, task_slack_s=0, audit_window_s=4, audit_answer_s=6, dispute_s=4)
# Worker modes the lab plays itself (the rest are ml/train/faults.py modes the trainer plays): a copycat
# serves rank 0's records; a withholder trains honestly but serves no record until one of its slots is
# disputed (issue 24 item 3); framers record false receipts from every non-framer co-worker (ADR 0167),
# which carry no signature of their sender (ADR 0209).
LAB_MODES = ("copycat", "withhold", "frame")


@dataclass(frozen=True)
class Scenario:
    name: str
    worker_faults: dict[int, str] = field(default_factory=dict)     # worker rank -> fault mode
    verifier_faults: dict[int, str] = field(default_factory=dict)   # verifier index -> mode
    verifier_stakes: dict[int, int] = field(default_factory=dict)   # verifier index -> bonded stake


@dataclass
class RunResult:
    scenario: str
    seed: int
    adversaries: list[str]
    guilty: list[str]                  # workers with a guilty slot
    slashed: list[str]                 # parties whose stake went down
    contradicted: list[str]            # verifiers / referees whose answer the verdict contradicted
    drawn_adversary_verifier: bool
    paid: dict[str, int]
    job_cpu_s: float
    audit_cpu_s: float
    job_worker_steps: int
    replayed_worker_steps: int
    outcomes: list[str]
    faked_fraction: float = 0.0        # partial cheater: the fraction of its segments it faked
    workers: list[str] = field(default_factory=list)
    verifiers: list[str] = field(default_factory=list)

    @property
    def honest_slashed(self) -> list[str]:
        return [p for p in self.slashed if p not in self.adversaries]

    def cheater_paid(self, adversary_is_worker: bool = True) -> bool:
        """An adversary paid for its work: a worker paid at least half an honest co-worker's pay (workers
        also earn a little for judging), unless a partial cheater faked nothing this run; a verifier paid
        and not slashed."""
        if not adversary_is_worker:
            return any(self.paid.get(a, 0) > 0 and a not in self.slashed for a in self.adversaries)
        if self.scenario.startswith("partial_q") and not self.faked_fraction:
            return False
        honest = [self.paid.get(w, 0) for w in self.workers if w not in self.adversaries]
        share = min(honest, default=0) // 2
        return any(self.paid.get(a, 0) > max(share, 0) for a in self.adversaries)


class Party:
    def __init__(self, index: int, roles: list[str], mode: str = ""):
        self.identity = ident(index)
        self.peer_id = self.identity.peer_id
        self.roles = roles
        self.mode = mode


def _hardware(profile: str) -> dict:
    return {"cpu_cores": 2, "ram_mb": 8000, "gpu": "", "gpu_mem_mb": 0, "bandwidth_mbps": 100,
            "profiles": [profile]}


def run_task(scenario: Scenario, seed: int, spec: TrainSpec, params: Params | None = None) -> RunResult:
    """One task of `spec` under `scenario`; `seed` varies the chain (hence every draw) and the faults."""
    profile = default_profile("cpu")
    owner = Party(1, [])
    workers = [Party(10 + i, ["compute"]) for i in range(WORKERS)]
    verifiers = [Party(20 + i, ["verifier"], scenario.verifier_faults.get(i, "")) for i in range(VERIFIERS)]
    parties = workers + verifiers
    balances = {p.peer_id: 10**6 for p in [owner, *parties]}
    chain = Chain(balances, params=params or Params(**LAB_PARAMS), chain_id=f"dekube-lab-{seed}")
    for i, party in enumerate(parties):
        chain.ok(party.identity, "register_node", {"roles": party.roles, "listen_addrs": [], "relay_addrs": [],
                                                   "hardware": _hardware(profile)})
        stake = scenario.verifier_stakes.get(i - WORKERS, STAKE) if i >= WORKERS else STAKE
        chain.ok(party.identity, "bond", {"amount": stake})
    nonce = chain.ledger.nonce(owner.peer_id)
    chain.ok(owner.identity, "submit_task", submit_payload(spec, WORKERS, PRICE, profile))
    task_id = task_id_for(owner.peer_id, nonce)
    chain.block()
    doc = chain.ledger.task_info(task_id)
    ranked = sorted(TaskInfo.from_json(doc).workers)
    by_peer = {p.peer_id: p for p in parties}
    for rank, peer in enumerate(ranked):
        by_peer[peer].mode = scenario.worker_faults.get(rank, "")
    stakes_before = {p.peer_id: chain.ledger.state.stakes[p.peer_id].bonded for p in parties}

    signers = {p: task_signer(by_peer[p].identity, task_id) for p in ranked}   # signed receipts (ADR 0209)
    trainers, sink = build_recorded(spec, WORKERS, {r: by_peer[p].mode for r, p in enumerate(ranked)
                                                    if by_peer[p].mode not in ("", *LAB_MODES)}, fault_seed=seed,
                                  names=ranked, signers=signers)
    cpu0 = time.process_time()
    asyncio.run(run_trainers(trainers))
    job_cpu = time.process_time() - cpu0
    served: dict[str, tuple[str, list]] = {}
    for rank, peer in enumerate(ranked):
        source = 0 if by_peer[peer].mode == "copycat" and rank != 0 else rank
        recorder = trainers[source].recorder
        assert recorder is not None   # build_recorded attached one to every trainer
        records = recorder.records
        if by_peer[peer].mode == "frame":
            records = _framed(records, {p for p in ranked if by_peer[p].mode != "frame"})
        served[peer] = (ranked[source], records)
    for rank, peer in enumerate(ranked):
        leaf_worker, records = served[peer]
        weights = artifact_id_of_bytes(trainers[rank].weights_bytes())
        chain.ok(by_peer[peer].identity, "commit_result", {
            "task_id": task_id, "segments_root": root(leaves(task_id, leaf_worker, records)),
            "result_hash": bytes.fromhex(weights), "segments": len(records)})

    tmp = tempfile.TemporaryDirectory(prefix="dekube-lab-")
    folder = Path(tmp.name)

    async def record(worker: str, index: int, segments: int) -> SegmentAnswer:
        if by_peer[worker].mode == "withhold" and not _disputed(chain.ledger.task_info(task_id), worker):
            raise OSError("withheld")
        leaf_worker, records = served[worker]
        leaf_list = leaves(task_id, leaf_worker, records)[:segments]   # under the commitment asked (ADR 0230)
        return SegmentAnswer(records[index], proof(leaf_list, index), len(leaf_list))

    async def artifact(artifact_id: str, holders: list[str]) -> Path:
        path = folder / artifact_id
        if not path.exists():
            path.write_bytes(sink.blobs[artifact_id])
        return path

    sources = Sources(record, artifact, {})
    train_spec = train_spec_for_task(dict(TaskInfo.from_json(doc).spec))
    audit_cpu, replayed, done = 0.0, 0, set()
    try:
        for _ in range(MAX_BLOCKS):
            task = TaskInfo.from_json(chain.ledger.task_info(task_id))
            if task.status in (TaskStatus.PAID, TaskStatus.FAILED):   # failed: every worker found guilty (ADR 0187)
                break
            next_time = chain.ledger.state.last_block_time_ms + chain.block_ms   # deadlines are block times
            txs = []
            for party in parties:
                for duty in duties_for(task, party.peer_id, next_time):
                    if (party.peer_id, duty.key) in done or duty.kind in (REVEAL, REFEREE_REVEAL):   # chain.reveals
                        continue
                    done.add((party.peer_id, duty.key))
                    if duty.kind == DISPUTE:
                        txs.append(chain.tx(party.identity, "dispute", {"task_id": task_id, "slot": duty.slot}))
                        continue
                    mode = party.mode if party.mode in ("false_accuser", "rubber_stamp") else ""
                    cpu0 = time.process_time()
                    judgement = asyncio.run(judge_as(mode, task, train_spec, duty.worker, duty.segment, duty.salt,
                                                     sources, task.slot_commit(task.slots[duty.slot])))
                    audit_cpu += time.process_time() - cpu0
                    if not mode:
                        replayed += train_spec.steps_in_segment(duty.segment)
                    if duty.kind == AUDIT:   # committed now, revealed once the slot's reveals open (ADR 0202)
                        txs.append(chain.seal(party.identity, task_id, duty.slot, judgement.match,
                                              judgement.evidence, judgement.step))
                    else:   # a referee's vote: committed now, revealed once the slot's votes open (ADR 0210)
                        txs.append(chain.seal_vote(party.identity, task_id, duty.slot, judgement.match,
                                                   judgement.evidence))
            result = chain.block(txs + chain.reveals(task_id))
            for receipt in result.receipts:
                if receipt.code != 0:
                    raise AssertionError(f"lab tx failed: {receipt}")
            if TaskInfo.from_json(chain.ledger.task_info(task_id)).status in TaskStatus.AUDITABLE:
                chain.block([chain.tx(owner.identity, "finalize", {"task_id": task_id})])
        else:
            raise AssertionError(f"task not settled after {MAX_BLOCKS} blocks: {chain.ledger.task_info(task_id)}")
    finally:
        tmp.cleanup()
    doc = chain.ledger.task_info(task_id)
    stakes_after = {p.peer_id: chain.ledger.state.stakes[p.peer_id].bonded for p in parties}
    final = TaskInfo.from_json(doc)
    slots = final.slots
    guilty = sorted({s.worker for s in slots if s.outcome == SlotOutcome.GUILTY})
    contradicted = sorted(set(doc.get("contradicted") or []))
    adversaries = sorted(p.peer_id for p in parties if p.mode)
    adversary_verifiers = {p.peer_id for p in verifiers if p.mode}
    drawn = any(v.verifier in adversary_verifiers for s in slots for v in s.verifiers)
    return RunResult(
        scenario.name, seed, adversaries, guilty,
        sorted(p for p in stakes_before if stakes_after[p] < stakes_before[p]), contradicted, drawn,
        dict(final.payouts), job_cpu, audit_cpu,
        spec.steps * WORKERS, replayed,
        [s.outcome for s in slots], _faked_fraction(trainers, spec), ranked, [v.peer_id for v in verifiers])


def _framed(records: list, victims: set[str]) -> list:
    """`records` with every receipt from a victim replaced by a digest of bytes it never sent (the victim's
    signature, of the bytes it did send, stays: a framer cannot sign for the victim)."""
    def lie(receipt):
        if receipt.sender not in victims:
            return receipt
        return dataclasses.replace(receipt, digest=hashlib.sha256(b"framed" + receipt.digest.encode()).hexdigest())
    return [dataclasses.replace(r, received=tuple(tuple(lie(x) for x in step) for step in r.received))
            for r in records]


def _disputed(doc: dict, worker: str) -> bool:
    """Whether one of `worker`'s slots is disputed (the withholder serves the referees)."""
    return any(s["worker"] == worker and (s.get("dispute") or s.get("referees")) for s in doc.get("slots") or [])


def _faked_fraction(trainers, spec: TrainSpec) -> float:
    for trainer in trainers:
        fault = getattr(trainer, "fault", None)
        if fault is not None and fault.q:
            return sum(fault.fake_segment(i) for i in range(spec.segment_count)) / spec.segment_count
    return 0.0


def lab_spec(steps: int = 200, segment_steps: int = 10) -> TrainSpec:
    """The lab's default job: the digits MLP, data-parallel, fp32."""
    return TrainSpec(steps=steps, segment_steps=segment_steps, report_every=steps, batch_size=32)


def digest(result: RunResult) -> str:
    """A short fingerprint of a run's outcome (for determinism checks)."""
    text = repr((result.guilty, result.slashed, result.outcomes, sorted(result.paid.items())))
    return hashlib.sha256(text.encode()).hexdigest()[:16]
