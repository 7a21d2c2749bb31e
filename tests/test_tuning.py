"""helpers.tuning against real MetaSchedule: one tiny tuning run, shared by the tests.

The run tunes a 3->8 channel conv + ReLU on a 16x16 image with 2 trials per
task: enough for real records, in 10 to 20 s on two cores.
"""

import contextlib
import io
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
import tvm
from tvm import relax
from tvm.relax.frontend.torch import from_exported_program
from tvm.s_tir import meta_schedule as ms

from helpers import config, tuning
from helpers.errors import CourseError, TuningDatabaseError
from helpers.models import ImportedModel

TRIALS_PER_TASK = 2


class ConvReLU(torch.nn.Module):
    def __init__(self, channels: int = 8):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, channels, 3, padding=1, bias=False)  # no bias: one task

    def forward(self, x):
        return torch.relu(self.conv(x))


def _import(model: torch.nn.Module, x: torch.Tensor):
    program = torch.export.export(model, (x,))
    mod = from_exported_program(program, keep_params_as_input=True)
    mod, params = relax.frontend.detach_params(mod)
    return mod, list(params["main"])


def _host_target(mcpu: str | None = None) -> tvm.target.Target:
    cpu = mcpu or str(tvm.target.codegen.llvm_get_system_cpu())
    return tvm.target.Target({"kind": "llvm", "mcpu": cpu, "num-cores": 2})


def _other_cpu() -> str:
    """An x86-64 CPU name that is not this machine's."""
    host = str(tvm.target.codegen.llvm_get_system_cpu())
    return "skylake-avx512" if host != "skylake-avx512" else "znver5"


def _run(executable, x: torch.Tensor, params: list) -> np.ndarray:
    dev = tvm.cpu(0)
    vm = relax.VirtualMachine(executable, dev)
    weights = [tvm.runtime.tensor(p.numpy(), dev) for p in params]
    out = vm["main"](tvm.runtime.tensor(x.numpy(), dev), *weights)
    while not hasattr(out, "numpy"):  # the torch importer returns a tuple of outputs
        out = out[0]
    return out.numpy()


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return ConvReLU().eval()


@pytest.fixture(scope="module")
def example():
    return torch.randn(1, 3, 16, 16, generator=torch.Generator().manual_seed(1))


@pytest.fixture(scope="module")
def imported(model, example):
    return _import(model, example)


@pytest.fixture(scope="module")
def target():
    return _host_target()


@pytest.fixture(scope="module")
def tuned(imported, target, tmp_path_factory):
    """Tune once; keep the directory and what a notebook cell would have shown."""
    mod, _ = imported
    work_dir = tmp_path_factory.mktemp("tuned")
    shown = io.StringIO()
    with contextlib.redirect_stdout(shown):
        returned = tuning.tune(mod, target, work_dir, max_trials_per_task=TRIALS_PER_TASK)
    return {"dir": work_dir, "returned": returned, "shown": shown.getvalue()}


def test_tune_writes_a_database_of_measured_records_for_the_target(tuned, target):
    work_dir = tuned["dir"]
    assert tuned["returned"] == work_dir
    assert (work_dir / tuning.WORKLOAD_FILE).stat().st_size > 0
    assert (work_dir / tuning.RECORD_FILE).stat().st_size > 0
    assert list((work_dir / tuning.LOG_DIR).glob("*.log")), "MetaSchedule's logs belong in work_dir/logs"

    summary = tuning.database_summary(work_dir)
    assert summary["workloads"] >= 1
    assert 1 <= summary["records"] <= TRIALS_PER_TASK * summary["workloads"]
    assert summary["targets"] == [str(target)]
    assert summary["mcpus"] == [str(target.attrs["mcpu"])]
    conv = [k for k in summary["kernels"] if "conv2d" in k["kernel"]]
    assert len(conv) == 1 and conv[0]["best_us"] > 0


def test_tune_shows_a_progress_bar_instead_of_metaschedule_logs(tuned):
    shown = tuned["shown"]
    finished = re.findall(r"(\d+)/(\d+) \[", shown)
    assert finished, f"no progress bar in the output: {shown[:300]!r}"
    done, total = map(int, finished[-1])
    assert done == total == tuning.database_summary(tuned["dir"])["records"]
    assert "task_scheduler.cc" not in shown and "[INFO]" not in shown


def _doubling_kernel() -> tvm.IRModule:
    a = tvm.te.placeholder((64,), name="a")
    b = tvm.te.compute((64,), lambda i: a[i] * 2.0, name="b")
    return tvm.IRModule({"main": tvm.te.create_prim_func([a, b])})


