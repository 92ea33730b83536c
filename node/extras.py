"""The optional ``compute`` extra (torch, numpy, scikit-learn, lz4) and the error naming its install.

``pip install dekube`` gives what validators and relays need; training (the compute role,
``dekube-node task run``, compute nodes in a testnet) needs ``pip install 'dekube[compute]'``.
"""
from __future__ import annotations

import importlib.util

COMPUTE_MODULES = ("torch", "numpy", "sklearn", "lz4")
COMPUTE_INSTALL = "pip install 'dekube[compute]'"


class MissingExtra(ImportError):
    """A feature needs a package of the ``compute`` extra that is not installed."""


def missing_compute_message(what: str, module: str) -> str:
    return f"{what} needs {module}, which is not installed; run: {COMPUTE_INSTALL}"


def require_compute(what: str) -> None:
    """Raise MissingExtra (naming ``what`` and the pip command) unless the compute extra is installed."""
    for module in COMPUTE_MODULES:
        try:
            found = importlib.util.find_spec(module) is not None
        except ImportError:  # a finder that refuses the module
            found = False
        if not found:
            raise MissingExtra(missing_compute_message(what, module))


def missing_compute_module(exc: BaseException) -> str | None:
    """The compute-extra module whose absence raised ``exc`` (a ModuleNotFoundError), else None."""
    name = getattr(exc, "name", None) or ""
    top = name.partition(".")[0]
    return top if isinstance(exc, ModuleNotFoundError) and top in COMPUTE_MODULES else None
