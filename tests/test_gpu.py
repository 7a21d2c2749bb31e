"""helpers.gpu: CUDA builds (no GPU needed), the simulated device, recorded measurements.

The parts that run on a GPU are checked where one exists (tests marked below); on
the CI machine, which has none, they must fail with a clear NoGPUError instead.
"""

import json
import time
from collections import Counter

import pytest
import torch
import tvm
from tvm import relax

from helpers import gpu, machine, models, timing
from helpers.maintainers import gpu_record
from helpers.errors import NoGPUError

ON_GPU = machine.has_gpu()


@pytest.fixture(scope="module")
def cuda():
    return machine.cuda_target() if ON_GPU else machine.cuda_target("sm_90")


@pytest.fixture(scope="module")
def fused(tiny_imported, cuda):
    with cuda:
        return relax.get_pipeline("zero")(tiny_imported.mod)


def test_every_kernel_of_a_small_cnn_gets_a_dlight_rule(fused, cuda):
    rules = gpu.dlight_rule_per_kernel(fused, cuda)
    assert rules and "none" not in rules.values(), rules
    assert set(rules.values()) <= {r.__name__ for r in gpu.DLIGHT_RULES}
    conv = [rule for name, rule in rules.items() if "conv2d" in name]
    assert conv == ["Matmul"], f"DLight's Matmul rule takes convolutions: {rules}"
    assert Counter(rules.values())["Fallback"] >= 1


def test_cuda_source_of_a_build_without_a_gpu(tiny_imported, cuda):
    executable = tvm.compile(tiny_imported.mod, target=cuda, relax_pipeline="default")
    source = gpu.cuda_source(executable)
    assert 'extern "C" __global__' in source and "threadIdx.x" in source
    cpu_only = tvm.compile(tiny_imported.mod, target=machine.cpu_target(), relax_pipeline="default")
    with pytest.raises(gpu.CourseError, match="no CUDA code"):
        gpu.cuda_source(cpu_only)


def test_a_cuda_graph_build_records_and_replays_its_launches(tiny_imported, cuda):
    """TVM's pass-context option reaches the VM: the build calls the capture-or-replay builtin."""
    with tvm.transform.PassContext(config=gpu.CUDA_GRAPH_CONFIG):
        graphed = tvm.compile(tiny_imported.mod, target=cuda).as_text()
    plain = tvm.compile(tiny_imported.mod, target=cuda).as_text()
    assert "vm.builtin.cuda_graph.run_or_capture" in graphed
    assert "cuda_graph" not in plain


def test_the_peer_on_the_gpu_is_the_fastest_pytorch_whatever_tvm_does():
    rows = [timing.Timing(label, 1, [ms]) for label, ms in (
        (gpu.EAGER_GPU, 4.0), (gpu.COMPILE_GPU, 2.7), (gpu.COMPILE_GPU_GRAPHS, 0.9),
        (gpu.FROZEN_GPU_GRAPHS, 1.1), (gpu.TVM_GPU, 1.0), (gpu.TVM_GPU_GRAPH, 0.3))]
    assert gpu.fastest_pytorch(rows) == gpu.COMPILE_GPU_GRAPHS
    assert gpu.fastest_pytorch(rows[:2] + rows[4:]) == gpu.COMPILE_GPU  # only the modes timed count
    with pytest.raises(ValueError, match="No PyTorch"):
        gpu.fastest_pytorch(rows[4:])


def test_float32_only_turns_tf32_off_and_restores_the_learners_choice():
    saved = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    try:
        torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = True
        with gpu.float32_only():
            assert not torch.backends.cudnn.allow_tf32 and not torch.backends.cuda.matmul.allow_tf32
        assert torch.backends.cudnn.allow_tf32 and torch.backends.cuda.matmul.allow_tf32
    finally:
        torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = saved


@pytest.mark.timed
def test_simulated_gpu_returns_before_the_work_and_sync_waits_for_it():
    with gpu.SimulatedGPU(work_ms=30, first_launch_ms=50) as device:
        start = time.perf_counter()
        device.launch()
        launched = time.perf_counter() - start
        device.sync()
        done = time.perf_counter() - start
        assert launched < 0.01 <= 0.075 < done, (launched, done)  # the first launch pays its start-up too
        (synced,) = timing.measure({"synced": device.launch}, sync=device.sync, warmup=1, repeats=5)
        (unsynced,) = timing.measure({"unsynced": device.launch}, warmup=0, repeats=5)
        device.sync()
        assert device.launches == 1 + 6 + 5
    assert 28 <= synced.median_ms < 60, synced.median_ms
    assert unsynced.median_ms < 3, "without sync the clock stops at the launch"
    with pytest.raises(ValueError):
        gpu.SimulatedGPU(work_ms=-1)


