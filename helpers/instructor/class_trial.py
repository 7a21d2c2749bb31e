"""A hostile class, graded before a real one: does grading survive what learners hand in, on your machine?

    python -m helpers.instructor.class_trial day01_import day07_layouts day11_capstone   # (any days; 1, 07 ...)

For each day, in a scratch copy of the course, the submissions a class really produces are made from the
day's solution and its release: untouched (``blank``), the first half of the exercises done (``half``), an
endless loop, an exception, a kernel killed (``os._exit``), memory exhausted, and a wrong answer behind an
emptied test cell. They are graded as `make autograde` grades them, with its progress, report and
feedback, and checked: every exercise's points as expected (a damaged exercise 0, the others whole, a
written answer "to be graded"), feedback for everyone and no line of a hidden test in it, and every
problem said in one line. Exits 1 on any difference. ``TVM_COURSE_QUICK=1`` grades at the suite's sizes.
"""

from __future__ import annotations

import copy
import sys
import tempfile
import time
from pathlib import Path

import nbformat

from . import exercises, grade_table, grading
from .days import day_name
from .feedback_hidden import hidden_test_lines, shown

LOOP = "while True:\n    pass"
CRASH = "raise RuntimeError('a bug in the learner code')"
KILL = "import os\nos._exit(1)"
HOG = "hog = []\nwhile True:\n    hog.append(bytearray(10**8))"


def _graded(nb: nbformat.NotebookNode) -> list[exercises.Exercise]:
    """The exercises a machine grades, in order."""
    return [ex for ex in exercises.read(nb) if ex.tests and not ex.manual]


def _cell(nb: nbformat.NotebookNode, grade_id: str) -> nbformat.NotebookNode:
    return next(c for c in nb.cells if exercises.grader(c).get("grade_id") == grade_id)


def _with(nb: nbformat.NotebookNode, grade_id: str, source: str) -> nbformat.NotebookNode:
    nb = copy.deepcopy(nb)
    _cell(nb, grade_id).source = source
    return nb


