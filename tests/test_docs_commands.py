"""Every command in README.md and docs/*.md works as written.

* Each ``daskhps ...`` command line of a shell block (a fence tagged ``bash``, ``sh``, ``shell``
  or ``console``) parses with the command line's own parser, and its CONFIG and ``--set``
  values validate when CONFIG is one of the repository's configs: a renamed flag, subcommand or
  config key fails here, naming the page and line. That costs no run, so it covers the commands
  too slow to run here (retraining, a real cluster, benchmarks).
* The blocks marked runnable run in page order (README.md, then docs/ by file name) in a copy
  of the repository, after the README's main job (``daskhps train configs/quickstart.yaml``) on
  the quickstart shrunk by :data:`SHRINK`, so that a path, a file name or a run folder that the
  quickstart does not leave behind fails here.

A block is marked by an HTML comment on the line before its opening fence (GitHub shows nothing
of it; blank lines between are allowed)::

    <!-- runnable -->                     run it: a shell block with bash (errexit, pipefail),
                                          a Python block with python
    <!-- runnable: as train.py -->        save it as train.py in the copy, for a later block
    <!-- runnable: in the background -->  start it and leave it running (a server) while the
                                          later blocks run; it must still run at the end

Every runnable block runs from the copy's root, with a ``daskhps`` on PATH that runs this
checkout's code.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from daskhps.cli import build_parser
from daskhps.config.runconfig import load_config
from daskhps.errors import DaskHPSError
from tests._clusters import WORKER_MEMORY
from tests._signals import default_dispositions

ROOT = Path(__file__).resolve().parents[1]

SHELL = {"bash", "sh", "shell", "console"}
PYTHON = {"python", "py"}
MARKER = re.compile(r"\s*<!--\s*runnable(?::\s*(?P<how>.*?))?\s*-->\s*")  # a line of its own
SAVE_AS = re.compile(r"as (?P<name>[\w.-]+)")
BACKGROUND = "in the background"
FENCE = re.compile(r"^\s*(?P<fence>```+|~~~+)\s*(?P<info>\S*)")
# The words that end one simple command and start the next.
OPERATORS = {"&&", "||", "|", "|&", ";", ";;", "&", "(", ")"}
REDIRECTS = {">", ">>", "<", ">&", "<&", "&>", ">|"}
PREFIXES = {"time", "sudo", "exec", "nohup", "env"}

# The README's quickstart, shrunk: its keys and shape (two days, the last one held out, 2
# epochs of 2 passes, so checkpoints pass-000002..4 are kept) on 1,000 rows a day and one
# small worker, so that the main job and every runnable block after it take about 2 minutes.
SHRINK: dict[str, Any] = {
    "data": {"generate": {"rows_per_day": 1000, "parts_per_day": 2, "vocab_scale": 0.01}},
    "passes": {"examples_per_pass": 500, "global_batch_size": 100, "num_shards": 4},
    "table": {"dim": 4},  # its tiers: the same fractions, of a smaller worker
    "model": {"options": {"bottom_mlp": [8, 4], "top_mlp": [8]}},
    "cluster": {"n_workers": 1, "memory_limit": WORKER_MEMORY, "dashboard_address": None},
}
BLOCK_TIMEOUT_S = 300
# Programs a block may call that a minimal machine lacks: such a block is reported, not run.
OPTIONAL_PROGRAMS = ("curl",)
# What a copy of the repository leaves out: git's data, caches, and what runs wrote.
NOT_COPIED = shutil.ignore_patterns(
    ".git", "runs", "data", "__pycache__", "*.egg-info", ".*_cache", ".hypothesis", ".venv",
    "preds", "exported*", "bench-out", "gpu-check", ".gpu-wheels",
)  # fmt: skip


@dataclass(frozen=True)
class Block:
    """One fenced block of a page: ``line`` is its opening fence's, counted from 1."""

    page: str
    line: int
    lang: str
    text: str
    how: str | None  # None: not marked; "": run it; else the marker's words

    @property
    def where(self) -> str:
        return f"{self.page}:{self.line}"


def pages(root: Path = ROOT) -> list[Path]:
    """README.md, then docs/*.md by name: the order a fresh reader's commands run in."""
    return [root / "README.md", *sorted((root / "docs").glob("*.md"))]


