"""tests/solution_copies.py finds a visible test that holds its exercise's answer, however it is renamed, in every
day, and leaves the course's own visible tests alone."""

import copy
import re

import nbformat
import pytest

import solution_copies
from helpers.instructor import grading

REPO = grading.REPO


def _source(day):
    return nbformat.read(REPO / grading.SOURCE / day / f"{day}.ipynb", as_version=4)


def _planted(nb, exercise: str, rename: dict[str, str]):
    """``nb`` with the solution cell of ``exercise`` written again in its first test cell, its names changed."""
    nb = copy.deepcopy(nb)
    cells = {c.metadata.get("nbgrader", {}).get("grade_id"): c for c in nb.cells}
    again = re.sub(r"^\s*### (BEGIN|END) SOLUTION\n", "", cells[exercise].source, flags=re.M)
    for old, new in {exercise: "reference", **rename}.items():
        again = re.sub(rf"\b{old}\b", new, again)
    test = next(c for g, c in cells.items() if g and g.startswith("test_") and exercise in g)
    test.source = f"{again}\n\n\n{test.source}"
    return nb


@pytest.mark.parametrize("day", grading.assignments())
def test_a_solution_written_again_in_a_visible_test_is_found(day):
    nb = _source(day)
    exercises = [c.metadata["nbgrader"]["grade_id"] for c in nb.cells if c.metadata.get("nbgrader", {}).get("solution")
                 and any(len(solution_copies.tokens(part)) >= solution_copies.MIN_TOKENS
                         for part in solution_copies.SOLUTION.findall(c.source))]
    for exercise in exercises:
        # as a maintainer writes "an independent reference": the same steps, the variables named otherwise
        found = solution_copies.copies(_planted(nb, exercise, {"x": "inputs", "result": "out", "scale": "s"}))
        assert any(f"of {exercise};" in line for line in found), (exercise, found)


def test_day12s_old_reference_error_would_have_been_found():
    """The copy the check was written for (Day 12, Exercise 2, before it moved to the hidden tests)."""
    nb = _source("day12_int8")
    test = next(c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade_id") == "test_layer_error")
    test.source = '''def reference_error(w, x, per_channel):
    low, high = min(float(x.min()), 0.0), max(float(x.max()), 0.0)
    sx = (high - low) / 255 or 1.0
    zx = int(np.clip(round(-low / sx), 0, 255))
    xq = np.clip(np.round(x / sx) + zx, 0, 255).astype(np.int64) - zx
    m = np.abs(w).max(axis=1) if per_channel else np.full(w.shape[0], np.abs(w).max())
    sw = np.where(m > 0, m / 127, 1.0)
    wq = np.clip(np.round(w / sw[:, None]), -127, 127).astype(np.int64)
    y = (xq @ wq.T) * sx * sw[None, :]
    want = x.astype(np.float64) @ w.T.astype(np.float64)
    return max(build.relative_error(y[:, c], want[:, c]) for c in range(w.shape[0]))
''' + test.source
    assert any("reference_error() holds" in line for line in solution_copies.copies(nb))
