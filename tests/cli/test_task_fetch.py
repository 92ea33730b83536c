"""``task fetch``'s core against a real artifact holder on loopback and a scripted ledger: the
weights come from the worker whose commitment names the ledger's result, are hashed again and
written with metrics.json; a task without a result, or whose result no holder can serve, is one
clear error; the load hint names the user's archive for a .pt2 task."""
import asyncio
import hashlib
import json

import pytest

from cli.client_node import client_node
from cli.errors import CliError
from cli.task_fetch import REGISTRY_CLASSES, fetch_result, load_hint, result_holders
from consensus.task_info import TaskInfo
from ml.compute import progress_protocol
from ml.compute.job_board import JobBoard
from node.identity import Identity

LOOPBACK = "/ip4/127.0.0.1/tcp/0"
TASK_ID = "ab" * 32


class ScriptedLedger:
    """The two reads fetch makes (dkb_getTask, dkb_getNode), answered from dicts."""

    def __init__(self, task: dict, nodes: dict[str, dict]) -> None:
        self.task, self.nodes, self.calls = task, nodes, []

    async def call(self, method: str, *params):
        self.calls.append(method)
        if method == "dkb_getTask":
            return self.task
        if method == "dkb_getNode":
            return self.nodes.get(params[0])
        raise AssertionError(method)


def task_with(result: str, holder: str, other: str) -> dict:
    return {"task_id": TASK_ID, "status": "paid", "owner": "o", "price": 10, "spec": {"model": "pt2"},
            "workers": [holder, other], "result": result,
            "commits": {holder: ["00" * 32, result, 4, 7], other: ["00" * 32, "cd" * 32, 4, 7]}}


def test_result_holders_are_the_committers_of_the_result():
    task = task_with("ef" * 32, "A", "B")
    assert result_holders(TaskInfo.from_json(task), "ef" * 32) == ["A"]
    assert result_holders(TaskInfo.from_json({"workers": ["A"], "commits": {}}), "ef" * 32) == ["A"]


def test_load_hint_for_an_archive_and_a_registry_model(tmp_path):
    assert load_hint(TaskInfo.from_json({"spec": {"model": "pt2"}}), tmp_path).startswith('model = torch.export.load("')
    hint = load_hint(TaskInfo.from_json({"spec": {"model": "mystery"}}), tmp_path)
    assert hint == f'model.load_state_dict(safetensors.torch.load_file("{tmp_path}/weights.safetensors"))'


@pytest.mark.parametrize("model, dataset", [("digits-mlp", "digits"), ("char-transformer", "shakespeare")])
def test_load_hint_for_a_registry_model_builds_its_class(tmp_path, model, dataset):
    """The hint names the class to build and runs as printed: the weights load strictly."""
    import safetensors.torch

    from ml.registry import MODELS, build_model, get_dataset

    assert set(REGISTRY_CLASSES) == set(MODELS)
    trained = build_model(model, get_dataset(dataset), 7)
    safetensors.torch.save_file({k: v.contiguous() for k, v in trained.state_dict().items()},
                                str(tmp_path / "weights.safetensors"))
    hint = load_hint(TaskInfo.from_json({"spec": {"model": model, "dataset": dataset}}), tmp_path)
    assert f"ml.registry.{type(trained).__name__}" in hint
    code, _, load = hint.partition("  # ")
    scope: dict = {}
    exec(code, scope)   # noqa: S102 - the printed hint, run as a user would
    exec("import safetensors.torch\n" + load.split("then ", 1)[1], scope)
    for name, value in trained.state_dict().items():
        assert scope["model"].state_dict()[name].equal(value)


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 60))


def test_fetch_writes_checked_weights_and_metrics(tmp_path):
    weights = bytes(range(256)) * 5000   # > 1 MiB: two chunks

    async def scenario():
        async with client_node(Identity.generate(), listen=LOOPBACK) as holder, \
                client_node(Identity.generate(), listen=LOOPBACK) as owner:
            result = await holder.artifacts.add_bytes(weights)
            silent = Identity.generate().peer_id   # committed something else; never asked
            ledger = ScriptedLedger(task_with(result, holder.peer_id, silent),
                                    {holder.peer_id: {"listen_addrs": holder.host.listen_addrs, "relay_addrs": []}})
            said = []
            fetched = await fetch_result(ledger, owner, TASK_ID, tmp_path / "out", say=said.append)
            return result, fetched, said

    result, fetched, said = run(scenario())
    assert fetched["result"] == result and "fetching weights" in said[0]
    assert (tmp_path / "out" / "weights.safetensors").read_bytes() == weights
    doc = json.loads((tmp_path / "out" / "metrics.json").read_text())
    assert doc["result"] == result and doc["task_id"] == TASK_ID and doc["status"] == "paid"
    assert fetched["load"].endswith(f'load_file("{tmp_path}/out/weights.safetensors"))')


