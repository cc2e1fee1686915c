"""The command line's own start: it imports only the code of the command it runs, and
``train`` and ``retrain`` start the fork server of their workers before their own imports,
from what their command line says of the cluster, a guess that the config's check puts right."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from daskhps import _forkserver as forkserver
from daskhps._forkserver_exit import SERVER
from daskhps.cli import COMMANDS, build_parser, named_command

ROOT = Path(__file__).resolve().parents[1]


def _fresh(code: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code), *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["train", "run.yaml"], "train"),
        (["-v", "--debug", "plan", "x.yaml", "--set", "a=b"], "plan"),
        (["-vv"], None),
        ([], None),
        (["bogus", "train"], "bogus"),
    ],
)
def test_the_command_is_the_first_word_that_is_not_an_option(
    argv: list[str], named: str | None
) -> None:
    assert named_command(argv) == named


def test_help_and_generate_import_no_command_code() -> None:
    """``daskhps --help`` and ``daskhps generate`` took 5-7 s, importing every command's
    module (torch, pandas, Dask) to build the arguments of commands they do not run."""
    probe = """
        import json, sys
        from daskhps.cli import main
        for argv in (["--help"], ["generate", "--help"], ["-v", "bogus"]):
            try:
                main(argv)
            except SystemExit:
                pass
        heavy = sorted(m for m in ("torch", "pandas", "dask", "distributed") if m in sys.modules)
        print(json.dumps(heavy))
    """
    out = _fresh(probe)
    assert out.returncode == 0, out.stderr[-2000:]
    assert json.loads(out.stdout.splitlines()[-1]) == []
    assert "--rows-per-day" in out.stdout  # generate's own arguments are there


def _arguments(parser: object, name: str) -> list[tuple[tuple[str, ...], str, object]]:
    sub = next(a for a in parser._actions if a.dest == "command")  # type: ignore[attr-defined]
    return [(tuple(a.option_strings), a.dest, a.default) for a in sub.choices[name]._actions]


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_a_commands_arguments_are_those_of_the_whole_parser(name: str) -> None:
    whole, named = build_parser(), build_parser(["-v", name])
    assert _arguments(named, name) == _arguments(whole, name)
    assert len(_arguments(named, name)) > 1  # more than --help


_EARLY = """
    import json, sys
    from daskhps import _forkserver
    from daskhps.cli import _workers_early
    seen = []
    for case in json.loads(sys.argv[1]):
        _workers_early(case)
        seen.append(_forkserver._started)
        _forkserver._stop_unwanted()
    print(json.dumps(seen))
"""


@pytest.mark.skipif(not forkserver.available(), reason="no forkserver here")
def test_train_starts_the_workers_server_early_unless_the_config_names_an_address(
    tmp_path: Path,
) -> None:
    embedded = tmp_path / "embedded.yaml"
    embedded.write_text("cluster:\n  n_workers: 2\n")
    addressed = tmp_path / "addressed.yaml"
    addressed.write_text("cluster:\n  address: tcp://10.0.0.1:8786\n")
    not_yaml = tmp_path / "broken.yaml"
    not_yaml.write_text("cluster: [\n")
    cases = {
        "embedded": ([str(embedded)], True),
        "with options": ([str(embedded), "--resume", "--set", "table.dim=8"], True),
        "address in the file": ([str(addressed)], False),
        "address by --set": ([str(embedded), "--set", "cluster.address=tcp://h:1"], False),
        "address unset by --set": ([str(addressed), "--set", "cluster.address=null"], True),
        "versions only": ([str(embedded), "--versions"], False),
        "help": ([str(embedded), "--help"], False),
        "no such file": ([str(tmp_path / "missing.yaml")], False),
        "not YAML": ([str(not_yaml)], False),
        "no config": ([], False),
    }
    out = _fresh(_EARLY, json.dumps([argv for argv, _ in cases.values()]))
    assert out.returncode == 0, out.stderr[-2000:]
    started = json.loads(out.stdout.splitlines()[-1])
    assert dict(zip(cases, started, strict=True)) == {k: v for k, (_, v) in cases.items()}


@pytest.mark.skipif(not forkserver.available(), reason="no forkserver here")
def test_a_server_started_on_a_guess_is_stopped_once_the_config_forks_nothing() -> None:
    """An early server the run's cluster turns out not to use is stopped (it would sit idle
    with torch loaded for the whole run); one a run asked for is kept."""
    probe = """
        import json, os
        from multiprocessing import forkserver as mf
        from daskhps import _forkserver as f
        from daskhps.config.cluster import ClusterConfig

        def alive(pid):
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                return False
            return os.waitpid(pid, os.WNOHANG)[0] == 0

        remote = ClusterConfig(address="tcp://127.0.0.1:8786")
        f.warm_up_early()
        guessed = mf._forkserver._forkserver_pid
        f.warm_up_for(remote)  # the config's check: no embedded cluster
        stopped = not alive(guessed) and not f._started
        f.warm_up_early()
        f.warm_up()  # a run that forks its workers asked for it
        wanted = mf._forkserver._forkserver_pid
        f.warm_up_for(remote)  # a later run of the same process, on a remote cluster
        print(json.dumps([stopped, alive(wanted), f._started]))
    """
    out = _fresh(probe)
    assert out.returncode == 0, out.stderr[-2000:]
    assert json.loads(out.stdout.splitlines()[-1]) == [True, True, True]


def test_the_fork_servers_exit_skips_the_interpreters_teardown() -> None:
    """In the fork server (started with the variable set), importing the module makes the
    process end with os._exit at exit: the status a normal exit would give (3 here) is never
    reached. Any other process that imports it exits as usual."""
    code = "import sys, daskhps._forkserver_exit; sys.exit(3)"
    plain = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        timeout=60,
        env={k: v for k, v in os.environ.items() if k != SERVER},
    )
    server = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        timeout=60,
        env={**os.environ, SERVER: "1"},
    )
    assert plain.returncode == 3, plain.stderr
    assert server.returncode == 0, server.stderr