def blocks(page: Path, root: Path = ROOT) -> list[Block]:
    """The fenced blocks of ``page``; a marker that no block follows, or whose words are not
    one of the module's, is an error (a typo would otherwise leave a block unchecked)."""
    name = str(page.relative_to(root))
    lines = page.read_text(encoding="utf-8").splitlines()
    found: list[Block] = []
    pending: tuple[int, str] | None = None
    i = 0
    while i < len(lines):
        marker = MARKER.fullmatch(lines[i])
        fence = FENCE.match(lines[i])
        if marker:
            how = marker.group("how") or ""
            if how and how != BACKGROUND and not SAVE_AS.fullmatch(how):
                raise ValueError(f"{name}:{i + 1}: unknown marker {marker.group(0)!r}")
            pending = (i + 1, how)
        elif fence:
            close = fence.group("fence")
            j = i + 1
            while j < len(lines) and not lines[j].strip().startswith(close):
                j += 1
            text = "\n".join(lines[i + 1 : j]) + "\n"
            lang = fence.group("info").lower()
            found.append(Block(name, i + 1, lang, text, None if pending is None else pending[1]))
            pending = None
            i = j
        elif pending is not None and lines[i].strip():
            raise ValueError(f"{name}:{pending[0]}: a runnable marker with no block after it")
        i += 1
    if pending is not None:
        raise ValueError(f"{name}:{pending[0]}: a runnable marker with no block after it")
    return found


def shell_commands(block: Block) -> Iterator[tuple[int, list[str]]]:
    """(line on the page, argv) of every ``daskhps`` command in a shell block: each logical
    line (backslash continuations joined) split at ``&&``, ``|``, ``;`` and ``&``, leading
    ``NAME=value`` assignments and ``time``/``sudo``-like words dropped; ``daskhps ...`` and
    ``python -m daskhps.cli ...`` both count. A console block's commands are its ``$`` lines."""
    lines = block.text.splitlines()
    i = 0
    while i < len(lines):
        at = block.line + 1 + i
        logical = lines[i]
        while logical.endswith("\\") and i + 1 < len(lines):
            i += 1
            logical = logical[:-1] + " " + lines[i]
        i += 1
        if block.lang == "console":
            if not logical.startswith("$ "):
                continue
            logical = logical[2:]
        lex = shlex.shlex(logical, posix=True, punctuation_chars=True)
        lex.whitespace_split = True
        words: list[str] = []
        for word in [*lex, ";"]:
            if word not in OPERATORS:
                words.append(word)
                continue
            argv = _daskhps_argv(words)
            if argv is not None:
                yield at, argv
            words = []


def _daskhps_argv(words: list[str]) -> list[str] | None:
    kept: list[str] = []
    skip = False
    for w in words:
        if skip:
            skip = False
        elif w in REDIRECTS:
            skip = True  # and its target
        else:
            kept.append(w)
    while kept and (re.fullmatch(r"\w+=.*", kept[0]) or kept[0] in PREFIXES):
        kept.pop(0)
    if kept and Path(kept[0]).name == "daskhps":
        return kept[1:]
    if kept[:3] in (["python", "-m", "daskhps.cli"], ["python3", "-m", "daskhps.cli"]):
        return kept[3:]
    return None


def command_error(argv: list[str], root: Path = ROOT) -> str | None:
    """Why ``daskhps ARGV`` is refused before it starts, or None: the parser's message, or
    the config's when CONFIG is a file of ``root`` (the repository's configs, --set applied)."""
    out = io.StringIO()
    try:
        with contextlib.redirect_stderr(out), contextlib.redirect_stdout(io.StringIO()):
            args = build_parser().parse_args(argv)
    except SystemExit as e:
        if e.code == 0:  # --help, --version
            return None
        return out.getvalue().strip().splitlines()[-1]
    config = getattr(args, "config", None)
    if config and (root / config).is_file():
        try:
            load_config(root / config, args.overrides)
        except DaskHPSError as e:
            return str(e)
    return None


