"""The self-study learner's path: `make lab` works in work/, a learner who did every exercise leaves the
course as it was (its tests still pass), and `make check` grades the learner's copy without touching it."""

import copy
import os
import shutil
import subprocess
import sys

import nbformat
import pytest

from helpers.errors import GradingError
from helpers.instructor import grading, selfstudy

import regenerated

REPO = grading.REPO
DAY = "day00_environment"  # the cheapest day to execute: these tests are about the path, not the day


def _solution_ids(nb) -> dict[str, str]:
    return {c.metadata["nbgrader"]["grade_id"]: c.source for c in nb.cells
            if c.cell_type == "code" and c.metadata.get("nbgrader", {}).get("solution")}


def _answered(student, source, only: set[str] | None = None):
    """The student notebook with the source's answers typed in (all, or the grade_ids in ``only``), as if
    run and saved in JupyterLab (outputs, execution counts, metadata)."""
    done = copy.deepcopy(student)
    answers = _solution_ids(source)
    for number, cell in enumerate(done.cells):
        grade_id = cell.metadata.get("nbgrader", {}).get("grade_id")
        if grade_id in answers and (only is None or grade_id in only):
            cell.source = answers[grade_id]
        if cell.cell_type == "code":
            cell.execution_count = number
            cell.outputs = [nbformat.v4.new_output("stream", name="stdout", text=f"ran {number}\n")]
            cell.metadata["execution"] = {"iopub.status.idle": "2026-01-01T00:00:00Z"}
    done.metadata["widgets"] = {"application/vnd.jupyter.widget-state+json": {"state": {}}}
    return done


def test_make_lab_fills_work_once_and_never_overwrites(tmp_path):
    work = tmp_path / "work"
    copied = selfstudy.fill(work=work)
    days = grading.assignments()
    assert {p.relative_to(work).parts[0] for p in copied if p.suffix == ".ipynb"} == set(days)
    assert (work / "GLOSSARY.md").is_file(), "the glossary goes beside the days"
    mine = work / DAY / f"{DAY}.ipynb"
    mine.write_text(mine.read_text().replace("raise NotImplementedError()", "return 16", 1))
    kept = mine.read_bytes()
    shutil.rmtree(work / days[-1])
    again = selfstudy.fill(work=work)
    assert mine.read_bytes() == kept, "make lab overwrote a learner's answer"
    assert {p.relative_to(work).parts[0] for p in again} == {days[-1]}, "only what was missing comes back"


def test_the_work_folder_is_ignored_by_git():
    proc = subprocess.run(["git", "check-ignore", "-q", f"{selfstudy.WORK}/{DAY}/{DAY}.ipynb"], cwd=REPO)
    if proc.returncode == 128:
        pytest.skip("not a git checkout")
    assert proc.returncode == 0, "work/ must be in .gitignore: a learner's answers are not part of the course"


def _course_files() -> list[str]:
    """The files of this checkout that git would keep (tracked, or new and not ignored)."""
    out = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=REPO,
                         capture_output=True, text=True, check=True).stdout
    return [line for line in out.splitlines() if (REPO / line).is_file()]


