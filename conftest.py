"""How `make test` splits the suite (tests/ and the notebooks in solutions/) into its two phases.

Phase one runs everything that grades no measured speed on two pytest-xdist workers; phase two
runs the tests marked `timed` alone, with every core to themselves (tests/run_suite.py).
"""

import pytest

# The days whose graded cells time kernels: timed from their first cell to their last.
SPEED_GRADED_DAYS = ("day07_layouts", "day08_tuning")
# Files whose tests share nothing expensive: the workers may take their tests one by one. Every
# other file goes to one worker whole: a notebook's cells run in order in one kernel, and a test
# file's module fixtures are built once.
INDEPENDENT_TESTS = ("tests/test_course_notebooks.py", "tests/test_hidden_tests.py")


# Tests of those days that time nothing (they compare files): they stay in phase one.
UNTIMED_CHECKS = ("test_student_notebooks_are_exactly_what_the_sources_generate",
                  "test_sources_use_the_course_kernel_and_have_graded_exercises")


def pytest_collection_modifyitems(config, items):
    for item in items:
        if any(day in item.nodeid for day in SPEED_GRADED_DAYS) and not any(t in item.nodeid for t in UNTIMED_CHECKS):
            item.add_marker(pytest.mark.timed)


@pytest.hookimpl(optionalhook=True)  # pytest-xdist's hook: unknown when it is not loaded (-p no:xdist)
def pytest_xdist_make_scheduler(config, log):
    """pytest-xdist's per-file scheduling (``--dist loadscope``), except for INDEPENDENT_TESTS."""
    from xdist.scheduler import LoadScopeScheduling

    class CourseScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            if nodeid.split("::")[0] in INDEPENDENT_TESTS:
                return nodeid
            return super()._split_scope(nodeid)

    return CourseScheduling(config, log)
