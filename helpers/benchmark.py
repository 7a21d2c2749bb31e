"""Where Days 8, 11 and 13 read the course's results files until their notebooks import ``helpers.results``.

Nothing is defined here: the names are ``helpers.results``'. The benchmark itself (the tables, tuning in
stages, their command line) is the maintainers' (``python -m helpers.maintainers.benchmark``); no learner
module imports this one. Once no notebook says ``benchmark.``, delete it (the index in ``helpers/__init__.py``,
checked against the notebooks, lists the days that still do).

Introduced on Day 8.
"""

from .results import CURVE_FILE, RESULTS_ROOT, read_curve, results_path, save_record

__all__ = ["CURVE_FILE", "RESULTS_ROOT", "read_curve", "results_path", "save_record"]
