"""Random sequences of what users do to a training folder and a retraining folder never lose a
model that a documented rule keeps.

A seeded random sequence drives the real command line (``python -m daskhps.cli``, a
LocalCluster of one worker, zarr stores on disk) through ``train``, ``train --resume`` (one
more epoch each time), ``train --overwrite``, failed trains with each bad input of
``docs/checkpoints.md``, ``train`` aimed at the retraining folder, ``retrain`` as new days
arrive, and ``predict``. After every step:

- every checkpoint of the training folder that no rule removed (``checkpoint.keep`` drops the
  oldest; ``--overwrite`` replaces the run) still loads and predicts the same probabilities,
  bit for bit, as when it was first seen, and the folder holds exactly those checkpoints;
- every published version of the retraining folder does the same, and ``CURRENT`` still names
  the newest published one.

A step that changed no byte of the folders (most refusals) is checked by their digest alone:
what a checkpoint predicts is a function of those bytes.

Every step kind (and every bad input) occurs at least once per sequence, in an order drawn
from the seed, with one more step drawn at random; a failure names the seed and the steps so
far. The steps refused before any cluster starts (a train into a folder that holds a run, the
bad inputs but the malformed row) go through the command line's ``main`` in this process
(tests/_runs.py ``cli_here``); every other step is a subprocess of its own. A sequence costs a
few minutes of training, so CI runs one fixed seed; ``DASKHPS_SEQUENCE_SEEDS=1,2,3`` runs
others.
"""

from __future__ import annotations

import os
import random
import shutil
import subprocess
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
import yaml

from daskhps.data.badrows import BadRowPolicy
from daskhps.data.parse import read_shard
from daskhps.data.schema import criteo_schema
from daskhps.data.source import SUCCESS
from daskhps.data.synthetic import GeneratorConfig, generate
from daskhps.retrain import ExitCode, Registry
from daskhps.runfiles.checkpoint import list_checkpoints
from daskhps.serve.score import CacheSizes, Scorer
from daskhps.serve.version import Servable, load_servable
from tests._runs import cli, cli_here, tiny_config, write_config
from tests.runfiles.test_rundir import tree_digest

pytestmark = pytest.mark.slow

DAYS = ["2024-01-01", "2024-01-02", "2024-01-03", "2024-01-04"]
KEEP = 2  # checkpoint.keep of the training folder
SMALL = CacheSizes(device_rows=4096, host_bytes=1 << 20)


def _pool(root: Path) -> Path:
    """Four generated days, copied into the folders as the steps need them."""
    out = root / "pool"
    generate(
        GeneratorConfig(days=4, rows_per_day=800, parts_per_day=2, seed=11, vocab_scale=0.01),
        str(out),
    )
    return out


def _base(run_dir: Path, logs: Path, **sections: Any) -> dict[str, Any]:
    return tiny_config(
        run_dir,
        logs,
        **{
            "data": {"bad_rows": "fail"},
            "passes": {"examples_per_pass": 400},
            "table": {"tiers": {"device": {"rows": 50_000}}},
            **sections,
        },
    )


def _cli(*args: str) -> subprocess.CompletedProcess:
    return cli(*args)


def _predict(servable: Servable, frame: pd.DataFrame) -> np.ndarray:
    scorer = Scorer(servable, SMALL)
    try:
        return scorer.score(frame)
    finally:
        scorer.close()


BAD_INPUTS: list[tuple[str, ...]] = [
    ("--overwrite", "--set", "data.train.paths=[/nonexistent/logs]"),
    ("--overwrite", "--set", "data.holdout.day=2031-01-01"),
    ("--overwrite", "--set", "data.train.days=2030-01-01..2030-01-02"),
    ("--overwrite", "--set", "table.tiers.store_dir=/proc/daskhps"),
    ("--overwrite", "--set", "cluster.gpu=true"),
    ("--resume", "--set", "table.dim=8"),
    ("--resume", "--checkpoint", "pass-000099"),
    ("--overwrite", "--set", "BADROWS"),  # a malformed row: fails on the cluster, after the move
]


