"""The compute node's side of availability challenges (docs/adr/0207), against the real ledger: a worker
whose verifiers could not fetch its record answers the challenge from the records it serves, and a
verifier asked again learns to judge afresh."""
import asyncio

from consensus.genesis import Params
from consensus.state.epochs import unavailable_evidence
from consensus.state.ledger import task_json
from consensus.state.tasks import task_id_for
from consensus.task_info import TaskInfo
from consensus.txcodes import TxCode
from devtools.ledger_chain import Chain, ident
from ml.compute.availability_duty import Reasks, answer_challenges, challenges_for, keys
from ml.compute.duties import Duty
from ml.compute.sealed_answers import SealedAnswers
from ml.compute.segment_record import SegmentRecord, StepHashes, leaves, proof, root
from ml.compute.segments_protocol import SegmentAnswer
from ml.compute.verification_flow import Judgement
from node.ledger import TxFailed

OWNER, W1, W2 = ident(1), ident(2), ident(3)
VERIFIERS = [ident(i) for i in range(4, 8)]
PROFILE = "cpu-x86-64-avx2/torch-2.13.0"
SEGMENTS = 4
HONEST = b"\xe0" * 32


def _records():
    return [SegmentRecord(i, f"{i:02x}" * 32, "ab" * 32, "cd" * 32, (StepHashes("ef" * 32, "ef" * 32, "ef" * 32),),
                          "12" * 32) for i in range(SEGMENTS)]


def _chain_with_a_challenge():
    params = Params(task_min_s=12, task_slack_s=0, audit_window_s=2, min_fee=0, audits_per_worker=1,
                    audit_double_bps=0, audit_answer_s=30, dispute_s=30, referees=3, stake_cover_bps=0,
                    beacon_delay=2)
    chain = Chain(params=params, balances={ident(i).peer_id: 1_000_000 for i in range(1, 10)})
    hardware = {"cpu_cores": 4, "ram_mb": 8000, "gpu": "", "gpu_mem_mb": 0, "bandwidth_mbps": 100,
                "profiles": [PROFILE]}
    for who, role in [(W1, "compute"), (W2, "compute"), *((v, "verifier") for v in VERIFIERS)]:
        chain.ok(who, "register_node", {"roles": [role], "listen_addrs": [], "relay_addrs": [], "hardware": hardware})
        chain.ok(who, "bond", {"amount": 2000})
    nonce = chain.ledger.nonce(OWNER.peer_id)
    chain.ok(OWNER, "submit_task", {"model": "mlp", "dataset": "digits", "hyperparams": {"steps": 40}, "workers": 2,
                                    "sync_mode": "allreduce", "codec": "int8", "price": 10_000, "profile": PROFILE,
                                    "segments": SEGMENTS})
    task_id = task_id_for(OWNER.peer_id, nonce)
    served = {who.peer_id: leaves(task_id, who.peer_id, _records()) for who in (W1, W2)}
    chain.block([chain.tx(who, "commit_result", {"task_id": task_id, "segments_root": root(served[who.peer_id]),
                                                 "result_hash": b"\x22" * 32, "segments": SEGMENTS})
                 for who in (W1, W2)])
    task = chain.ledger.state.tasks[task_id]
    while not task.slots or any(slot.get("draw") for slot in task.slots):
        chain.block()
    slot = next(s for s in task.slots if s["worker"] == W1.peer_id)
    verifier = next(v for v in (W2, *VERIFIERS) if v.peer_id == slot["verifiers"][0]["verifier"])
    chain.block([chain.seal(verifier, task_id, slot["slot"], False, unavailable_evidence(slot["salt"]), 0)])
    chain.reveal_all(task_id)
    assert slot["challenge"]["deadline"]
    return chain, task_id, task, slot, verifier, served


def _doc(chain, task_id, task):
    return TaskInfo.from_json(task_json(task_id, task, 1000 * chain.ledger.height))


def _record_for(served):
    def record_for(task_id, index, segments):
        return SegmentAnswer(_records()[index], proof(served, index), len(served))
    return record_for


def _sender(chain, who):
    async def send(tx_type, payload):
        receipt = chain.block([chain.tx(who, tx_type, payload)]).receipts[0]
        if receipt.code != TxCode.OK:
            raise TxFailed(tx_type, receipt.log, receipt.code.name)
    return send


