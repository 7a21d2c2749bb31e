"""The grading gate: student notebooks are generated from solutions/; autograding on a real
gradebook gives each solution full marks; every graded test cell fails on the student version
of its exercise, proved in the solution's own run (tests/blank_probe.py); every exercise stands
alone, needing no other exercise's answer (tests/standalone.py); and no visible test holds the answer it
grades (tests/solution_copies.py).

The autograde of the solution is the suite's one execution of each source notebook: nbval's
checks (every cell runs without error, tagged cells reproduce their stored outputs) are applied to
what autograde executed (tests/stored_outputs.py), and the site publishes it. Whole blank
releases are autograded where the whole notebook is what is tested: tests/test_classroom.py and
tests/test_hub.py."""

import json
import shutil
from pathlib import Path

import nbformat
import pytest

from helpers import config
from helpers.instructor import grading, learner_outputs, notebooks, site

import blank_probe
import regenerated as regenerated_course
import solution_copies
import standalone
import stored_outputs

REPO = grading.REPO
ASSIGNMENTS = grading.assignments()
# Days whose graded cells grade measured speed: graded while one core is kept busy, as on a shared
# classroom machine, so a correct answer must pass on ratios measured in one run, with margins. Their
# graded timing cells keep the cores busy themselves (config.grading_load()), only while they measure:
# the rest of the notebook runs at full speed, and so do the suite's other tests beside it.
# (Day 4's graded cells check a sweep's structure and synthetic data, not speed: a busy core
# would only slow its PyTorch cells many times over, proving nothing.)
LOADED_IN_CELL = {"day07_layouts", "day08_tuning"}


def _cells(path: Path) -> list[dict]:
    nb = json.loads(path.read_text())
    return [{k: c.get(k) for k in ("cell_type", "source", "metadata", "outputs")} for c in nb["cells"]]


def test_every_day_has_a_source_and_a_student_version():
    assert "day00_environment" in ASSIGNMENTS
    released = sorted(p.name for p in (REPO / grading.RELEASE).iterdir() if p.is_dir())
    assert released == ASSIGNMENTS, "notebooks/ and solutions/ hold different days: run `make student`"


@pytest.fixture(scope="module")
def regenerated(tmp_path_factory):
    """A course directory with every day generated from the sources (tests/regenerated.py), a copy of
    its own for this test module."""
    return Path(shutil.copytree(regenerated_course.shared(), tmp_path_factory.mktemp("course"), dirs_exist_ok=True))


def out_of_sync(committed: Path, fresh: Path) -> str | None:
    """Why a committed student notebook is not what its source generates (None when it is)."""
    if _cells(committed) == _cells(fresh):
        return None
    return (f"{committed.relative_to(committed.parents[2])} is not what solutions/ generate. A learner: do the exercises "
            "in your own copies (work/, opened by `make lab`) and restore this file with `git checkout -- notebooks/`. "
            "A maintainer who changed a source: run `make student`.")


@pytest.mark.parametrize("assignment", ASSIGNMENTS)
def test_student_notebooks_are_exactly_what_the_sources_generate(regenerated, assignment):
    fresh = regenerated / grading.RELEASE / assignment / f"{assignment}.ipynb"
    committed = REPO / grading.RELEASE / assignment / f"{assignment}.ipynb"
    problem = out_of_sync(committed, fresh)
    assert problem is None, problem


def test_the_sync_check_catches_an_edited_or_executed_student_notebook(tmp_path):
    day = "day00_environment"
    committed = REPO / grading.RELEASE / day / f"{day}.ipynb"
    for change in ("an answer typed in", "outputs of a run"):
        nb = nbformat.read(committed, as_version=4)
        cell = next(c for c in nb.cells if c.metadata.get("nbgrader", {}).get("solution"))
        if change == "an answer typed in":
            cell.source = cell.source.replace("raise NotImplementedError()", "return 16")
        else:
            cell.outputs = [nbformat.v4.new_output("stream", name="stdout", text="16\n")]
            cell.execution_count = 3
        edited = tmp_path / change / grading.RELEASE / day / f"{day}.ipynb"
        edited.parent.mkdir(parents=True)
        nbformat.write(nb, edited)
        assert out_of_sync(edited, committed) is not None, f"{change} went unnoticed"
        assert "work/" in out_of_sync(edited, committed), "the message must send a learner to their own copies"
    assert out_of_sync(committed, committed) is None


