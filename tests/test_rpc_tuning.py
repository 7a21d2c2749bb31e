"""helpers.rpc_tuning on localhost: a real tracker, two real servers, MetaSchedule's RPCRunner."""

import os
import signal
import time

import pytest
import torch
from tvm.s_tir import meta_schedule as ms
from tvm.ir.utils import derived_object

from helpers import rpc_tuning, tuning
from helpers.errors import CourseError
from test_tuning import ConvReLU, _host_target, _import


@pytest.fixture(scope="module")
def mod():
    torch.manual_seed(0)
    return _import(ConvReLU().eval(), torch.randn(1, 3, 16, 16))[0]


def _records(work_dir):
    db = ms.database.JSONDatabase(work_dir=str(work_dir), allow_missing=False)
    return db.get_all_tuning_records()


def test_rpc_tuning_gives_records_of_the_kind_local_tuning_gives(mod, tmp_path):
    target = _host_target()
    with rpc_tuning.start_local(2, key="course-test") as cluster:
        assert rpc_tuning.free_servers(cluster.address, "course-test") == 2
        work = rpc_tuning.tune(mod, target, tmp_path / "rpc", 4, cluster.address, "course-test", progress=False)
        records = _records(work)
        assert records and all(tuning._succeeded(r) for r in records), "every candidate measured on a server"
        for record in records:
            assert str(record.target) == str(target)
            sch = __import__("tvm").s_tir.Schedule(record.workload.mod)
            record.trace.apply_to_schedule(sch, remove_postproc=False)  # a trace that replays


@derived_object
class _LoseServerInSecondRound(ms.runner.PyRunner):
    """The RPC runner, with one server killed as soon as the second round's candidates are sent out."""

    def __init__(self, inner, server, tracker: str, key: str) -> None:
        super().__init__()
        self.inner, self.server, self.tracker, self.key = inner, server, tracker, key
        self.rounds, self.killed_while_busy = [], False

    def run(self, runner_inputs):
        futures = self.inner.run(runner_inputs)
        self.rounds.append(futures)
        if len(self.rounds) == 2:
            # wait until both servers hold a candidate, so that the killed one loses one in flight
            deadline = time.monotonic() + 10
            while rpc_tuning.free_servers(self.tracker, self.key) > 0 and time.monotonic() < deadline:
                time.sleep(0.005)
            self.killed_while_busy = rpc_tuning.free_servers(self.tracker, self.key) == 0
            os.killpg(self.server.pid, signal.SIGKILL)  # the server and the session measuring on it
        return futures


def test_a_server_lost_mid_tuning_costs_only_its_own_candidates(mod, tmp_path, monkeypatch):
    monkeypatch.setattr(tuning, "MAX_TRIALS_PER_ROUND", 4)  # 12 trials in rounds of 4
    target = _host_target()
    with rpc_tuning.start_local(2, key="course-lost") as cluster:
        runner = _LoseServerInSecondRound(rpc_tuning.runner(cluster.address, "course-lost", timeout_s=10),
                                          cluster.servers[0], cluster.address, "course-lost")
        tuning.tune(mod, target, tmp_path / "lost", 12, runner=runner, progress=False)
        assert cluster.servers[0].poll() is not None, "the server was killed"
    failed = [sum(f.result().error_msg is not None for f in futures) for futures in runner.rounds]
    print(f"failed per round: {failed}; killed while busy: {runner.killed_while_busy}")
    assert len(failed) >= 3, f"rounds before, during and after the loss: {failed}"
    assert failed[0] == 0 and not any(failed[2:]), f"failures outside the round of the loss: {failed}"
    assert failed[1] < len(runner.rounds[1]), "the surviving server measured part of the round of the loss"
    assert failed[1] >= 1 or not runner.killed_while_busy, "the candidate on the killed server is a failed record"
    records = _records(tmp_path / "lost")
    assert len(records) == sum(map(len, runner.rounds)), "every candidate, measured or not, is recorded"
    assert sum(tuning._succeeded(r) for r in records) == len(records) - sum(failed)


def test_no_server_under_key_says_what_to_run():
    with rpc_tuning.start_local(0, key="none") as cluster:
        with pytest.raises(CourseError, match="rpc_tuning server"):
            rpc_tuning.runner(cluster.address, "nobody")
    with pytest.raises(CourseError, match="no RPC tracker answers"):
        rpc_tuning.free_servers(f"127.0.0.1:{rpc_tuning.free_port()}", "x")
