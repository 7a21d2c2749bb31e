"""`make test`: the whole suite in quick mode, in two phases, so that it fits a 2-core machine.

Most of the suite times nothing: it compiles, executes notebooks and grades them, one core at a
time. Those tests run first on ``TEST_WORKERS`` pytest-xdist workers (2 unless set), each held to
one thread (PyTorch and TVM) so that the workers share the cores instead of fighting over them.
The tests marked ``timed`` (tests/conftest.py) grade or assert measured speed: they run second,
alone, with every core, as a learner's notebook would. The site's build (``after_notebooks``) runs
second too: it publishes the solutions that phase one's autograde executed.

Two limits, and this docstring is the one place that says how they are set:

* **The budget** (``BUDGET_S``): 45 minutes on the slowest CPU kind the project runs on (a Zen 3),
  new days included. On a faster CPU the same suite must finish sooner, so the budget is scaled by
  how fast this CPU kind ran the suite against a Zen 3 (``RELATIVE_TIME``, measured; a CPU not in
  it gets the full 45 minutes and is said to be unmeasured). Past it the run still passes but
  warns, names its slowest tests and says what its time means on a Zen 3, so that a slow suite is
  seen long before it reaches CI's wall.
* **The stop** (``stop_at``): in real time, never scaled. CI gives ``.ci/run`` 90 minutes of real
  time (``CI_WALL_S``), past which nothing lands, however fast the CPU; a fast machine having a slow
  hour must not be stopped while CI would still have let it finish. ``.ci/run`` exports its own
  start (``COURSE_CI_START``, seconds since the epoch) before it builds the environment, so the
  environment's build counts against the wall; the stop is the wall less ``MARGIN_S`` (5 minutes:
  CI's clone before ``.ci/run`` starts, and killing and reporting a stopped run). Run by hand, the
  clock starts when this script does.

The cost of each day (its autograde, its hidden-test proofs, its other checks) is printed at the
end, so that a new day's share of the budget is seen when it lands.

``--day N`` (``make test DAY=N``) runs one day's checks alone (tests/one_day.py): its notebook
through the grading gate, its hidden-test proofs, its sync, prose and leak checks and the tests of
the helpers it imports. Other arguments are passed to both phases (e.g. ``make test
PYTEST_ARGS="-k day03"``). The exit status is the first failing phase's; a phase that selects no
test is not a failure unless both do.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path

import one_day

NO_TESTS_COLLECTED = 5  # pytest's exit status
UNKNOWN_DAY = 2         # the exit status of `make test DAY=...` for a day the course does not have
BUDGET_S = 45 * 60
# The suite's time on each CPU kind (LLVM's name) as a share of its time on a Zen 3, 2 cores each. Zen 5: 18.5
# minutes on 2026-12-02 against a real Zen 3's 36.4 the day before (stop 67). Zen 4: the same share, as issue 76
# measured it (about 20 minutes on a Zen 4 or a Zen 5 against the real Zen 3's 36.4; its 0.42 of stop 28 was
# against a Zen 3 estimated at 50). The Intel Xeon of the 5th generation about 0.43 (stop 33, the same estimate).
RELATIVE_TIME = {"znver3": 1.0, "znver4": 0.51, "znver5": 0.51, "emeraldrapids": 0.43}
CI_WALL_S = 90 * 60     # CI's limit for one run of .ci/run, in real time
MARGIN_S = 5 * 60       # CI's clone before .ci/run, and stopping and reporting a stopped run
START_ENV = "COURSE_CI_START"
STOPPED = 124  # the exit status of a suite stopped at its real-time limit (as timeout(1) uses)


def phases(workers: str) -> list[tuple[list[str], dict[str, str]]]:
    one_thread = {"OMP_NUM_THREADS": "1", "TVM_NUM_THREADS": "1"}
    return [
        (["-n", workers, "-m", "not timed and not after_notebooks"], one_thread),
        (["-m", "timed or after_notebooks"], {}),
    ]


def _cases(reports: list[Path]) -> list[tuple[float, str]]:
    """(seconds, test id) of every test recorded in pytest's JUnit XML reports."""
    found = []
    for report in reports:
        if report.is_file():
            for case in ET.parse(report).iter("testcase"):
                found.append((float(case.get("time", 0)), f"{case.get('classname')}::{case.get('name')}"))
    return found


def slowest(reports: list[Path], count: int = 10) -> list[tuple[float, str]]:
    """The ``count`` slowest tests recorded in pytest's JUnit XML reports, as (seconds, test id)."""
    return sorted(_cases(reports), reverse=True)[:count]


DAY_IN_ID = re.compile(r"\b(?:test_)?(day\d\d)")


def cost_per_day(reports: list[Path]) -> dict[str, dict[str, float]]:
    """Seconds of test time per day, split into its autograde (which executes the notebook once), its
    hidden-test proofs (tests/test_hidden_tests.py) and its other checks (sync, prose, leaks); the tests
    that belong to no day under ``"-"``. Test time, not wall time: the two workers of phase one overlap."""
    costs: dict[str, dict[str, float]] = defaultdict(lambda: {"autograde": 0.0, "proofs": 0.0, "other": 0.0})
    for seconds, test in _cases(reports):
        found = DAY_IN_ID.search(test.split("::", 1)[-1])
        day = found.group(1) if found else "-"
        part = ("autograde" if "test_autograde" in test else "proofs" if "test_hidden_tests" in test else "other")
        costs[day][part] += seconds
    return dict(sorted(costs.items()))