def test_no_result_yet_and_unservable_result_are_clear_errors(tmp_path):
    async def scenario():
        async with client_node(Identity.generate(), listen=LOOPBACK) as holder, \
                client_node(Identity.generate(), listen=LOOPBACK) as owner:
            nodes = {holder.peer_id: {"listen_addrs": holder.host.listen_addrs, "relay_addrs": []}}
            pending = ScriptedLedger({**task_with("", holder.peer_id, "x"), "status": "running"}, nodes)
            with pytest.raises(CliError, match="no result on the ledger yet .status running"):
                await fetch_result(pending, owner, TASK_ID, tmp_path / "a")
            missing = ScriptedLedger(task_with("12" * 32, holder.peer_id, "x"), nodes)   # held by no one
            with pytest.raises(CliError, match="cannot fetch the weights"):
                await fetch_result(missing, owner, TASK_ID, tmp_path / "b")
            nowhere = ScriptedLedger(task_with("12" * 32, holder.peer_id, "x"), {})
            with pytest.raises(CliError, match="registered addresses"):
                await fetch_result(nowhere, owner, TASK_ID, tmp_path / "c")

    run(scenario())
    assert not (tmp_path / "b" / "weights.safetensors").exists()


def test_a_task_stopped_before_any_epoch_closed_has_no_weights_to_fetch(tmp_path):
    """A task whose crew stopped in its first epoch (docs/adr/0203) has no closed epoch's state."""
    stopped = {**task_with("", "w", "x"), "status": "expired", "epochs": {"current": 0, "commits": {}, "stopped": 0}}

    async def scenario():
        async with client_node(Identity.generate(), listen=LOOPBACK) as owner:
            with pytest.raises(CliError, match="stopped in epoch 1 before any epoch closed .* no trained weights"):
                await fetch_result(ScriptedLedger(stopped, {}), owner, TASK_ID, tmp_path / "a")

    run(scenario())


def trainer_state(seed: int) -> tuple[bytes, dict]:
    """A digits MLP trainer's full state file (as a worker's sink stores it) and its model's weights."""
    from ml.registry import build_model, get_dataset
    from ml.train.state_file import state_bytes

    model = build_model("digits-mlp", get_dataset("digits"), seed)
    weights = {k: v.clone() for k, v in model.state_dict().items()}
    return state_bytes({"model": model.state_dict(), "inner": {"state": {}}, "step": 40, "bytes_sent": 9}), weights


def epoch_task(current: int, commits: dict, stopped=None, result="", status="running") -> dict:
    progress = {"current": current, "commits": commits, **({"stopped": stopped} if stopped is not None else {})}
    return {**task_with(result, *list(commits)[:2]), "status": status, "result": result, "epochs": progress,
            "spec": {"model": "digits-mlp", "dataset": "digits", "epochs": 4}}


def test_fetch_epoch_n_writes_the_model_weights_of_that_epochs_state(tmp_path):
    """``task fetch --epoch N`` (and a task stopped at an epoch boundary, ADR 0211): the state a worker
    committed for epoch N, checked against the digest, its model weights written as safetensors."""
    from safetensors.torch import load_file

    first, first_weights = trainer_state(1)
    second, second_weights = trainer_state(2)

    async def scenario():
        async with client_node(Identity.generate(), listen=LOOPBACK) as holder, \
                client_node(Identity.generate(), listen=LOOPBACK) as owner:
            served = {hashlib.sha256(data).hexdigest(): await holder.artifacts.add_bytes(data)
                      for data in (first, second)}
            one, two = list(served)   # the ledger has the states' sha256; the worker tells their artifact ids
            board = JobBoard()
            board.start(TASK_ID, workers=[holder.peer_id])
            board.update(TASK_ID, state="committed", epoch_states=served)
            holder.host.set_handler(progress_protocol.PROTOCOL, progress_protocol.make_handler(board))
            other = Identity.generate().peer_id   # committed a state nobody serves: tried after the holder's
            commits = {holder.peer_id: [["00" * 32, one, 2, 5], ["00" * 32, two, 4, 9]],
                       other: [["00" * 32, "77" * 32, 2, 5]]}
            nodes = {holder.peer_id: {"listen_addrs": holder.host.listen_addrs, "relay_addrs": []}}
            running = ScriptedLedger(epoch_task(2, commits), nodes)
            said = []
            at_one = await fetch_result(running, owner, TASK_ID, tmp_path / "e1", say=said.append, epoch=1)
            with pytest.raises(CliError, match="epoch 3 of task .* has not closed .2 closed so far"):
                await fetch_result(running, owner, TASK_ID, tmp_path / "e3", epoch=3)
            stopped = ScriptedLedger(epoch_task(2, commits, stopped=2, result=two, status="stopped"), nodes)
            last = await fetch_result(stopped, owner, TASK_ID, tmp_path / "last")
            return one, two, at_one, last, said

    one, two, at_one, last, said = run(scenario())
    assert at_one["result"] == one and at_one["epoch"] == 1 and "the state of epoch 1" in said[0]
    got = load_file(str(tmp_path / "e1" / "weights.safetensors"))
    assert set(got) == set(first_weights) and all(got[k].equal(v) for k, v in first_weights.items())
    assert last["result"] == two and last["epoch"] == 2   # stopped: the last closed epoch's state
    got = load_file(str(tmp_path / "last" / "weights.safetensors"))
    assert all(got[k].equal(v) for k, v in second_weights.items())
    assert json.loads((tmp_path / "last" / "metrics.json").read_text())["epoch"] == 2


def test_a_state_file_that_is_not_one_is_refused(tmp_path):
    from cli.task_fetch import weights_from_state
    from ml.train.state_file import state_bytes

    junk = tmp_path / "junk"
    junk.write_bytes(b"\x00" * 100)
    with pytest.raises(CliError, match="malformed"):
        weights_from_state(junk)
    empty = tmp_path / "empty"
    empty.write_bytes(state_bytes({"step": 3}))
    with pytest.raises(CliError, match="no model weights"):
        weights_from_state(empty)