def test_in_process_builder_builds_in_this_process_quickly(target):
    mod = _doubling_kernel()
    start = time.perf_counter()
    results = tuning.InProcessBuilder().build([ms.builder.BuilderInput(mod, target)])
    elapsed = time.perf_counter() - start
    assert results[0].error_msg is None and results[0].artifact_path
    assert elapsed < 10, f"an in-process build took {elapsed:.1f} s"
    shutil.rmtree(str(results[0].artifact_path).rsplit("/", 1)[0], ignore_errors=True)


def _thread_bound_kernel() -> tvm.IRModule:
    """A kernel bound to GPU threads, which the CPU's code generator refuses."""
    sch = tvm.s_tir.Schedule(_doubling_kernel())
    sch.bind(sch.get_loops(sch.get_sblock("b"))[0], "threadIdx.x")
    return sch.mod


@pytest.mark.parametrize("timeout_s", [tuning.BUILD_TIMEOUT_S, None], ids=["in a fork", "here"])
def test_a_candidate_that_fails_to_build_is_a_failed_candidate_with_its_reason(target, timeout_s):
    results = tuning.InProcessBuilder(timeout_s=timeout_s).build([ms.builder.BuilderInput(_thread_bound_kernel(), target)])
    assert results[0].artifact_path is None
    assert results[0].error_msg.startswith("InProcessBuilder: ") and "Error" in results[0].error_msg


def test_a_build_that_runs_past_its_time_limit_is_stopped_and_fails(target):
    start = time.perf_counter()
    results = tuning.InProcessBuilder(timeout_s=1e-4).build([ms.builder.BuilderInput(_doubling_kernel(), target)])
    assert results[0].artifact_path is None
    assert "took over 0.0001 s and was stopped" in results[0].error_msg
    assert time.perf_counter() - start < 10
    assert not _zombie_children(), "the stopped build was left behind, not waited for"


def _zombie_children() -> list[str]:
    """This process's children that exited and were never waited for (Linux's /proc)."""
    zombies = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            state, parent = stat.read_text().rsplit(")", 1)[1].split()[:2]
        except (OSError, IndexError):  # gone meanwhile
            continue
        if parent == str(os.getpid()) and state == "Z":
            zombies.append(stat.parent.name)
    return zombies


def test_tuned_build_matches_the_untuned_build_and_uses_the_database(imported, model, example, target, tuned):
    mod, params = imported
    applied = tuning.apply_database(mod, target, tuned["dir"])
    scheduled = {
        gv.name_hint: bool(f.attrs.get("tirx.is_scheduled", False))
        for gv, f in applied.functions_items()
        if isinstance(f, tvm.tirx.PrimFunc)
    }
    conv = [name for name in scheduled if "conv2d" in name]
    assert conv and all(scheduled[name] for name in conv), scheduled

    tuned_out = _run(tuning.build_tuned(mod, target, tuned["dir"]), example, params)
    untuned_out = _run(tvm.compile(mod, target=target, relax_pipeline="default"), example, params)
    np.testing.assert_allclose(tuned_out, untuned_out, rtol=1e-5, atol=1e-5)
    with torch.no_grad():
        np.testing.assert_allclose(tuned_out, model(example).numpy(), rtol=1e-4, atol=1e-4)


def test_a_database_tuned_for_another_cpu_is_refused_unless_transferred(imported, model, example, target, tuned, tmp_path, retarget):
    mod, _ = imported
    other = _host_target(_other_cpu())
    foreign = tmp_path / "foreign"
    retarget(tuned["dir"], foreign, other)
    assert tuning.database_summary(foreign)["mcpus"] == [_other_cpu()]

    with pytest.raises(TuningDatabaseError, match="no records for your target") as err:
        tuning.apply_database(mod, target, foreign)
    message = str(err.value)
    assert "mcpu" in message and _other_cpu() in message and str(target.attrs["mcpu"]) in message
    assert "tune" in message and "transfer=True" in message  # says what to do
    # The same database is fine for the CPU it was tuned for.
    assert isinstance(tuning.apply_database(mod, other, foreign), tvm.IRModule)
    # Transferred knowingly: the traces replay for this CPU and compute the same thing.
    _, params = imported
    out = _run(tuning.build_tuned(mod, target, foreign, transfer=True), example, params)
    with torch.no_grad():
        np.testing.assert_allclose(out, model(example).numpy(), rtol=1e-4, atol=1e-4)


def test_tune_records_its_budget_and_adds_to_it(tuned, tmp_path):
    assert tuning.budget(tuned["dir"]) == TRIALS_PER_TASK
    assert tuning.tuned_in_quick_mode(tuned["dir"]) == config.quick()
    assert tuning.budget(tmp_path) is None  # a database that never said


