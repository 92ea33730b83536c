"""Print the [tool.mypy] overrides that let today's non-strict modules pass: the error codes each
module still has, grouped. Paste the output over the baseline block in pyproject.toml.

    python scripts/mypy_baseline.py            # runs mypy without the baseline, prints TOML

Strict modules are never given a baseline; tighten by deleting a module (or one of its codes) from
the block and fixing what mypy then reports. The block should only ever shrink.
"""
from __future__ import annotations

import collections
import fnmatch
import re
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BEGIN = "# mypy-baseline:begin"
END = "# mypy-baseline:end"
_ERROR = re.compile(r"^([\w/]+)\.py:\d+: error: .*\[([a-z-]+)\]$")


def config_without_baseline() -> str:
    text = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    start, end = text.index(BEGIN), text.index(END) + len(END)
    return text[:start] + text[end:]


def strict_patterns() -> list[str]:
    """The module patterns of the strict override (the one with disallow_untyped_defs)."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    return [pattern for override in config["tool"]["mypy"].get("overrides", [])
            if override.get("disallow_untyped_defs") for pattern in override["module"]]


def baseline_codes(mypy_output: str, strict: list[str]) -> dict[str, set[str]]:
    """Error codes per non-strict module (a strict module's errors must be fixed, not baselined)."""
    modules: dict[str, set[str]] = collections.defaultdict(set)
    for line in mypy_output.splitlines():
        match = _ERROR.match(line.strip())
        if match:
            module = match.group(1).replace("/", ".").removesuffix(".__init__")
            if not any(fnmatch.fnmatchcase(module, p) or module == p.removesuffix(".*") for p in strict):
                modules[module].add(match.group(2))
    return modules


def render(modules: dict[str, set[str]]) -> str:
    groups: dict[tuple[str, ...], list[str]] = collections.defaultdict(list)
    for module, codes in modules.items():
        groups[tuple(sorted(codes))].append(module)
    out = [BEGIN + " (scripts/mypy_baseline.py; only ever remove entries)"]
    for code_set, members in sorted(groups.items(), key=lambda item: (-len(item[1]), item[0])):
        out.append("[[tool.mypy.overrides]]")
        out.append("module = [" + ", ".join(f'"{m}"' for m in sorted(members)) + "]")
        out.append("disable_error_code = [" + ", ".join(f'"{c}"' for c in code_set) + "]")
    out.append(END)
    return "\n".join(out)


def main() -> int:
    with tempfile.NamedTemporaryFile("w", suffix=".toml", dir=ROOT, delete=False) as config:
        config.write(config_without_baseline())
    try:
        result = subprocess.run([sys.executable, "-m", "mypy", "--config-file", config.name],
                                cwd=ROOT, capture_output=True, text=True, check=False)
    finally:
        Path(config.name).unlink()
    print(render(baseline_codes(result.stdout, strict_patterns())))
    return 0


if __name__ == "__main__":
    sys.exit(main())
