"""`make test`: the whole suite in quick mode, in two phases, so that it fits a 2-core machine.

Most of the suite times nothing: it compiles, executes notebooks and grades them, one core at a
time. Those tests run first on ``TEST_WORKERS`` pytest-xdist workers (2 unless set), each held to
one thread (PyTorch and TVM) so that the workers share the cores instead of fighting over them.
The tests marked ``timed`` (tests/conftest.py) grade or assert measured speed: they run second,
alone, with every core, as a learner's notebook would.

Arguments are passed to both phases (e.g. ``make test PYTEST_ARGS="-k day03"``). The exit status
is the first failing phase's; a phase that selects no test is not a failure unless both do.
"""

import os
import subprocess
import sys

NO_TESTS_COLLECTED = 5  # pytest's exit status


def phases(workers: str) -> list[tuple[list[str], dict[str, str]]]:
    one_thread = {"OMP_NUM_THREADS": "1", "TVM_NUM_THREADS": "1"}
    return [
        (["-n", workers, "-m", "not timed"], one_thread),
        (["-m", "timed"], {}),
    ]


def main(args: list[str]) -> int:
    env = {**os.environ, "TVM_COURSE_QUICK": "1"}
    codes = []
    for options, extra_env in phases(os.environ.get("TEST_WORKERS", "2")):
        print(f"\n=== pytest {' '.join(options)}", flush=True)
        codes.append(subprocess.call([sys.executable, "-m", "pytest", *options, *args], env={**env, **extra_env}))
    ran = [code for code in codes if code != NO_TESTS_COLLECTED]
    if not ran:
        return NO_TESTS_COLLECTED
    return next((code for code in ran if code != 0), 0)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
