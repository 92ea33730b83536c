"""The parts ``dekube-node provide`` adds before it bonds (docs/adr/0198): the stake it proposes covers
the network's largest recent task under the 10x-pay rule, a typed passphrase is kept in the OS keyring
where there is one (and nothing breaks where there is none), and each check fails with a sentence that
says what to do (no GPU, a driver torch cannot use, a port in use, a clock far off, too little stake)."""
import argparse
import socket

import keyring
import pytest
from keyring.backend import KeyringBackend
from keyring.backends import fail

from cli import keyring_store, provide
from cli.errors import CliError
from cli.provide_stake import describe, params_from, propose
from consensus.genesis import Params
from consensus.state.records import Task
from consensus.state.tasks import required_worker_stake
from consensus.task_info import TaskInfo
from ml.compute.provider_checks import clock_problem, coverage_problem, gpu_problem, port_problem, stake_problem

GENESIS_PARAMS = {"min_worker_stake": 100, "min_verifier_stake": 100, "stake_cover_bps": 20_000,
                  "audits_per_worker": 2, "slash_mismatch_bps": 1_000, "verifier_share_bps": 500,
                  "relay_share_bps": 1_000}


def task(price, workers):
    return {"task_id": "ab" * 32, "price": price, "spec": {"workers": workers}}


def test_the_stake_proposed_takes_the_largest_recent_task():
    params = params_from(GENESIS_PARAMS)
    recent = [task(10_000, 3), task(1_000, 1), task(2_000, 2)]
    plan = propose(params, recent, configured=None, asked=None)
    # the ledger's own rule for the largest task: a worker needs 10x its pay of 2,833
    ledger_rule = required_worker_stake(params, Task("12D3KooW" + "a" * 44, 0, {"workers": 3}, 10_000, 1))
    assert plan.stake == ledger_rule == 28_330 and plan.max_pay == 2_833 and plan.typical_pay == 850
    assert plan.covers(params) >= plan.max_pay
    text = describe(plan, params, len(recent))
    assert "up to 2833 per worker" in text and "10x its pay" in text and "takes all of them" in text
    # the chain's floor alone (what provide proposed before) would never be drawn for that task
    floor_only = propose(params, [], None, None)
    assert floor_only.stake == 100 and floor_only.covers(params) == 10
    assert "no recent task" in describe(floor_only, params, 0)
    # --stake below the largest task: said so; a configured larger stake is kept
    small = propose(params, recent, None, asked=9_000)
    assert small.stake == 9_000 and "the typical one but not the largest" in describe(small, params, 3)
    assert propose(params, recent, configured=50_000, asked=None).stake == 50_000
    # the rule turned off (stake_cover_bps 0): the floor, any pay
    off = params_from({**GENESIS_PARAMS, "stake_cover_bps": 0})
    assert propose(off, recent, None, None).stake == 100 and "any pay" in describe(propose(off, recent, None, None),
                                                                                    off, 3)
    assert propose(params, [{"task_id": "x", "price": "junk", "spec": None}], None, None).stake == 100


class MemoryKeyring(KeyringBackend):
    priority = 1

    def __init__(self):
        super().__init__()
        self.entries = {}

    def get_password(self, service, username):
        return self.entries.get((service, username))

    def set_password(self, service, username, password):
        self.entries[(service, username)] = password

    def delete_password(self, service, username):
        self.entries.pop((service, username), None)


@pytest.fixture
def memory_keyring():
    before = keyring.get_keyring()
    store = MemoryKeyring()
    keyring.set_keyring(store)
    yield store
    keyring.set_keyring(before)


def prompts(monkeypatch, answers):
    asked = []

    def getpass(prompt):
        asked.append(prompt)
        return answers[len(asked) - 1]
    monkeypatch.setattr("getpass.getpass", getpass)
    monkeypatch.setattr("sys.stdin.isatty", lambda: True)
    monkeypatch.delenv("DEKUBE_KEY_PASSPHRASE", raising=False)
    monkeypatch.setattr("cli.passphrase._env_secret", None)
    return asked


