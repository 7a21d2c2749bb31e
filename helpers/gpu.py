"""The GPU side of the course: CUDA builds, honest GPU timing, recorded measurements.

A GPU call returns as soon as its work is *queued*, and its input has to travel
from host memory first; both change what "latency" means. This module builds
models for CUDA (TVM's default GPU pipeline: fusion, then DLight's schedules),
times CPU and GPU backends side by side with a device sync after every call,
and keeps the measurements, with the machine they came from, in
``results/gpu/`` so that Day 9 runs (from recorded data) on a machine without
a GPU.

    python -m helpers.maintainers.gpu_record   # on a machine with an NVIDIA GPU: measure and save

Introduced on Day 9.
"""

from __future__ import annotations

import contextlib
import copy
import json
import queue
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
import tvm
from tvm.s_tir import dlight as dl

from . import dynamic, machine, models, peers, timing
from .build import CompiledModel, check_parity, compile_model, relative_error
from .config import REPO, pick  # noqa: F401  (Day 9 names a recording by its path in the repository (gpu.REPO))
from .errors import CourseError, NoGPUError
from .results import RESULTS_ROOT

RECORDED_ROOT = RESULTS_ROOT / "gpu"

# The labels of every GPU measurement the course records and plots.
EAGER_CPU = "PyTorch eager (CPU)"
TVM_CPU = "TVM untuned (CPU)"
EAGER_GPU = "PyTorch eager (GPU)"
TVM_GPU = "TVM DLight (GPU)"
EAGER_GPU_NO_SYNC = "PyTorch eager (GPU), no sync"
EAGER_GPU_RESIDENT = "PyTorch eager (GPU, input already there)"
COMPILE_GPU = "torch.compile (GPU)"
COMPILE_GPU_GRAPHS = "torch.compile + CUDA graphs (GPU)"
FROZEN_GPU_GRAPHS = "torch.compile, freezing + CUDA graphs (GPU)"
TVM_GPU_GRAPH = "TVM DLight + CUDA graph (GPU)"
# PyTorch's ways to run a model on the GPU, from the default to what PyTorch recommends for inference
# (BatchNorm folded, every launch of a call recorded once as a CUDA graph and replayed with one launch).
PYTORCH_GPU = (EAGER_GPU, COMPILE_GPU, COMPILE_GPU_GRAPHS, FROZEN_GPU_GRAPHS)
# TVM's pass-context option that records the VM's kernel launches as a CUDA graph on the first call.
CUDA_GRAPH_CONFIG = {"relax.backend.use_cuda_graph": True}

# DLight's GPU rules in the order TVM's default CUDA pipeline tries them.
DLIGHT_RULES = (dl.gpu.Matmul, dl.gpu.GEMV, dl.gpu.Reduction, dl.gpu.GeneralReduction, dl.gpu.Fallback)


# ------------------------------------------------------------------ building


def dlight_rule_per_kernel(mod: tvm.IRModule, target: tvm.target.Target) -> dict[str, str]:
    """Which DLight rule schedules each kernel of a fused module (the first that applies, as TVM does).

    ``mod`` is a legalized and fused module (``relax.get_pipeline("zero")``);
    kernels no rule takes are listed as ``"none"`` (they would fail to build for a GPU).
    """
    chosen = {}
    with target:
        for gvar, func in mod.functions_items():
            if not isinstance(func, tvm.tirx.PrimFunc):
                continue
            rule_name = "none"
            for rule in DLIGHT_RULES:
                if rule().apply(func, target, False) is not None:
                    rule_name = rule.__name__
                    break
            chosen[gvar.name_hint] = rule_name
    return chosen


def find_module(mod: tvm.runtime.Module, kind: str) -> tvm.runtime.Module | None:
    """The runtime module of ``kind`` (``"cuda"``, ``"llvm"``) among ``mod`` and the modules it imports."""
    if mod.kind == kind:
        return mod
    for imported in mod.imports:
        found = find_module(imported, kind)
        if found is not None:
            return found
    return None


def cuda_source(executable: tvm.runtime.Executable) -> str:
    """The CUDA C++ TVM generated for an executable built for a CUDA target."""
    module = find_module(executable.mod, "cuda")
    if module is None:
        raise CourseError("This executable holds no CUDA code: was it built for a CUDA target?")
    return module.inspect_source()