def command_errors(root: Path = ROOT) -> tuple[int, list[str]]:
    """How many ``daskhps`` commands the shell blocks of the pages hold, and one line per
    command that is refused: page:line, the command, why."""
    count, errors = 0, []
    for page in pages(root):
        for block in blocks(page, root):
            if block.lang not in SHELL:
                continue
            for line, argv in shell_commands(block):
                count += 1
                why = command_error(argv, root)
                if why is not None:
                    errors.append(f"{block.page}:{line}: daskhps {shlex.join(argv)}: {why}")
    return count, errors


def test_every_daskhps_command_in_the_docs_parses() -> None:
    count, errors = command_errors()
    assert count >= 30  # the pages' commands are found: a parser that finds none checks nothing
    assert errors == []


def test_the_checks_see_a_wrong_command_and_a_wrong_marker(tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    (tmp_path / "configs").mkdir()
    shutil.copy(ROOT / "configs" / "quickstart.yaml", tmp_path / "configs")
    (tmp_path / "README.md").write_text(
        "text\n\n```bash\n"
        "daskhps train configs/quickstart.yaml --restart   # no such flag\n"
        "DASKHPS_KILL_AT=x time daskhps inspect runs/q && daskhps serv --model m | head\n"
        "daskhps predict --model m \\\n    --data d --out o --bogus 1\n"
        "echo 'daskhps train --nothing'; python -m daskhps.cli config --schema > s.json\n"
        "```\n\n```console\n$ daskhps plan configs/quickstart.yaml --set table.dimm=8\n"
        "daskhps: output, not a command\n```\n\n"
        "```\ndaskhps train --unlabelled-blocks-are-not-commands\n```\n"
    )
    (tmp_path / "docs" / "a.md").write_text(
        "Mark a block with `<!-- runnable -->`.\n\n```bash\ndaskhps --version\n```\n"
        "<!-- runnable -->\n\n```bash\ndaskhps config configs/quickstart.yaml\n```\n"
        "<!-- runnable: as x.py -->\n```python\nprint(1)\n```\n"
    )
    count, errors = command_errors(tmp_path)
    assert count == 8
    assert [e.split(": daskhps ")[0] for e in errors] == [
        "README.md:4", "README.md:5", "README.md:6", "README.md:12",
    ]  # fmt: skip
    assert "unrecognized arguments: --restart" in errors[0]
    assert "invalid choice: 'serv'" in errors[1]
    assert "unrecognized arguments: --bogus 1" in errors[2]
    assert "table.dimm: unknown key; did you mean table.dim?" in errors[3]
    marked = [(b.where, b.how) for b in blocks(tmp_path / "docs" / "a.md", tmp_path)]
    assert marked == [("docs/a.md:3", None), ("docs/a.md:8", ""), ("docs/a.md:12", "as x.py")]

    (tmp_path / "docs" / "a.md").write_text("<!-- runnable: twice -->\n```bash\nls\n```\n")
    with pytest.raises(ValueError, match=r"docs/a.md:1: unknown marker"):
        blocks(tmp_path / "docs" / "a.md", tmp_path)
    (tmp_path / "docs" / "a.md").write_text("<!-- runnable -->\nprose\n```bash\nls\n```\n")
    with pytest.raises(ValueError, match=r"docs/a.md:1: a runnable marker with no block"):
        blocks(tmp_path / "docs" / "a.md", tmp_path)


def runnable_blocks(root: Path = ROOT) -> list[Block]:
    return [b for page in pages(root) for b in blocks(page, root) if b.how is not None]


def _copy(tmp_path: Path) -> Path:
    """A copy of the repository with the quickstart shrunk, as a fresh checkout would be."""
    copy = tmp_path / "checkout"
    shutil.copytree(ROOT, copy, ignore=NOT_COPIED)
    quickstart = copy / "configs" / "quickstart.yaml"
    config = yaml.safe_load(quickstart.read_text())
    for section, keys in SHRINK.items():
        _merge(config[section], keys)
    quickstart.write_text(yaml.safe_dump(config, sort_keys=False))
    return copy


def _merge(into: dict[str, Any], over: dict[str, Any]) -> None:
    for k, v in over.items():
        if isinstance(v, dict) and isinstance(into.get(k), dict):
            _merge(into[k], v)
        else:
            into[k] = v


def _environment(tmp_path: Path, copy: Path) -> dict[str, str]:
    """PATH with a ``daskhps`` that runs the copy's code under this interpreter (an installed
    ``daskhps`` script may belong to another checkout), PYTHONPATH the copy."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    script = bin_dir / "daskhps"
    script.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m daskhps.cli "$@"\n')
    script.chmod(0o755)
    python = bin_dir / "python"  # the pages' `python script.py`: this interpreter
    python.write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
    python.chmod(0o755)
    return {
        **os.environ,
        "PATH": os.pathsep.join([str(bin_dir), os.environ.get("PATH", "")]),
        "PYTHONPATH": str(copy),
    }


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) != 0


def _argv(block: Block, scripts: Path) -> list[str]:
    if block.lang in SHELL:
        return ["bash", "-e", "-o", "pipefail", "-c", block.text]
    if block.lang in PYTHON:
        script = scripts / f"{block.page.replace('/', '-')}-{block.line}.py"
        script.write_text(block.text)
        return [sys.executable, str(script)]
    raise AssertionError(f"{block.where}: a runnable block is shell or Python, not {block.lang!r}")


def _tail(path: Path, chars: int = 3000) -> str:
    return path.read_text(errors="replace")[-chars:]


@pytest.mark.slow
def test_runnable_blocks_run_as_written_after_the_main_job(tmp_path: Path) -> None:
    marked = runnable_blocks()
    assert len(marked) >= 15  # the markers are found
    if not _port_free(8000):  # the pages' server examples use the default port
        pytest.skip("port 8000 is in use on this machine; the docs' serving examples need it")
    copy = _copy(tmp_path)
    env = _environment(tmp_path, copy)
    logs = tmp_path / "logs"
    scripts = tmp_path / "scripts"
    logs.mkdir()
    scripts.mkdir()
    seconds: list[str] = []

    def run(name: str, argv: list[str]) -> tuple[int, Path]:
        log = logs / f"{name}.txt"
        start = time.monotonic()
        with log.open("w") as out:
            code = subprocess.run(
                argv, cwd=copy, env=env, stdout=out, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL, timeout=BLOCK_TIMEOUT_S, check=False,
            ).returncode  # fmt: skip
        seconds.append(f"{name}: {time.monotonic() - start:.1f} s")
        return code, log

    # The README's main job, less its install: the copy is this checkout's code.
    code, log = run("main-job", ["daskhps", "train", "configs/quickstart.yaml"])
    assert code == 0, _tail(log)
    background: list[tuple[Block, subprocess.Popen[bytes], Path]] = []

    def still_running() -> None:
        for b, proc, lg in background:
            assert proc.poll() is None, f"{b.where} exited {proc.returncode}:\n{_tail(lg)}"

    try:
        for block in marked:
            name = f"{block.page.replace('/', '-')}-{block.line}"
            save = SAVE_AS.fullmatch(block.how or "")
            missing = [p for p in OPTIONAL_PROGRAMS if p in block.text and not shutil.which(p)]
            if save:
                (copy / save.group("name")).write_text(block.text)
            elif missing:
                seconds.append(f"{name}: not run, no {' or '.join(missing)} on this machine")
            elif block.how == BACKGROUND:
                with (logs / f"{name}.txt").open("w") as out:
                    proc = subprocess.Popen(
                        _argv(block, scripts), cwd=copy, env=env, stdin=subprocess.DEVNULL,
                        stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                        preexec_fn=default_dispositions,  # stopped by SIGTERM below
                    )  # fmt: skip
                background.append((block, proc, logs / f"{name}.txt"))
            else:
                code, log = run(name, _argv(block, scripts))
                if code != 0:
                    still_running()  # a server that failed to start is the cause: name it
                assert code == 0, f"{block.where} failed ({code}):\n{_tail(log)}"
        still_running()
        for b, proc, lg in background:  # stopped as the pages say a server is stopped
            os.killpg(proc.pid, signal.SIGTERM)
            assert proc.wait(timeout=60) == 0, f"{b.where} after SIGTERM:\n{_tail(lg)}"
    finally:
        for _, proc, _ in background:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        print("\n".join(seconds))