def args(**kw):
    return argparse.Namespace(passphrase_file=None, insecure_unencrypted_key=False, keyring=True, **kw)


def test_a_typed_passphrase_is_kept_in_the_keyring(tmp_path, monkeypatch, memory_keyring, capsys):
    asked = prompts(monkeypatch, ["s3cret", "s3cret"])
    identity, _, new = provide.ensure_key(tmp_path, args())
    assert new and len(asked) == 2 and "kept the key's passphrase in the OS keyring" in capsys.readouterr().out
    assert list(memory_keyring.entries.values()) == ["s3cret"]
    # the next run (provide or start) asks nothing: no terminal at all
    monkeypatch.setattr("sys.stdin.isatty", lambda: False)
    again, unlock, new = provide.ensure_key(tmp_path, args())
    assert not new and again.peer_id == identity.peer_id and len(asked) == 2
    from cli.passphrase import unlock_passphrase
    assert unlock_passphrase(args(), tmp_path / "node_key.json")() == b"s3cret"   # the path `start` takes


def test_without_a_keyring_backend_it_falls_back(tmp_path, monkeypatch, capsys):
    before = keyring.get_keyring()
    keyring.set_keyring(fail.Keyring())   # what a CI container has
    try:
        assert keyring_store.backend() is None and keyring_store.store(tmp_path / "k", b"x") is False
        assert keyring_store.load(tmp_path / "k") is None
        asked = prompts(monkeypatch, ["s3cret", "s3cret"])
        provide.ensure_key(tmp_path, args())
        assert "no OS keyring here" in capsys.readouterr().out and len(asked) == 2
        monkeypatch.setattr("sys.stdin.isatty", lambda: False)   # and no terminal: told how to give it
        with pytest.raises(CliError, match="--passphrase-file"):
            provide.ensure_key(tmp_path, args())
    finally:
        keyring.set_keyring(before)


def test_checks_say_what_to_do():
    assert gpu_problem("auto", {"gpu": ""}) is None and gpu_problem("cuda", {"gpu": "H200"}) is None
    assert "no GPU found" in gpu_problem("cuda", {"gpu": ""}) and "--device cpu" in gpu_problem("cuda", {"gpu": ""})
    driver = gpu_problem("cuda", {"gpu": "", "error": "The NVIDIA driver on your system is too old (found 470)"})
    assert driver.startswith("the NVIDIA driver does not work") and "nvidia-smi" in driver
    assert clock_problem(1_000_000, 1_010_000) is None
    behind = clock_problem(1_000_000, 900_000)
    assert "100 s behind" in behind and "timedatectl set-ntp true" in behind
    assert "ahead of" in clock_problem(0, 3_600_000)
    assert stake_problem(100, 100) is None and "--stake 100" in stake_problem(99, 100)
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        assert f"port {port} is used by another program" in port_problem(f"/ip4/127.0.0.1/tcp/{port}")
    assert port_problem(f"/ip4/127.0.0.1/tcp/{port}") is None   # free again
    assert "--listen" in port_problem("/dns4/x")


def test_params_from_an_rpc_answer_keeps_defaults():
    assert params_from({"min_worker_stake": 7}).stake_cover_bps == Params().stake_cover_bps


def test_a_stake_too_small_for_the_recent_tasks_is_said():
    params = params_from(GENESIS_PARAMS)
    recent = [TaskInfo.from_json(task(10_000, 3)), TaskInfo.from_json({"task_id": "x"})]   # no workers: no pay
    assert coverage_problem(params, 28_330, recent) is None and coverage_problem(params, 0, []) is None
    said = coverage_problem(params, 1_000, recent)
    assert "pays 2833 per worker and needs 28330 bonded, this node has 1000: bond 27330 more" in said
