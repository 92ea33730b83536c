"""``task submit`` names the task's execution profile (docs/adr/0166): the portable CPU profile for a CPU
task, ``--profile ID`` (required for cuda/any: ADR 0188); a malformed or mismatched one is one
line on stderr before anything is sent."""
import pytest

from cli.main import main
from ml.profiles import default_profile


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
    (("--device", "cuda"), "--device cuda needs --profile"),
    (("--device", "any"), "--device any needs --profile"),
])
def test_bad_profile_is_one_line_before_anything_is_sent(key, sent, capsys, argv, message):
    assert submit(key, *argv) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err and "Traceback" not in err
    assert sent == []
