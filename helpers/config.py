"""Where the course lives, and one switch that shrinks heavy work to a reduced but real size.

CI has two cores and runs every notebook more than once, so it sets
``TVM_COURSE_QUICK=1``: fewer repeats, smaller sweeps, small tuning budgets.
A learner leaves it unset and gets the full-size experiment.

Introduced on Day 4.
"""

import os
from pathlib import Path

# The repository's root: results/, tuning/, build/ and requirements.txt are found from it (the one place it is computed).
REPO = Path(__file__).resolve().parent.parent

QUICK_ENV = "TVM_COURSE_QUICK"


def quick() -> bool:
    """True when the course runs in reduced (CI) mode."""
    return os.environ.get(QUICK_ENV, "").strip().lower() in {"1", "true", "yes", "on"}


def pick(full, reduced):
    """Return ``reduced`` in quick mode and ``full`` otherwise.

    Notebooks call ``pick(100, 10)`` instead of branching on the environment.
    """
    return reduced if quick() else full


GRADING_LOAD_ENV = "TVM_COURSE_GRADING_LOAD"


def grading_load() -> int:
    """Cores a graded timing test keeps busy while it measures (``TVM_COURSE_GRADING_LOAD``, default 0).

    The grading gate sets it to prove that timing exercises pass on a shared,
    busy machine; the load then covers only the graded cell, not the whole notebook.
    """
    value = os.environ.get(GRADING_LOAD_ENV, "").strip() or "0"
    if not value.isdigit():
        raise ValueError(f"{GRADING_LOAD_ENV} must be a number of cores (0, 1, ...), got {value!r}.")
    return int(value)
