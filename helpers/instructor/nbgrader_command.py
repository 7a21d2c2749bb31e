"""The ``nbgrader`` command, run in a process of its own that starts without importing nbgrader again.

Starting ``nbgrader`` costs about 3.5 s before it does anything (it imports Jupyter's server,
nbconvert, sqlalchemy and jsonschema's format checkers), and a grading run calls it many times:
once per autograde, feedback, export and release. Here the first call starts a server process
(multiprocessing's forkserver) that imports nbgrader once; every call is a fresh process forked
from it, in the course directory, with the caller's environment at the time of the call, running
exactly what the console script runs (``NbGraderApp.launch_instance``). Each call is still its own
process, so nothing of one run (configuration, the gradebook's connection, logging) reaches the next.
"""

from __future__ import annotations

import multiprocessing
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

_CONTEXT = None


def _context():
    global _CONTEXT
    if _CONTEXT is None:
        _CONTEXT = multiprocessing.get_context("forkserver")
        _CONTEXT.set_forkserver_preload([__name__, "nbgrader.apps.nbgraderapp"])
    return _CONTEXT


def _child(args: list[str], course: str, env: dict[str, str], out: str, err: str) -> None:
    """The console script's work, in the course directory, its output into ``out`` and ``err``."""
    for path, fd in ((out, 1), (err, 2)):
        handle = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        os.dup2(handle, fd)
        os.close(handle)
    os.chdir(course)
    os.environ.clear()
    os.environ.update(env)
    sys.argv = ["nbgrader", *args]
    from nbgrader.apps.nbgraderapp import NbGraderApp

    code = 0
    try:
        NbGraderApp.launch_instance(argv=list(args))
    except SystemExit as stop:
        code = stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 1)
    except BaseException:  # what the console script would print before exiting with 1
        import traceback

        traceback.print_exc()
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def run(args: list[str], course: Path, env: dict[str, str],
        on_log_line: Callable[[str], None] | None = None) -> subprocess.CompletedProcess:
    """``nbgrader ARGS`` in ``course`` with ``env``: its exit status and output, as ``subprocess.run`` gives them.
    ``on_log_line`` is given each line of its log (stderr) as it is written, about once a second."""
    with tempfile.TemporaryDirectory(prefix="nbgrader-") as scratch:
        out, err = os.path.join(scratch, "stdout"), os.path.join(scratch, "stderr")
        process = _context().Process(target=_child, args=(list(args), str(course), dict(env), out, err))
        process.start()
        read = lambda path: Path(path).read_text(errors="replace") if os.path.exists(path) else ""
        passed = 0
        while process.exitcode is None:
            process.join(timeout=1)
            if on_log_line:
                log = read(err)
                complete = log[passed:].rpartition("\n")[0] if process.exitcode is None else log[passed:]
                for line in complete.splitlines():
                    on_log_line(line)
                passed += len(complete) + (1 if process.exitcode is None and complete else 0)
        return subprocess.CompletedProcess(["nbgrader", *args], process.exitcode, read(out), read(err))
