"""Print the biggest classes of some packages by line span (first line of the class statement,
decorators included, to its last line), biggest first: ``python3 scripts/class_sizes.py ml [--top N]
[--max LINES]``; with ``--max`` it exits 1 when a class is longer (issue 20: none over 300 in ml/)."""
from __future__ import annotations

import argparse
import ast
import sys
from pathlib import Path


def class_spans(root: Path) -> list[tuple[int, str]]:
    """(lines, "path:Class") for every class under ``root`` (nested ones too)."""
    out = []
    for path in sorted(root.rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                start = min([node.lineno, *(d.lineno for d in node.decorator_list)])
                out.append(((node.end_lineno or node.lineno) - start + 1, f"{path}:{node.name}"))
    return sorted(out, reverse=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("roots", nargs="+", type=Path)
    parser.add_argument("--top", type=int, default=10)
    parser.add_argument("--max", type=int, default=None)
    args = parser.parse_args(argv)
    spans = sorted((s for root in args.roots for s in class_spans(root)), reverse=True)
    for lines, name in spans[:args.top]:
        print(f"{lines:6d}  {name}")
    if args.max is not None and spans and spans[0][0] > args.max:
        print(f"the biggest class has {spans[0][0]} lines, over {args.max}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
