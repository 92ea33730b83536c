"""Alias of the perturbation soak (docs/adr/0164): ``python scripts/soak.py [--manifest FILE] [args]``
runs ``python -m devtools.perturb`` with the CI manifest unless another one is named.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from devtools.perturb.__main__ import main  # noqa: E402

if __name__ == "__main__":
    args = sys.argv[1:]
    if "--manifest" not in args:
        args = ["--manifest", os.path.join(os.path.dirname(__file__), "..", "devtools", "perturb", "manifests",
                                           "ci.toml"), *args]
    sys.exit(main(args))