class RunFolders:
    """A training folder T and a retraining folder R, and what each must still serve."""

    def __init__(
        self, root: Path, pool: Path, here: Callable[..., subprocess.CompletedProcess]
    ) -> None:
        self.dir = root
        self.here = here  # the command line in this process, for refusals
        self.logs = self.dir / "train-logs"  # two days, both trained on
        for day in DAYS[:2]:
            shutil.copytree(pool / f"day={day}", self.logs / f"day={day}")
        self.new_days = [pool / f"day={d}" for d in DAYS]  # arrive in R one by one
        self.rlogs = self.dir / "retrain-logs"
        self.rlogs.mkdir(parents=True)
        self.epochs, self.seed = 1, 1  # of the run in T: what a resume must repeat
        self.train_cfg = self._write(
            "train.yaml",
            _base(self.dir / "T", self.logs, checkpoint={"every_passes": 1, "keep": KEEP}),
        )
        self.train_cfg_data = yaml.safe_load(self.train_cfg.read_text())
        self.retrain_cfg = self._write(
            "retrain.yaml",
            _base(
                self.dir / "R",
                self.rlogs,
                data={"train": {"require_complete": True}, "bad_rows": "fail"},
                eval={"every_pass": False},
                retrain={"max_auc_drop": 0.5, "max_logloss_rise": 0.5},
            ),
        )
        frame, _ = read_shard(
            str(sorted((pool / f"day={DAYS[1]}").glob("part-*"))[0]),
            self._schema(),
            BadRowPolicy(action="skip"),
        )
        self.frame = frame.iloc[:300]
        self.expected: dict[str, np.ndarray] = {}  # T's checkpoints: name -> probabilities
        self.versions: dict[str, np.ndarray] = {}  # R's published versions
        self.arrived = 0
        self.copies: dict[Path, dict[str, np.ndarray]] = {}  # copies of T: what each predicts
        self.checked = ""  # the folders' digest when check() last predicted
        # T starts with a trained run: most rules are about not losing it
        self._train_ok()

    def _write(self, name: str, d: dict[str, Any]) -> Path:
        return write_config(self.dir / name, d)

    def _schema(self) -> Any:
        return criteo_schema()

    # -- what must hold ------------------------------------------------------------------

    def _record_new(self, *, replaced: bool) -> None:
        """After a successful train: the folder holds the ``KEEP`` newest checkpoints; a
        checkpoint seen before predicts as it did (``replaced``: none seen before survive)."""
        if replaced:
            self.expected.clear()
        found = list_checkpoints(self.dir / "T")
        assert len(found) <= KEEP
        names = [c.name for c in found]
        assert names == sorted(names)
        kept_before = [n for n in self.expected if n not in names]
        newest = max(self.expected, default="")
        assert all(n < names[0] for n in kept_before), ("a kept checkpoint vanished", names)
        self.expected = {n: p for n, p in self.expected.items() if n in names}
        for c in found:
            if c.name not in self.expected:
                assert c.name > newest or replaced
                self.expected[c.name] = _predict(Servable.from_checkpoint(c), self.frame)

    def _same_run(self) -> list[str]:
        return ["--set", f"run.seed={self.seed}", "--set", f"passes.epochs={self.epochs}"]

    def _train_ok(self, *args: str, replaced: bool = False) -> None:
        run = _cli("train", str(self.train_cfg), *self._same_run(), *args)
        assert run.returncode == 0, run.stderr[-3000:]
        self._record_new(replaced=replaced)

    def check(self) -> None:
        # A step that changed no byte under the folders (a refusal) cannot have changed a
        # prediction: scoring is a function of those bytes. The digest is taken of every
        # folder at once, so a checkpoint that read files of another folder would be covered.
        digest = tree_digest(self.dir)
        if digest == self.checked:
            return
        self.training_checkpoints_predict_the_same()
        self.published_versions_predict_the_same()
        self.copies_predict_the_same()
        self.checked = digest

    def copies_predict_the_same(self) -> None:
        for folder, expected in self.copies.items():
            found = {c.name: c for c in list_checkpoints(folder)}
            assert sorted(found) == sorted(expected), folder
            for name, probs in expected.items():
                got = _predict(Servable.from_checkpoint(found[name]), self.frame)
                assert np.array_equal(got, probs), (folder, name)

    def training_checkpoints_predict_the_same(self) -> None:
        found = {c.name: c for c in list_checkpoints(self.dir / "T")}
        assert sorted(found) == sorted(self.expected)
        for name, probs in self.expected.items():
            got = _predict(Servable.from_checkpoint(found[name]), self.frame)
            assert np.array_equal(got, probs), name

    def published_versions_predict_the_same(self) -> None:
        if not self.versions:
            return
        registry = Registry(self.dir / "R" / "versions")
        published = {v.name: v for v in registry.versions()}
        assert set(self.versions) <= set(published)
        current = registry.current()
        assert current is not None and current.name == max(self.versions)
        for name, probs in self.versions.items():
            got = _predict(load_servable(published[name].checkpoint), self.frame)
            assert np.array_equal(got, probs), name

    # -- the steps -----------------------------------------------------------------------

    def train_again_is_refused(self) -> None:
        before = tree_digest(self.dir / "T")
        run = self.here("train", str(self.train_cfg), *self._same_run())
        assert run.returncode == 1 and "already holds a run" in run.stderr, run.stderr[-2000:]
        assert tree_digest(self.dir / "T") == before

    def resume_one_more_epoch(self) -> None:
        self.epochs += 1
        self._train_ok("--resume")

    def overwrite(self, seed: int) -> None:
        self.epochs, self.seed = 1, seed
        self._train_ok("--overwrite", replaced=True)

    def a_bad_train_changes_nothing(self, bad: tuple[str, ...]) -> None:
        args = list(bad)
        command = self.here  # refused before any cluster starts
        if args[-1] == "BADROWS":  # fails on the cluster: a run of its own
            command = _cli
            args[-1] = f"data.train.paths=[{self._broken_logs()}]"
        before = tree_digest(self.dir / "T")
        run = command("train", str(self.train_cfg), *self._same_run(), *args)
        assert run.returncode != 0, run.stderr[-2000:]
        assert tree_digest(self.dir / "T") == before

    def train_into_the_retraining_folder_is_refused(self) -> None:
        published = self.dir / "R" / "versions"
        before = tree_digest(self.dir / "R") if published.exists() else None
        command = _cli if before is None else self.here  # refused, or a run of its own
        if before is None and not self.arrived:  # a run of its own needs a day to train on
            self.a_new_day_arrives()
        run = command("train", str(self.retrain_cfg), "--overwrite")
        if before is not None:
            assert run.returncode == 1 and "daskhps retrain" in run.stderr, run.stderr[-2000:]
            assert tree_digest(self.dir / "R") == before
        else:  # nothing there yet: it trains like any new run; keep R for retraining
            assert run.returncode == 0, run.stderr[-2000:]
            shutil.rmtree(self.dir / "R")

    def copy_and_resume_the_copy(self) -> None:
        """``cp -a T C``, then C resumes from its oldest checkpoint with another learning
        rate: T must not change (check() compares it), and C trains in its own stores."""
        copy = self.dir / f"C{len(self.copies)}"
        shutil.copytree(self.dir / "T", copy, symlinks=True)
        oldest = list_checkpoints(copy)[0].name
        run = _cli(
            "train", str(self.train_cfg), *self._same_run(), "--set", f"run.dir={copy}",
            "--resume", "--checkpoint", oldest, "--overwrite",
            "--set", "table.optimizer.lr=0.2",
        )  # fmt: skip
        assert run.returncode == 0, run.stderr[-3000:]
        found = list_checkpoints(copy)
        assert all(c.stores_dir == (copy / "stores").absolute() for c in found)
        self.copies[copy] = {
            c.name: _predict(Servable.from_checkpoint(c), self.frame) for c in found
        }

    def retrain_on_the_training_run_is_refused(self) -> None:
        before = tree_digest(self.dir / "T")
        run = self.here("retrain", str(self.train_cfg), *self._same_run())
        assert run.returncode == ExitCode.BAD_CONFIG, run.stderr[-2000:]
        assert "holds a training run" in run.stderr, run.stderr[-2000:]
        assert tree_digest(self.dir / "T") == before

    def a_refused_resume_changes_nothing(self) -> None:
        before = tree_digest(self.dir / "T")
        if self.epochs > 1:  # fewer epochs than the checkpoint has done
            args = ["--set", f"passes.epochs={self.epochs - 1}", "--resume"]
            run = self.here("train", str(self.train_cfg), "--set", f"run.seed={self.seed}", *args)
        else:  # an earlier checkpoint without --overwrite
            oldest = list_checkpoints(self.dir / "T")[0].name
            args = ["--resume", "--checkpoint", oldest]
            run = self.here("train", str(self.train_cfg), *self._same_run(), *args)
        assert run.returncode != 0, run.stderr[-2000:]
        assert tree_digest(self.dir / "T") == before

    def resume_of_the_finished_run_says_so(self) -> None:
        before = tree_digest(self.dir / "T")
        run = self.here("train", str(self.train_cfg), *self._same_run(), "--resume")
        assert run.returncode == 0 and "is complete" in run.stderr, run.stderr[-2000:]
        assert tree_digest(self.dir / "T") == before

    def a_failed_first_attempt_then_the_same_command(self) -> None:
        """A new run that fails on a malformed row leaves no folder; the same command then
        fails the same way, not on "a run" it left."""
        broken = self._broken_logs()
        folder = self.dir / "F"
        config = self._write("first.yaml", _base(folder, broken))
        for _ in range(2):
            run = _cli("train", str(config))
            assert run.returncode != 0
            assert "already holds a run" not in run.stderr, run.stderr[-2000:]
            assert "bad-row policy is 'fail'" in run.stderr.strip().splitlines()[-1]
            assert not folder.exists()

    def _broken_logs(self) -> Path:
        broken = self.dir / "broken-logs"
        if not broken.exists():
            shutil.copytree(self.logs, broken)
            part = sorted((broken / f"day={DAYS[0]}").glob("part-*"))[0]
            with part.open("a") as f:
                f.write("not\ta\trow\n")
        return broken

    def a_new_day_arrives(self) -> None:
        if self.arrived == len(DAYS):
            return
        src = self.new_days[self.arrived]
        shutil.copytree(src, self.rlogs / src.name)
        (self.rlogs / src.name / SUCCESS).write_text("")
        self.arrived += 1

    def retrain(self) -> None:
        if self.arrived < 2:  # one day to train, one to score
            self.a_new_day_arrives()
            self.a_new_day_arrives()
        run = _cli("retrain", str(self.retrain_cfg))
        assert run.returncode in (ExitCode.PUBLISHED, ExitCode.NOTHING_NEW), run.stderr[-3000:]
        if run.returncode == ExitCode.PUBLISHED:
            current = Registry(self.dir / "R" / "versions").current()
            assert current is not None and current.name not in self.versions
            self.versions[current.name] = _predict(load_servable(current.checkpoint), self.frame)

    def predict_the_latest(self) -> None:
        out = self.dir / "preds"
        day = sorted((self.new_days[1]).glob("part-*"))[0]
        run = _cli(
            "predict",
            "--model",
            str(self.dir / "T"),
            "--data",
            str(day),
            "--out",
            str(out),
            "--overwrite",
        )
        assert run.returncode == 0, run.stderr[-3000:]
        got = pd.read_parquet(out).sort_values("row")["probability"].to_numpy()[:300]
        latest = max(self.expected)
        np.testing.assert_allclose(got, self.expected[latest], rtol=0, atol=1e-6)


