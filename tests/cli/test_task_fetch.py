"""``task fetch``'s core against a real artifact holder on loopback and a scripted ledger: the
weights come from the worker whose commitment names the ledger's result, are hashed again and
written with metrics.json; a task without a result, or whose result no holder can serve, is one
clear error; the load hint names the user's archive for a .pt2 task."""
import asyncio
import json

import pytest

from cli.client_node import client_node
from cli.errors import CliError
from cli.task_fetch import REGISTRY_CLASSES, fetch_result, load_hint, result_holders
from consensus.task_info import TaskInfo
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


def test_a_stopped_task_says_it_has_no_weights_to_fetch(tmp_path):
    """A task whose crew stopped (docs/adr/0203) was paid for its closed epochs but has no weights result."""
    stopped = {**task_with("", "w", "x"), "status": "paid", "epochs": {"current": 1, "commits": {}, "stopped": 1}}

    async def scenario():
        async with client_node(Identity.generate(), listen=LOOPBACK) as owner:
            with pytest.raises(CliError, match="stopped in epoch 2 .* no trained weights"):
                await fetch_result(ScriptedLedger(stopped, {}), owner, TASK_ID, tmp_path / "a")

    run(scenario())
