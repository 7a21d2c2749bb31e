"""Keep the outputs that nbval checks inside the source notebooks.

nbval (run with --nbval-lax) compares only cells tagged ``nbval-check-output``
with the output stored in the notebook. After editing a source notebook, run
``python -m helpers.instructor.notebooks solutions/DAY/DAY.ipynb``: it executes the notebook
and stores the outputs of those cells, and nothing else (timings and plots
differ from run to run and would only bloat the repo).
"""

from __future__ import annotations

import sys
from pathlib import Path

import nbformat
from nbclient import NotebookClient

CHECK_TAG = "nbval-check-output"


def is_checked(cell) -> bool:
    return cell.cell_type == "code" and CHECK_TAG in cell.metadata.get("tags", [])


def refresh_checked_outputs(path: str | Path, timeout: int = 1200) -> int:
    """Execute the notebook in its folder; keep only the checked cells' outputs. Returns their count."""
    path = Path(path)
    nb = nbformat.read(path, as_version=4)
    NotebookClient(nb, timeout=timeout, kernel_name="tvm-course", resources={"metadata": {"path": str(path.parent)}}).execute()
    kept = 0
    for cell in nb.cells:
        cell.metadata.pop("execution", None)  # timestamps: a diff on every run, for nothing
        if cell.cell_type != "code":
            continue
        if is_checked(cell):
            kept += 1  # nbval needs the execution count of a cell whose output it compares
        else:
            cell.outputs = []
            cell.execution_count = None
    nb.metadata.pop("widgets", None)
    nbformat.write(nb, path)
    return kept


if __name__ == "__main__":
    for arg in sys.argv[1:]:
        print(f"{arg}: {refresh_checked_outputs(arg)} checked output(s) stored")
