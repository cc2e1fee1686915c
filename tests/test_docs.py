"""The docs stand on the repository alone.

* No file cites a design document that the repository does not hold: what the system keeps is
  in docs/invariants.md, where a reader can follow it.
* Every link between the docs finds its page and its heading.
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


# A markdown link to another page of the repository, with an optional #anchor.
LINK = re.compile(r"\]\(([\w./-]*\.md)?(?:#([\w-]+))?\)")
FENCE = re.compile(r"^```.*?^```", re.M | re.S)


def _slug(heading: str) -> str:
    """GitHub's anchor of a heading: lowercase, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[^\w\s-]", "", heading.strip().lower())
    return re.sub(r"\s", "-", text)


def _anchors(page: Path) -> set[str]:
    """The anchors of a page's headings (a repeated heading gets -1, -2, ...)."""
    seen: dict[str, int] = {}
    out = set()
    for line in FENCE.sub("", page.read_text(encoding="utf-8")).splitlines():
        if line.startswith("#"):
            slug = _slug(line.lstrip("#"))
            n = seen.get(slug, 0)
            seen[slug] = n + 1
            out.add(slug if n == 0 else f"{slug}-{n}")
    return out


def broken_links(pages: list[Path]) -> list[str]:
    """``page: target`` for each link to a page or a heading that does not exist."""
    broken = []
    for page in pages:
        text = FENCE.sub("", page.read_text(encoding="utf-8"))
        for target, anchor in LINK.findall(text):
            dest = (page.parent / target).resolve() if target else page
            if not dest.is_file():
                broken.append(f"{page.name}: {target}")
            elif anchor and anchor not in _anchors(dest):
                broken.append(f"{page.name}: {target}#{anchor}")
    return broken


def test_every_link_between_the_docs_finds_its_page_and_heading() -> None:
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    assert broken_links(pages) == []


def test_the_link_check_sees_a_missing_heading(tmp_path: Path) -> None:
    (tmp_path / "a.md").write_text("# Title\n\n## Rows, their state\n\n[x](b.md#gone)\n")
    (tmp_path / "b.md").write_text("# B\n\n[ok](a.md#rows-their-state) [self](#b)\n")
    assert broken_links([tmp_path / "a.md", tmp_path / "b.md"]) == ["a.md: b.md#gone"]
