"""The README's install-and-test command keeps the build of torch installed first.

``pip install torch==2.13.0 && pip install -e ".[test]"`` must not swap the CPU build for the
newest torch from the index (a multi-GB CUDA build whose import alone costs each worker about
a third of a GiB more). pip resolves an extra that names its own project (``daskhps[s3]`` inside
``test``) as a second requirement on daskhps and re-resolves daskhps's own requirements with
it, upgrading ``torch>=2.4`` to the newest release: so no extra may name daskhps.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _project() -> dict:
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+; the CI machines have it
    return tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]


def _name(requirement: str) -> str:
    return re.split(r"[\s\[<>=!~;]", requirement, maxsplit=1)[0].lower().replace("_", "-")


def test_no_extra_names_daskhps_itself() -> None:
    project = _project()
    extras = project["optional-dependencies"]
    assert "test" in extras and "s3fs>=2024.2" in extras["test"]  # the object-storage tests' need
    own = {
        f"{extra}: {req}"
        for extra, reqs in extras.items()
        for req in reqs
        if _name(req) == project["name"]
    }
    assert own == set(), "an extra naming daskhps makes pip swap the torch installed first"


def _readme_test_command() -> str:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    commands = re.findall(r"^pip install torch==[^\n]*python -m pytest$", readme, re.M)
    assert len(commands) == 1, commands
    return commands[0]


def test_ci_runs_the_readme_command_in_a_virtualenv_of_its_own() -> None:
    """CI sees what a new user sees: a new virtualenv, then the README's command as written
    (its pip commands quiet), not the packages already in the machine's Python."""
    script = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    lines = [line.strip() for line in script.splitlines() if not line.lstrip().startswith("#")]
    venv = next(i for i, line in enumerate(lines) if re.search(r"-m venv\b", line))
    activate = next(
        i for i, line in enumerate(lines) if re.match(r"(\.|source) .*/bin/activate", line)
    )
    wanted = shlex.split(_readme_test_command())
    ran = [
        i
        for i, line in enumerate(lines)
        if line and [w for w in shlex.split(line) if w != "-q"] == wanted
    ]
    assert len(ran) == 1 and venv < activate < ran[0], script
