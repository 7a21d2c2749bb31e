"""`make test DAY=N` (tests/one_day.py): one day's checks, selected from the real collection, and a clear
refusal of a day the course does not have."""

import subprocess
import sys

import pytest

import one_day
import run_suite

DAY = "day03_build"


@pytest.mark.parametrize("spelling", ["3", "03", "day03", "day03_build"])
def test_a_day_is_named_as_make_check_names_it(spelling):
    assert one_day.day_name(spelling) == DAY


@pytest.mark.parametrize("spelling", ["99", "day3x", "build", ""])
def test_an_unknown_day_is_refused_with_the_days_there_are(spelling):
    with pytest.raises(one_day.UnknownDay, match=r"make test DAY=3.*day07_layouts.*alone runs the whole suite"):
        one_day.day_name(spelling)


def test_make_test_with_an_unknown_day_says_so_and_runs_nothing(capsys):
    assert run_suite.main(["--day", "42"]) == run_suite.UNKNOWN_DAY
    assert "There is no day '42'" in capsys.readouterr().err
    assert run_suite.main(["--day"]) == run_suite.UNKNOWN_DAY


def test_a_day_s_files_are_its_gate_proofs_prose_leaks_and_its_helpers_tests():
    files = one_day.files("day07_layouts")
    for f in ("tests/test_course_notebooks.py", "tests/test_hidden_tests.py", "tests/test_prose.py",
              "tests/test_site.py", "tests/test_kernels.py", "tests/test_nchwc.py", "tests/test_block_fusion.py"):
        assert f in files, f
    assert "tests/test_transformer.py" not in files  # Day 14's helper
    assert "tests/test_tuning.py" in one_day.files("day08_tuning") and "tests/test_tuning_package.py" in one_day.files("day08_tuning")


def test_the_day_s_tests_are_what_pytest_collects_for_it():
    """Through pytest's real collection (conftest.py's --day): the day's gate, proofs, prose and leak checks,
    every test of its helpers' files, and no other day's test."""
    proc = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q",
                           *one_day.pytest_arguments("3")], capture_output=True, text=True, cwd=one_day.REPO)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    ids = [line for line in proc.stdout.splitlines() if "::" in line]
    expected = [f"test_course_notebooks.py::test_student_notebooks_are_exactly_what_the_sources_generate[{DAY}]",
                f"test_course_notebooks.py::test_autograde_gives_solution_full_marks_and_every_test_fails_on_the_blank[{DAY}]",
                f"test_prose.py::test_a_student_notebook_says_nothing_about_how_the_course_was_made[{DAY}]",
                f"test_site.py::test_stripping_leaves_no_solution_hidden_test_output_or_grader_metadata[{DAY}]",
                "test_hidden_tests.py::test_day03_"]
    for part in expected:
        assert any(part in i for i in ids), f"{part} was not collected"
    assert any(i.startswith("tests/test_build.py::") for i in ids)
    other = [i for i in ids if ("[day" in i and f"[{DAY}]" not in i) or "::test_day" in i and "::test_day03_" not in i]
    assert not other, other
