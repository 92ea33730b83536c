"""Tests import the product as any code does (ADR 0190): no ``pytest.importorskip`` of the project's
own modules (a broken import must fail the run, not skip it) and no ``sys.path`` patching (the
checkout's root is on the path through pyproject's ``pythonpath``). Checked statically over tests/."""
from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parent
OWN = ("node", "consensus", "relay", "ml", "cli", "devtools", "bench", "tests")


def offences(source: str) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
            continue
        func = node.func
        if (func.attr == "importorskip" and node.args and isinstance(node.args[0], ast.Constant)
                and str(node.args[0].value).split(".")[0] in OWN):
            found.append(f"line {node.lineno}: importorskip({node.args[0].value!r})")
        if (func.attr in ("insert", "append", "extend") and isinstance(func.value, ast.Attribute)
                and func.value.attr == "path" and isinstance(func.value.value, ast.Name)
                and func.value.value.id == "sys"):
            found.append(f"line {node.lineno}: sys.path.{func.attr}")
    return found


def test_the_checker_sees_both_patterns():
    assert offences("import pytest\npytest.importorskip('ml.train')\n") == ["line 2: importorskip('ml.train')"]
    assert offences("import sys\nsys.path.insert(0, 'x')\n") == ["line 2: sys.path.insert"]
    assert offences("import pytest\npytest.importorskip('torch')\nS = 'sys.path.insert(0, x)'\n") == []


def test_tests_import_the_product_plainly():
    bad = {str(path.relative_to(TESTS)): found for path in sorted(TESTS.rglob("*.py"))
           if (found := offences(path.read_text()))}
    assert bad == {}
