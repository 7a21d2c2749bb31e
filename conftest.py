"""How `make test` splits the suite (tests/ and the notebooks in solutions/) into its two phases.

Phase one runs everything that grades no measured speed on two pytest-xdist workers; phase two
runs the tests marked `timed` alone, with every core to themselves (tests/run_suite.py).
"""

import pytest

# The days whose graded cells time kernels: timed from their first cell to their last. Day 7 grades
# a schedule's speed against bars a busy machine could miss. Day 8 is not one of them: its one timed
# test measures a tuned kernel against the untuned one on one thread while it keeps a core busy itself
# (LOADED_IN_CELL, tests/test_course_notebooks.py), for a bar of 2x where tuning gives 16-39x; it runs in
# phase one beside the other worker, as on a classroom machine shared with another learner.
SPEED_GRADED_DAYS = ("day07_layouts",)
# Files whose tests share nothing expensive: the workers may take their tests one by one. Every
# other file goes to one worker whole: a notebook's cells run in order in one kernel, and a test
# file's module fixtures are built once.
INDEPENDENT_TESTS = ("tests/test_course_notebooks.py", "tests/test_hidden_tests.py")


# Tests of those days that time nothing (they compare files): they stay in phase one.
UNTIMED_CHECKS = ("test_student_notebooks_are_exactly_what_the_sources_generate", "test_every_exercise_stands_alone",
                  "test_sources_use_the_course_kernel_and_have_graded_exercises",
                  "test_stripping_leaves_no_solution_hidden_test_output_or_grader_metadata")


# The longest work units of phase one, with their seconds on one worker of two, every cache cold as in
# CI (a Zen 4, the run of 1695449 on 2026-11-28; pytest's JUnit times; the files' times from 2026-11-28's
# earlier cold run): a test id (an independent test) or a file (a unit of its own). They are handed out
# first, in this order, so that the two workers finish together instead of one of them running a long
# autograde alone at the end. The classroom test comes first: it generates its own course, so one worker
# starts on it while the other generates the whole course that every autograde waits for, then starts
# the longest autograde (Day 8's, which keeps one core busy itself for its one timed test).
AUTOGRADE = "test_autograde_gives_solution_full_marks_and_every_test_fails_on_the_blank"
LONGEST_FIRST = {
    "tests/test_classroom.py": 155,
    f"{AUTOGRADE}[day08_tuning]": 165,
    f"{AUTOGRADE}[day11_capstone]": 130,
    f"{AUTOGRADE}[day14_transformers]": 112,
    "tests/test_hub.py": 97,
    f"{AUTOGRADE}[day13_dispatch]": 84,
    f"{AUTOGRADE}[day15_llm]": 75,   # (measured alone here, a Zen 4, 2026-12-07, as test_llm.py's)
    "tests/test_rpc_tuning.py": 80,
    f"{AUTOGRADE}[day12_int8]": 80,
    "tests/test_nchwc.py": 80,
    f"{AUTOGRADE}[day10_torch_compile]": 72,
    "tests/test_selfstudy.py": 69,
    f"{AUTOGRADE}[day04_benchmark]": 67,
    "tests/test_quantize.py": 65,
    "tests/test_execute.py": 55,
    "tests/test_lms_import.py": 58,  # (its time and test_readme's measured alone here, a Zen 4, 2026-12-06)
    "tests/test_readme.py": 55,
    "tests/test_tuning.py": 60,
    f"{AUTOGRADE}[day06_export]": 59,
    "tests/test_transformer.py": 51,
    "tests/test_llm.py": 35,
    "tests/test_maintainers.py": 51,
    f"{AUTOGRADE}[day03_build]": 44,
    f"{AUTOGRADE}[day02_optimize]": 43,
    f"{AUTOGRADE}[day05_profile]": 40,
    f"{AUTOGRADE}[day01_import]": 36,
    "tests/test_databases.py": 36,
    "tests/test_paged_cache.py": 30,
    "tests/test_grading_fresh.py": 27,
    f"{AUTOGRADE}[day09_gpu]": 26,
}


def _place(nodeid: str) -> int:
    """Where a test's unit stands in LONGEST_FIRST; every other unit after them, as collected."""
    order = list(LONGEST_FIRST)
    for key in (nodeid.split("::")[-1], nodeid.split("::")[0]):
        if key in LONGEST_FIRST:
            return order.index(key)
    return len(order)


def pytest_addoption(parser):
    parser.addoption("--day", default=None, metavar="NAME",
                     help="only the checks of one day (a folder name such as day07_layouts): make test DAY=7")


def pytest_collection_modifyitems(config, items):
    day = config.getoption("--day")
    if day:
        import one_day  # tests/one_day.py (tests/ is on the path: pyproject.toml's pythonpath)

        keep = [one_day.keeps(item.nodeid, day) for item in items]
        config.hook.pytest_deselected(items=[item for item, kept in zip(items, keep) if not kept])
        items[:] = [item for item, kept in zip(items, keep) if kept]
    for item in items:
        if any(day in item.nodeid for day in SPEED_GRADED_DAYS) and not any(t in item.nodeid for t in UNTIMED_CHECKS):
            item.add_marker(pytest.mark.timed)
    # Longest first; a file's tests stay together, in their own order (sorted() is stable). What builds
    # on the notebooks' runs (the site, after Days 7 and 8 in phase two) comes last.
    items[:] = sorted(items, key=lambda item: (item.get_closest_marker("after_notebooks") is not None,
                                               _place(item.nodeid)))


@pytest.hookimpl(optionalhook=True)  # pytest-xdist's hook: unknown when it is not loaded (-p no:xdist)
def pytest_xdist_make_scheduler(config, log):
    """pytest-xdist's per-file scheduling (``--dist loadscope``), except for INDEPENDENT_TESTS, and in
    the order of the collection (LONGEST_FIRST), not by the number of tests in a unit."""
    from xdist.scheduler import LoadScopeScheduling

    config.option.loadscopereorder = False

    class CourseScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            if nodeid.split("::")[0] in INDEPENDENT_TESTS:
                return nodeid
            return super()._split_scope(nodeid)

    return CourseScheduling(config, log)
