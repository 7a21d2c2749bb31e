"""`make test`: the whole suite in quick mode, in two phases, so that it fits a 2-core machine.

Most of the suite times nothing: it compiles, executes notebooks and grades them, one core at a
time. Those tests run first on ``TEST_WORKERS`` pytest-xdist workers (2 unless set), each held to
one thread (PyTorch and TVM) so that the workers share the cores instead of fighting over them.
The tests marked ``timed`` (tests/conftest.py) grade or assert measured speed: they run second,
alone, with every core, as a learner's notebook would. The site's build (``after_notebooks``) runs
second too: it publishes the solutions that phase one's autograde executed.

The suite's budget is ``BUDGET_S``: 30 minutes on the slowest CPU kind the project runs on (a
Zen 3). On a faster CPU the same suite must finish sooner, so the budget here is scaled by how fast
this CPU kind ran the suite against a Zen 3 (``RELATIVE_TIME``, measured; a CPU not in it gets the
full 30 minutes and is said to be unmeasured). Past its budget the run still passes but warns,
names its slowest tests and says what the time means on a Zen 3, so that a slow suite is seen long
before it reaches CI's wall (90 minutes, past which nothing lands). Past ``HARD_LIMIT_S`` (70
minutes on a Zen 3, scaled the same way: what is left of CI's 90 covers building the environment)
the run is stopped and fails.

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
BUDGET_S = 30 * 60
# The suite's time on each CPU kind (LLVM's name) as a share of its time on a Zen 3, 2 cores each:
# Zen 4 21 minutes against 50 (issue 28, one commit, stop 28); the Intel Xeon of the 5th generation about 0.43
# (stop 33). Zen 5: 18.5 minutes on 2026-12-02 against a real Zen 3's 36.4 the day before (stop 67;
# 16 against 50 at stop 28): that Zen 5 ran in phases of up to half its speed, so its share is the measured one.
RELATIVE_TIME = {"znver3": 1.0, "znver4": 0.42, "znver5": 0.51, "emeraldrapids": 0.43}
HARD_LIMIT_S = 70 * 60
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


def budget_for(cpu: str) -> tuple[float, str]:
    """The suite's budget in seconds on ``cpu`` (an LLVM CPU name), and a line that says where it comes from."""
    share = RELATIVE_TIME.get(cpu)
    if share is None:
        return BUDGET_S, f"{cpu}: its speed against a Zen 3 is unmeasured, so the full {BUDGET_S // 60} minutes"
    return BUDGET_S * share, f"{BUDGET_S // 60} minutes on a Zen 3 are about {BUDGET_S * share / 60:.1f} on {cpu}"


def hard_limit_for(cpu: str) -> float:
    """Seconds after which a run on ``cpu`` is stopped: ``HARD_LIMIT_S`` on a Zen 3, scaled like the budget."""
    return HARD_LIMIT_S * RELATIVE_TIME.get(cpu, 1.0)


def this_cpu() -> str:
    """LLVM's name for this CPU, as the course's targets use it (asked in a child process: it imports TVM)."""
    proc = subprocess.run([sys.executable, "-c", "from helpers import machine; print(machine.cpu_name())"],
                          capture_output=True, text=True)
    return proc.stdout.strip().splitlines()[-1] if proc.returncode == 0 and proc.stdout.strip() else "unknown"


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
    cpu = this_cpu()
    hard_limit = hard_limit_for(cpu)
    start = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        for number, (options, extra_env) in enumerate(phases(os.environ.get("TEST_WORKERS", "2"))):
            print(f"\n=== pytest {' '.join(options)}", flush=True)
            reports.append(Path(tmp) / f"phase{number}.xml")
            command = [sys.executable, "-m", "pytest", *options, f"--junitxml={reports[-1]}", *args]
            codes.append(run_phase(command, {**env, **extra_env}, hard_limit - (time.monotonic() - start)))
            if codes[-1] == STOPPED:
                break
        took = time.monotonic() - start
        budget, why = budget_for(cpu)
        zen3 = f"; about {took / RELATIVE_TIME[cpu] / 60:.0f} on a Zen 3" if cpu in RELATIVE_TIME else ""
        print(f"\n=== the suite took {took / 60:.1f} minutes on {cpu}{zen3} (budget: {why})", flush=True)
        over = took > budget
        if over or codes[-1] == STOPPED:
            print("The slowest tests:\n" + "\n".join(f"  {s:7.1f} s  {name}" for s, name in slowest(reports)), flush=True)
    if codes[-1] == STOPPED:
        print(f"FAILED: the suite was stopped after {hard_limit / 60:.0f} minutes on {cpu} ({HARD_LIMIT_S // 60} on a Zen 3), "
              "well before CI's 90-minute wall; "
              "make the slowest tests above cheaper.", flush=True)
        return STOPPED
    if over:
        print(f"WARNING: over the suite's budget ({why}): make the slowest tests above cheaper.", flush=True)
    ran = [code for code in codes if code != NO_TESTS_COLLECTED]
    if not ran:
        return NO_TESTS_COLLECTED
    return next((code for code in ran if code != 0), 0)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