def test_a_learner_who_did_every_exercise_leaves_the_course_as_it_was(tmp_path):
    """A copy of the course, every exercise answered in work/ and saved with outputs: git sees no
    change, and the checks that read the course's notebooks (sync with the sources, prose) pass there."""
    if subprocess.run(["git", "rev-parse"], cwd=REPO, capture_output=True).returncode != 0:
        pytest.skip("not a git checkout")
    clone = tmp_path / "clone"
    for name in _course_files():
        (clone / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / name, clone / name)
    git = lambda *args: subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=clone,
                                       capture_output=True, text=True, check=True).stdout
    git("init", "-q")
    git("add", "-A")
    git("commit", "-qm", "the course")
    subprocess.run([sys.executable, "-m", "helpers.instructor.selfstudy", "fill"], cwd=clone, check=True,
                   capture_output=True, env={**os.environ, "PYTHONPATH": str(clone)})
    for day in grading.assignments(clone):
        mine = clone / selfstudy.WORK / day / f"{day}.ipynb"
        source = nbformat.read(clone / grading.SOURCE / day / f"{day}.ipynb", as_version=4)
        nbformat.write(_answered(nbformat.read(mine, as_version=4), source), mine)
    assert git("status", "--porcelain") == "", "doing the exercises changed files of the course"
    # the copy's sources are this checkout's: its generated course is the one the suite shares (made once)
    generated = regenerated.shared()
    assert regenerated.sources_digest(clone) == generated.name
    shutil.copytree(generated, clone / "build" / "regenerated" / generated.name)
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:xdist", "-q", "-p", "no:cacheprovider",
         "tests/test_course_notebooks.py::test_student_notebooks_are_exactly_what_the_sources_generate",
         "tests/test_prose.py"],
        cwd=clone, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(clone)})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert "passed" in proc.stdout and str(clone) in subprocess.run(
        [sys.executable, "-c", "import helpers; print(helpers.__file__)"], cwd=clone, capture_output=True, text=True,
        env={**os.environ, "PYTHONPATH": str(clone)}).stdout, "the copy's checks must read the copy, not this checkout"


@pytest.fixture(scope="module")
def learner(tmp_path_factory):
    """A learner's work folder with three copies of Day 0: all answered, none, one of two."""
    root = tmp_path_factory.mktemp("learners")
    source = nbformat.read(REPO / grading.SOURCE / DAY / f"{DAY}.ipynb", as_version=4)
    student = nbformat.read(REPO / grading.RELEASE / DAY / f"{DAY}.ipynb", as_version=4)
    works = {}
    for who, nb in {"done": _answered(student, source), "blank": student,
                    "half": _answered(student, source, only={"float32_lanes"})}.items():
        works[who] = root / who
        selfstudy.fill(work=works[who])
        nbformat.write(nb, works[who] / DAY / f"{DAY}.ipynb")
    return works


@pytest.mark.parametrize("who,expected", [("done", {"test_float32_lanes": 2, "test_peak_gflops": 2}),
                                          ("blank", {"test_float32_lanes": 0, "test_peak_gflops": 0}),
                                          ("half", {"test_float32_lanes": 2, "test_peak_gflops": 0})])
def test_make_check_grades_the_learners_copy_and_leaves_it_untouched(learner, who, expected):
    mine = learner[who] / DAY / f"{DAY}.ipynb"
    before = mine.read_bytes()
    results = selfstudy.check("0", work=learner[who], cell_timeout=120, log=lambda *_: None)
    assert {r.grade_id: r.points for r in results} == expected
    assert mine.read_bytes() == before, "make check modified the learner's notebook"
    report = selfstudy.report(DAY, results)
    assert report.startswith(f"{DAY}: {sum(expected.values())} / 4 points")
    for result in results:
        if result.points < result.max_points:
            assert result.message, f"{result.grade_id} failed without a message"
            assert result.message.split(":")[0] in report
    assert "Exercise 1: float32 lanes of a target" in report


def test_make_check_says_what_is_wrong_with_a_broken_or_missing_notebook(tmp_path):
    work = tmp_path / "work"
    with pytest.raises(GradingError, match="make lab"):
        selfstudy.check("0", work=work)
    (work / DAY).mkdir(parents=True)
    (work / DAY / f"{DAY}.ipynb").write_text('{"cells": [')  # a save cut short
    with pytest.raises(GradingError, match="not a notebook that can be read") as err:
        selfstudy.check("0", work=work)
    assert "\n" not in str(err.value)
    with pytest.raises(GradingError, match="There is no day '42'"):
        selfstudy.check("42", work=work)
    assert selfstudy.day_name("3") == selfstudy.day_name("day03") == selfstudy.day_name("03") == "day03_build"


def test_make_check_on_a_handout_without_solutions_sends_the_learner_to_the_visible_tests(tmp_path):
    handout = tmp_path / "handout"
    shutil.copytree(REPO / grading.RELEASE, handout / grading.RELEASE)
    selfstudy.fill(course=handout, work=handout / "work")
    with pytest.raises(GradingError, match="no solutions/"):
        selfstudy.check("0", course=handout, work=handout / "work")
