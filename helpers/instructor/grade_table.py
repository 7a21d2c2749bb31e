"""The class's grades as an instructor reports them: a line per student after an autograde, a CSV for a
learning platform, each exercise on its own.

nbgrader's own export gives one total per student and counts a written answer nobody has graded yet as
0, so Day 11's grades read 0/4 for the written part until an instructor grades it, and nothing says so.
Here a written answer not graded yet is "to be graded", the total is left empty until every part is
graded, and `make autograde`'s report and `make grades`'s CSV count the same points. A learning
platform imports the CSV as it is (a column per exercise, the student's id first).
"""

from __future__ import annotations

import csv
import sys
from dataclasses import dataclass
from pathlib import Path

import nbformat

from ..errors import GradingError
from . import exercises, stops
from .grading import GRADEBOOK, REPO, SOURCE, assignments, gradebook_url, in_gradebook

TO_BE_GRADED = "to be graded"
WRITTEN = " (written)"  # the end of a written exercise's label: an instructor grades it


@dataclass(frozen=True)
class Row:
    """One student's grades on one day: points per exercise (None: a written answer not graded yet)."""

    student: str
    day: str
    points: dict[str, float | None]   # exercise label -> points
    max_points: dict[str, float]
    late_penalty: float

    @property
    def complete(self) -> bool:
        return all(p is not None for p in self.points.values())

    @property
    def total(self) -> float | None:
        return sum(self.points.values()) - self.late_penalty if self.complete else None

    @property
    def autograded(self) -> tuple[float, float]:
        """(points, max) of the exercises a machine graded."""
        auto = [label for label, p in self.points.items() if not label.endswith(WRITTEN)]
        return sum(self.points[label] for label in auto), sum(self.max_points[label] for label in auto)

    def line(self) -> str:
        """The line `make autograde` prints: autograded points, then what waits for an instructor."""
        got, most = self.autograded
        waiting = [label for label, p in self.points.items() if p is None]
        written = "; " + ", ".join(f"{label}: {TO_BE_GRADED}" for label in waiting) if waiting else ""
        late = f"; late: -{self.late_penalty:g}" if self.late_penalty else ""
        total = f"; total {self.total:g} / {sum(self.max_points.values()):g}" if self.complete else ""
        return f"{self.student}: {got:g} / {most:g} autograded{written}{late}{total}"


def _exercise_of_cells(day: str, course: Path) -> dict[str, str]:
    """Each graded cell's grade_id -> its exercise's label, from the day's source, in the exercises' order."""
    nb = nbformat.read(course / SOURCE / day / f"{day}.ipynb", as_version=4)
    owner = {}
    for ex in exercises.read(nb):
        label = f"Exercise {ex.number}{WRITTEN if ex.manual else ''}"
        for index in ex.cells:
            meta = exercises.grader(nb.cells[index])
            if meta.get("grade"):
                owner[meta["grade_id"]] = label
    return owner


def rows(day: str, course: Path = REPO) -> list[Row]:
    """Every graded submission of ``day`` in the gradebook, exercise by exercise."""
    from nbgrader.api import Gradebook  # (nbgrader's import costs seconds; the report needs it only here)

    owner = _exercise_of_cells(day, course)
    found = []
    with Gradebook(gradebook_url(course)) as gb:
        for sub in gb.assignment_submissions(day):
            points: dict[str, float | None] = {}
            most: dict[str, float] = {}
            for nb in sub.notebooks:
                for grade in nb.grades:
                    label = owner.get(grade.name, grade.name)
                    most[label] = most.get(label, 0.0) + float(grade.max_score)
                    if label.endswith(WRITTEN) and grade.needs_manual_grade:  # (a test cell's, e.g. deleted: its 0)
                        points[label] = None
                    elif points.get(label, 0.0) is not None:
                        points[label] = points.get(label, 0.0) + float(grade.score)
            order = [*dict.fromkeys(owner.values()), *sorted(set(most) - set(owner.values()))]
            found.append(Row(sub.student_id, day, {label: points[label] for label in order if label in points},
                             {label: most[label] for label in order if label in most},
                             float(sub.late_submission_penalty or 0.0)))
    return sorted(found, key=lambda r: r.student)


def write_csv(path: Path, course: Path = REPO) -> Path:
    """Every grade of every student, a row per student and a column per day's exercise, then the day's total
    (empty while a written answer waits) and its late penalty where there is one: what a learning platform
    imports as a gradebook."""
    by_day = {day: rows(day, course) for day in assignments(course)} if (course / GRADEBOOK).exists() else {}
    columns: list[tuple[str, str]] = []  # (day, what)
    for day, graded in by_day.items():
        labels = list(dict.fromkeys(label for row in graded for label in row.max_points))  # in the exercises' order
        most = {label: max(row.max_points[label] for row in graded if label in row.max_points) for label in labels}
        columns += [(day, f"{label} ({most[label]:g})") for label in labels] + ([(day, "total")] if graded else [])
        columns += [(day, "late penalty")] if any(row.late_penalty for row in graded) else []
    cells: dict[str, dict[tuple[str, str], str]] = {}
    for day, graded in by_day.items():
        for row in graded:
            mine = cells.setdefault(row.student, {})
            for label, points in row.points.items():
                mine[(day, f"{label} ({row.max_points[label]:g})")] = TO_BE_GRADED if points is None else f"{points:g}"
            mine[(day, "total")] = "" if row.total is None else f"{row.total:g}"
            mine[(day, "late penalty")] = f"{row.late_penalty:g}"
    with open(path, "w", newline="") as f:
        out = csv.writer(f)
        out.writerow(["student", *(f"{day}: {what}" for day, what in columns)])
        for student in sorted(cells):
            out.writerow([student, *(cells[student].get(column, "") for column in columns)])
    return path


def report(day: str, course: Path = REPO) -> tuple[list[str], list[str]]:
    """After an autograde: a line per student (``Row.line``), and a line per problem: a student nbgrader could
    not grade, a cell a dead kernel or a time limit stopped."""
    submitted = sorted(p.parent.name for p in (course / "submitted").glob(f"*/{day}") if p.is_dir())
    graded = {row.student: row for row in rows(day, course)} if in_gradebook(day, course) else {}
    lines, problems = [], []
    for student in submitted:
        notebooks = sorted((course / "autograded" / student / day).glob("*.ipynb"))
        if student not in graded or not notebooks:
            problems.append(f"{student}: not graded (nbgrader's log above says why); their notebook is in submitted/")
            continue
        lines.append(graded[student].line())
        for path in notebooks:
            problems += [f"{student}: {problem}" for problem in stops.stopped_cells(nbformat.read(path, as_version=4))]
    return lines, problems


def main(argv: list[str] | None = None) -> int:
    import argparse  # (the command line only)

    parser = argparse.ArgumentParser(prog="python -m helpers.instructor.grade_table", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("report", help="each student's points and each problem of a day's autograde").add_argument("day")
    sub.add_parser("export", help="every grade as CSV, a column per exercise").add_argument("csv", nargs="?", default="grades.csv")
    args = parser.parse_args(argv)
    if args.command == "export":
        print(write_csv(Path(args.csv).resolve()))
        return 0
    try:
        lines, problems = report(args.day)
    except GradingError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    print("\n".join(["Scores:", *lines] + (["Problems:", *problems] if problems else [])))
    return 1 if any("not graded" in p for p in problems) else 0


if __name__ == "__main__":
    sys.exit(main())
