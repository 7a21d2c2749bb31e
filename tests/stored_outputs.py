"""nbval's checks, run on a notebook that nbgrader's autograde has already executed.

Every source notebook used to run twice with its solutions: once under nbval (every cell must
run without error; cells tagged ``nbval-check-output`` must reproduce their stored output) and
once under ``nbgrader autograde`` (the solution must earn full marks). Both execute the same
cells in the same order, so the suite now executes each source once, under autograde, and
applies nbval's checks to what autograde executed, with nbval's own comparison code
(``IPyNbCell.compare_outputs``, ``coalesce_streams``): no error output in any cell, and every
checked cell's outputs equal to those stored in the source (``make outputs`` stores them).
"""

from __future__ import annotations

import copy
from types import SimpleNamespace

import nbformat
from nbval.plugin import IPyNbCell, coalesce_streams, nocolors

from helpers.instructor.notebooks import is_checked

# The keys nbval leaves out of a comparison when it runs without nbdime (what the suite did).
SKIP_COMPARE = ("metadata", "traceback", "prompt_number", "output_type",
                "name", "execution_count", "application/vnd.jupyter.widget-view+json", "image/png", "image/jpeg")


def _comparer() -> SimpleNamespace:
    """The part of an nbval cell item that ``IPyNbCell.compare_outputs`` uses (no sanitizers: the suite set none)."""
    item = SimpleNamespace(colors=nocolors, comparison_traceback=[], parent=SimpleNamespace(skip_compare=SKIP_COMPARE))
    item.sanitize = lambda text: text
    item.format_output_compare = lambda key, left, right: item.comparison_traceback.append(
        f"{key}: stored {left!r}\n  got {right!r}")
    return item


def errors(executed: nbformat.NotebookNode) -> list[str]:
    """The code cells that raised, with the error: nbval fails a notebook on any of them."""
    found = []
    for number, cell in enumerate(c for c in executed.cells if c.cell_type == "code"):
        for out in cell.get("outputs", []):
            if out.get("output_type") == "error":
                grade_id = cell.metadata.get("nbgrader", {}).get("grade_id", "")
                found.append(f"cell {number} {grade_id}: {out.get('ename')}: {out.get('evalue', '')[:300]}")
    return found


def differences(executed: nbformat.NotebookNode, source: nbformat.NotebookNode) -> tuple[int, list[str]]:
    """``(checked, failures)``: how many tagged cells were compared, and each one whose output differs.

    Cells are matched in order; a notebook whose code cells do not line up with its source
    (another notebook, or cells added or removed) is a failure, not a silent pass.
    """
    ran = [c for c in executed.cells if c.cell_type == "code"]
    stored = [c for c in source.cells if c.cell_type == "code"]
    if [c.source for c in ran] != [c.source for c in stored]:
        return 0, ["the executed notebook's code cells are not the source's: cannot compare outputs"]
    checked, failures = 0, []
    for number, (got, ref) in enumerate(zip(ran, stored)):
        if not is_checked(ref):
            continue
        if ref.execution_count is None:
            failures.append(f"cell {number} is tagged for nbval but has no stored output: run `make outputs`")
            continue
        checked += 1
        item = _comparer()
        if not IPyNbCell.compare_outputs(item, coalesce_streams(copy.deepcopy(got.outputs)),
                                         coalesce_streams(copy.deepcopy(ref.outputs))):
            failures.append(f"cell {number}: outputs differ from those stored in the source\n"
                            + "\n".join(item.comparison_traceback))
    return checked, failures