def test_recorded_measurements_round_trip_with_their_machine(tmp_path):
    rows = [timing.Timing(gpu.EAGER_GPU, b, [1.0 + b, 2.0 + b, 3.0 + b]) for b in (1, 4)]
    path = gpu_record.save_recorded("tiny", rows[:1], rows, root=tmp_path)
    loaded = gpu.load_recorded(path)
    assert loaded.model == "tiny" and loaded.machine["cores"] == machine.core_count()
    assert [(t.label, t.batch, t.times_ms) for t in loaded.crossover] == [(t.label, t.batch, t.times_ms) for t in rows]
    assert loaded.gpu_backends[0].median_ms == 3.0
    assert "measured" in json.loads(path.read_text())
    with pytest.raises(FileNotFoundError, match="python -m helpers.maintainers.gpu_record"):
        gpu.load_recorded(model="no_such_model")


def test_the_shipped_recording_names_its_gpu_and_covers_the_sweep():
    files = gpu.recorded_files("mobilenet_v2")
    assert files, "the course ships recorded GPU measurements for MobileNetV2 (results/gpu/)"
    for path in files:
        rec = gpu.load_recorded(path)
        assert rec.machine["gpu"] and rec.machine["gpu_arch"].startswith("sm_") and rec.measured
        labels = {t.label for t in rec.crossover}
        assert {gpu.EAGER_CPU, gpu.EAGER_GPU, gpu.TVM_CPU, gpu.TVM_GPU} <= labels
        batches = sorted({t.batch for t in rec.crossover if t.label == gpu.EAGER_GPU})
        assert batches[0] == 1 and batches[-1] >= 64
        # every PyTorch a GPU user would pick, so that the peer is the fastest of them, and both TVM builds
        assert {t.label for t in rec.gpu_backends} == {*gpu.PYTORCH_GPU, gpu.TVM_GPU, gpu.TVM_GPU_GRAPH,
                                                       gpu.EAGER_GPU_NO_SYNC}


@pytest.mark.skipif(ON_GPU, reason="this machine has a GPU")
def test_gpu_measurements_without_a_gpu_say_so(tiny_model):
    with pytest.raises(NoGPUError, match="GPU"):
        gpu.measure_gpu_backends(tiny_model)
    with pytest.raises(NoGPUError, match="GPU"):
        gpu.crossover_builds(tiny_model, max_batch=4)
    if not torch.cuda.is_available():
        with pytest.raises(NoGPUError, match="CUDA"):
            gpu.torch_on_device(tiny_model, "cuda")


@pytest.mark.skipif(not ON_GPU, reason="needs an NVIDIA GPU")
def test_every_gpu_backend_on_a_real_gpu_matches_and_is_timed(tiny_model):
    results = gpu.measure_gpu_backends(tiny_model, repeats=3, progress=None)
    assert {t.label for t in results} == {*gpu.PYTORCH_GPU, gpu.TVM_GPU, gpu.TVM_GPU_GRAPH, gpu.EAGER_GPU_NO_SYNC}
    assert torch.backends.cudnn.allow_tf32, "float32_only gave TF32 back to cuDNN afterwards"


@pytest.mark.skipif(not ON_GPU, reason="needs an NVIDIA GPU")
def test_crossover_sweep_on_a_real_gpu():
    model = models.load_model("resnet18", pretrained=False)
    builds = gpu.crossover_builds(model, max_batch=8)
    results = gpu.measure_crossover(builds, [1, 8], repeats=3, tvm_cpu_max_batch=1, progress=None)
    got = {(t.label, t.batch) for t in results}
    assert (gpu.TVM_CPU, 1) in got and (gpu.TVM_CPU, 8) not in got
    assert {(gpu.EAGER_GPU, 8), (gpu.TVM_GPU, 8), (gpu.EAGER_CPU, 8)} <= got
