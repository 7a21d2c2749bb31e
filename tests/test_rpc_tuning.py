"""helpers.rpc_tuning on localhost: a real tracker, two real servers, MetaSchedule's RPCRunner."""

import os
import signal
import time

import psutil
import pytest
import torch
import tvm
from tvm.s_tir import meta_schedule as ms
from tvm.ir.utils import derived_object

from helpers import rpc_tuning, tuning
from helpers.errors import CourseError
from test_tuning import ConvReLU, _host_target, _import


@pytest.fixture(scope="module")
def mod():
    torch.manual_seed(0)
    return _import(ConvReLU().eval(), torch.randn(1, 3, 16, 16))[0]


def _group_alive(group: int, within_s: float) -> bool:
    """True when a process of ``group`` is still there after ``within_s`` seconds."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            os.killpg(group, 0)
        except ProcessLookupError:
            return False
        time.sleep(0.1)
    return True


def _records(work_dir):
    db = ms.database.JSONDatabase(work_dir=str(work_dir), allow_missing=False)
    return db.get_all_tuning_records()


@derived_object
class _LoseServerInSecondRound(ms.runner.PyRunner):
    """The RPC runner, with one server killed (process group and all) while it serves a second-round candidate."""

    def __init__(self, inner, server) -> None:
        super().__init__()
        self.inner, self.server = inner, server
        self.rounds, self.killed_while_busy = [], False

    def _in_session(self) -> bool:
        """TVM's server: a worker process that listens, and a process per session it serves."""
        return len(psutil.Process(self.server.pid).children(recursive=True)) > 1

    def run(self, runner_inputs):
        futures = self.inner.run(runner_inputs)
        self.rounds.append(futures)
        if len(self.rounds) == 2:
            # wait until the server forks a session for a candidate, so that it dies with one in flight
            deadline = time.monotonic() + 10
            while not self._in_session() and time.monotonic() < deadline:
                time.sleep(0.002)
            self.killed_while_busy = self._in_session()
            os.killpg(self.server.pid, signal.SIGKILL)  # the server and the session measuring on it
        return futures


def test_rpc_tuning_records_what_local_tuning_does_and_a_lost_server_costs_only_its_own_candidates(mod, tmp_path,
                                                                                                     monkeypatch):
    """One RPC search (12 trials in rounds of 4, two servers, one killed while it measures a second-round candidate):
    its records are a local search's kind (this target, traces that replay); the candidates in flight on the lost
    server fail, the others are measured; and closing the cluster ends every process it started. (Day 8's RPC cell
    runs the plain case: two servers, nothing lost.)"""
    monkeypatch.setattr(tuning.search, "MAX_TRIALS_PER_ROUND", 4)  # 12 trials in rounds of 4
    target = _host_target()
    with rpc_tuning.start_local(2, key="course-lost") as cluster:
        assert rpc_tuning.free_servers(cluster.address, "course-lost") == 2
        runner = _LoseServerInSecondRound(rpc_tuning.runner(cluster.address, "course-lost", timeout_s=10),
                                          cluster.servers[0])
        tuning.tune(mod, target, tmp_path / "lost", 12, runner=runner, progress=False)
        assert cluster.servers[0].poll() is not None, "the server was killed"
    # TVM serves from worker processes: closing the cluster must end those too
    groups = [cluster.tracker.pid, *(server.pid for server in cluster.servers)]
    assert not [g for g in groups if _group_alive(g, within_s=10)], "RPC worker processes outlived the cluster"
    # the candidate in flight on the lost server fails, or TVM's tracker client retries it elsewhere
    failed = [sum(f.result().error_msg is not None for f in futures) for futures in runner.rounds]
    print(f"failed per round: {failed}; killed while busy: {runner.killed_while_busy}")
    assert runner.killed_while_busy, "the server was lost while it served a candidate"
    assert len(failed) >= 3, f"rounds before, during and after the loss: {failed}"
    assert failed[0] == 0 and not any(failed[2:]), f"failures outside the round of the loss: {failed}"
    assert failed[1] < len(runner.rounds[1]), "the surviving server measured part of the round of the loss"
    records = _records(tmp_path / "lost")
    assert len(records) == sum(map(len, runner.rounds)), "every candidate, measured or not, is recorded"
    assert sum(tuning.succeeded(r) for r in records) == len(records) - sum(failed)
    for record in (r for r in records if tuning.succeeded(r)):
        assert str(record.target) == str(target)
        sch = tvm.s_tir.Schedule(record.workload.mod)
        record.trace.apply_to_schedule(sch, remove_postproc=False)  # a trace that replays


def test_no_server_under_key_says_what_to_run():
    with rpc_tuning.start_local(0, key="none") as cluster:
        with pytest.raises(CourseError, match="rpc_tuning server"):
            rpc_tuning.runner(cluster.address, "nobody")
    with pytest.raises(CourseError, match="no RPC tracker answers"):
        rpc_tuning.free_servers(f"127.0.0.1:{rpc_tuning.free_port()}", "x")