def submissions(solution: nbformat.NotebookNode, release: nbformat.NotebookNode) -> dict[str, tuple[nbformat.NotebookNode, set[int]]]:
    """student -> (their notebook, the exercises it damaged)."""
    auto = _graded(solution)
    everything = {ex.number for ex in auto}
    first, middle, last = auto[0], auto[len(auto) // 2], auto[-1]
    half, done = release, auto[: max(1, len(auto) // 2)]
    for grade_id in (g for ex in done for g in ex.solutions):
        half = _with(half, grade_id, _cell(solution, grade_id).source)
    wrong = _with(solution, first.solutions[0], _cell(release, first.solutions[0]).source)
    return {
        "blank": (release, everything),
        "half": (half, everything - {ex.number for ex in done}),
        "loops": (_with(solution, last.solutions[0], LOOP), {last.number}),
        "crashes": (_with(solution, first.solutions[0], CRASH), {first.number}),
        "kills_kernel": (_with(solution, middle.solutions[0], KILL), {middle.number}),
        "eats_memory": (_with(solution, middle.solutions[0], HOG), {middle.number}),
        "edits_tests": (_with(wrong, first.tests[0], "pass"), {first.number}),
    }


def expected_points(solution: nbformat.NotebookNode, damaged: set[int], answered: bool = True) -> dict[str, float | None]:
    """Exercise label (as grade_table names it) -> points: 0 where damaged, whole elsewhere; a written answer None
    (to be graded) where ``answered``, 0 where left as released (nbgrader scores an untouched answer 0)."""
    return {f"Exercise {ex.number}{grade_table.WRITTEN if ex.manual else ''}":
            (None if answered else 0.0) if ex.manual else 0.0 if ex.number in damaged else float(ex.points)
            for ex in exercises.read(solution) if ex.tests or ex.manual}


def _answered(nb: nbformat.NotebookNode, release: nbformat.NotebookNode) -> bool:
    """Whether a submission's written answers differ from the release's (the learner wrote something)."""
    written = lambda book: [c.source for c in book.cells if c.cell_type == "markdown" and exercises.grader(c).get("solution")]
    return written(nb) != written(release)


def scratch_class(day: str, folder: Path) -> tuple[Path, nbformat.NotebookNode, nbformat.NotebookNode]:
    """A course of ``day`` alone in ``folder``, released: (the course, its solution, its release)."""
    course = grading.scratch_course(folder, [day])
    grading.generate(day, course)
    read = lambda where: nbformat.read(course / where / day / f"{day}.ipynb", as_version=4)
    return course, read(grading.SOURCE), read(grading.RELEASE)


def hand_in(course: Path, day: str, notebooks: dict[str, nbformat.NotebookNode]) -> None:
    """Each student's notebook submitted to ``day``, as `make submit` files a collected one."""
    incoming = course / "incoming"
    incoming.mkdir(exist_ok=True)
    for student, nb in notebooks.items():
        nbformat.write(nb, incoming / f"{student}.ipynb")
        grading.submit(course, day, student, incoming / f"{student}.ipynb")


def trial(day: str, root: Path, cell_timeout: int) -> list[str]:
    """Grade a hostile class on ``day`` in ``root``; the differences from what is expected (none: it held)."""
    course, solution, release = scratch_class(day, root / day)
    cases = submissions(solution, release)
    hand_in(course, day, {student: nb for student, (nb, _) in cases.items()})
    begun = time.monotonic()
    grading.autograde(day, course, cell_timeout=cell_timeout, check=False, progress=lambda line: print("  " + line, flush=True))
    lines, problems = grade_table.report(day, course)
    print(f"{day}: graded in {time.monotonic() - begun:.0f} s\n" + "\n".join(["Scores:", *lines, "Problems:", *problems]), flush=True)
    wrong = []
    rows = {row.student: row for row in grade_table.rows(day, course)}
    for student, (nb, damaged) in cases.items():
        want = expected_points(solution, damaged, _answered(nb, release))
        got = rows[student].points if student in rows else {}
        if {label: got.get(label, 0.0) for label in want} != want:
            wrong.append(f"{day} {student}: points {got}, expected {want}")
    pages = {p.parts[-3]: p.read_text() for p in grading.feedback(day, course, allow_ungraded=True)}
    wrong += [f"{day} {student}: no feedback" for student in cases if student not in pages]
    hidden = hidden_test_lines(solution)
    wrong += [f"{day} {student}: feedback shows {len(found)} hidden-test lines" for student, text in pages.items()
              if (found := shown(text, hidden))]
    for student, expect in (("loops", "ran past"), ("kills_kernel", "the kernel died")):
        if not any(p.startswith(f"{student}: ") and expect in p for p in problems):
            wrong.append(f"{day} {student}: no problem line saying '{expect}'")
    print(f"{day}: " + ("as expected" if not wrong else "DIFFERENT:\n" + "\n".join(wrong)), flush=True)
    return wrong


def main(argv: list[str] | None = None) -> int:
    import argparse  # (the command line only)

    parser = argparse.ArgumentParser(prog="python -m helpers.instructor.class_trial", description=__doc__.splitlines()[0])
    parser.add_argument("days", nargs="+", help="days as make check reads them: 1, 07, day11_capstone")
    parser.add_argument("--cell-timeout", type=int, default=120, help="seconds a cell may run (the class's is 300)")
    args = parser.parse_args(argv)
    names = [day_name(d, grading.assignments(), "class_trial") for d in args.days]
    with tempfile.TemporaryDirectory(prefix="class-trial-") as root:
        wrong = [w for name in names for w in trial(name, Path(root), args.cell_timeout)]
    print("\n".join(["DIFFERENCES:", *wrong]) if wrong else f"Every score, feedback and problem line as expected on {', '.join(names)}.")
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
