"""cli.task_report: how `task show` / `task wait` tell a task's audit slots and payouts."""
from cli.payout_lines import payout_lines, role_of
from cli.task_report import deadline_lines, deadline_text, relay_lines, report_final, slot_lines
from consensus.task_info import TaskInfo

W1, W2, V1, V2, R1, OWNER = ("12D3KooW" + c * 44 for c in "abcdef")
EV, BAD = "aa" * 32, "bb" * 32


def task() -> dict:
    return {
        "task_id": "11" * 32, "status": "paid", "owner": OWNER, "block_time_ms": 60_000, "workers": [W1, W2],
        "price": 1000,
        "profile": "cpu-x86-64-avx2/torch-2.13.0",
        "slots": [
            {"slot": 0, "worker": W1, "segment": 3, "salt": "00" * 32, "outcome": "ok",
             "verifiers": [{"verifier": V1, "deadline": 50_000, "redraw": False,
                            "answer": {"match": True, "evidence": EV, "step": 0}}],
             "dispute_deadline": 0, "dispute": None, "referees": [], "referee_deadline": 0,
             "verdict": {"match": True, "evidence": EV}},
            {"slot": 1, "worker": W2, "segment": 1, "salt": "01" * 32, "outcome": "guilty",
             "verifiers": [{"verifier": V1, "deadline": 50_000, "redraw": False, "answer": None},
                           {"verifier": V2, "deadline": 90_000, "redraw": True,
                            "answer": {"match": False, "evidence": BAD, "step": 2}}],
             "dispute_deadline": 100_000, "dispute": {"height": 95}, "referee_deadline": 3_840_000,
             "referees": [{"referee": R1, "vote": {"match": False, "evidence": BAD}}],
             "verdict": {"match": False, "evidence": BAD}},
        ],
        "payouts": {W1: 600, V2: 30, R1: 20, OWNER: 350}, "result": "cc" * 32,
    }


def test_slot_lines_tell_worker_segment_answers_dispute_referees_and_outcome():
    lines = slot_lines(TaskInfo.from_json(task()))
    assert lines[0] == "audit slots (2, profile cpu-x86-64-avx2/torch-2.13.0):"
    text = "\n".join(lines)
    assert f"  slot 0  ok         segment 3 of {W1[:16]}.." in lines
    assert f"  slot 1  guilty     segment 1 of {W2[:16]}.." in lines
    assert f"verifier {V1[:16]}..  match, evidence {EV[:16]}..  (due passed 10s ago)" in text   # block times
    assert f"verifier {V1[:16]}..  silent (no answer by its deadline)" in text
    assert f"verifier {V2[:16]}..  MISMATCH from step 2, evidence {BAD[:16]}..  [redrawn]" in text
    assert "disputed by the worker at height 95" in text
    assert f"referee  {R1[:16]}..  MISMATCH, evidence {BAD[:16]}..  (due in 1h03m)" in text
    assert slot_lines(TaskInfo.from_json({**task(), "slots": []})) == []


def test_pending_slot_shows_open_answers_and_dispute_window():
    doc = task()
    slot = doc["slots"][1]
    slot.update(outcome="pending", dispute=None, referees=[], verdict=None)
    text = "\n".join(slot_lines(TaskInfo.from_json(doc)))
    assert "no answer yet" in text and "the worker may dispute: due in 40s" in text


def test_sealed_and_withheld_judgements_are_told_apart():
    doc = task()
    slot = doc["slots"][1]
    slot.update(outcome="pending", verdict=None)
    slot["verifiers"][0]["commitment"] = "cd" * 32                  # sealed, reveals not open yet
    slot["referees"] = [{"referee": R1, "vote": None, "commitment": "ef" * 32, "unrevealed": True},
                        {"referee": W1, "vote": None, "commitment": "ab" * 32}]
    text = "\n".join(slot_lines(TaskInfo.from_json(doc)))
    assert f"verifier {V1[:16]}..  answer sealed, not revealed yet" in text
    assert f"referee  {R1[:16]}..  withheld its sealed vote (slashed)" in text
    assert f"referee  {W1[:16]}..  vote sealed, not revealed yet" in text


def test_roles_and_the_final_report(capsys):
    doc = task()
    assert [role_of(TaskInfo.from_json(doc), p) for p in (OWNER, W1, V2, R1, "12D3KooWzz")] == \
        ["owner", "worker", "verifier", "referee", "relay"]
    assert report_final(TaskInfo.from_json(doc)) == 0
    out = capsys.readouterr().out
    assert "slot 1  guilty" in out and f"  {R1}  referee    20" in out
    assert f"  {W2}  worker     0 (not paid: no commitment, or an audit slot found it guilty)" in out


