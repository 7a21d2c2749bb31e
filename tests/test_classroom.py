"""Autograding that survives real students, on Day 0 (two exercises, 2 points each).

Each submission is made here from the real source and student notebooks, graded by
the real nbgrader on a sqlite gradebook in one autograde run, and checked cell by cell.
"""

import csv
import copy
import shutil
from pathlib import Path

import nbformat
import pytest

from helpers.instructor import class_trial, grade_table, grading
from helpers.instructor.feedback_hidden import MARK, hidden_test_lines, shown

DAY = "day00_environment"
EX1, EX2 = "test_float32_lanes", "test_peak_gflops"


def _grade_id(cell) -> str | None:
    return cell.metadata.get("nbgrader", {}).get("grade_id")


def _cell(nb, grade_id):
    return next(c for c in nb.cells if _grade_id(c) == grade_id)


def _without(nb, grade_id):
    nb = copy.deepcopy(nb)
    nb.cells = [c for c in nb.cells if _grade_id(c) != grade_id]
    return nb


def _with_source(nb, grade_id, source):
    nb = copy.deepcopy(nb)
    _cell(nb, grade_id).source = source
    return nb


def submissions(solution, blank) -> dict[str, tuple[object, dict[str, float]]]:
    """student -> (notebook, expected points per test cell)."""
    right_ex1 = _cell(solution, "float32_lanes").source
    # The untouched solution earns full marks for every day in the grading gate
    # (tests/test_course_notebooks.py), which also proves each test fails on its exercise's blank;
    # here the whole blank release is graded as a class hands it in, with the submissions in between.
    return {
        # the release as handed out, submitted untouched: nothing
        "blank": (blank, {EX1: 0, EX2: 0}),
        # first exercise solved, second left as released: exactly the first exercise's points
        "partial": (_with_source(blank, "float32_lanes", right_ex1), {EX1: 2, EX2: 0}),
        # an infinite loop in the second exercise: interrupted, the run finishes, only its points lost
        "loops": (_with_source(solution, "peak_gflops", "while True:\n    pass"), {EX1: 2, EX2: 0}),
        # an exception in the first exercise costs only the first exercise
        "crashes": (_with_source(solution, "float32_lanes", "raise RuntimeError('oops')"), {EX1: 0, EX2: 2}),
        # a wrong answer hidden by emptying the test cell: the test cell comes back from the gradebook
        "edits_tests": (
            _with_source(_with_source(solution, "float32_lanes", "def float32_lanes(target):\n    return 0"), EX1, "pass"),
            {EX1: 0, EX2: 2},
        ),
        # a wrong answer hidden by deleting the test cell: the test still counts against it
        "deletes_tests": (
            _without(_with_source(solution, "peak_gflops", "def peak_gflops(*a, **k):\n    return 1.0"), EX2),
            {EX1: 2, EX2: 0},
        ),
        # the learner deleted their own solution cell: only that exercise is lost
        "deletes_solution": (_without(solution, "float32_lanes"), {EX1: 0, EX2: 2}),
        # a kernel that dies in the first exercise (the process ends, as in a segfault of compiled code): the
        # rest of the notebook is graded in a new kernel, and the learner gets feedback saying which cell
        "kills_kernel": (_with_source(solution, "float32_lanes", "import os\nos._exit(1)"), {EX1: 0, EX2: 2}),
        # answers that pass the visible tests and fail the hidden ones (no ARM CPU, no check of the
        # arguments): the hidden tests raise, and the feedback shows their tracebacks
        "fails_hidden": (
            _with_source(_with_source(solution, "float32_lanes", _cell(solution, "float32_lanes").source.replace(
                '("neon", 128)', '("neon", 64)')), "peak_gflops",
                "def peak_gflops(cores, ghz, fp32_lanes, fma_units):\n    return cores * ghz * fma_units * 2 * fp32_lanes"),
            {EX1: 0, EX2: 0},
        ),
    }


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    course, solution, blank = class_trial.scratch_class(DAY, tmp_path_factory.mktemp("class"))
    cases = submissions(solution, blank)
    class_trial.hand_in(course, DAY, {student: nb for student, (nb, _) in cases.items()})
    shown = []
    (course / "autograde.log").write_text(grading.autograde(DAY, course, cell_timeout=20, progress=shown.append).stderr)
    (course / "progress.log").write_text("\n".join(shown))
    return course, cases


def test_each_submission_scores_exactly_the_exercises_it_got_right(graded):
    course, cases = graded
    totals = grading.scores(DAY, course)
    for student, (_, expected) in cases.items():
        got = grading.cell_scores(DAY, student, course)
        assert {k: got.get(k, 0.0) for k in expected} == expected, student
        assert totals[student].score == sum(expected.values()), student
    assert 0 < totals["partial"].score < totals["partial"].max_score


