"""The suite's time guard (tests/run_suite.py): it names the slowest tests and stops a run that overstays."""

import sys
import time

import run_suite


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
    assert run_suite.budget_for("znver3")[0] == run_suite.BUDGET_S
    for cpu in ("znver4", "znver5", "emeraldrapids"):
        assert run_suite.budget_for(cpu)[0] == run_suite.BUDGET_S * run_suite.RELATIVE_TIME[cpu] < run_suite.BUDGET_S
    budget, why = run_suite.budget_for("some-future-cpu")
    assert budget == run_suite.BUDGET_S and "unmeasured" in why


def test_the_hard_limit_is_an_hour_on_a_zen_3_scaled_like_the_budget():
    assert run_suite.BUDGET_S == 30 * 60 and run_suite.HARD_LIMIT_S == 70 * 60
    assert run_suite.hard_limit_for("znver3") == run_suite.HARD_LIMIT_S
    assert run_suite.hard_limit_for("znver4") == run_suite.HARD_LIMIT_S * run_suite.RELATIVE_TIME["znver4"]
    assert run_suite.hard_limit_for("some-future-cpu") == run_suite.HARD_LIMIT_S


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