def test_payout_lines_split_each_peer_by_kind(capsys):
    """Price 1000 with the genesis shares: verifier pool 50 (two decided slots, 25 each), relay budget 100,
    worker share (1000 - 50 - 100) // 2 = 425. W1 committed and also verified W2's slot (guilty); the
    owner gets the rest back. Each part is its own labelled line."""
    doc = task()
    RL = "12D3KooW" + "g" * 44
    doc["commits"] = {W1: ["aa" * 32, "cc" * 32, 4, 30], W2: ["bb" * 32, "cc" * 32, 4, 31]}
    doc["slots"][1]["verifiers"][1]["verifier"] = W1
    doc["relay_claims"] = {RL: 40}
    doc["payouts"] = {W1: 437, V1: 25, R1: 12, RL: 40, OWNER: 486}
    lines = payout_lines(TaskInfo.from_json(doc))
    assert lines == [f"  {OWNER}  refund     486", f"  {W1}  worker     425", f"  {W1}  verifier   12",
                     f"  {RL}  relay      40", f"  {V1}  verifier   25", f"  {R1}  referee    12"]
    assert report_final(TaskInfo.from_json(doc)) == 0
    out = capsys.readouterr().out
    assert f"  {W1}  verifier   12" in out and f"  {OWNER}  refund     486" in out


def test_a_split_that_does_not_add_up_shows_the_total_with_the_role():
    doc = task()
    doc["commits"] = {W1: ["aa" * 32, "cc" * 32, 4, 30]}
    doc["payouts"] = {W1: 999, OWNER: 1}   # another chain's shares: no invented split
    assert payout_lines(TaskInfo.from_json(doc)) == [f"  {W1}  worker     999", f"  {OWNER}  refund     1"]


def test_rejected_task_shows_reject_fees_relays_and_refund():
    RL = "12D3KooW" + "g" * 44
    doc = {**task(), "status": "rejected", "slots": [], "rejections": {W1: "bad", W2: "bad"},
           "relay_claims": {RL: 30}, "payouts": {W1: 5, W2: 5, RL: 30, OWNER: 960}}
    assert payout_lines(TaskInfo.from_json(doc)) == [f"  {OWNER}  refund     960", f"  {RL}  relay      30",
                                 f"  {W1}  reject fee 5", f"  {W2}  reject fee 5"]



def test_deadlines_are_told_from_the_ledgers_time_and_failed_endings_exit_1(capsys):
    doc = {**task(), "status": "running", "commit_deadline": 125_000, "spec": {"expected_s": 78}, "slots": []}
    assert deadline_lines(TaskInfo.from_json(doc)) == ["commit by:  in 1m05s (expected work 1m18s)"]
    assert deadline_text(TaskInfo.from_json({}), 5) == "at block time 5 ms"          # a validator from before ADR 0187
    assert deadline_lines(TaskInfo.from_json({**doc, "status": "committed", "window_end": 30_000})) == \
        ["audits end: passed 30s ago at the earliest"]
    expired = {**task(), "status": "expired", "slots": [], "result": "", "payouts": {OWNER: 1000},
               "reason": "no worker committed a result by the commit deadline (block time 1 ms)"}
    assert report_final(TaskInfo.from_json(expired)) == 1
    out = capsys.readouterr().out
    assert f"task {'11' * 32} expired: no worker committed a result" in out and "paid" not in out.split("payouts")[0]
    failed = {**expired, "status": "failed", "reason": "every committed result (2) was found wrong"}
    assert report_final(TaskInfo.from_json(failed)) == 1
    assert "failed: every committed result" in capsys.readouterr().out


def test_a_challenged_slot_says_the_worker_must_show_its_record():
    doc = task()
    slot = doc["slots"][1]
    slot.update(outcome="pending", dispute=None, referees=[], verdict=None, challenge={"deadline": 100_000,
                                                                                       "responses": 0})
    lines = slot_lines(TaskInfo.from_json(doc))
    assert [line.strip() for line in lines if "challenged" in line] == [
        "challenged: the worker must show its record, due in 40s"]
    slot["challenge"] = {"deadline": 0, "responses": 1}   # answered: no longer shown
    assert not any("challenged" in line for line in slot_lines(TaskInfo.from_json(doc)))


def test_relay_lines_sum_the_workers_reports_per_relay():
    doc = {**task(), "relay_bytes": {W1: {R1: 3 << 20, V1: 1 << 19}, W2: {R1: 1 << 20}}}
    assert relay_lines(TaskInfo.from_json(doc)) == [
        "relayed: 4.50 MiB through relays (the workers' circuit counts at commit)",
        f"  relay {V1[:16]}..  0.50 MiB", f"  relay {R1[:16]}..  4.00 MiB"]   # in peer id order
    assert relay_lines(TaskInfo.from_json(task())) == []
