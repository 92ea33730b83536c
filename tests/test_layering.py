"""The layering contract (docs/adr/0130), checked statically over every .py file of the product.

Each module's imports are read with ``ast`` (module-level, function-level and ``TYPE_CHECKING``
imports alike, relative ones resolved, plus ``importlib.import_module("...")`` with a literal name),
so a lazy import inside a function breaks the contract as surely as one at the top of a file. A
string that is a dotted module path of the product, optionally with ``:attribute`` (what a loader
resolves, e.g. ``"consensus.tx:signed_tx_bytes"``), counts as an import of it too: node/ gets the
roles, services and encoders above it handed in (node.plugins, ADR 0201), never names them.

The layers, lowest first: ``node`` (runtime, transport, RPC) < ``consensus`` (the ledger) and
``relay`` (circuit relays) < ``ml`` (compute) < ``cli`` and ``devtools`` (may import anything).
``relay`` may use the ledger's data formats (``consensus.encoding``, ``consensus.tx``: a relay
receipt is a ledger transaction both endpoints sign), nothing else of ``consensus``. No product
package imports ``cli`` or ``devtools``.
"""
from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
TOP_LEVEL = ("node", "consensus", "relay", "ml", "cli", "devtools")
# "package.module[.more][:attribute]": a module named by a string, for a loader to import
MODULE_STRING = re.compile(r"((?:" + "|".join(TOP_LEVEL) + r")(?:\.[A-Za-z_]\w*)+)(?::[A-Za-z_]\w*)?")

# package -> top-level packages it must not import
FORBIDDEN = {
    "node": {"consensus", "relay", "ml", "cli", "devtools"},
    "consensus": {"relay", "ml", "cli", "devtools"},
    "relay": {"consensus", "ml", "cli", "devtools"},
    "ml": {"relay", "cli", "devtools"},
}
# package -> modules of a forbidden package it may import all the same (with their submodules/names)
ALLOWED = {
    "relay": ("consensus.encoding", "consensus.tx"),
}
# Known violations waiting on a fix, each with a comment saying why; an entry that no longer
# matches an import fails the test, so none outlives its violation.
KNOWN_VIOLATIONS: set[tuple[str, str]] = set()  # (file, module) pairs waiting on a fix; none today