# ------------------------------------------------------------------ timing


class SimulatedGPU:
    """An asynchronous device in miniature, for learning to time one on any machine.

    ``launch()`` queues ``work_ms`` of work and returns at once, as a CUDA kernel
    launch does; a worker thread does the work in order; ``sync()`` waits until
    the queue is empty, as ``torch.cuda.synchronize()`` does. ``launches`` counts
    the calls. Use it as a context manager, or call ``close()``, to stop the worker.
    """

    def __init__(self, work_ms: float, first_launch_ms: float = 0.0) -> None:
        if work_ms < 0 or first_launch_ms < 0:
            raise ValueError("work_ms and first_launch_ms must be 0 or more.")
        self.work_ms = work_ms
        self.first_launch_ms = first_launch_ms  # one-time start-up cost (a context, a JIT compile)
        self.launches = 0
        self._queue: queue.Queue[float | None] = queue.Queue()
        self._worker = threading.Thread(target=self._work, daemon=True)
        self._worker.start()

    def _work(self) -> None:
        while (seconds := self._queue.get()) is not None:
            time.sleep(seconds)
            self._queue.task_done()
        self._queue.task_done()

    def launch(self) -> None:
        """Queue one unit of work and return immediately."""
        extra = self.first_launch_ms if self.launches == 0 else 0.0
        self.launches += 1
        self._queue.put((self.work_ms + extra) / 1000.0)

    def sync(self) -> None:
        """Wait until every queued unit of work is done."""
        self._queue.join()

    def close(self) -> None:
        self._queue.put(None)
        self._worker.join()

    def __enter__(self) -> "SimulatedGPU":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def torch_on_device(model: torch.nn.Module, device: str) -> torch.nn.Module:
    """A copy of the model on ``device`` (the CPU model stays where it is)."""
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise NoGPUError("PyTorch sees no CUDA device here: a GPU run needs an NVIDIA GPU and a CUDA build of torch.")
    return copy.deepcopy(model).to(device).eval()


def torch_host_runner(model: torch.nn.Module, x: torch.Tensor, device: str) -> Callable[[], torch.Tensor]:
    """Host to host: copy the input to ``device``, run, copy the output back (``.cpu()`` waits for the GPU).

    This is what a server holding images in host memory pays, and what a CPU
    backend is fairly compared with.
    """

    def run():
        with torch.inference_mode():
            return model(x.to(device)).cpu()

    return run


def torch_resident_runner(model: torch.nn.Module, x: torch.Tensor, device: str) -> Callable[[], torch.Tensor]:
    """The input already on ``device``; the call does not wait (time it with ``sync``)."""
    on_device = x.to(device)

    def run():
        with torch.inference_mode():
            return model(on_device)

    return run


def tvm_host_runner(compiled: CompiledModel, x: torch.Tensor) -> Callable[[], object]:
    """Host to host for a TVM build: copy in, run, copy the output back to host memory."""
    return lambda: compiled(x)


def cuda_sync() -> None:
    """Wait for every queued GPU operation (a no-op without a GPU)."""
    if torch.cuda.is_available():
        torch.cuda.synchronize()


@dataclass
class CrossoverBuilds:
    """The four builds of one model a CPU/GPU sweep compares."""

    model_cpu: torch.nn.Module
    model_gpu: torch.nn.Module
    tvm_cpu: dynamic.DynamicBatchModel
    tvm_gpu: dynamic.DynamicBatchModel


def crossover_builds(model: torch.nn.Module, max_batch: int) -> CrossoverBuilds:
    """PyTorch on CPU and GPU, and TVM (one dynamic-batch build each) on CPU and GPU, checked against PyTorch."""
    machine.require_gpu("a CPU/GPU sweep")
    example = models.example_input(2)
    imported = dynamic.import_dynamic_batch(model, example, max_batch=max_batch)
    tvm_cpu = dynamic.compile_dynamic(imported, machine.cpu_target())
    tvm_gpu = dynamic.compile_dynamic(imported, machine.cuda_target())
    for build in (tvm_cpu, tvm_gpu):
        check_parity(build, model, example)
    return CrossoverBuilds(model, torch_on_device(model, "cuda"), tvm_cpu, tvm_gpu)