def _sequence(rng: random.Random, folders: RunFolders) -> list[tuple[str, Callable[[], None]]]:
    """Every step kind once, and every bad input once, shuffled; then one more drawn at random."""
    f = folders
    kinds: list[tuple[str, Callable[[], None]]] = [
        ("train again", f.train_again_is_refused),
        ("resume one more epoch", f.resume_one_more_epoch),
        ("overwrite", lambda: f.overwrite(rng.randint(2, 5))),
        ("train into the retraining folder", f.train_into_the_retraining_folder_is_refused),
        ("a new day arrives", f.a_new_day_arrives),
        ("retrain", f.retrain),
        ("predict", f.predict_the_latest),
        ("copy and resume the copy", f.copy_and_resume_the_copy),
        ("retrain on the training run", f.retrain_on_the_training_run_is_refused),
        ("a refused resume", f.a_refused_resume_changes_nothing),
        ("resume of the finished run", f.resume_of_the_finished_run_says_so),
        ("a failed first attempt, twice", f.a_failed_first_attempt_then_the_same_command),
    ]
    bad = [
        (f"bad train {b[-1]}", (lambda b=b: f.a_bad_train_changes_nothing(b))) for b in BAD_INPUTS
    ]
    steps = kinds + bad
    rng.shuffle(steps)
    return [*steps, rng.choice(kinds)]


_SEEDS = [int(x) for x in os.environ.get("DASKHPS_SEQUENCE_SEEDS", "0").split(",")]


@pytest.mark.parametrize("seed", _SEEDS)
def test_run_folders_survive_any_sequence(
    tmp_path: Path,
    seed: int,
    capfd: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    here = partial(cli_here, capfd, caplog)
    folders = RunFolders(tmp_path / "folders", _pool(tmp_path), here)  # trains T first
    folders.check()
    done: list[str] = []
    for name, step in _sequence(random.Random(seed), folders):
        done.append(name)
        try:
            step()
            folders.check()
        except AssertionError as e:
            raise AssertionError(f"seed {seed}, after steps {done}: {e}") from e
