"""The ADR index in docs/adr/README.md matches the records, and every record has a status line."""
import importlib.util
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _adr_index():
    spec = importlib.util.spec_from_file_location("adr_index", ROOT / "scripts" / "adr_index.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_adr_has_a_title_and_status_line():
    rows, problems = _adr_index().adr_rows()
    assert problems == []
    assert len(rows) == len(list((ROOT / "docs" / "adr").glob("[0-9][0-9][0-9][0-9]-*.md")))


def test_index_table_is_current():
    module = _adr_index()
    rows, _ = module.adr_rows()
    text = (ROOT / "docs" / "adr" / "README.md").read_text(encoding="utf-8")
    assert module.updated_readme(text, module.render_table(rows)) == text, \
        "docs/adr/README.md is out of date: run python scripts/adr_index.py"


def test_status_names_existing_records():
    rows, _ = _adr_index().adr_rows()
    numbers = {number for number, *_ in rows}
    for number, _title, status, _name in rows:
        if status != "accepted":
            named = [word.strip(",()") for word in status.split() if word.strip(",()").isdigit()]
            assert named and all(n in numbers for n in named), (number, status)


def test_relative_links_in_docs_resolve():
    for doc in (ROOT / "docs").rglob("*.md"):
        text = doc.read_text(encoding="utf-8")
        for target in _relative_link_targets(text):
            assert (doc.parent / target).resolve().exists(), f"{doc.relative_to(ROOT)}: broken link {target}"


def _relative_link_targets(text):
    for match in re.finditer(r"\]\(([^)\s]+)\)", text):
        target = match.group(1).split("#", 1)[0]
        if target and "://" not in target and not target.startswith("mailto:"):
            yield target