def test_the_worker_answers_its_challenge_and_its_verifier_judges_afresh():
    chain, task_id, task, slot, verifier, served = _chain_with_a_challenge()
    doc = _doc(chain, task_id, task)
    now = doc.block_time_ms
    [challenge] = challenges_for(doc, W1.peer_id, now)
    assert (challenge.slot, challenge.segment) == (slot["slot"], slot["segment"])
    assert challenges_for(doc, W2.peer_id, now) == [] and challenges_for(doc, W1.peer_id, challenge.deadline + 1) == []
    reasks = Reasks()
    assert reasks.forget(doc, verifier.peer_id) == []
    answered: set = set()
    sent = asyncio.run(answer_challenges(doc, W1.peer_id, now, W1.peer_id, _record_for(served[W1.peer_id]),
                                         _sender(chain, W1), answered))
    assert sent == 1 and answered == {(task_id.hex(), slot["slot"])}
    assert not slot["challenge"]["deadline"] and slot["verifiers"][0]["answer"] is None   # the ledger took it
    # the same document again: nothing sent twice
    assert asyncio.run(answer_challenges(doc, W1.peer_id, now, W1.peer_id, _record_for(served[W1.peer_id]),
                                         _sender(chain, W1), answered)) == 0
    doc = _doc(chain, task_id, task)
    assert reasks.forget(doc, verifier.peer_id) == [(task_id.hex(), slot["slot"])]
    assert reasks.forget(doc, verifier.peer_id) == []   # once per re-ask
    assert keys(task_id.hex(), slot["slot"]) == [("audit", task_id.hex(), slot["slot"]),
                                                 ("reveal", task_id.hex(), slot["slot"])]
    chain.block([chain.seal(verifier, task_id, slot["slot"], True, HONEST, 0)])
    chain.reveal_all(task_id)
    assert slot["outcome"] == "ok"


def test_a_refused_response_is_retried_and_a_missing_record_is_not_sent():
    chain, task_id, task, slot, verifier, served = _chain_with_a_challenge()
    doc = _doc(chain, task_id, task)
    now = doc.block_time_ms
    answered: set = set()
    # records of another worker do not prove our root: the ledger refuses, the duty stays open
    wrong = _record_for(served[W2.peer_id])
    assert asyncio.run(answer_challenges(doc, W1.peer_id, now, W1.peer_id, wrong, _sender(chain, W1), answered)) == 0
    assert answered == set() and slot["challenge"]["deadline"]
    assert asyncio.run(answer_challenges(doc, W1.peer_id, now, W1.peer_id, lambda *_: None, _sender(chain, W1),
                                         answered)) == 0
    assert answered == set()
    assert asyncio.run(answer_challenges(doc, W1.peer_id, now, W1.peer_id, _record_for(served[W1.peer_id]),
                                         _sender(chain, W1), answered)) == 1
    assert not slot["challenge"]["deadline"]


def test_closed_settled_and_foreign_challenges_are_not_answered():
    def task(**slot):
        commit = {"root": "00" * 32, "segments": 3, "first": 0, "low": 0}   # the commitment it checks (ADR 0230)
        return TaskInfo.from_json({"task_id": "00", "slots": [{"slot": 0, "segment": 1, "salt": "", "commit": commit,
                                                               **slot}]})
    assert challenges_for(task(worker=W1.peer_id, challenge={"deadline": 5}), W1.peer_id, 1) != []
    for other in [task(worker=W1.peer_id, outcome="ok", challenge={"deadline": 5}),
                  task(worker=W1.peer_id, challenge={"deadline": 0, "responses": 1}),
                  task(worker=W2.peer_id, challenge={"deadline": 5}), task(worker=W1.peer_id)]:
        assert challenges_for(other, W1.peer_id, 1) == []
    seated = task(worker=W1.peer_id, verifiers=[{"verifier": "me"}, {"verifier": "other", "set_aside": [{}]}])
    assert Reasks().forget(seated, "me") == []


def test_a_reasked_verifier_forgets_its_sealed_judgement():
    sealed = SealedAnswers(W2)
    task_id = b"\x05" * 32
    stale = Judgement(False, unavailable_evidence(b"s" * 32), 0, "could not fetch")
    sealed.commit_payload(task_id, 3, stale)
    duty = Duty("audit", task_id.hex(), 3, W1.peer_id, 0, b"s" * 32, 0)
    assert sealed.recall(duty) == stale
    sealed.forget(task_id.hex(), 3)
    assert sealed.recall(duty) is None
