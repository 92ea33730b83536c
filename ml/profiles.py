"""Execution profiles: named classes of machines whose training results are bitwise identical (ADR 0166).

A profile id is text of at most 96 characters from ``[a-z0-9._/+-]``:

- ``cpu-x86-64-avx2/torch-<version>``: the portable CPU profile. Any x86-64 CPU with AVX2, any vendor,
  with the kernel settings of ``PORTABLE_CPU_ENV``: ATen's vectorized kernels fixed at AVX2 (whatever
  AVX-512 the CPU has), MKL in its conditional-reproducibility COMPATIBLE branch (the one branch MKL
  keeps identical on Intel and non-Intel CPUs; its AVX2 branch is Intel-only and silently falls back
  to the CPU's own dispatch elsewhere), oneDNN capped at AVX2 and unused by torch for training
  (``configure_portable_torch``), one thread.
- ``cuda-<gpu-slug>-cc<major.minor>-cuda<ver>/torch-<version>``: one GPU model and compute capability
  with one CUDA runtime and torch release (deterministic algorithms, no TF32: ml.train.reproducibility).

torch, MKL and oneDNN read these settings when they load, so ``apply_portable_cpu_env`` must run before
torch is imported (``dekube-node start`` does it for the compute role). ``local_profiles`` then checks
what the loaded libraries really use: a process started without the settings never claims the
portable profile. This module imports torch only inside ``local_profiles``.
"""
from __future__ import annotations

import os
import platform
import re
import sys
from collections.abc import MutableMapping

PROFILE_ID_MAX = 96        # characters in a profile id (the ledger's bound)
MAX_PROFILES = 8           # profile ids in a node record's hardware["profiles"]
PINNED_TORCH = "2.13.0"    # pyproject's torch pin: the version named when torch is not installed here
PORTABLE_CPU_PREFIX = "cpu-x86-64-avx2"
_PROFILE_ID = re.compile(rf"[a-z0-9._/+-]{{1,{PROFILE_ID_MAX}}}\Z")
_X86_64 = ("x86_64", "amd64")
_MAX_GPU_SLUG = 40

PORTABLE_CPU_ENV: dict[str, str] = {
    "ATEN_CPU_CAPABILITY": "avx2",     # torch's own vectorized kernels (elementwise, reductions, softmax...)
    "MKL_CBWR": "COMPATIBLE",          # MKL sgemm & co.: the cross-vendor reproducible branch
    "DNNL_MAX_CPU_ISA": "AVX2",        # oneDNN (GELU, convolutions): no AVX-512 code
    "ONEDNN_MAX_CPU_ISA": "AVX2",      # the same, under oneDNN 3's name
    "OMP_NUM_THREADS": "1",            # one thread: reductions are not split differently
    "MKL_NUM_THREADS": "1",
}


class ProfileError(ValueError):
    """A malformed profile id."""


def is_profile_id(text: object) -> bool:
    return isinstance(text, str) and _PROFILE_ID.match(text) is not None


def check_profile_id(text: object) -> str:
    """``text`` if it is a well-formed profile id, else ProfileError saying why."""
    if not is_profile_id(text):
        raise ProfileError(f"bad profile id {text!r}: expected at most {PROFILE_ID_MAX} characters of "
                           f"[a-z0-9._/+-], e.g. {portable_cpu_profile(PINNED_TORCH)!r}")
    return str(text)


def _release(version: str) -> str:
    """The public release of a torch version ("2.13.0+cpu" -> "2.13.0"): the wheel variants of one
    release build the same CPU kernels; CUDA variants are told apart by the cuda part of their id."""
    return version.split("+", 1)[0].strip().lower()


def torch_release() -> str:
    """The installed torch's release, read from package metadata (no import), or the pinned one."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return _release(version("torch"))
    except PackageNotFoundError:
        return PINNED_TORCH


def portable_cpu_profile(torch_version: str) -> str:
    return f"{PORTABLE_CPU_PREFIX}/torch-{_release(torch_version)}"


def gpu_slug(name: str) -> str:
    """"NVIDIA H100 80GB HBM3" -> "nvidia-h100-80gb-hbm3" (at most 40 characters)."""
    slug = re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")
    return slug[:_MAX_GPU_SLUG].rstrip("-") or "unknown"


def cuda_profile(gpu_name: str, capability: tuple[int, int], cuda_version: str, torch_version: str) -> str:
    cuda = re.sub(r"[^a-z0-9.]+", "", cuda_version.lower()) or "unknown"
    return check_profile_id(f"cuda-{gpu_slug(gpu_name)}-cc{capability[0]}.{capability[1]}-cuda{cuda}"
                            f"/torch-{_release(torch_version)}")


def apply_portable_cpu_env(environ: MutableMapping[str, str] | None = None) -> bool:
    """Set ``PORTABLE_CPU_ENV`` in ``environ`` (default: this process's), overriding what was there.

    Must run before torch is imported: returns False when torch is already loaded in this process
    (then the settings reach only child processes, and ``local_profiles`` will not claim the profile
    here unless the loaded libraries happen to match it)."""
    target = os.environ if environ is None else environ
    target.update(PORTABLE_CPU_ENV)
    return "torch" not in sys.modules


def portable_env_applied(environ: MutableMapping[str, str] | None = None) -> bool:
    environ = os.environ if environ is None else environ
    return all(environ.get(name) == value for name, value in PORTABLE_CPU_ENV.items())


def configure_portable_torch(torch) -> None:
    """In a process running the portable CPU profile, keep torch's fp32 ops off oneDNN: its AVX2
    kernels still size their blocking (and so their summation order) by the CPU's cache sizes, while
    ATen's own kernels (GELU, and convolutions as im2col plus MKL's COMPATIBLE sgemm) depend only on
    the settings above. Called by ml.train.reproducibility.configure_determinism; a no-op elsewhere."""
    if portable_env_applied():
        torch.backends.mkldnn.enabled = False


def _portable_cpu_active(torch) -> bool:
    """This process computes as the portable CPU profile says: an x86-64 CPU, ATen's kernels at
    AVX2 (not AVX-512, not the scalar fallback of a CPU without AVX2), the library settings in place."""
    if platform.machine().lower() not in _X86_64:
        return False
    if torch.backends.cpu.get_cpu_capability() != "AVX2":
        return False
    return portable_env_applied()


def _cuda_profiles(torch) -> list[str]:
    try:
        if not torch.cuda.is_available() or not torch.version.cuda:
            return []
        props = torch.cuda.get_device_properties(0)
        return [cuda_profile(props.name, (props.major, props.minor), torch.version.cuda, torch.__version__)]
    except (RuntimeError, AssertionError, ProfileError):   # a broken driver, a device taken away
        return []


def local_profiles() -> list[str]:
    """The profiles this process can compute in (imports torch; blocking: a CUDA query)."""
    import torch

    profiles = [portable_cpu_profile(torch.__version__)] if _portable_cpu_active(torch) else []
    profiles += _cuda_profiles(torch)
    return profiles[:MAX_PROFILES]


def default_profile(device: str) -> str:
    """The profile a task for ``device`` names when its owner names none, known without the ledger: the
    portable CPU profile for "cpu"; "" for "cuda" and "any" (`task submit` names the profile the most
    compute nodes on the ledger run: cli/task_crew.py)."""
    if device == "cpu":
        return portable_cpu_profile(torch_release())
    if device in ("cuda", "any"):
        return ""
    raise ProfileError(f"unknown device {device!r}: expected cpu, cuda or any")
