"""`make test`: the whole suite in quick mode, in two phases, so that it fits a 2-core machine.

Most of the suite times nothing: it compiles, executes notebooks and grades them, one core at a
time. Those tests run first on ``TEST_WORKERS`` pytest-xdist workers (2 unless set), each held to
one thread (PyTorch and TVM) so that the workers share the cores instead of fighting over them.
The tests marked ``timed`` (tests/conftest.py) grade or assert measured speed: they run second,
alone, with every core, as a learner's notebook would. The site's build (``after_notebooks``) runs
second too: it publishes the solutions that phase one's autograde executed.

The suite's budget is ``BUDGET_S`` (20 minutes on the slowest CPU kind the project runs on): past
it, the run still passes but warns and names its slowest tests, so that a slow suite is seen long
before it reaches CI's wall (90 minutes, past which nothing lands). At ``HARD_LIMIT_S`` the run is
stopped and fails.

Arguments are passed to both phases (e.g. ``make test PYTEST_ARGS="-k day03"``). The exit status
is the first failing phase's; a phase that selects no test is not a failure unless both do.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path

NO_TESTS_COLLECTED = 5  # pytest's exit status
BUDGET_S = 20 * 60
HARD_LIMIT_S = 60 * 60
STOPPED = 124  # the exit status of a suite stopped at HARD_LIMIT_S (as timeout(1) uses)


def phases(workers: str) -> list[tuple[list[str], dict[str, str]]]:
    one_thread = {"OMP_NUM_THREADS": "1", "TVM_NUM_THREADS": "1"}
    return [
        (["-n", workers, "-m", "not timed and not after_notebooks"], one_thread),
        (["-m", "timed or after_notebooks"], {}),
    ]


def slowest(reports: list[Path], count: int = 10) -> list[tuple[float, str]]:
    """The ``count`` slowest tests recorded in pytest's JUnit XML reports, as (seconds, test id)."""
    found = []
    for report in reports:
        if report.is_file():
            for case in ET.parse(report).iter("testcase"):
                found.append((float(case.get("time", 0)), f"{case.get('classname')}::{case.get('name')}"))
    return sorted(found, reverse=True)[:count]


def run_phase(command: list[str], env: dict[str, str], seconds_left: float) -> int:
    """One pytest run, stopped (with everything it started) when ``seconds_left`` runs out."""
    proc = subprocess.Popen(command, env=env, start_new_session=True)
    try:
        return proc.wait(timeout=max(seconds_left, 1))
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        return STOPPED


def main(args: list[str]) -> int:
    env = {**os.environ, "TVM_COURSE_QUICK": "1"}
    codes, reports = [], []
    start = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        for number, (options, extra_env) in enumerate(phases(os.environ.get("TEST_WORKERS", "2"))):
            print(f"\n=== pytest {' '.join(options)}", flush=True)
            reports.append(Path(tmp) / f"phase{number}.xml")
            command = [sys.executable, "-m", "pytest", *options, f"--junitxml={reports[-1]}", *args]
            codes.append(run_phase(command, {**env, **extra_env}, HARD_LIMIT_S - (time.monotonic() - start)))
            if codes[-1] == STOPPED:
                break
        took = time.monotonic() - start
        print(f"\n=== the suite took {took / 60:.1f} minutes (budget {BUDGET_S // 60} on the slowest CPU kind)", flush=True)
        if took > BUDGET_S or codes[-1] == STOPPED:
            print("The slowest tests:\n" + "\n".join(f"  {s:7.1f} s  {name}" for s, name in slowest(reports)), flush=True)
    if codes[-1] == STOPPED:
        print(f"FAILED: the suite was stopped after {HARD_LIMIT_S // 60} minutes, well before CI's 90-minute wall; "
              "make the slowest tests above cheaper.", flush=True)
        return STOPPED
    if took > BUDGET_S:
        print(f"WARNING: over the suite's {BUDGET_S // 60}-minute budget: make the slowest tests above cheaper.", flush=True)
    ran = [code for code in codes if code != NO_TESTS_COLLECTED]
    if not ran:
        return NO_TESTS_COLLECTED
    return next((code for code in ran if code != 0), 0)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
