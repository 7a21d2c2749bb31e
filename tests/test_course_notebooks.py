"""The grading gate: student notebooks are generated from solutions/, and autograding
on a real gradebook gives the solution full marks and the blank release zero.

The autograde of the solution is also the suite's one execution of each source notebook:
nbval's checks (every cell runs without error, tagged cells reproduce their stored outputs)
are applied to what autograde executed (tests/stored_outputs.py), instead of executing every
source a third time under nbval."""

import json
import shutil
from pathlib import Path

import nbformat
import pytest

from helpers import config, timing
from helpers.instructor import grading, notebooks, site

import stored_outputs

REPO = grading.REPO
ASSIGNMENTS = grading.assignments()
# Days whose graded cells grade measured speed: graded while one core is kept busy, as on a shared
# classroom machine, so a correct answer must pass on ratios measured in one run, with margins.
# (Day 4's graded cells check a sweep's structure and synthetic data, not speed: a busy core
# would only slow its PyTorch cells many times over, proving nothing.)
TIMED = {"day07_layouts"}
# Days whose graded timing cells keep the cores busy themselves (config.grading_load()), only while
# they measure: the rest of the notebook runs at full speed.
LOADED_IN_CELL = {"day08_tuning"}


def _cells(path: Path) -> list[dict]:
    nb = json.loads(path.read_text())
    return [{k: c.get(k) for k in ("cell_type", "source", "metadata", "outputs")} for c in nb["cells"]]


def test_every_day_has_a_source_and_a_student_version():
    assert "day00_environment" in ASSIGNMENTS
    released = sorted(p.name for p in (REPO / grading.RELEASE).iterdir() if p.is_dir())
    assert released == ASSIGNMENTS, "notebooks/ and solutions/ hold different days: run `make student`"


def _sources_digest() -> str:
    """Everything `nbgrader generate_assignment` reads: the sources, the config, the course's grading code."""
    import hashlib

    import nbgrader

    digest = hashlib.sha256(nbgrader.__version__.encode())
    files = [REPO / "nbgrader_config.py", REPO / "helpers" / "instructor" / "grading.py", *sorted((REPO / grading.SOURCE).rglob("*"))]
    for path in files:
        if path.is_file():
            digest.update(str(path.relative_to(REPO)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:16]


@pytest.fixture(scope="module")
def regenerated(tmp_path_factory):
    """A course directory with every day generated from the sources, its own for this test module.

    Generating takes about half a minute, so it is done once per state of the sources and shared by
    the suite's worker processes (under a lock); each module then grades in a copy of its own.
    """
    import fcntl

    root = REPO / "build" / "regenerated"
    root.mkdir(parents=True, exist_ok=True)
    generated = root / _sources_digest()
    with open(root / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (generated / grading.RELEASE).is_dir():
            scratch = grading.scratch_course(tmp_path_factory.mktemp("generating"))
            grading.generate(course=scratch)
            shutil.copytree(scratch, generated)
    return Path(shutil.copytree(generated, tmp_path_factory.mktemp("course"), dirs_exist_ok=True))


@pytest.mark.parametrize("assignment", ASSIGNMENTS)
def test_student_notebooks_are_exactly_what_the_sources_generate(regenerated, assignment):
    fresh = regenerated / grading.RELEASE / assignment / f"{assignment}.ipynb"
    committed = REPO / grading.RELEASE / assignment / f"{assignment}.ipynb"
    assert _cells(committed) == _cells(fresh), f"{committed} is stale or edited by hand: run `make student`"


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


def _submit_blank(course: Path, assignment: str) -> None:
    grading.submit(course, assignment, "blank", course / grading.RELEASE / assignment / f"{assignment}.ipynb")


def _assert_blank_scores_zero(course: Path, assignment: str) -> None:
    blank = grading.scores(assignment, course)["blank"]
    # manually graded cells (written answers) are not autograded: the blank release must get no automatic points
    assert blank.max_score > 0
    assert blank.score == 0, f"the blank release scored {blank.score}: " + _failures(course, assignment, "blank")


@pytest.mark.parametrize("assignment", ASSIGNMENTS)
def test_autograde_gives_solution_full_marks_and_blank_zero(regenerated, assignment, monkeypatch, request):
    course = regenerated
    # A day that grades measured speed is graded in phase two, alone on the machine; its blank release
    # fails before it measures anything, so it is graded in phase one (the test below), beside the rest.
    with_blank = request.node.get_closest_marker("timed") is None
    if assignment in LOADED_IN_CELL:
        monkeypatch.setenv(config.GRADING_LOAD_ENV, "1")
    grading.submit(course, assignment, "solution", course / grading.SOURCE / assignment / f"{assignment}.ipynb")
    if with_blank:
        _submit_blank(course, assignment)
    with timing.busy_cores(1 if assignment in TIMED else 0):
        grading.autograde(assignment, course, student=None if with_blank else "solution")
    sol = grading.scores(assignment, course)["solution"]
    assert sol.max_score > 0
    assert sol.score == sol.max_score, f"the solution scored {sol.score}/{sol.max_score}: " + _failures(course, assignment, "solution")
    if with_blank:
        _assert_blank_scores_zero(course, assignment)
    graded = nbformat.read(course / "autograded" / "solution" / assignment / f"{assignment}.ipynb", as_version=4)
    noisy = [c.metadata["nbgrader"]["grade_id"] for c in graded.cells
             if c.metadata.get("nbgrader", {}).get("grade") and any(o.get("name") == "stderr" for o in c.get("outputs", []))]
    assert not noisy, f"passing test cells wrote to stderr (nbgrader scores that as a failure): {noisy}"
    # nbval's checks, on the solution autograde has just executed
    raised = stored_outputs.errors(graded)
    assert not raised, f"cells of the solution raised: {raised}"
    source = nbformat.read(REPO / grading.SOURCE / assignment / f"{assignment}.ipynb", as_version=4)
    checked, differ = stored_outputs.differences(graded, source)
    assert not differ, "\n".join(differ)
    assert checked == sum(map(notebooks.is_checked, source.cells)) > 0
    # the site (tests/test_site.py, `make site --quick`) publishes this run instead of executing the day again
    site.store_executed(assignment, course / "autograded" / "solution" / assignment / f"{assignment}.ipynb", config.quick())


@pytest.mark.parametrize("assignment", sorted(TIMED | LOADED_IN_CELL))
def test_autograde_gives_the_blank_release_of_a_speed_graded_day_zero(regenerated, assignment):
    _submit_blank(regenerated, assignment)
    grading.autograde(assignment, regenerated, student="blank")
    _assert_blank_scores_zero(regenerated, assignment)


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