def cost_table(costs: dict[str, dict[str, float]]) -> str:
    """``cost_per_day`` as lines a maintainer reads: each day's seconds and its share of all test time."""
    total = sum(sum(parts.values()) for parts in costs.values()) or 1.0
    lines = [f"  {'day':6} {'autograde':>10} {'proofs':>8} {'other':>8} {'share':>7}"]
    for day, parts in costs.items():
        lines.append(f"  {'none' if day == '-' else day:6} {parts['autograde']:9.0f}s {parts['proofs']:7.0f}s "
                     f"{parts['other']:7.0f}s {sum(parts.values()) / total:7.1%}")
    return "\n".join(lines)


def budget_for(cpu: str) -> tuple[float, str]:
    """The suite's budget in seconds on ``cpu`` (an LLVM CPU name), and a line that says where it comes from."""
    share = RELATIVE_TIME.get(cpu)
    if share is None:
        return BUDGET_S, f"{cpu}: its speed against a Zen 3 is unmeasured, so the full {BUDGET_S // 60} minutes"
    return BUDGET_S * share, f"{BUDGET_S // 60} minutes on a Zen 3 are about {BUDGET_S * share / 60:.1f} on {cpu}"


def started(environ: dict[str, str], now: float) -> float:
    """When the clock of the stop started, in seconds since the epoch: ``.ci/run``'s start where it exported
    one (``COURSE_CI_START``), else ``now``."""
    value = environ.get(START_ENV, "").strip()
    try:
        return float(value) if value else now
    except ValueError:
        raise SystemExit(f"{START_ENV}={value!r} is not a time: .ci/run exports `date +%s` there, or leave it unset.")


def stop_at(start: float) -> float:
    """The epoch time at which a run that started at ``start`` is stopped: CI's wall less the margin, in real
    time whatever the CPU."""
    return start + CI_WALL_S - MARGIN_S


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


def day_arguments(args: list[str]) -> tuple[str | None, list[str]]:
    """``--day N`` taken out of ``args``: (the day as given or None, the rest)."""
    if "--day" not in args:
        return None, args
    at = args.index("--day")
    if at + 1 >= len(args) or not args[at + 1].strip():
        raise one_day.UnknownDay("make test DAY= needs a day: make test DAY=7 (or DAY=day07_layouts).")
    return args[at + 1], args[:at] + args[at + 2:]


def main(args: list[str]) -> int:
    try:
        day, args = day_arguments(args)
        selection = one_day.pytest_arguments(day) if day else []
    except one_day.UnknownDay as error:
        print(error, file=sys.stderr, flush=True)
        return UNKNOWN_DAY
    env = {**os.environ, "TVM_COURSE_QUICK": "1"}
    codes, reports = [], []
    cpu = this_cpu()
    start = time.monotonic()
    deadline = stop_at(started(os.environ, time.time()))
    with tempfile.TemporaryDirectory() as tmp:
        for number, (options, extra_env) in enumerate(phases(os.environ.get("TEST_WORKERS", "2"))):
            print(f"\n=== pytest {' '.join(options + selection)}", flush=True)
            reports.append(Path(tmp) / f"phase{number}.xml")
            command = [sys.executable, "-m", "pytest", *options, f"--junitxml={reports[-1]}", *selection, *args]
            codes.append(run_phase(command, {**env, **extra_env}, deadline - time.time()))
            if codes[-1] == STOPPED:
                break
        took = time.monotonic() - start
        budget, why = budget_for(cpu)
        zen3 = f"; about {took / RELATIVE_TIME[cpu] / 60:.0f} on a Zen 3" if cpu in RELATIVE_TIME else ""
        print(f"\n=== {'day ' + day if day else 'the suite'} took {took / 60:.1f} minutes on {cpu}{zen3}"
              + ("" if day else f" (budget: {why})"), flush=True)
        print("Test time per day (both workers of phase one added up):\n" + cost_table(cost_per_day(reports)), flush=True)
        over = not day and took > budget
        if over or codes[-1] == STOPPED:
            print("The slowest tests:\n" + "\n".join(f"  {s:7.1f} s  {name}" for s, name in slowest(reports)), flush=True)
    if codes[-1] == STOPPED:
        print(f"FAILED: the run was stopped at {time.strftime('%H:%M:%S', time.localtime(deadline))}, "
              f"{(CI_WALL_S - MARGIN_S) / 60:.0f} minutes of real time after it started (CI's wall is "
              f"{CI_WALL_S // 60}); make the slowest tests above cheaper.", flush=True)
        return STOPPED
    if over:
        print(f"WARNING: over the suite's budget ({why}): make the slowest tests above cheaper.", flush=True)
    ran = [code for code in codes if code != NO_TESTS_COLLECTED]
    if not ran:
        return NO_TESTS_COLLECTED
    return next((code for code in ran if code != 0), 0)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
