"""`make test DAY=N`: which tests check one day, so that a maintainer who changed a day runs them alone.

A day's checks are its notebook through the grading gate (sync with its source, autograde with the
blank-probe proofs and nbval's checks: tests/test_course_notebooks.py), its hidden-test proofs
(``test_dayNN_*`` in tests/test_hidden_tests.py), its prose and leak checks (tests/test_prose.py, the
site's stripping check in tests/test_site.py), the README's generated parts (they read each day's
opening) and the whole test file of every helper the day imports, as the index in
``helpers/__init__.py`` lists them. run_suite.py passes ``--day NAME`` and these files to pytest, and
conftest.py keeps, of the files checked per day, the tests of that day only.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

from helpers.errors import GradingError
from helpers.instructor import days
from helpers.instructor.grading import assignments

REPO = Path(__file__).resolve().parent.parent
TESTS = REPO / "tests"
# Files with a test per day (a parameter ``[dayNN_name]`` or a name ``test_dayNN_...``): only the day's run.
PER_DAY = ("test_course_notebooks.py", "test_hidden_tests.py", "test_prose.py", "test_site.py")
# Files that read every day and cost seconds: run whole.
WHOLE = ("test_readme.py",)


class UnknownDay(ValueError):
    """A day the course does not have, said with the days it has."""


def day_name(day: str) -> str:
    """The day's folder name from ``7``, ``07``, ``day07`` or ``day07_layouts``, as ``make check`` reads them."""
    try:
        return days.day_name(day, assignments(REPO), "make test")
    except GradingError as err:
        raise UnknownDay(f"make test: {err} `make test` alone runs the whole suite.") from None


def index(root: Path = REPO) -> dict[str, set[int]]:
    """The table of ``helpers/__init__.py``'s docstring: ``{module: days}`` (``-``: no day)."""
    text = ast.get_docstring(ast.parse((root / "helpers" / "__init__.py").read_text()))
    rows = re.findall(r"^    (\w+)\s{2,}(-|\d[\d, -]*?)\s{2,}\S.*$", text, re.M)
    days = {}
    for name, spans in rows:
        days[name] = set()
        for span in ([] if spans == "-" else spans.split(",")):
            low, _, high = span.strip().partition("-")
            days[name] |= set(range(int(low), int(high or low) + 1))
    return days


def helper_tests(name: str) -> list[str]:
    """The test files of the helpers day ``name`` imports (``tests/test_<module>*.py``, e.g. test_tuning.py and
    test_tuning_package.py for the ``tuning`` package)."""
    number = int(name[3:5])
    modules = sorted(module for module, days in index().items() if number in days)
    return sorted({f"tests/{p.name}" for module in modules for p in TESTS.glob(f"test_{module}*.py")
                   if p.stem == f"test_{module}" or p.stem.startswith(f"test_{module}_")})


def files(name: str) -> list[str]:
    """Every test file that holds a check of day ``name``."""
    return sorted({*(f"tests/{f}" for f in PER_DAY + WHOLE), *helper_tests(name)})


def pytest_arguments(day: str) -> list[str]:
    """What run_suite.py gives pytest for ``make test DAY=day``; UnknownDay for a day the course lacks."""
    name = day_name(day)
    return ["--day", name, *files(name)]


def keeps(nodeid: str, name: str) -> bool:
    """Whether the test ``nodeid`` belongs to the run of day ``name``: every test of a helper's file or a
    whole file, and of the per-day files the tests of that day only."""
    path, _, test = nodeid.partition("::")
    if Path(path).name not in PER_DAY:
        return True
    return f"[{name}]" in test or test.startswith(f"test_{name[:5]}_")
