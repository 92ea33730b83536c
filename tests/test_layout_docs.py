"""The prose that maps the tree stays true to it (ADR 0190): every path docs/ARCHITECTURE.md names
exists, and the README's Layout section and ml's docstring name every package of the product."""
from __future__ import annotations

import re
from pathlib import Path

import ml

ROOT = Path(__file__).resolve().parents[1]
PRODUCT = ("node", "consensus", "relay", "ml", "cli", "devtools")


def subpackages(package: str) -> list[str]:
    return sorted(p.parent.name for p in (ROOT / package).glob("*/__init__.py"))


def test_every_path_in_the_architecture_note_exists():
    text = (ROOT / "docs" / "ARCHITECTURE.md").read_text(encoding="utf-8")
    paths = {m for m in re.findall(r"`([\w./-]+)`", text) if "/" in m and not m.startswith("/dekube")}
    assert len(paths) > 30
    assert sorted(p for p in paths if not (ROOT / p.rstrip("/")).exists()) == []


def test_readme_layout_names_every_package_and_ml_subpackage():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    layout = readme[readme.index("## Layout"):]
    layout = layout[:layout.find("\n## ", 1) if "\n## " in layout[1:] else len(layout)]
    assert [p for p in PRODUCT if f"{p}/" not in layout] == []
    assert [s for s in subpackages("ml") if f"{s}/" not in layout] == []
    assert [s for s in ("netlab", "perturb") if f"{s}/" not in layout] == []


def test_ml_docstring_names_every_subpackage():
    assert [s for s in subpackages("ml") if f"``{s}``" not in (ml.__doc__ or "")] == []
