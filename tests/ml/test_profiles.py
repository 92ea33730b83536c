"""Execution profiles (docs/adr/0166): profile ids, the portable CPU profile's settings, and the proof
that it gives bitwise-identical training on one machine whatever kernel capability the caller preset,
while the machine's native kernels give other bits."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import ml.compute.membership as membership_module
from ml.profiles import (
    MAX_PROFILES,
    PORTABLE_CPU_ENV,
    PROFILE_ID_MAX,
    ProfileError,
    apply_portable_cpu_env,
    check_profile_id,
    cuda_profile,
    default_profile,
    gpu_slug,
    is_profile_id,
    local_profiles,
    portable_cpu_profile,
    torch_release,
)

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "profile_hash.py"


def cpu_flags() -> set[str]:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


FLAGS = cpu_flags()
needs_avx2 = pytest.mark.skipif("avx2" not in FLAGS, reason="the portable CPU profile needs an AVX2 CPU")
needs_avx512 = pytest.mark.skipif("avx512f" not in FLAGS, reason="native kernels equal AVX2 ones without AVX-512")


def clean_env(**preset: str) -> dict[str, str]:
    """This process's environment without any kernel setting, plus ``preset`` (what a user exported)."""
    env = {k: v for k, v in os.environ.items() if k not in PORTABLE_CPU_ENV and not k.startswith("MKL_")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    return {**env, **preset}


def profile_hash(*args: str, **preset: str) -> dict:
    done = subprocess.run([sys.executable, str(SCRIPT), *args], cwd=REPO, env=clean_env(**preset),
                          capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_profile_ids_are_bounded_and_well_formed():
    assert portable_cpu_profile("2.13.0+cpu") == "cpu-x86-64-avx2/torch-2.13.0"
    assert default_profile("cpu") == portable_cpu_profile(torch_release())
    assert default_profile("cuda") == default_profile("any") == ""
    with pytest.raises(ProfileError):
        default_profile("tpu")
    h100 = cuda_profile("NVIDIA H100 80GB HBM3", (9, 0), "12.8", "2.13.0+cu128")
    assert h100 == "cuda-nvidia-h100-80gb-hbm3-cc9.0-cuda12.8/torch-2.13.0"
    long_name = cuda_profile("Some Vendor's Extremely Long Accelerator Name " * 5, (12, 1), "13.0", "2.13.0")
    assert is_profile_id(long_name) and len(long_name) <= PROFILE_ID_MAX
    assert gpu_slug("  ") == "unknown"
    for bad in ("", "CPU-x86", "cpu profile", "a" * (PROFILE_ID_MAX + 1), None, 7, "cpu\n"):
        assert not is_profile_id(bad)
        with pytest.raises(ProfileError):
            check_profile_id(bad)


def test_the_pinned_torch_release_is_pyprojects_pin():
    """A CLI without torch names the portable profile of the pinned release: it must be the one the
    compute extra installs."""
    from ml.profiles import PINNED_TORCH

    assert f'"torch=={PINNED_TORCH}"' in (REPO / "pyproject.toml").read_text()


def test_apply_overrides_what_the_user_preset():
    environ = {"ATEN_CPU_CAPABILITY": "avx512", "MKL_CBWR": "AVX512,STRICT", "ONEDNN_MAX_CPU_ISA": "AVX512_CORE",
               "OMP_NUM_THREADS": "16", "HOME": "/home/x"}
    apply_portable_cpu_env(environ)
    assert environ == {**PORTABLE_CPU_ENV, "HOME": "/home/x"}
    assert PORTABLE_CPU_ENV["ATEN_CPU_CAPABILITY"] == "avx2" and PORTABLE_CPU_ENV["MKL_CBWR"] == "COMPATIBLE"


def test_a_process_started_without_the_settings_claims_no_portable_profile(monkeypatch):
    import torch

    for name in PORTABLE_CPU_ENV:
        monkeypatch.delenv(name, raising=False)
    assert not any(p.startswith("cpu-") for p in local_profiles())
    assert apply_portable_cpu_env({}) is False   # torch is loaded in this process: too late for it
    if torch.backends.cpu.get_cpu_capability() != "AVX2":   # settings present now, but torch loaded without them
        for name, value in PORTABLE_CPU_ENV.items():
            monkeypatch.setenv(name, value)
        assert not any(p.startswith("cpu-") for p in local_profiles())


def test_onednn_is_turned_off_only_under_the_portable_profile(monkeypatch):
    from types import SimpleNamespace

    from ml.profiles import configure_portable_torch

    fake = SimpleNamespace(backends=SimpleNamespace(mkldnn=SimpleNamespace(enabled=True)))
    for name in PORTABLE_CPU_ENV:
        monkeypatch.delenv(name, raising=False)
    configure_portable_torch(fake)
    assert fake.backends.mkldnn.enabled is True      # native kernels: oneDNN stays
    for name, value in PORTABLE_CPU_ENV.items():
        monkeypatch.setenv(name, value)
    configure_portable_torch(fake)
    assert fake.backends.mkldnn.enabled is False


def test_hardware_record_publishes_at_most_eight_profiles(monkeypatch):
    monkeypatch.setattr(membership_module, "HARDWARE", {**membership_module.HARDWARE, "profiles": None})
    ids = [f"cpu-x86-64-avx2/torch-2.{i}.0" for i in range(12)]
    record = membership_module.hardware_record({"profiles": ids}, 100)
    assert record["profiles"] == ids[:MAX_PROFILES]
    assert membership_module.hardware_record({}, 100)["profiles"] == []


@needs_avx2
def test_compute_node_start_applies_the_profile_before_torch_loads():
    """What ``dekube-node start --role compute`` does, in a fresh process whose user preset AVX-512:
    the settings go in before the compute role's import loads torch, so the process offers the profile."""
    code = ("import os, sys; from cli.start import apply_compute_profile; from node.config import load_config\n"
            "from cli.assembly import install_product; install_product()\n"
            "config = load_config(None, env={}, overrides={('node', 'roles'): 'compute'})\n"
            "assert 'torch' not in sys.modules\n"
            "assert apply_compute_profile(config, config.get('node', 'roles'), os.environ)\n"
            "import ml.compute.role, torch; from ml.profiles import local_profiles\n"
            "from ml.train.reproducibility import configure_determinism; configure_determinism(1)\n"
            "assert not torch.backends.mkldnn.enabled\n"
            "print(torch.backends.cpu.get_cpu_capability(), local_profiles())\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=clean_env(ATEN_CPU_CAPABILITY="avx512"),
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split(None, 1)[0] == "AVX2" and default_profile("cpu") in done.stdout


def test_opting_out_or_not_computing_leaves_the_environment_alone():
    from cli.start import apply_compute_profile
    from node.config import load_config

    for roles, portable in (("validator,relay", "true"), ("compute", "false")):
        config = load_config(None, env={}, overrides={("node", "roles"): roles, ("compute", "portable_cpu"): portable})
        environ = {"ATEN_CPU_CAPABILITY": "avx512"}
        assert apply_compute_profile(config, config.get("node", "roles"), environ) is False
        assert environ == {"ATEN_CPU_CAPABILITY": "avx512"}


@needs_avx2
def test_portable_profile_gives_identical_bits_whatever_the_caller_preset():
    runs = {
        # (a) a user who exported the machine's AVX-512 kernels (ATen, MKL, oneDNN): the profile overrides
        "preset_avx512": profile_hash(ATEN_CPU_CAPABILITY="avx512", MKL_CBWR="AVX512",
                                      ONEDNN_MAX_CPU_ISA="AVX512_CORE", OMP_NUM_THREADS="2"),
        # (b) a user who preset ATen's AVX2 kernels only
        "preset_avx2": profile_hash(ATEN_CPU_CAPABILITY="avx2"),
        # (c) an AVX2-only CPU, emulated by capping every library's dispatch at AVX2 (MKL lower still)
        "emulated_avx2_cpu": profile_hash(ATEN_CPU_CAPABILITY="avx2", MKL_ENABLE_INSTRUCTIONS="AVX2",
                                          DNNL_MAX_CPU_ISA="AVX2", ONEDNN_MAX_CPU_ISA="AVX2"),
        "emulated_sse42_mkl": profile_hash(MKL_ENABLE_INSTRUCTIONS="SSE4_2"),
    }
    for name, run in runs.items():
        assert run["capability"] == "AVX2" and run["profiles"][:1] == [default_profile("cpu")], (name, run)
        assert all(job["workers_agree"] and len(job["segment_hashes"]) == 2 for job in run["jobs"].values())
    jobs = {name: run["jobs"] for name, run in runs.items()}
    assert len({json.dumps(j, sort_keys=True) for j in jobs.values()}) == 1, jobs


@needs_avx512
def test_native_kernels_give_other_bits_so_the_profile_matters():
    portable = profile_hash()["jobs"]
    native = profile_hash("--native")
    assert native["capability"] != "AVX2" and not any(p.startswith("cpu-") for p in native["profiles"])
    aten_only = profile_hash("--native", ATEN_CPU_CAPABILITY="avx2")   # ATen at AVX2 but MKL's own dispatch
    for model, job in portable.items():
        assert native["jobs"][model]["segment_hashes"][0] != job["segment_hashes"][0], model
        assert aten_only["jobs"][model]["params_hash"] != job["params_hash"], model