def measure_crossover(
    builds: CrossoverBuilds,
    batches: Sequence[int],
    repeats: int | None = None,
    tvm_cpu_max_batch: int = 16,
    progress: Callable[[str], None] | None = print,
) -> list[timing.Timing]:
    """CPU and GPU, PyTorch and TVM, host to host, interleaved at each batch size.

    One more GPU row has its input already on the GPU: the difference to the
    host-to-host row is what the copies cost. PyTorch is held to float32, as TVM is.

    Untuned TVM on the CPU runs on one core and takes seconds per call at large
    batches, so it is measured only up to ``tvm_cpu_max_batch``.
    """
    repeats = repeats or pick(10, 3)
    results: list[timing.Timing] = []
    for batch in batches:
        x = models.example_input(batch)
        backends = {
            EAGER_CPU: timing.torch_runner(builds.model_cpu, x),
            EAGER_GPU: torch_host_runner(builds.model_gpu, x, "cuda"),
            EAGER_GPU_RESIDENT: torch_resident_runner(builds.model_gpu, x, "cuda"),
            TVM_GPU: tvm_host_runner(builds.tvm_gpu, x),
        }
        if batch <= tvm_cpu_max_batch:
            backends[TVM_CPU] = tvm_host_runner(builds.tvm_cpu, x)
        start = time.perf_counter()
        with float32_only():
            results += timing.measure(backends, batch=batch, warmup=2, repeats=repeats, sync=cuda_sync)
        if progress:
            progress(f"batch {batch:4d}: {len(backends)} backends in {time.perf_counter() - start:5.1f} s")
    return results


@contextlib.contextmanager
def float32_only():
    """PyTorch held to float32 on the GPU, as TVM computes: TF32 off for cuDNN's convolutions (on by
    default, a 10-bit mantissa: another function, and a faster one) and for cuBLAS's matrix products."""
    saved = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = saved


def torch_gpu_peers(model: torch.nn.Module, x: torch.Tensor) -> peers.Peers:
    """Every PyTorch of ``PYTORCH_GPU`` on the GPU, input already there, each on its own copy of the model,
    compiled by its first calls (seconds kept) and checked against eager. A mode that fails to compile or
    to match is left out with its reason (``missing``), so one broken mode does not cost the others."""
    builds = {
        COMPILE_GPU: lambda m: torch.compile(m),
        COMPILE_GPU_GRAPHS: lambda m: torch.compile(m, mode="reduce-overhead"),
        FROZEN_GPU_GRAPHS: lambda m: peers.FrozenCompiled(m, {"triton.cudagraphs": True}),
    }
    result = peers.Peers({EAGER_GPU: torch_resident_runner(torch_on_device(model, "cuda"), x, "cuda")})
    expected = result.runners[EAGER_GPU]().cpu().numpy()
    for label, build in builds.items():
        try:
            run = torch_resident_runner(build(torch_on_device(model, "cuda")), x, "cuda")
            start = time.perf_counter()
            for _ in range(3):  # CUDA graph trees record on the second or third call
                out = run().cpu().numpy()  # a replayed graph's output is overwritten by the next replay
            result.compile_s[label] = time.perf_counter() - start
            error = relative_error(out, expected)
        except Exception as err:  # any compile failure: reported with its first line, the others still timed
            result.missing[label] = peers.why_missing(label, err)
            continue
        if not error <= peers.RTOL:
            result.missing[label] = f"{label} differs from eager: relative error {error:.2e} > {peers.RTOL:.0e}"
            continue
        result.runners[label] = run
    return result


def compile_with_cuda_graph(imported: models.ImportedModel, target: tvm.target.Target) -> CompiledModel:
    """TVM's default GPU build with ``CUDA_GRAPH_CONFIG``: the first call records the kernel launches as a CUDA
    graph, and every later call replays it with one launch. Check it on a second input too (``tvm_gpu_builds``
    does): a replay that read the first call's input would still match on that one."""
    return compile_model(imported, target, pass_config=CUDA_GRAPH_CONFIG)


