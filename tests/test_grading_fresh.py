"""The instructor's commands on a fresh clone: the student notebooks are committed, the gradebook
is not (.gitignore), and `make student` may never have run. Every command either works or says
in one line what to run first; none ends in nbgrader's traceback."""

import os
import pwd
import shutil
import subprocess
import sys

import nbformat
import pytest

from helpers.instructor import grading
from helpers.errors import GradingError

DAY = "day99_tiny"
ROOT = grading.REPO  # (the repository: the test below points grading.REPO at a scratch course)


def _tiny_source() -> nbformat.NotebookNode:
    """A one-exercise instructor source: a solution cell and its graded test, with a hidden test."""
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "tvm-course", "display_name": "TVM course (Python 3.11)", "language": "python"}

    def meta(**kw):
        return {"nbgrader": {"schema_version": 3, "task": False, **kw}}

    nb.cells = [
        nbformat.v4.new_markdown_cell("Write `answer()`: it returns 42."),
        nbformat.v4.new_code_cell("def answer():\n    ### BEGIN SOLUTION\n    return 42\n    ### END SOLUTION",
                                  metadata=meta(grade=False, grade_id="answer", locked=False, solution=True)),
        nbformat.v4.new_code_cell("assert callable(answer)\n### BEGIN HIDDEN TESTS\nassert answer() == 42\n### END HIDDEN TESTS",
                                  metadata=meta(grade=True, grade_id="test-answer", locked=True, points=1, solution=False)),
    ]
    return nb


@pytest.fixture
def fresh_clone(tmp_path):
    """A course as a clone of the repository has it: sources and committed student notebooks, no gradebook."""
    course = tmp_path / "course"
    (course / grading.SOURCE / DAY).mkdir(parents=True)
    shutil.copy(grading.REPO / "nbgrader_config.py", course)
    nbformat.write(_tiny_source(), course / grading.SOURCE / DAY / f"{DAY}.ipynb")
    grading.generate(DAY, course)  # the instructor who committed notebooks/ did this, on another machine
    (course / grading.GRADEBOOK).unlink()
    return course


def test_autograde_works_on_a_fresh_clone_without_touching_the_student_notebooks(fresh_clone):
    course = fresh_clone
    released = course / grading.RELEASE / DAY / f"{DAY}.ipynb"
    committed = released.read_bytes()
    assert not (course / grading.GRADEBOOK).exists()

    grading.submit(course, DAY, "ada", course / grading.SOURCE / DAY / f"{DAY}.ipynb")  # a correct answer
    grading.submit(course, DAY, "bob", released)  # the blank release
    grading.autograde(DAY, course, cell_timeout=60)  # before the fix: "No assignment with ID ... in the database"

    got = {name: (s.score, s.max_score) for name, s in grading.scores(DAY, course).items()}
    assert got == {"ada": (1.0, 1.0), "bob": (0.0, 1.0)}, "the hidden test must come back from the gradebook"
    assert [p.parts[-3] for p in grading.feedback(DAY, course)] == ["ada", "bob"]
    assert released.read_bytes() == committed, "recording the day in the gradebook must not rewrite notebooks/"


def test_commands_that_cannot_run_yet_say_what_to_run_first(fresh_clone):
    course = fresh_clone
    for command, first in [
        (lambda: grading.scores(DAY, course), "make autograde"),
        (lambda: grading.feedback(DAY, course), "make autograde"),
        (lambda: grading.autograde(DAY, course), "make submit"),
        (lambda: grading.submit(course, DAY, "ada", course / "missing.ipynb"), "NB="),
        (lambda: grading.autograde("day98_missing", course), "the days are"),
    ]:
        with pytest.raises(GradingError) as err:
            command()
        message = str(err.value)
        assert first in message and "\n" not in message, message
    assert not (course / grading.GRADEBOOK).exists(), "a refused command must not create a gradebook"


def test_the_command_line_prints_one_line_instead_of_a_traceback(capsys):
    assert grading.main(["feedback", "day98_missing"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: There is no day 'day98_missing'") and err.count("\n") == 1, err


def test_make_student_with_a_day_regenerates_that_day_only(fresh_clone, monkeypatch, capsys):
    """`make student DAY=N` releases one day, the day spelled as `make check` reads it; `make student` every day."""
    course, other = fresh_clone, "day98_other"
    (course / grading.SOURCE / other).mkdir()
    nbformat.write(_tiny_source(), course / grading.SOURCE / other / f"{other}.ipynb")
    monkeypatch.setattr(grading, "REPO", course)
    released = {day: course / grading.RELEASE / day / f"{day}.ipynb" for day in (DAY, other)}
    for spelling in ("99", "day99", DAY):
        released[DAY].unlink()
        assert grading.main(["generate", spelling]) == 0
        assert released[DAY].is_file() and not released[other].exists(), spelling
    assert grading.main(["generate", "7"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: There is no day '7'") and "make student DAY=3" in err and err.count("\n") == 1, err
    assert grading.main(["generate"]) == 0
    assert all(path.is_file() for path in released.values())
    # the Makefile passes DAY through, and no DAY at all means every day
    for args, command in ([["DAY=03"], "grading generate 03"], [[], "grading generate"]):
        shown = subprocess.run(["make", "-n", "student", *args], cwd=ROOT,
                               capture_output=True, text=True, check=True).stdout.splitlines()[-1]
        assert shown.rstrip().endswith(command), shown


@pytest.mark.parametrize("account", ["tvm-no-such-instructor", "this user"])
def test_a_hub_command_before_the_hub_is_set_up_says_to_set_it_up(tmp_path, account):
    """`hub release` (collect, autograde, feedback) before `make hub`: one line, not a KeyError from the account's lookup;
    also where the instructor's account exists but the course directory does not."""
    instructor = pwd.getpwuid(os.geteuid()).pw_name if account == "this user" else account
    env = {**os.environ, "TVM_HUB_ROOT": str(tmp_path / "hub"), "TVM_HUB_INSTRUCTOR": instructor}
    proc = subprocess.run([sys.executable, "-m", "helpers.instructor.hub", "release", "day00_environment"], cwd=ROOT,
                          env=env, capture_output=True, text=True)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.startswith("error: The hub is not set up yet") and "`sudo make hub` first" in proc.stderr, proc.stderr
    assert proc.stderr.count("\n") == 1, proc.stderr
