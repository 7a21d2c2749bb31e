"""What a graded notebook says where autograde stopped a cell (helpers/instructor/execute.py), read back
for `make autograde`'s report without importing nbgrader."""

from __future__ import annotations

from nbformat import NotebookNode

KERNEL_DIED = "KernelDied"          # the error a cell gets when the kernel died while it ran
NOT_RUN = "NotebookTimeLimit"       # the error of each cell left when the notebook's time ran out
PROGRESS = "grading "  # the start of every line CourseExecute logs: `make autograde` shows them as they come

# What each way of running out says in a graded notebook, as a line of `make autograde`'s report.
STOPPED = {KERNEL_DIED: "the kernel died", "CellTimeoutError": "ran past the cell's time limit",
           NOT_RUN: "not run: the notebook's time limit was reached"}


def stopped_cells(nb: NotebookNode) -> list[str]:
    """The cells of a graded notebook that a dead kernel or a time limit stopped: "test_x: the kernel died"."""
    found = []
    for index, cell in enumerate(nb.cells):
        for name in dict.fromkeys(o.get("ename") for o in cell.get("outputs", []) if o.get("ename") in STOPPED):
            found.append(f"{cell.get('metadata', {}).get('nbgrader', {}).get('grade_id') or f'cell {index}'}: {STOPPED[name]}")
    return found