def test_make_autograde_shows_progress_then_every_score_and_a_line_per_problem(graded):
    course, cases = graded
    shown = (course / "progress.log").read_text().splitlines()
    for student in cases:
        assert any(line.startswith(f"{student}/{DAY}: test_") for line in shown), f"no progress for {student}"
    assert any("the kernel died in cell" in line and line.startswith("kills_kernel/") for line in shown)
    scores, problems = grade_table.report(DAY, course)
    assert sorted(line.split(":")[0] for line in scores) == sorted(cases)
    assert "kills_kernel: 2 / 4 autograded; total 2 / 4" in scores
    assert problems == ["kills_kernel: float32_lanes: the kernel died", "loops: peak_gflops: ran past the cell's time limit"]


def test_only_an_edited_test_cell_is_reported_as_changed(graded):
    """nbgrader's own autograde says every untouched test cell with hidden tests "has changed!"."""
    course, _ = graded
    changed, student = set(), None
    for line in (course / "autograde.log").read_text().splitlines():
        if "Sanitizing " in line:
            student = Path(line.split("Sanitizing ", 1)[1]).parts[-3]
        elif "Attribute 'checksum' for cell" in line:
            changed.add((student, line.split("for cell ", 1)[1].split()[0]))
    assert changed == {("edits_tests", EX1)}


@pytest.fixture(scope="module")
def feedback(graded):
    """Each student's feedback page, made with the course's config (`make feedback`)."""
    course, _ = graded
    return {p.parts[-3]: p.read_text() for p in grading.feedback(DAY, course)}


def test_feedback_tells_the_learner_what_was_expected(feedback):
    pages = feedback
    assert set(pages) >= {"crashes", "partial", "edits_tests"}
    # the restored visible test explains the wrong answer
    assert "is not a SIMD width of an x86-64 CPU" in pages["edits_tests"]
    assert "NotImplementedError" in pages["partial"]
    # a dead kernel is said where it died, and a loop with the limit it ran past
    assert "the kernel died while this cell ran" in pages["kills_kernel"]  # (every kind of death: test_execute.py)
    assert "your code ran past 20 s" in pages["loops"]


def _leaks(pages: dict[str, str]) -> dict[str, list[str]]:
    """The lines of Day 0's hidden tests each page shows."""
    hidden = hidden_test_lines(nbformat.read(grading.REPO / grading.SOURCE / DAY / f"{DAY}.ipynb", as_version=4))
    assert len(hidden) > 20, "Day 0's hidden tests are what this test looks for"
    return {student: found for student, text in pages.items() if (found := shown(text, hidden))}


def test_feedback_never_shows_a_hidden_test(graded, feedback, tmp_path):
    """No line of a hidden test in any page: not in the cells' code (the passing answers of `loops` and
    `crashes` are the solution's), not in a traceback of a hidden test that raised (`fails_hidden`),
    which shows marks instead. Made again with nbgrader's own feedback preprocessors, and without the
    traceback's marks, the same pages show them: the check finds what it looks for."""
    course, cases = graded
    assert set(feedback) == set(cases)
    assert _leaks(feedback) == {}
    assert "float32 lanes (an ARM CPU with NEON), got 2" in feedback["fails_hidden"]
    assert MARK in feedback["fails_hidden"], "the hidden test's traceback is shown, its lines as marks"

    old = shutil.copytree(course, tmp_path / "course")
    for preprocessors, leaking in [("GetGrades, CSSHTMLHeaderPreprocessor", set(cases)),  # nbgrader's own
                                   ("ClearHiddenTests, GetGrades, CSSHTMLHeaderPreprocessor", {"fails_hidden"})]:
        with open(old / "nbgrader_config.py", "a") as config:
            config.write("from nbconvert.preprocessors import CSSHTMLHeaderPreprocessor\n"
                         "from nbgrader.preprocessors import ClearHiddenTests, GetGrades\n"
                         f"c.GenerateFeedback.preprocessors = [{preprocessors}]\n")
        pages = {p.parts[-3]: p.read_text() for p in grading.feedback(DAY, old)}
        assert leaking <= set(_leaks(pages)), f"[{preprocessors}] must leak the hidden tests of {sorted(leaking)}"


def test_grades_export_as_csv(graded, tmp_path):
    course, cases = graded
    rows = list(csv.DictReader(grade_table.write_csv(tmp_path / "grades.csv", course).open()))
    by_student = {r["student"]: float(r[f"{DAY}: total"]) for r in rows}
    assert all(float(r[f"{DAY}: Exercise 1 (2)"]) + float(r[f"{DAY}: Exercise 2 (2)"]) == by_student[r["student"]] for r in rows)
    assert by_student == {s: float(sum(exp.values())) for s, (_, exp) in cases.items()}