def test_seeding_measures_another_cpus_schedules_here_and_counts_their_budget(imported, target, tuned, tmp_path, retarget):
    mod, _ = imported
    foreign = tmp_path / "foreign"
    retarget(tuned["dir"], foreign, _host_target(_other_cpu()))
    replayed, failed = tuning.seed_with(foreign, tmp_path / "seeded", target, progress=False)
    summary = tuning.database_summary(tmp_path / "seeded")
    assert (replayed, failed) == (tuning.database_summary(foreign)["workloads"], 0)
    assert summary["targets"] == [str(target)] and summary["records"] == replayed  # measured here, for this target
    with contextlib.redirect_stdout(io.StringIO()):
        tuning.tune(mod, target, tmp_path / "topped-up", max_trials_per_task=1, seed_from=foreign)
    settings = json.loads((tmp_path / "topped-up" / tuning.SETTINGS_FILE).read_text())
    assert settings["seeded_from"]["database"] == "foreign" and settings["seeded_from"]["replayed"] == replayed
    assert tuning.budget(tmp_path / "topped-up") == 1 + TRIALS_PER_TASK
    with pytest.raises(CourseError, match="another database"):
        tuning.tune(mod, target, foreign, max_trials_per_task=1, seed_from=foreign)


def test_a_database_for_another_model_says_how_many_kernels_matched(target, tuned):
    torch.manual_seed(0)
    x = torch.randn(1, 3, 20, 20)
    other_mod, _ = _import(ConvReLU(channels=4).eval(), x)
    with pytest.raises(TuningDatabaseError, match=r"0 of this module's \d+ kernels"):
        tuning.apply_database(other_mod, target, tuned["dir"])


def test_missing_directory_is_a_clear_course_error(imported, target, tmp_path):
    mod, _ = imported
    with pytest.raises(TuningDatabaseError, match="No tuning directory") as err:
        tuning.apply_database(mod, target, tmp_path / "never-tuned")
    assert isinstance(err.value, CourseError)
    with pytest.raises(TuningDatabaseError, match="No tuning directory"):
        tuning.database_summary(tmp_path / "never-tuned")


def test_a_database_missing_one_file_names_that_file(imported, target, tuned, tmp_path):
    mod, _ = imported
    half = tmp_path / "half"
    half.mkdir()
    shutil.copy(tuned["dir"] / tuning.WORKLOAD_FILE, half)
    with pytest.raises(TuningDatabaseError, match=tuning.RECORD_FILE + " is missing"):
        tuning.apply_database(mod, target, half)


@pytest.fixture(scope="module")
def tuned_prepacked(imported, target, tmp_path_factory):
    mod, _ = imported
    work_dir = tmp_path_factory.mktemp("prepacked")
    with contextlib.redirect_stdout(io.StringIO()):
        tuning.tune(mod, target, work_dir, max_trials_per_task=TRIALS_PER_TASK, prepack=True)
    return work_dir


def test_prepacked_tuning_lifts_the_weight_layout_into_transform_params(imported, model, example, target, tuned_prepacked):
    mod, params = imported
    assert json.loads((tuned_prepacked / tuning.SETTINGS_FILE).read_text())["prepack"] is True
    applied = tuning.apply_database(mod, target, tuned_prepacked)  # prepack taken from the settings file
    assert "main_transform_params" in {gv.name_hint for gv in applied.functions}
    compiled = tuning.compile_tuned(ImportedModel(mod, params, tuple(example.shape), "float32"), target, tuned_prepacked)
    # the weights the model runs with are main_transform_params' output (the layout the schedule chose,
    # which may or may not differ from PyTorch's for this tiny kernel), not the imported ones
    packed = compiled.vm["main_transform_params"]([tvm.runtime.tensor(p.numpy()) for p in params])
    assert [tuple(p.shape) for p in compiled.params] == [tuple(p.shape) for p in packed]
    for ours, theirs in zip(compiled.params, packed):
        np.testing.assert_array_equal(ours.numpy(), theirs.numpy())
    with torch.no_grad():
        np.testing.assert_allclose(compiled(example), model(example).numpy(), rtol=1e-4, atol=1e-4)


def test_prepacked_and_plain_databases_do_not_mix(imported, target, tuned, tuned_prepacked):
    mod, _ = imported
    with pytest.raises(TuningDatabaseError, match="prepack=True"):
        tuning.apply_database(mod, target, tuned_prepacked, prepack=False)
    with pytest.raises(TuningDatabaseError, match="tuned with prepack=True"):
        tuning.tune(mod, target, tuned_prepacked, max_trials_per_task=1, prepack=False)