@dataclass(frozen=True)
class Import:
    path: str      # file, relative to the repository root
    line: int
    name: str      # absolute dotted name: module, or module.attribute for ``from m import a``


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path, root: Path) -> list[Import]:
    """Every import in ``path``, at any depth of the syntax tree, as absolute dotted names."""
    rel = path.relative_to(root).as_posix()
    package = module_name(path, root).split(".")
    if path.name != "__init__.py":
        package = package[:-1]
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=rel)):
        if isinstance(node, ast.Import):
            found += [Import(rel, node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[:len(package) - (node.level - 1)] + ([node.module] if node.module else [])
            else:
                base = node.module.split(".")
            found += [Import(rel, node.lineno, ".".join(base + [alias.name])) for alias in node.names
                      if alias.name != "*"] or [Import(rel, node.lineno, ".".join(base))]
        elif (isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant)
              and isinstance(node.args[0].value, str) and _is_dynamic_import(node.func)):
            found.append(Import(rel, node.lineno, node.args[0].value))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            named = MODULE_STRING.fullmatch(node.value)
            if named:
                found.append(Import(rel, node.lineno, named.group(1)))
    return sorted(dict.fromkeys(found), key=lambda imp: imp.line)


def _is_dynamic_import(func: ast.expr) -> bool:
    if isinstance(func, ast.Name):
        return func.id in ("__import__", "import_module")
    return isinstance(func, ast.Attribute) and func.attr == "import_module"


def violations(root: Path) -> list[Import]:
    """Imports in ``root``'s product packages that break FORBIDDEN (less ALLOWED)."""
    bad = []
    for package, forbidden in FORBIDDEN.items():
        for path in sorted((root / package).rglob("*.py")):
            for imp in imports_of(path, root):
                top = imp.name.split(".")[0]
                allowed = ALLOWED.get(package, ())
                if top in forbidden and not any(imp.name == a or imp.name.startswith(a + ".") for a in allowed):
                    bad.append(imp)
    return bad


def _known(imp: Import) -> tuple[str, str] | None:
    """The KNOWN_VIOLATIONS entry (file, module) that covers ``imp``, if any."""
    for path, module in KNOWN_VIOLATIONS:
        if imp.path == path and (imp.name == module or imp.name.startswith(module + ".")):
            return path, module
    return None


def test_product_packages_keep_their_layers():
    found = violations(REPO_ROOT)
    new = [f"{i.path}:{i.line} imports {i.name}" for i in found if _known(i) is None]
    assert not new, "layering violations (docs/adr/0130):\n" + "\n".join(new)


def test_every_known_violation_still_exists():
    """A known violation that was fixed must leave the allow-list with it."""
    stale = KNOWN_VIOLATIONS - {_known(i) for i in violations(REPO_ROOT)}
    assert not stale, f"fixed, remove from KNOWN_VIOLATIONS: {sorted(stale)}"


def test_only_cli_among_product_packages_imports_devtools():
    users = {imp.path.split("/")[0] for package in FORBIDDEN
             for path in (REPO_ROOT / package).rglob("*.py")
             for imp in imports_of(path, REPO_ROOT) if imp.name.split(".")[0] == "devtools"}
    assert not users


def test_every_top_level_package_is_covered():
    """A new top-level package must be placed in the layers (or be a non-product directory)."""
    packages = {p.parent.name for p in REPO_ROOT.glob("*/__init__.py")}
    assert packages - {"tests"} == set(TOP_LEVEL)
    assert set(FORBIDDEN) | {"cli", "devtools"} == set(TOP_LEVEL)


@pytest.fixture
def fake_repo(tmp_path: Path) -> Path:
    for package in TOP_LEVEL:
        (tmp_path / package).mkdir()
        (tmp_path / package / "__init__.py").write_text("")
    return tmp_path


def test_lazy_relative_and_dynamic_imports_are_found(fake_repo: Path):
    (fake_repo / "node" / "p2p").mkdir()
    (fake_repo / "node" / "p2p" / "__init__.py").write_text("")
    (fake_repo / "node" / "p2p" / "host.py").write_text(
        "from . import limits\n"
        "from ..rpc import server\n"
        "def later():\n"
        "    from consensus.tx import build_tx\n"
        "    import relay.client as rc\n"
        "class C:\n"
        "    def m(self):\n"
        "        return importlib.import_module('ml.codecs')\n")
    names = [(i.line, i.name) for i in imports_of(fake_repo / "node" / "p2p" / "host.py", fake_repo)]
    assert names == [(1, "node.p2p.limits"), (2, "node.rpc.server"), (4, "consensus.tx.build_tx"),
                     (5, "relay.client"), (8, "ml.codecs")]
    assert [i.name for i in violations(fake_repo)] == ["consensus.tx.build_tx", "relay.client", "ml.codecs"]


def test_relay_may_use_only_the_ledgers_data_formats(fake_repo: Path):
    (fake_repo / "relay" / "receipts.py").write_text(
        "from consensus.tx import relay_receipt_signing_bytes\n"
        "from consensus.encoding import encode\n"
        "from consensus import tx\n"
        "from consensus import rpcclient\n"
        "def f():\n"
        "    from consensus.validator import ValidatorRole\n"
        "    from devtools.testnet import Testnet\n")
    assert [i.name for i in violations(fake_repo)] == [
        "consensus.rpcclient", "consensus.validator.ValidatorRole", "devtools.testnet.Testnet"]


def test_a_module_named_by_a_string_is_an_import(fake_repo: Path):
    """The back door of "module:factory" tables (ADR 0201): a string naming a higher layer's module is
    caught like an import of it; prose and plain role names are not module paths."""
    (fake_repo / "node" / "roles.py").write_text(
        'IMPLEMENTATIONS = {"validator": "consensus.validator.role:ValidatorRole",\n'
        '                   "serving": "ml.serve.service:ServingService"}\n'
        'ENCODER = "consensus.tx:signed_tx_bytes"\n'
        'NAMES = ("validator", "relay", "compute")\n'
        'OWN = "node.p2p.host"\n'
        'PROSE = "see consensus.tx for the encoding"\n')
    names = [(i.line, i.name) for i in imports_of(fake_repo / "node" / "roles.py", fake_repo)]
    assert names == [(1, "consensus.validator.role"), (2, "ml.serve.service"), (3, "consensus.tx"),
                     (5, "node.p2p.host")]
    assert [i.name for i in violations(fake_repo)] == ["consensus.validator.role", "ml.serve.service", "consensus.tx"]


def test_bench_devtools_and_scripts_never_import_the_tests():
    """Benchmarks and tools import the product (issue 20: "not bench -> tests"); a helper both need
    lives in the product or in devtools, never in tests/."""
    found = [f"{imp.path}:{imp.line} imports {imp.name}"
             for folder in ("bench", "devtools", "scripts") for path in sorted((REPO_ROOT / folder).rglob("*.py"))
             for imp in imports_of(path, REPO_ROOT) if imp.name.split(".")[0] == "tests"]
    assert not found, "\n".join(found)