def tvm_gpu_builds(model: torch.nn.Module, x: torch.Tensor) -> peers.Peers:
    """TVM with DLight on the GPU, plain and with a CUDA graph, each checked against PyTorch on ``x`` and on a
    second input (build seconds kept); the CUDA-graph build is left out with its reason if it fails."""
    imported = models.import_to_relax(model, x)
    other = models.example_input(x.shape[0], seed=1)
    result = peers.Peers({})
    for label, build in ((TVM_GPU, compile_model), (TVM_GPU_GRAPH, compile_with_cuda_graph)):
        start = time.perf_counter()
        try:
            compiled = build(imported, machine.cuda_target())
            for example in (x, other, x):
                check_parity(compiled, model, example)
        except Exception as err:
            if label == TVM_GPU:
                raise
            result.missing[label] = peers.why_missing(label, err)
            continue
        result.compile_s[label] = time.perf_counter() - start
        result.runners[label] = timing.tvm_runner(compiled, x)
    return result


def fastest_pytorch(timings: Sequence[timing.Timing]) -> str:
    """The label of the fastest PyTorch on the GPU (by median) among the timings: the peer TVM is held to."""
    medians = {t.label: t.median_ms for t in timings if t.label in PYTORCH_GPU}
    if not medians:
        raise ValueError(f"No PyTorch GPU timing among {sorted({t.label for t in timings})}.")
    return min(medians, key=medians.__getitem__)


def measure_gpu_backends(
    model: torch.nn.Module, batch: int = 1, repeats: int | None = None, progress: Callable[[str], None] | None = print
) -> list[timing.Timing]:
    """At one batch size, input already on the GPU, PyTorch held to float32 as TVM is, interleaved: every
    PyTorch of ``PYTORCH_GPU`` and TVM with DLight, plain and with a CUDA graph; then eager without sync.

    The no-sync row is the classic mistake, kept to show what it measures: the launch, not the work.
    """
    machine.require_gpu("GPU backends")
    repeats = repeats or pick(50, 10)
    x = models.example_input(batch)
    with float32_only():
        torch_side, tvm_side = torch_gpu_peers(model, x), tvm_gpu_builds(model, x)
        for side in (torch_side, tvm_side) if progress else ():
            for label, seconds in side.compile_s.items():
                progress(f"{label}: built and checked in {seconds:.1f} s")
            for reason in side.missing.values():
                progress(f"left out: {reason}")
        cuda_sync()
        synced = timing.measure(
            {**torch_side.runners, **tvm_side.runners}, batch=batch, warmup=5, repeats=repeats, sync=cuda_sync
        )
        (unsynced,) = timing.measure(
            {EAGER_GPU_NO_SYNC: torch_side.runners[EAGER_GPU]}, batch=batch, warmup=5, repeats=repeats
        )
        cuda_sync()
    return synced + [unsynced]


# ------------------------------------------------------------------ records


@dataclass
class Recorded:
    """GPU measurements kept in the repository, with where and when they were taken."""

    path: Path
    measured: str
    machine: dict
    model: str
    gpu_backends: list[timing.Timing]
    crossover: list[timing.Timing]

    @property
    def where(self) -> str:
        m = self.machine
        return f"{m['gpu']} with {m['host_cpu']} ({m['cores']} cores), {self.measured}"


def _timings(rows: list[dict]) -> list[timing.Timing]:
    return [timing.Timing(r["backend"], int(r["batch"]), [float(t) for t in r["times_ms"]]) for r in rows]


def recorded_rows(timings: Sequence[timing.Timing]) -> list[dict]:
    """Timings as a recording keeps them (every time, for ``load_recorded`` to read back)."""
    return [{**t.as_record(), "times_ms": [round(v, 5) for v in t.times_ms]} for t in timings]


def recorded_files(model: str = "mobilenet_v2", root: Path = RECORDED_ROOT) -> list[Path]:
    """The recorded GPU measurements the course ships for ``model``."""
    return sorted(Path(root).glob(f"{model}-*.json"))


def load_recorded(path: str | Path | None = None, model: str = "mobilenet_v2") -> Recorded:
    """Recorded GPU measurements (the first shipped file for ``model`` when no path is given)."""
    if path is None:
        files = recorded_files(model)
        if not files:
            raise FileNotFoundError(
                f"No recorded GPU measurements for {model} in {RECORDED_ROOT}: on a machine with an "
                "NVIDIA GPU, `python -m helpers.maintainers.gpu_record` makes them."
            )
        path = files[0]
    path = Path(path)
    data = json.loads(path.read_text())
    return Recorded(
        path=path,
        measured=data["measured"],
        machine=data["machine"],
        model=data["model"],
        gpu_backends=_timings(data["gpu_backends"]),
        crossover=_timings(data["crossover"]),
    )