def test_task_table_weights_repeated_kernels(target):
    class Twice(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a = torch.nn.Conv2d(8, 8, 1, bias=False)
            self.b = torch.nn.Conv2d(8, 8, 1, bias=False)

        def forward(self, x):
            return torch.relu(self.b(torch.relu(self.a(x))))  # the same kernel twice

    torch.manual_seed(0)
    mod, _ = _import(Twice().eval(), torch.randn(1, 8, 10, 10))
    rows = tuning.task_table(mod, target)
    conv = [r for r in rows if "conv2d" in r["task"]]
    assert len(conv) == 1 and conv[0]["calls"] == 2, rows  # one task, called twice
    assert all(r["mflop"] > 0 and r["mflop_total"] == pytest.approx(r["mflop"] * r["calls"]) for r in rows)
    assert [r["mflop_total"] for r in rows] == sorted((r["mflop_total"] for r in rows), reverse=True)


def test_compile_tuned_reuses_its_build_until_the_database_changes(imported, model, example, target, tuned, tmp_path, monkeypatch):
    from helpers import cache

    monkeypatch.setattr(cache, "CACHE_ROOT", tmp_path / "cache")
    builds = []
    build_tuned = tuning.build_tuned
    monkeypatch.setattr(tuning.apply, "build_tuned", lambda *args, **kw: builds.append(args) or build_tuned(*args, **kw))
    mod, params = imported
    model_in = ImportedModel(mod, params, tuple(example.shape), "float32")
    first = tuning.compile_tuned(model_in, target, tuned["dir"])
    second = tuning.compile_tuned(model_in, target, tuned["dir"])
    assert len(builds) == 1, "the second build should come from the cache"
    assert first.library == second.library and first.library.is_file(), "both run the cached library"
    np.testing.assert_array_equal(first(example), second(example))
    # a database with other records (here: one fewer) has another key, so it gets a fresh build
    changed = tmp_path / "changed"
    shutil.copytree(tuned["dir"], changed)
    lines = (changed / tuning.RECORD_FILE).read_text().splitlines(keepends=True)
    (changed / tuning.RECORD_FILE).write_text("".join(lines[:-1]))
    tuning.compile_tuned(model_in, target, changed)
    assert len(builds) == 2, "a changed database must be built again, not served from the cache"


def test_a_damaged_database_file_is_a_clear_error_not_a_crash(imported, target, tuned, tmp_path):
    mod, _ = imported
    damaged = tmp_path / "damaged"
    shutil.copytree(tuned["dir"], damaged)
    with open(damaged / tuning.RECORD_FILE, "a") as records:
        records.write("\n[1, {\"trace\"")  # a blank line (MetaSchedule's reader segfaults on it) and a cut-off record
    with pytest.raises(TuningDatabaseError, match=f"line \\d+ of {tuning.RECORD_FILE}"):
        tuning.apply_database(mod, target, damaged)
    with pytest.raises(TuningDatabaseError, match=f"line \\d+ of {tuning.RECORD_FILE}"):
        tuning.database_targets(damaged)  # what databases.candidates reads: the same refusal
    (damaged / tuning.RECORD_FILE).write_text('[0, [[], [0.1], "not a target"]]\n')
    with pytest.raises(TuningDatabaseError, match="not MetaSchedule's"):
        tuning.database_targets(damaged)


def test_reading_records_imports_tvms_tensor_intrinsics_only_when_they_name_one(tmp_path):
    """TVM's set costs seconds per process to import; a float32 database names none, and one that
    names TVM's VNNI intrinsic must find it registered (checked in a fresh process: this one has it)."""
    plain, tensorized = tmp_path / "plain.json", tmp_path / "tensorized.json"
    plain.write_text('[0,[[[["GetSBlock",[],["root","main"],["b0"]]]]]]\n')
    tensorized.write_text('[0,[[[["Tensorize",["b1"],["dot_16x4_vnni",true],[]]]]]]\n')
    script = (
        "import sys\n"
        "from helpers import int8, tuning\n"
        "from tvm.s_tir import TensorIntrin\n"
        f"tuning.import_tensor_intrinsics({str(plain)!r})\n"
        "TensorIntrin.get(int8.VNNI_INTRIN)\n"
        "print('tvm set after plain:', 'tvm.s_tir.tensor_intrin' in sys.modules)\n"
        f"tuning.import_tensor_intrinsics({str(tensorized)!r})\n"
        "TensorIntrin.get('dot_16x4_vnni')\n"
        "print('tvm set after tensorized:', 'tvm.s_tir.tensor_intrin' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True).stdout
    assert "tvm set after plain: False" in out and "tvm set after tensorized: True" in out, out
