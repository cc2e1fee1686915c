"""Children that a test stops with a signal start with that signal's default disposition.

A background job of a non-interactive shell (``python -m pytest ... &``, as CI may start the
suite) inherits SIGINT and SIGQUIT as ignored, and ``exec`` keeps an ignored signal ignored.
Python then installs no ``KeyboardInterrupt`` handler, so a child that a test sends Ctrl-C
never hears it, as ``nohup``'d or ``&``'d programs are meant not to. A test that signals a
child decides what the child hears, whatever the suite inherited: it passes
``preexec_fn=default_dispositions`` to ``subprocess.Popen``.
"""

from __future__ import annotations

import signal

# What the tests send; SIGKILL and SIGSTOP cannot be ignored.
SENT = (signal.SIGINT, signal.SIGTERM)


def default_dispositions() -> None:
    """Run in the child between fork and exec: each signal a test sends acts as it does when
    a terminal starts the program (Python turns SIGINT into ``KeyboardInterrupt``)."""
    for sig in SENT:
        signal.signal(sig, signal.SIG_DFL)
