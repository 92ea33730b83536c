"""Where serving computes (docs/adr/0179): CPU by default, CUDA when present.

`resolve_device` turns a `--device` / `[serve] device` choice (auto, cpu, cuda) into the device to use:
auto is cuda when torch sees a CUDA device, else cpu; cuda on a machine without one is a DeviceError
at start, never a failure mid-session. `prepare_device` also puts torch in the deterministic CUDA
settings training uses (ml.train.reproducibility: cuBLAS workspace, no TF32, deterministic
algorithms), so that two servers with the same GPU model, CUDA and torch give the same bits.
`serving_profile` names the execution profile (ml/profiles.py, ADR 0166) a party computing on that
device is in: what a server announces in `hardware.serving` and what clients and referees match it by.

Blocking (imports torch, queries the driver): call these from a worker thread in async code.
"""
from __future__ import annotations

DEVICES = ("auto", "cpu", "cuda")


class DeviceError(ValueError):
    """A device choice this machine cannot honour (unknown, or cuda without a CUDA device)."""


def resolve_device(choice: str) -> str:
    """"cpu" or "cuda" for `choice` (auto, cpu or cuda)."""
    if choice not in DEVICES:
        raise DeviceError(f"unknown device {str(choice)[:20]!r}: expected one of {', '.join(DEVICES)}")
    import torch

    available = torch.cuda.is_available()
    if choice == "auto":
        return "cuda" if available else "cpu"
    if choice == "cuda" and not available:
        build = "a CPU-only build" if torch.version.cuda is None else f"built for CUDA {torch.version.cuda}"
        raise DeviceError(f"device cuda: torch {torch.__version__} ({build}) sees no CUDA device here; "
                          "use --device cpu (or auto)")
    return choice


def prepare_device(choice: str) -> str:
    """`resolve_device(choice)`, with torch's deterministic CUDA settings applied when it is cuda."""
    device = resolve_device(choice)
    if device == "cuda":
        from ml.train.reproducibility import configure_cuda_determinism

        configure_cuda_determinism()
    return device


def serving_profile(device: str) -> str:
    """The execution profile of serving computations on `device` ("cpu" or "cuda"): the portable CPU
    profile, or the CUDA profile of the current GPU (`cuda-<gpu>-cc<x.y>-cuda<v>/torch-<v>`)."""
    from ml.profiles import cuda_profile, default_profile

    if device == "cpu":
        return default_profile("cpu")
    if device != "cuda":
        raise DeviceError(f"no profile for device {device[:20]!r}")
    import torch

    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    return cuda_profile(props.name, (props.major, props.minor), torch.version.cuda or "", torch.__version__)
