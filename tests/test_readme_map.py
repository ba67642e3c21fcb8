"""The README's "Where things live" map names files and functions that exist (so it cannot rot)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ENTRY = re.compile(r"`([\w./-]+\.py)::([\w.]+)`")


def map_section() -> str:
    text = (ROOT / "README.md").read_text()
    start = text.index("## Where things live")
    end = text.find("\n## ", start + 1)
    return text[start:end if end >= 0 else None]


def defined(path: Path, dotted: str) -> bool:
    """Whether ``dotted`` (a name, or Class.name) is defined at the top of ``path`` (a def, a
    class or an assigned name) or, for Class.name, in that class's body."""
    body = ast.parse(path.read_text()).body
    for part in dotted.split("."):
        found = None
        for node in body:
            names = []
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names = [node.name]
            elif isinstance(node, ast.Assign):
                names = [t.id for t in node.targets if isinstance(t, ast.Name)]
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                names = [node.target.id]
            if part in names:
                found = node
        if found is None:
            return False
        body = getattr(found, "body", [])
    return True


def test_every_entry_of_the_map_exists():
    entries = ENTRY.findall(map_section())
    assert len(entries) >= 30, "the map lost its entries (or their `file::name` form)"
    missing = [f"{f}::{n}" for f, n in entries
               if not (ROOT / f).is_file() or not defined(ROOT / f, n)]
    assert not missing, f"README map names what does not exist: {missing}"


def test_the_map_covers_what_the_issue_asks():
    text = map_section()
    for what in ("a parameter counted", "a forecast band, step by step", "an alert decided",
                 "the step taken", "law.json written", "the run directory read"):
        assert what in text.lower(), what


def test_the_checker_rejects_a_name_that_is_not_there(tmp_path):
    f = tmp_path / "m.py"
    f.write_text("class A:\n    def b(self):\n        pass\nX = 1\n")
    assert defined(f, "A.b") and defined(f, "X")
    assert not defined(f, "A.c") and not defined(f, "b")
