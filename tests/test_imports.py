"""The torch-free install: the CLI, the validator and relay roles and task-spec checks import no torch,
numpy, scikit-learn or lz4, and training entry points without them say to install the compute extra."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
HEAVY = ("torch", "numpy", "sklearn", "lz4")

# Makes torch, numpy, sklearn and lz4 unimportable, as on a `pip install dekube` without the compute extra.
BLOCK_COMPUTE = """
import sys
class _NoCompute:
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in ("torch", "numpy", "sklearn", "lz4"):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None
sys.meta_path.insert(0, _NoCompute())
"""


def run_python(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], check=False, cwd=REPO_ROOT, capture_output=True, text=True,
                          timeout=120)


@pytest.mark.parametrize("statement", [
    "import cli.main; cli.main.build_parser()",
    "import consensus.validator",
    "import relay.role",
    "from cli.assembly import PRODUCT; from node.roles import role_factory; "
    "role_factory('validator', PRODUCT); role_factory('relay', PRODUCT)",
    "from ml.compute.task_spec import submit_payload; from ml.train.spec import TrainSpec; TrainSpec(codec='int8+lz4')",
])
def test_import_leaves_out_torch_numpy_sklearn(statement):
    result = run_python(f"import sys\n{statement}\n"
                        f"print(sorted(m for m in {HEAVY!r} if m in sys.modules))")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1] == "[]", f"{statement} imported {result.stdout}"


def test_the_blocker_does_block():
    result = run_python(BLOCK_COMPUTE + "import torch")
    assert result.returncode != 0 and "ModuleNotFoundError" in result.stderr


def test_help_and_validator_role_work_without_the_compute_extra():
    result = run_python(BLOCK_COMPUTE + "from cli.main import main\n"
                        "from cli.assembly import PRODUCT\n"
                        "from node.roles import role_factory\n"
                        "from consensus.validator.role import ValidatorRole\n"
                        "assert role_factory('validator', PRODUCT) is not None and ValidatorRole.name == 'validator'\n"
                        "main(['--help'])")
    assert result.returncode == 0, result.stderr
    assert "dekube-node" in result.stdout


def test_compute_role_without_torch_names_the_extra():
    result = run_python(BLOCK_COMPUTE + "from cli.assembly import PRODUCT\n"
                        "from node.roles import RoleError, role_factory\n"
                        "try:\n    role_factory('compute', PRODUCT)\nexcept RoleError as exc:\n    print(exc)\n")
    assert result.returncode == 0, result.stderr
    assert "pip install 'dekube[compute]'" in result.stdout
    assert "torch" in result.stdout


def test_task_run_without_torch_is_a_one_line_error():
    result = run_python(BLOCK_COMPUTE + "from cli.main import main\n"
                        "raise SystemExit(main(['task', 'run', '--workers', '2']))")
    assert result.returncode == 1, result.stdout + result.stderr
    assert result.stderr.startswith("dekube-node: error: dekube-node task run needs torch")
    assert "pip install 'dekube[compute]'" in result.stderr
