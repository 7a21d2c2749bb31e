"""helpers.rpc_tuning on localhost: a real tracker, two real servers, MetaSchedule's RPCRunner."""

import threading

import pytest
import torch
from tvm.s_tir import meta_schedule as ms

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


def test_rpc_tuning_gives_local_kind_of_records_and_survives_a_lost_server(mod, tmp_path):
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
        # a server lost mid-tuning: kill one as soon as measuring starts
        killer = threading.Timer(2.0, cluster.servers[0].kill)
        killer.start()
        rpc_tuning.tune(mod, target, tmp_path / "lost", 8, cluster.address, "course-test", progress=False)
        killer.join()
        lost = _records(tmp_path / "lost")
        ok = [r for r in lost if tuning._succeeded(r)]
        assert ok, "the surviving server measured its candidates"
        assert cluster.servers[0].poll() is not None


def test_no_server_under_key_says_what_to_run():
    with rpc_tuning.start_local(0, key="none") as cluster:
        with pytest.raises(CourseError, match="rpc_tuning server"):
            rpc_tuning.runner(cluster.address, "nobody")
    with pytest.raises(CourseError, match="no RPC tracker answers"):
        rpc_tuning.free_servers(f"127.0.0.1:{rpc_tuning.free_port()}", "x")
