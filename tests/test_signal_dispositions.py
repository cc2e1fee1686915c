"""The suite passes when started in the background, as CI may start it.

A background job of a non-interactive shell inherits SIGINT as ignored, and so does every
process it starts; a test that sends a child Ctrl-C would wait for an exit that never comes.
Each test that signals a child sets the child's dispositions itself (tests/_signals.py).
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# The child's view of SIGINT, started both ways from inside a shell's background job.
_PROBE = """
import subprocess, sys
from tests._signals import default_dispositions
ask = [sys.executable, "-c", "import signal; h = signal.getsignal(signal.SIGINT); "
       "print('ignored' if h == signal.SIG_IGN else h.__name__)"]
print(subprocess.run(ask, capture_output=True, text=True).stdout.strip())
print(subprocess.run(ask, capture_output=True, text=True,
                     preexec_fn=default_dispositions).stdout.strip())
"""

SENDS = re.compile(r"(?:killpg|send_signal|os\.kill)\([^)]*SIG(?:INT|TERM)\b")


def test_a_background_job_hears_ctrl_c_only_through_the_helper() -> None:
    # `cmd & wait` in `bash -c`: a non-interactive shell's background job, as CI starts one
    res = subprocess.run(
        ["bash", "-c", '"$0" -c "$1" & wait $!', sys.executable, _PROBE],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert res.returncode == 0, res.stderr
    inherited, restored = res.stdout.splitlines()
    assert inherited == "ignored"  # what the helper is for
    assert restored == "default_int_handler"  # Ctrl-C raises KeyboardInterrupt


def test_every_test_that_signals_a_child_sets_its_dispositions() -> None:
    senders = [
        p for p in sorted((ROOT / "tests").rglob("*.py")) if SENDS.search(p.read_text("utf-8"))
    ]
    assert len(senders) >= 4  # the Ctrl-C and SIGTERM tests are found
    missing = [
        str(p.relative_to(ROOT))
        for p in senders
        if "preexec_fn=default_dispositions" not in p.read_text("utf-8")
    ]
    assert missing == [], "pass preexec_fn=default_dispositions (tests/_signals.py) to Popen"
