"""The docs stand on the repository alone.

* No file cites a design document that the repository does not hold: what the system keeps is
  in docs/invariants.md, where a reader can follow it.
* Every test that docs/invariants.md names exists, so the page cannot claim a check that was
  renamed or removed.
"""

from __future__ import annotations

import ast
import os
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
INVARIANTS = ROOT / "docs" / "invariants.md"

# Built, not written out, so this file does not cite it itself.
OUTSIDE_DESIGN_DOC = "DESIGN" + ".md"
CHECKED_SUFFIXES = {".py", ".md", ".yaml", ".yml", ".toml"}
# Tool caches and environments: not the project's files.
SKIPPED_DIRS = {
    ".git",
    ".venv",
    "venv",
    "__pycache__",
    ".mypy_cache",
    ".ruff_cache",
    ".pytest_cache",
    ".hypothesis",
    "node_modules",
    "build",
    "dist",
}

TEST_REF = re.compile(r"(tests/[\w/]+\.py)(?:::(\w+))?")


def citing_files(root: Path, needle: str) -> list[str]:
    """Files under ``root`` (relative paths) whose text contains ``needle``."""
    found = []
    for folder, dirs, files in os.walk(root):
        dirs[:] = [d for d in dirs if d not in SKIPPED_DIRS and not d.endswith(".egg-info")]
        for name in files:
            path = Path(folder) / name
            if path.suffix not in CHECKED_SUFFIXES:
                continue
            if needle in path.read_text(encoding="utf-8", errors="replace"):
                found.append(str(path.relative_to(root)))
    return sorted(found)


def _top_level_names(source: str) -> set[str]:
    """Test functions, test classes and assigned test cases defined at module level."""
    names: set[str] = set()
    for node in ast.parse(source).body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
    return names


def missing_tests(doc: str, root: Path) -> list[str]:
    """``tests/...py`` and ``tests/...py::name`` references of ``doc`` that ``root`` lacks."""
    missing = []
    for path, name in TEST_REF.findall(doc):
        file = root / path
        if not file.is_file():
            missing.append(path)
        elif name and name not in _top_level_names(file.read_text(encoding="utf-8")):
            missing.append(f"{path}::{name}")
    return missing


def test_no_file_cites_a_design_document_outside_the_repository() -> None:
    assert citing_files(ROOT, OUTSIDE_DESIGN_DOC) == [], (
        f"cite docs/invariants.md (or the docs page that says it) instead of {OUTSIDE_DESIGN_DOC}"
    )


def test_every_test_named_in_the_invariants_exists() -> None:
    doc = INVARIANTS.read_text(encoding="utf-8")
    named = [name for _, name in TEST_REF.findall(doc) if name]
    assert len(named) >= 30  # the page names its tests; a parser that finds none checks nothing
    assert missing_tests(doc, ROOT) == []


def test_the_checks_see_a_citation_and_a_missing_test(tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.md").write_text(f"as {OUTSIDE_DESIGN_DOC} says\n")
    (tmp_path / ".git").mkdir()
    (tmp_path / ".git" / "b.md").write_text(OUTSIDE_DESIGN_DOC)  # not the project's
    (tmp_path / "c.txt").write_text(OUTSIDE_DESIGN_DOC)  # not a checked kind of file
    assert citing_files(tmp_path, OUTSIDE_DESIGN_DOC) == [str(Path("docs") / "a.md")]

    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_x.py").write_text(
        "def test_there():\n    pass\n\nTestCase = object\n"
    )
    doc = (
        "`tests/test_x.py::test_there`, `tests/test_x.py::TestCase`, "
        "`tests/test_x.py::test_gone`, `tests/test_y.py::test_any`, `tests/test_x.py`"
    )
    assert missing_tests(doc, tmp_path) == ["tests/test_x.py::test_gone", "tests/test_y.py"]
