"""The layering of daskhps, checked on every module.

* The layers that run anywhere (tiers, table, models, sharding, hashing, config) import neither
  dask nor distributed: they are loaded by workers' plugins, the CLI's config checks and
  ``daskhps serve``, which must not pay for (or depend on) a Dask import.
* daskhps's modules form no import cycle at import time: a cycle makes the result depend on
  which module is imported first (a half-initialised module raises ImportError on a name).
* config is the roof, not the ground floor: the components whose sections it composes (data,
  passes, table, tiers, models) import nothing from ``daskhps.config``, and the option base they
  declare their options with (``daskhps.options``) imports no daskhps package but
  ``daskhps.errors``. Every import counts here, at any depth: in a function and under
  ``if TYPE_CHECKING:`` too, since a type-only import is still a dependency a reader follows,
  and the first step back to a cycle dodged by a lazy import.
* daskhps's packages import each other one way (a module at the top, ``daskhps/storage.py``,
  is a package of its own): no cycle between packages, counting imports inside functions (they
  load when they run) but not type-only ones.
* A package's private parts are its own: no module imports another package's ``_private``
  module or name; what others need has a public name in the package that owns it.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "daskhps"

DASK_FREE = [
    "daskhps.tiers",
    "daskhps.table",
    "daskhps.models",
    "daskhps.sharding",
    "daskhps.data.hashing",
    "daskhps.options",
    "daskhps.config",
]
FORBIDDEN = ("dask", "distributed")

# Run in a fresh interpreter: records, for the first forbidden module imported, the modules
# whose top level was executing at that moment (outermost first): the chain that pulled it in.
_PROBE = """
import importlib, json, sys

FORBIDDEN = {forbidden!r}
chain = []


class Recorder:
    def find_spec(self, name, path=None, target=None):
        if not chain and name.split(".")[0] in FORBIDDEN:
            frame, stack = sys._getframe(1), []
            while frame is not None:
                if frame.f_code.co_name == "<module>":
                    stack.append(frame.f_globals.get("__name__", "?"))
                frame = frame.f_back
            chain.extend([m for m in reversed(stack) if m != "__main__"] + [name])
        return None  # never loads anything: the real finders do


