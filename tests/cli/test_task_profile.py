"""``task submit`` names the task's execution profile (docs/adr/0166, 0188): ``--profile ID``, else the
portable CPU profile for a CPU task and, for cuda or any, the profile the most compute nodes on the
ledger run (cli/task_crew.py, issue 24), said before anything is sent; a malformed or mismatched
profile, or a ledger without a crew for the device, is one line on stderr before anything is sent."""
import pytest

import cli.task_crew as task_crew
from cli.main import main
from ml.profiles import default_profile

H100 = "cuda-nvidia-h100-80gb-hbm3-cc9.0-cuda12.8/torch-2.13.0"
A100 = "cuda-nvidia-a100-sxm4-40gb-cc8.0-cuda12.8/torch-2.13.0"
CPU = "cpu-x86-64-avx2/torch-2.13.0"


def node(profiles, gpu="", roles=("compute",)):
    return {"peer_id": f"node{len(profiles)}{gpu}", "roles": list(roles),
            "hardware": {"gpu": gpu, "profiles": list(profiles)}}


@pytest.fixture
def ledger(monkeypatch):
    """The node records the command reads from the ledger (dkb_listNodes), and the calls it made."""
    nodes, calls = [], []

    def fake_rpc(url, method, *params):
        calls.append((method, *params))
        return nodes

    monkeypatch.setattr(task_crew, "rpc_call", fake_rpc)
    return nodes, calls


def submit(key, *argv):
    return main(["task", "submit", "--rpc", "http://127.0.0.1:9", "--key", str(key), "--price", "100",
                 "--skip-dry-run", "--model", "mlp", "--dataset", "digits", "--json", *argv])


@pytest.mark.parametrize(("argv", "profile"), [
    ((), default_profile("cpu")),
    (("--device", "cpu"), "cpu-x86-64-avx2/torch-2.13.0"),
    (("--device", "cuda", "--profile", "cuda-nvidia-h100-80gb-hbm3-cc9.0-cuda12.8/torch-2.13.0"),
     "cuda-nvidia-h100-80gb-hbm3-cc9.0-cuda12.8/torch-2.13.0"),
    (("--device", "any", "--profile", "cpu-x86-64-avx2/torch-2.13.0"), "cpu-x86-64-avx2/torch-2.13.0"),
])
def test_submit_payload_names_the_profile(key, sent, argv, profile):
    assert submit(key, *argv) == 0
    assert sent[-1].get("profile") == profile
    assert "" not in sent[-1].values()


@pytest.mark.parametrize(("argv", "message"), [
    (("--profile", "CPU AVX2"), "--profile: bad profile id"),
    (("--profile", "x" * 97), "--profile: bad profile id"),
    (("--profile", "cuda-nvidia-h100-cc9.0-cuda12.8/torch-2.13.0"), "is not a cpu profile"),
    (("--device", "cuda", "--profile", "cpu-x86-64-avx2/torch-2.13.0"), "is not a cuda profile"),
    (("--device", "cuda"), "no compute node on the ledger runs a cuda execution profile"),
    (("--device", "any"), "no compute node on the ledger runs any execution profile"),
])
def test_bad_profile_is_one_line_before_anything_is_sent(key, sent, capsys, ledger, argv, message):
    assert submit(key, *argv) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err and "Traceback" not in err
    assert sent == []


def test_a_cuda_task_names_the_gpu_class_most_compute_nodes_on_the_ledger_run(key, sent, ledger):
    nodes, calls = ledger
    nodes += [node([H100], "NVIDIA H100 80GB HBM3")] * 2 + [node([A100, CPU], "NVIDIA A100")] + [node([CPU])] * 4
    nodes += [node([A100])] * 3                                     # claims a GPU profile without a GPU: not counted
    nodes += [node([A100], "NVIDIA A100", roles=("validator",))] * 3   # not compute nodes
    assert submit(key, "--device", "cuda", "--workers", "2") == 0
    assert sent[-1]["profile"] == H100 and sent[-1]["device"] == "cuda"
    assert calls == [("dkb_listNodes", "compute", None, task_crew.LIST_LIMIT)]


@pytest.mark.parametrize(("cpu_nodes", "profile"), [(4, CPU), (1, H100), (2, CPU)])   # a tie: the lower id
def test_an_any_task_names_the_profile_of_the_largest_crew(key, sent, ledger, cpu_nodes, profile):
    nodes, _ = ledger
    nodes += [node([H100], "NVIDIA H100 80GB HBM3")] * 2 + [node([CPU])] * cpu_nodes
    assert submit(key, "--device", "any", "--workers", "1") == 0
    assert sent[-1]["profile"] == profile and sent[-1]["device"] == "any"


def test_the_derived_profile_is_said_before_anything_is_paid(key, monkeypatch, ledger, capsys):
    nodes, _ = ledger
    nodes += [node([H100], "NVIDIA H100 80GB HBM3")] * 3
    said = []

    async def fake_submit(args, identity, payload, inputs):
        said.append(capsys.readouterr().out)
        return 0

    monkeypatch.setattr("cli.task_submit.submit", fake_submit)
    assert main(["task", "submit", "--rpc", "http://127.0.0.1:9", "--key", str(key), "--price", "100",
                 "--skip-dry-run", "--model", "mlp", "--dataset", "digits", "--device", "cuda"]) == 0
    assert f"profile {H100}: run by 3 compute node(s)" in said[0]


def test_too_few_nodes_for_the_workers_is_one_line_before_anything_is_sent(key, sent, ledger, capsys):
    nodes, _ = ledger
    nodes += [node([H100], "NVIDIA H100 80GB HBM3")] * 2
    assert submit(key, "--device", "cuda", "--workers", "3") == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"2 compute node(s) running {H100}" in err and "--workers 3" in err
    assert sent == []
