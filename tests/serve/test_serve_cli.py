"""`dekube-node serve` / `generate` / `tune` as processes: two servers plus a spare, generate with a
server killed before the client starts (the spare takes over), identical tokens to local inference;
tune a LoRA adapter through the servers and generate with it."""
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from cli.main import main
from ml.serve.device import serving_profile

ROOT = Path(__file__).resolve().parents[2]
MODEL = "random:4x32:4@5"


def start_server(blocks: str, *extra: str) -> tuple[subprocess.Popen, dict]:
    proc = subprocess.Popen([sys.executable, "-m", "cli.main", "serve", "--model", MODEL, "--blocks", blocks, *extra],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    line = proc.stdout.readline()
    if not line:
        proc.kill()
        raise AssertionError(proc.stderr.read())
    return proc, json.loads(line)


def test_generate_and_tune_through_served_blocks(capsys, tmp_path):
    procs = []
    try:
        first, first_info = start_server("0:2")
        spare, spare_info = start_server("0:2")
        second, second_info = start_server("2:4")
        procs = [first, spare, second]
        first.kill()
        first.wait()
        code = main(["generate", "--model", MODEL, "--prompt", "hello", "--max-tokens", "12", "--check-local",
                     "--server", f"{first_info['addrs'][0]}=0:2", "--server", f"{spare_info['addrs'][0]}=0:2",
                     "--server", f"{second_info['addrs'][0]}=2:4"])
        out = json.loads(capsys.readouterr().out)
        assert code == 0 and out["identical_to_local"] is True and len(out["tokens"]) == 12
        assert second_info["blocks"] == "2:4" and second_info["model"] == first_info["model"]
        # --device auto (ADR 0179): CUDA when torch sees it, announced in that device's profile
        assert first_info["device"] == ("cuda" if torch.cuda.is_available() else "cpu")
        assert first_info["profile"] == serving_profile(first_info["device"]) and out["device"] == first_info["device"]

        text = tmp_path / "text.txt"
        text.write_text("to be or not to be, that is the question. " * 20)
        servers = ["--server", f"{spare_info['addrs'][0]}=0:2", "--server", f"{second_info['addrs'][0]}=2:4"]
        adapter = tmp_path / "adapter.safetensors"
        code = main(["tune", "--model", MODEL, "--text", str(text), "--steps", "15", "--length", "24",
                     "--lora-rank", "2", "--prompt-length", "2", "--lr", "0.03", "--out", str(adapter), *servers])
        tuned = json.loads(capsys.readouterr().out)
        assert code == 0 and tuned["loss_after"] < tuned["loss_before"] and adapter.exists()
        code = main(["generate", "--model", MODEL, "--prompt", "to be", "--max-tokens", "8", "--check-local",
                     "--adapter", str(adapter), *servers])   # pushed: the 0:2 server sends its answers to the 2:4 one
        with_adapter = json.loads(capsys.readouterr().out)
        assert code == 0 and with_adapter["identical_to_local"] is True and with_adapter["pushed_steps"] == 8
        code = main(["generate", "--model", MODEL, "--prompt", "to be", "--max-tokens", "8", "--adapter", str(adapter),
                     "--no-push", *servers])
        driven = json.loads(capsys.readouterr().out)
        assert code == 0 and driven["tokens"] == with_adapter["tokens"] and "pushed_steps" not in driven

        # a new server asked to fill the gap next to the 2:4 server takes 0:2
        third, third_info = start_server("auto:2", "--known", second_info["addrs"][0])
        procs.append(third)
        assert third_info["blocks"] == "0:2"
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()


@pytest.mark.parametrize("argv,match", [
    (["serve", "--model", "random:4x30:4", "--blocks", "0:1"], "divisible"),
    (["serve", "--model", "random:4x32", "--blocks", "3:9"], "inside"),
    (["serve", "--model", "nope.safetensors"], "neither"),
    (["serve", "--model", "random:4x32", "--blocks", "auto:9"], "auto:N"),
    (["generate", "--model", MODEL, "--server", "/ip4/127.0.0.1/tcp/1=0:4", "--prompt", "x"], "p2p"),
])
def test_bad_arguments_are_one_line_errors(argv, match, capsys):
    assert main(argv) == 1
    assert match in capsys.readouterr().err


def test_without_the_compute_extra_the_commands_name_it():
    code = ("import sys\n"
            "class NoTorch:\n"
            "    def find_spec(self, name, path=None, target=None):\n"
            "        if name.partition('.')[0] in ('torch', 'numpy'):\n"
            "            raise ModuleNotFoundError(name)\n"
            "sys.meta_path.insert(0, NoTorch())\n"
            "from cli.main import main\n"
            "sys.exit(main(['serve', '--model', 'random:2x32']))\n")
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert result.returncode == 1 and "dekube[compute]" in result.stderr