@pytest.mark.parametrize("assignment", ASSIGNMENTS)
def test_sources_use_the_course_kernel_and_have_graded_exercises(assignment):
    nb = nbformat.read(REPO / grading.SOURCE / assignment / f"{assignment}.ipynb", as_version=4)
    assert nb.metadata["kernelspec"]["name"] == "tvm-course"
    graded = [c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade")]
    assert graded, f"{assignment} has no graded cell"
    for cell in nb.cells:
        meta = cell.metadata.get("nbgrader", {})
        if meta.get("solution") and cell.cell_type == "code":
            assert "### BEGIN SOLUTION" in cell.source, f"{meta['grade_id']}: a solution cell without a solution block"


@pytest.mark.parametrize("assignment", ASSIGNMENTS)
def test_every_exercise_stands_alone(assignment):
    """No solution or test cell reads a name that comes from another exercise's answer (tests/standalone.py):
    a learner who left one exercise blank keeps the points of the others that are right."""
    source = nbformat.read(REPO / grading.SOURCE / assignment / f"{assignment}.ipynb", as_version=4)
    student = nbformat.read(REPO / grading.RELEASE / assignment / f"{assignment}.ipynb", as_version=4)
    needs = standalone.dependencies(source, student)
    assert not needs, "an exercise that needs another's answer loses its points with it; give it what it needs " \
                      "from the day (a helper, a lesson cell) instead:\n" + "\n".join(needs)


@pytest.mark.parametrize("assignment", ASSIGNMENTS)
def test_no_visible_test_holds_the_answer_it_grades(assignment):
    """A function in a test cell the learner sees must not hold the exercise's solution (tests/solution_copies.py):
    returning its result would pass the visible and the hidden tests."""
    source = nbformat.read(REPO / grading.SOURCE / assignment / f"{assignment}.ipynb", as_version=4)
    found = solution_copies.copies(source)
    assert not found, "\n".join(found)


@pytest.mark.parametrize("assignment", ASSIGNMENTS)
def test_autograde_gives_solution_full_marks_and_every_test_fails_on_the_blank(regenerated, assignment, monkeypatch):
    course = regenerated
    if assignment in LOADED_IN_CELL:
        monkeypatch.setenv(config.GRADING_LOAD_ENV, "1")
    source = nbformat.read(REPO / grading.SOURCE / assignment / f"{assignment}.ipynb", as_version=4)
    student = nbformat.read(REPO / grading.RELEASE / assignment / f"{assignment}.ipynb", as_version=4)
    submission = course / "incoming" / f"{assignment}.ipynb"
    submission.parent.mkdir(exist_ok=True)
    nbformat.write(blank_probe.with_probes(source, student), submission)
    grading.submit(course, assignment, "solution", submission)
    grading.autograde(assignment, course, student="solution")
    sol = grading.scores(assignment, course)["solution"]
    assert sol.max_score > 0
    assert sol.score == sol.max_score, f"the solution scored {sol.score}/{sol.max_score}: " + _failures(course, assignment, "solution")
    executed = nbformat.read(course / "autograded" / "solution" / assignment / f"{assignment}.ipynb", as_version=4)
    assert not blank_probe.probes_that_broke(executed), blank_probe.probes_that_broke(executed)
    tests = [c for c in source.cells if c.cell_type == "code" and c.metadata.get("nbgrader", {}).get("grade")]
    assert blank_probe.probed_test_count(executed) == len(tests), "every graded test cell must be replayed on the blank"
    passing = blank_probe.tests_passing_on_the_blank(executed)
    assert not passing, "\n".join(passing)
    graded = blank_probe.without_probes(executed)
    # the learner's own numbers, shown to the grader above a written answer (learner_outputs.py): not the solution's
    shown = [c for c in graded.cells if c.metadata.get(learner_outputs.SHOWN)]
    tagged = [c for c in source.cells if learner_outputs.TAG in c.metadata.get("tags", [])]
    assert len(shown) == (1 if tagged else 0), "the cells tagged for the grader are shown once, above the written answer"
    graded.cells = [c for c in graded.cells if not c.metadata.get(learner_outputs.SHOWN)]
    noisy = [c.metadata["nbgrader"]["grade_id"] for c in graded.cells
             if c.metadata.get("nbgrader", {}).get("grade") and any(o.get("name") == "stderr" for o in c.get("outputs", []))]
    assert not noisy, f"passing test cells wrote to stderr (nbgrader scores that as a failure): {noisy}"
    # nbval's checks, on the solution autograde has just executed
    raised = stored_outputs.errors(graded)
    assert not raised, f"cells of the solution raised: {raised}"
    checked, differ = stored_outputs.differences(graded, source)
    assert not differ, "\n".join(differ)
    assert checked == sum(map(notebooks.is_checked, source.cells)) > 0
    # the site (tests/test_site.py, `make site --quick`) publishes this run instead of executing the day again
    clean = course / "incoming" / f"{assignment}.executed.ipynb"
    nbformat.write(graded, clean)
    site.store_executed(assignment, clean, config.quick())


def _failures(course: Path, assignment: str, student: str) -> str:
    """The test cells that failed in an autograded notebook, with their error, for the assertion message."""
    path = course / "autograded" / student / assignment / f"{assignment}.ipynb"
    if not path.exists():
        return f"(no autograded notebook at {path})"
    nb = nbformat.read(path, as_version=4)
    bad = []
    for cell in nb.cells:
        meta = cell.metadata.get("nbgrader", {})
        for out in cell.get("outputs", []):
            if out.get("output_type") == "error" or out.get("name") == "stderr":
                bad.append(f"{meta.get('grade_id', '?')}: {out.get('ename', 'stderr')} {out.get('evalue', out.get('text', ''))[:300]}")
    return "; ".join(bad) or "(no error output found)"
