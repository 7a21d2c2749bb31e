"""The suite's time guard (tests/run_suite.py): it names the slowest tests and stops a run that overstays."""

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

import run_suite

REPO = Path(__file__).resolve().parent.parent


def test_slowest_reads_junit_reports_and_sorts(tmp_path):
    report = tmp_path / "phase0.xml"
    report.write_text('<testsuites><testsuite><testcase classname="tests.test_a" name="fast" time="1.5"/>'
                      '<testcase classname="tests.test_b" name="slow" time="300.25"/></testsuite></testsuites>')
    assert run_suite.slowest([report, tmp_path / "missing.xml"], count=1) == [(300.25, "tests.test_b::slow")]


def test_a_phase_past_its_time_is_stopped_with_its_children():
    start = time.monotonic()
    sleeper = "import subprocess, sys; subprocess.run([sys.executable, '-c', 'import time; time.sleep(60)'])"
    assert run_suite.run_phase([sys.executable, "-c", sleeper], {}, seconds_left=1) == run_suite.STOPPED
    assert time.monotonic() - start < 10


def test_the_budget_shrinks_on_a_faster_cpu_and_is_whole_on_an_unmeasured_one():
    assert run_suite.BUDGET_S == 45 * 60
    assert run_suite.budget_for("znver3")[0] == run_suite.BUDGET_S
    for cpu in ("znver4", "znver5", "emeraldrapids"):
        assert run_suite.budget_for(cpu)[0] == run_suite.BUDGET_S * run_suite.RELATIVE_TIME[cpu] < run_suite.BUDGET_S
    budget, why = run_suite.budget_for("some-future-cpu")
    assert budget == run_suite.BUDGET_S and "unmeasured" in why


def test_the_stop_is_ci_s_wall_in_real_time_from_ci_s_start_less_a_margin():
    assert run_suite.CI_WALL_S == 90 * 60 and 0 < run_suite.MARGIN_S <= 10 * 60
    assert run_suite.stop_at(1000.0) == 1000.0 + run_suite.CI_WALL_S - run_suite.MARGIN_S
    assert run_suite.started({run_suite.START_ENV: "1700000000"}, now=1800000000.0) == 1700000000.0
    assert run_suite.started({}, now=1800000000.0) == 1800000000.0  # run by hand: the clock starts now
    with pytest.raises(SystemExit, match="not a time"):
        run_suite.started({run_suite.START_ENV: "yesterday"}, now=0.0)
    assert "COURSE_CI_START" in (REPO / ".ci" / "run").read_text(), ".ci/run must export its start for the stop"


def test_a_planted_slow_test_is_stopped_at_the_real_time_limit_whatever_the_cpu(tmp_path):
    """The stop fires at CI's wall less the margin counted from COURSE_CI_START, not at a time scaled by
    the CPU's speed: here the clock started so long ago that 20 seconds are left."""
    (tmp_path / "test_planted.py").write_text("import time\n\ndef test_slow():\n    time.sleep(600)\n")
    left = 20
    start = time.time() - (run_suite.CI_WALL_S - run_suite.MARGIN_S) + left
    begun = time.monotonic()
    proc = subprocess.run([sys.executable, str(REPO / "tests" / "run_suite.py"), "test_planted.py"], cwd=tmp_path,
                          env={**os.environ, run_suite.START_ENV: str(start), "TEST_WORKERS": "1"},
                          capture_output=True, text=True, timeout=300)
    took = time.monotonic() - begun
    assert proc.returncode == run_suite.STOPPED, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert left - 5 < took < left + 60, f"stopped after {took:.0f} s, {left} s were left"
    assert "was stopped at" in proc.stdout and "real time" in proc.stdout


def test_each_day_s_cost_is_split_into_autograde_proofs_and_the_rest(tmp_path):
    report = tmp_path / "phase0.xml"
    report.write_text(
        '<testsuites><testsuite>'
        '<testcase classname="tests.test_course_notebooks" name="test_autograde_gives_solution_full_marks[day07_layouts]" time="100"/>'
        '<testcase classname="tests.test_hidden_tests" name="test_day07_wrong_tiles_fail" time="20"/>'
        '<testcase classname="tests.test_prose" name="test_a_student_notebook[day07_layouts]" time="1"/>'
        '<testcase classname="tests.test_timing" name="test_measure" time="79"/>'
        '</testsuite></testsuites>')
    costs = run_suite.cost_per_day([report])
    assert costs == {"-": {"autograde": 0.0, "proofs": 0.0, "other": 79.0},
                     "day07": {"autograde": 100.0, "proofs": 20.0, "other": 1.0}}
    table = run_suite.cost_table(costs)
    assert "day07" in table and "60.5%" in table and "none" in table


def test_a_phase_in_time_returns_its_exit_status():
    assert run_suite.run_phase([sys.executable, "-c", "raise SystemExit(3)"], {}, seconds_left=30) == 3


def test_every_unit_named_longest_first_exists():
    """A renamed test or file would silently lose its place at the front of phase one."""
    import importlib.util
    from pathlib import Path

    from helpers.instructor import grading

    root = Path(__file__).resolve().parent.parent
    spec = importlib.util.spec_from_file_location("root_conftest", root / "conftest.py")
    conftest = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(conftest)
    assert conftest.LONGEST_FIRST
    for key in conftest.LONGEST_FIRST:
        if key.startswith("tests/"):
            assert (root / key).is_file(), key
        else:
            name, _, param = key.partition("[")
            assert f"def {name}(" in (root / "tests" / "test_course_notebooks.py").read_text(), key
            assert param.rstrip("]") in grading.assignments(), key
