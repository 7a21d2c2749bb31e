"""A day's exercises, read from its notebook: what `make check` reports and the grading gate probes.

An exercise starts at a heading ``### Exercise N (P points): title`` and holds the cells up to the
next heading of its level or above: the learner's solution cells, lesson cells that use them, and
the graded test cells that score them. nbgrader's metadata says which cell is which.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import nbformat

HEADING = re.compile(r"^### Exercise (\d+) \((\d+) points?(, graded by your instructor)?\): (.+)$", re.M)
ANY_HEADING = re.compile(r"^#{1,3} ", re.M)


@dataclass
class Exercise:
    number: int
    title: str
    points: int
    manual: bool                                   # a written answer, graded by an instructor
    cells: list[int] = field(default_factory=list)  # indices of the cells under its heading
    solutions: list[str] = field(default_factory=list)  # grade_ids of the learner's code cells
    tests: list[str] = field(default_factory=list)      # grade_ids of its autograded test cells

    @property
    def label(self) -> str:
        return f"Exercise {self.number}: {self.title}"


def grader(cell) -> dict:
    return cell.get("metadata", {}).get("nbgrader", {})


def read(nb: nbformat.NotebookNode) -> list[Exercise]:
    """The exercises of a notebook (a source or a student version), in order."""
    found: list[Exercise] = []
    current: Exercise | None = None
    for index, cell in enumerate(nb.cells):
        if cell.cell_type == "markdown":
            match = HEADING.search(cell.source)
            if match:
                current = Exercise(int(match.group(1)), match.group(4).strip(), int(match.group(2)), bool(match.group(3)))
                found.append(current)
            elif ANY_HEADING.search(cell.source) and current is not None and not grader(cell).get("solution"):
                current = None
        if current is None:
            continue
        current.cells.append(index)
        meta = grader(cell)
        if cell.cell_type == "code" and meta.get("solution"):
            current.solutions.append(meta["grade_id"])
        elif cell.cell_type == "code" and meta.get("grade"):
            current.tests.append(meta["grade_id"])
    return found


def by_test(exercises: list[Exercise]) -> dict[str, Exercise]:
    """Each autograded test cell's exercise, by the test cell's grade_id."""
    return {test: ex for ex in exercises for test in ex.tests}
