"""One switch that shrinks heavy work to a reduced but real size.

CI has two cores and runs every notebook more than once, so it sets
``TVM_COURSE_QUICK=1``: fewer repeats, smaller sweeps, small tuning budgets.
A learner leaves it unset and gets the full-size experiment.
"""

import os

QUICK_ENV = "TVM_COURSE_QUICK"


def quick() -> bool:
    """True when the course runs in reduced (CI) mode."""
    return os.environ.get(QUICK_ENV, "").strip().lower() in {"1", "true", "yes", "on"}


def pick(full, reduced):
    """Return ``reduced`` in quick mode and ``full`` otherwise.

    Notebooks call ``pick(100, 10)`` instead of branching on the environment.
    """
    return reduced if quick() else full
