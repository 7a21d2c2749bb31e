"""The hub's spawner: the limits it promises are set by the kernel on a real child process.

The user switch (LocalProcessSpawner's setuid to the learner's account) is replaced by nothing: the
test runs as one user. Everything the course adds before it runs as written."""

import multiprocessing
import os
import resource

import pytest

pytest.importorskip("jupyterhub")

from jupyterhub.spawner import LocalProcessSpawner  # noqa: E402

from helpers.instructor import hub_spawner  # noqa: E402


@pytest.fixture
def spawner_class(monkeypatch):
    monkeypatch.setattr(LocalProcessSpawner, "make_preexec_fn", lambda self, name: (lambda: None))
    monkeypatch.setattr(hub_spawner.CourseSpawner, "_placed", 0)
    return hub_spawner.CourseSpawner


def _limits_in_a_child(preexec) -> tuple:
    """(RLIMIT_AS, RLIMIT_NPROC, CPU affinity) of a forked process after ``preexec``, as a learner's server gets them."""
    context = multiprocessing.get_context("fork")
    queue = context.Queue()

    def child():
        preexec()
        queue.put((resource.getrlimit(resource.RLIMIT_AS), resource.getrlimit(resource.RLIMIT_NPROC),
                   sorted(os.sched_getaffinity(0))))

    process = context.Process(target=child)
    process.start()
    got = queue.get(timeout=30)
    process.join(timeout=30)
    return got


def test_a_learners_server_gets_its_memory_processes_and_cores(spawner_class, monkeypatch):
    monkeypatch.setenv("TVM_HUB_NPROC", "300")
    cores = sorted(os.sched_getaffinity(0))
    # an address-space limit above what this process (torch and TVM loaded) already maps
    first = spawner_class(mem_limit="64G", cpu_limit=1)
    memory, processes, affinity = _limits_in_a_child(first.make_preexec_fn("learner1"))
    assert memory == (64 * 2**30, 64 * 2**30)
    assert processes == (300, 300)
    assert affinity == cores[:1], "the first learner is placed on the first core"
    second = spawner_class(mem_limit="64G", cpu_limit=1)
    _, _, affinity = _limits_in_a_child(second.make_preexec_fn("learner2"))
    assert affinity == [cores[1 % len(cores)]], "learners are placed round-robin across the cores"


def test_cores_are_placed_round_robin_and_never_more_than_the_machine_has():
    cores = sorted(os.sched_getaffinity(0))
    assert hub_spawner._cores_for(0, len(cores) + 5) == set(cores)
    assert hub_spawner._cores_for(0, 0) == {cores[0]}, "at least one core"
    placed = [hub_spawner._cores_for(i, 1) for i in range(2 * len(cores))]
    assert [next(iter(c)) for c in placed] == cores + cores
