"""`task show` and `task list` tell what happened to a task the ledger refunded (ADR 0187): a task nobody
committed to by its commit deadline reads ``expired`` with the ledger's reason, never ``paid``, and a
running task shows its commit deadline from the ledger's block time. The documents come from a real
ledger (devtools/ledger_chain.py) through the CLI's RPC call."""
import pytest

import cli.task
from cli.main import main
from consensus.genesis import Params
from consensus.state.tasks import task_id_for
from devtools.ledger_chain import Chain, ident

OWNER, W1, W2, W3 = (ident(i) for i in range(1, 5))
SPEC = {"model": "mlp-digits", "dataset": "digits", "hyperparams": {"steps": 200}, "workers": 3,
        "sync_mode": "allreduce", "codec": "int8", "price": 100_000, "expected_s": 78,
        "profile": "cpu-x86-64-avx2/torch-2.13.0", "segments": 4}
HARDWARE = {"cpu_cores": 4, "ram_mb": 8000, "gpu": "", "gpu_mem_mb": 0, "bandwidth_mbps": 100,
            "profiles": [SPEC["profile"]]}


@pytest.fixture
def chain(monkeypatch):
    chain = Chain(params=Params(min_fee=0, audits_per_worker=0, stake_cover_bps=0), block_ms=1000)
    for worker in (W1, W2, W3):
        chain.ok(worker, "register_node", {"roles": ["compute"], "listen_addrs": [], "relay_addrs": [],
                                           "hardware": HARDWARE})
        chain.ok(worker, "bond", {"amount": 1000})

    def rpc(url, method, *params):
        if method == "dkb_getTask":
            return chain.ledger.task_info(bytes.fromhex(params[0]))
        if method == "dkb_listTasks":
            return chain.ledger.list_tasks(*params)
        raise AssertionError(method)

    monkeypatch.setattr(cli.task, "_rpc", rpc)
    return chain


def submit(chain) -> str:
    nonce = chain.ledger.nonce(OWNER.peer_id)
    chain.ok(OWNER, "submit_task", SPEC)
    return task_id_for(OWNER.peer_id, nonce).hex()


def test_an_expired_task_reads_expired_with_its_reason_in_show_and_list(chain, capsys):
    task_id = submit(chain)
    assert main(["task", "show", task_id]) == 0
    out = capsys.readouterr().out
    span = chain.params.task_slack_s + 78 * chain.params.deadline_factor_pct // 100    # 612 s: above task_min_s
    assert "status:     assigned" in out and f"commit by:  in {span // 60}m{span % 60:02d}s" in out
    assert "(expected work 1m18s)" in out
    chain.empty_blocks(span)                                 # nobody commits
    assert main(["task", "show", task_id]) == 0
    out = capsys.readouterr().out
    assert "status:     expired" in out and "paid" not in out.replace("payouts", "")
    assert "reason:     no worker committed a result by the commit deadline" in out
    assert main(["task", "list"]) == 0
    line = capsys.readouterr().out.strip()
    assert line.startswith(f"{task_id}  expired") and "(no worker committed a result" in line
    assert main(["task", "list", "--status", "paid"]) == 0
    assert capsys.readouterr().out.strip() == "no tasks"