sys.meta_path.insert(0, Recorder())
importlib.import_module({module!r})
loaded = sorted(m for m in sys.modules if m.split(".")[0] in FORBIDDEN)
print(json.dumps({{"loaded": loaded[:5], "chain": chain}}))
"""


@pytest.mark.parametrize("module", DASK_FREE)
def test_imports_neither_dask_nor_distributed(module: str) -> None:
    code = _PROBE.format(forbidden=FORBIDDEN, module=module)
    res = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT
    )
    got = json.loads(res.stdout.strip().splitlines()[-1])
    assert not got["loaded"], f"import {module} loads {got['loaded']} via " + " -> ".join(
        got["chain"]
    )


def _module_names() -> dict[str, Path]:
    names = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        names[".".join(parts)] = path
    return names


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _top_level_imports(body: list[ast.stmt]) -> list[ast.Import | ast.ImportFrom]:
    """Imports that run when the module is imported: not inside functions or classes, not
    under ``if TYPE_CHECKING:`` (its ``else`` does run)."""
    found: list[ast.Import | ast.ImportFrom] = []
    for node in body:
        if isinstance(node, ast.Import | ast.ImportFrom):
            found.append(node)
        elif isinstance(node, ast.If):
            if not _is_type_checking(node.test):
                found += _top_level_imports(node.body)
            found += _top_level_imports(node.orelse)
        elif isinstance(node, ast.Try):
            found += _top_level_imports(node.body + node.orelse + node.finalbody)
            for handler in node.handlers:
                found += _top_level_imports(handler.body)
        elif isinstance(node, ast.With):
            found += _top_level_imports(node.body)
    return found


def _source(name: str, path: Path, node: ast.ImportFrom) -> str:
    """The module ``from ... import`` reads from in module ``name`` (at ``path``), absolute."""
    if not node.level:
        return node.module or ""
    # relative: from the module's package, level - 1 packages up
    base = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    base = base[: len(base) - node.level + 1]
    return ".".join([*base, node.module] if node.module else base)


def import_graph(names: dict[str, Path]) -> dict[str, set[str]]:
    """Module -> the daskhps modules its top level imports (``from P import m`` counts as
    importing module ``P.m`` when there is one, else ``P``)."""
    graph: dict[str, set[str]] = {}
    for name, path in names.items():
        edges: set[str] = set()
        for node in _top_level_imports(ast.parse(path.read_text(), str(path)).body):
            if isinstance(node, ast.Import):
                edges.update(a.name for a in node.names if a.name in names)
                continue
            source = _source(name, path, node)
            for alias in node.names:
                target = f"{source}.{alias.name}"
                if target in names:
                    edges.add(target)
                elif source in names:
                    edges.add(source)
        edges.discard(name)
        graph[name] = edges
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle as ``[a, b, ..., a]``, or None (depth-first search, white/grey/black)."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt) :], nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_no_import_cycles() -> None:
    cycle = find_cycle(import_graph(_module_names()))
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_cycle_finder_sees_a_cycle_and_ignores_lazy_imports(tmp_path: Path) -> None:
    # The check above must be able to fail: a real cycle is found, function-level and
    # TYPE_CHECKING imports are not edges.
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from pkg.b import x\n")
    (pkg / "b.py").write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from pkg.a import y\n"
        "def f():\n    from pkg import a\n"
        "from . import c\n"
    )
    (pkg / "c.py").write_text("import pkg.d\n")
    (pkg / "d.py").write_text("")
    names = {
        ".".join(p.relative_to(tmp_path).with_suffix("").parts).removesuffix(".__init__"): p
        for p in pkg.rglob("*.py")
    }
    graph = import_graph(names)
    assert graph["pkg.b"] == {"pkg.c"}
    assert find_cycle(graph) is None
    (pkg / "d.py").write_text("from pkg.a import z\n")
    assert find_cycle(import_graph(names)) == ["pkg.a", "pkg.b", "pkg.c", "pkg.d", "pkg.a"]


# --- config above the components, the option base below them --------------------------------

BELOW_CONFIG = (
    "daskhps.data",
    "daskhps.passes",
    "daskhps.table",
    "daskhps.tiers",
    "daskhps.models",
)
OPTIONS = "daskhps.options"
OPTIONS_MAY_IMPORT = (OPTIONS, "daskhps.errors")


def _within(name: str, package: str) -> bool:
    return name == package or name.startswith(package + ".")


def every_import(name: str, path: Path, *, type_only: bool = True) -> list[tuple[int, str]]:
    """``(line, dotted name)`` of every import in a module, at any depth (in functions, under
    ``if TYPE_CHECKING:`` unless ``type_only`` is false: a type-only import loads nothing);
    ``from P import x`` is ``P.x``, relative imports made absolute."""
    tree = ast.parse(path.read_text(), str(path))
    skipped = (
        set()
        if type_only
        else {
            id(inner)
            for node in ast.walk(tree)
            if isinstance(node, ast.If) and _is_type_checking(node.test)
            for stmt in node.body
            for inner in ast.walk(stmt)
        }
    )
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            source = _source(name, path, node)
            found += [(node.lineno, f"{source}.{a.name}") for a in node.names]
    return found


def layer_violations(
    names: dict[str, Path], packages: tuple[str, ...], refused: Callable[[str], bool]
) -> list[str]:
    """``module:line: name`` for every import by a module of ``packages`` that ``refused``."""
    return [
        f"{name}:{line}: {target}"
        for name, path in sorted(names.items())
        if any(_within(name, p) for p in packages)
        for line, target in every_import(name, path)
        if refused(target)
    ]


def test_components_import_nothing_from_config() -> None:
    found = layer_violations(_module_names(), BELOW_CONFIG, lambda t: _within(t, "daskhps.config"))
    assert not found, "config composes these components; they must not import it:\n" + "\n".join(
        found
    )


def test_the_option_base_imports_no_package_above_it() -> None:
    def above(target: str) -> bool:
        return _within(target, "daskhps") and not any(
            _within(target, p) for p in OPTIONS_MAY_IMPORT
        )

    found = layer_violations(_module_names(), (OPTIONS,), above)
    assert not found, "daskhps.options must stay below every component:\n" + "\n".join(found)


def test_layer_check_sees_imports_at_any_depth(tmp_path: Path) -> None:
    # The checks above must be able to fail: an import of config in a function, under
    # TYPE_CHECKING, relative or as ``from pkg import config`` is found; a module whose name
    # only starts like it is not.
    pkg = tmp_path / "pkg"
    (pkg / "config").mkdir(parents=True)
    (pkg / "comp").mkdir()
    for init in (pkg, pkg / "config", pkg / "comp"):
        (init / "__init__.py").write_text("")
    (pkg / "configs.py").write_text("")
    (pkg / "comp" / "a.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.config import X\n"
    )
    (pkg / "comp" / "b.py").write_text("def f():\n    from ..config import y\n")
    (pkg / "comp" / "c.py").write_text("import pkg.configs\nfrom pkg import config\n")
    (pkg / "comp" / "d.py").write_text("from . import a\n")
    (pkg / "user.py").write_text("import pkg.config\n")
    names = {
        ".".join(p.relative_to(tmp_path).with_suffix("").parts).removesuffix(".__init__"): p
        for p in pkg.rglob("*.py")
    }
    found = layer_violations(names, ("pkg.comp",), lambda t: _within(t, "pkg.config"))
    assert found == [
        "pkg.comp.a:3: pkg.config.X",
        "pkg.comp.b:2: pkg.config.y",
        "pkg.comp.c:2: pkg.config",
    ]


# --- packages import each other one way; a package's private parts stay its own -------------


def _package_of(name: str) -> str | None:
    """The package of daskhps a module belongs to (``daskhps.training.loop`` -> ``training``;
    a module at the top, ``daskhps.storage``, is a package of its own), None outside."""
    parts = name.split(".")
    return parts[1] if len(parts) > 1 and parts[0] == "daskhps" else None


def package_graph(names: dict[str, Path]) -> dict[str, dict[str, str]]:
    """Package -> {package it imports: the first ``module:line`` that does}."""
    graph: dict[str, dict[str, str]] = {}
    for name, path in sorted(names.items()):
        me = _package_of(name)
        if me is None:
            continue
        edges = graph.setdefault(me, {})
        for line, target in every_import(name, path, type_only=False):
            other = _package_of(target)
            # a name of daskhps itself (``from daskhps import __version__``) is no package
            if other is not None and other != me and f"daskhps.{other}" in names:
                edges.setdefault(other, f"{name}:{line}")
    return graph


def test_no_cycle_between_packages() -> None:
    graph = package_graph(_module_names())
    cycle = find_cycle({p: set(edges) for p, edges in graph.items()})
    where = [
        f"{a} -> {b} ({graph[a][b]})" for a, b in zip(cycle or [], (cycle or [])[1:], strict=False)
    ]
    assert cycle is None, "packages importing each other:\n" + "\n".join(where)


def private_imports(names: dict[str, Path]) -> list[str]:
    """``module:line: name`` for every import of another package's private module or name
    (a part after the package's own name that starts with one underscore)."""
    found = []
    for name, path in sorted(names.items()):
        for line, target in every_import(name, path):
            parts = target.split(".")
            owner = _package_of(target)
            if owner is None or owner == _package_of(name) or len(parts) < 3:
                continue
            if any(p.startswith("_") and not p.startswith("__") for p in parts[2:]):
                found.append(f"{name}:{line}: {target}")
    return sorted(set(found))


def test_no_package_imports_another_packages_private_parts() -> None:
    found = private_imports(_module_names())
    assert not found, (
        "a package's private parts are its own; give what others need a public name:\n"
        + "\n".join(found)
    )


def test_package_checks_see_cycles_and_private_imports(tmp_path: Path) -> None:
    # The two checks above must be able to fail: a cycle through a function-level import is
    # found, a type-only import is no edge; a private module or name of another package is
    # found, a package's own private parts and the top package's private modules are not.
    root = tmp_path / "daskhps"
    for sub in ("a", "b"):
        (root / sub).mkdir(parents=True)
        (root / sub / "__init__.py").write_text("")
    (root / "__init__.py").write_text("")
    (root / "_shared.py").write_text("")
    (root / "a" / "_inner.py").write_text("")
    (root / "a" / "x.py").write_text(
        "from daskhps.a._inner import y\nfrom daskhps import _shared\n"
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from daskhps.b.m import T\n"
    )
    (root / "b" / "m.py").write_text("from daskhps.a.x import z\n")
    names = {
        ".".join(p.relative_to(tmp_path).with_suffix("").parts).removesuffix(".__init__"): p
        for p in root.rglob("*.py")
    }
    graph = package_graph(names)
    assert find_cycle({p: set(e) for p, e in graph.items()}) is None
    assert private_imports(names) == []
    (root / "a" / "x.py").write_text("def f():\n    from daskhps.b import m\n")
    (root / "b" / "m.py").write_text(
        "from daskhps.a.x import z\nfrom daskhps.a import _inner\nfrom daskhps.a.x import _z\n"
    )
    graph = package_graph(names)
    assert find_cycle({p: set(e) for p, e in graph.items()}) == ["a", "b", "a"]
    assert private_imports(names) == [
        "daskhps.b.m:2: daskhps.a._inner",
        "daskhps.b.m:3: daskhps.a.x._z",
    ]
