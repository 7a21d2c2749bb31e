"""One TensorIR kernel, built for this CPU and measured in GFLOP/s (Day 7).

The kernel is a pointwise (1x1) convolution, the operator that does most of
MobileNetV2's arithmetic, written in two layouts: plain NCHW, and NCHWc, where
the channels are cut into blocks of ``block`` values stored innermost so that
one vector register holds one block. Schedules are applied to it with
``tvm.s_tir.Schedule``; the helpers here build it, check it against PyTorch and
time it against other versions, interleaved, as ``helpers.timing`` does.

Introduced on Day 7.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field

import numpy as np
import torch
import tvm
from tvm import s_tir
from tvm.script import tirx as T

from . import machine, timing
from .build import relative_error
from .config import pick
from .errors import CourseError
from .machine import FmaThroughput, cpu_target, float32_lanes  # Day 7 calls kernels.float32_lanes
from .timing import Timing, tvm_runner  # Day 7 and 13 call it as kernels.tvm_runner(lib, args)

BLOCK_NAME = "conv"


class KernelShapeError(CourseError, ValueError):
    """A kernel shape that the layout cannot hold (e.g. channels not a multiple of the block)."""


class KernelMismatchError(CourseError, AssertionError):
    """A compiled kernel whose output differs from PyTorch's on the same data."""


def peak_gflops(cores: int, ghz: float, lanes: int, fma_units: int) -> float:
    """Estimated float32 peak: every core issues ``fma_units`` FMAs of ``lanes`` values per cycle.

    An FMA is 2 floating-point operations. ``lanes`` is the width of the FMA unit, which is not
    always the register's (``machine.fma_throughput`` gives both figures for a CPU, and says where
    they come from). It is an estimate: the clock under load (turbo, AVX-512 down-clocking) varies.
    """
    for name, value in {"cores": cores, "ghz": ghz, "lanes": lanes, "fma_units": fma_units}.items():
        if not value > 0:
            raise ValueError(f"{name} must be positive, got {value!r}")
    return float(cores * ghz * fma_units * 2 * lanes)


@dataclass(frozen=True)
class PeakEstimate:
    """The float32 peak of this machine, with every number it is made of and where each comes from."""

    cores: int  # physical cores (SMT siblings share their core's FMA units)
    ghz: float
    ghz_reported: bool  # False: the OS does not say, and 2 GHz is assumed
    fma: FmaThroughput

    @property
    def gflops(self) -> float:
        return peak_gflops(self.cores, self.ghz, self.fma.fp32_lanes, self.fma.units)

    def explain(self) -> str:
        clock = "reported by the OS" if self.ghz_reported else "assumed: the OS does not report it"
        return (f"{self.cores} physical cores x {self.ghz} GHz ({clock}) x {self.fma.units} FMA units x 2 flops x "
                f"{self.fma.fp32_lanes} lanes ({self.fma.width_bits}-bit units) = {self.gflops:.0f} GFLOP/s\n"
                f"{self.fma.summary()}")


def estimated_peak(target: tvm.target.Target | None = None, cores: int | None = None,
                   ghz: float | None = None) -> PeakEstimate:
    """The peak of ``target``'s CPU (default: this machine) on ``cores`` physical cores (default: this
    machine's) at ``ghz`` (default: the clock the OS reports, else 2 GHz, and it says so)."""
    reported = machine.cpu_ghz()
    clock = ghz or reported or 2.0
    return PeakEstimate(cores or machine.physical_core_count(), clock, bool(ghz or reported),
                        machine.fma_throughput(target))


def _positive(**sizes: int) -> None:
    for name, value in sizes.items():
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
            raise KernelShapeError(f"{name} must be a positive integer, got {value!r}")


@dataclass
class PointwiseShape:
    """A 1x1 convolution at batch 1: ``c_in`` -> ``c_out`` channels on an ``h`` x ``w`` image."""

    c_in: int
    c_out: int
    h: int
    w: int

    def __post_init__(self) -> None:
        _positive(c_in=self.c_in, c_out=self.c_out, h=self.h, w=self.w)

    @property
    def flops(self) -> int:
        """One multiply and one add per output value per input channel."""
        return 2 * self.c_in * self.c_out * self.h * self.w

    @property
    def min_bytes(self) -> int:
        """float32 bytes a kernel must at least move: read the input and weights once, write the output once."""
        return 4 * (self.c_in * self.h * self.w + self.c_in * self.c_out + self.c_out * self.h * self.w)

    @property
    def intensity(self) -> float:
        """Arithmetic intensity (FLOP per byte of memory traffic), at the minimum traffic: the roofline's x."""
        return self.flops / self.min_bytes


def pointwise_nchw(shape: PointwiseShape) -> tvm.tirx.PrimFunc:
    """The 1x1 convolution in NCHW, as naive loops (what an unscheduled build runs)."""
    ci, co, h, w = shape.c_in, shape.c_out, shape.h, shape.w

    @T.prim_func(s_tir=True)
    def main(X: T.Buffer((1, ci, h, w), "float32"), Wt: T.Buffer((co, ci, 1, 1), "float32"),
             Y: T.Buffer((1, co, h, w), "float32")):
        T.func_attr({"global_symbol": "main", "tir.noalias": True})
        for n, oc, y, x, ic in T.grid(1, co, h, w, ci):
            with T.sblock("conv"):
                vn, voc, vy, vx, vic = T.axis.remap("SSSSR", [n, oc, y, x, ic])
                with T.init():
                    Y[vn, voc, vy, vx] = T.float32(0)
                Y[vn, voc, vy, vx] = Y[vn, voc, vy, vx] + X[vn, vic, vy, vx] * Wt[voc, vic, 0, 0]

    return main


def _check_block(shape: PointwiseShape, block: int) -> None:
    _positive(block=block)
    bad = [f"{name}={c}" for name, c in (("c_in", shape.c_in), ("c_out", shape.c_out)) if c % block]
    if bad:
        raise KernelShapeError(
            f"NCHW{block}c needs channel counts that are multiples of the block {block}, got {', '.join(bad)}. "
            "Pick a block that divides both (e.g. 8 or 4), or pad the channels."
        )


def pointwise_nchwc(shape: PointwiseShape, block: int) -> tvm.tirx.PrimFunc:
    """The 1x1 convolution in NCHW{block}c, with weights prepacked as OIHW{block}i{block}o.

    Loops, outermost first: n, oc_outer, h, w, oc_inner, ic_outer, ic_inner; the
    block is called ``conv``. Naive order: the reduction is innermost, as in NCHW.
    """
    _check_block(shape, block)
    c, ci, co, h, w = block, shape.c_in // block, shape.c_out // block, shape.h, shape.w

    @T.prim_func(s_tir=True)
    def main(X: T.Buffer((1, ci, h, w, c), "float32"), Wp: T.Buffer((co, ci, 1, 1, c, c), "float32"),
             Y: T.Buffer((1, co, h, w, c), "float32")):
        T.func_attr({"global_symbol": "main", "tir.noalias": True})
        for n, oc_outer, y, x, oc_inner, ic_outer, ic_inner in T.grid(1, co, h, w, c, ci, c):
            with T.sblock("conv"):
                vn, voo, vy, vx, voi, vio, vii = T.axis.remap("SSSSSRR", [n, oc_outer, y, x, oc_inner, ic_outer, ic_inner])
                with T.init():
                    Y[vn, voo, vy, vx, voi] = T.float32(0)
                Y[vn, voo, vy, vx, voi] = Y[vn, voo, vy, vx, voi] + X[vn, vio, vy, vx, vii] * Wp[voo, vio, 0, 0, vii, voi]

    return main


def pack_nchwc(x: np.ndarray, block: int) -> np.ndarray:
    """NCHW -> NCHW{block}c: element [n, c, h, w] moves to [n, c // block, h, w, c % block]."""
    if x.ndim != 4:
        raise KernelShapeError(f"pack_nchwc expects an NCHW array (4 dimensions), got shape {x.shape}")
    n, c, h, w = x.shape
    _check_block(PointwiseShape(c, c, max(h, 1), max(w, 1)), block)
    return np.ascontiguousarray(x.reshape(n, c // block, block, h, w).transpose(0, 1, 3, 4, 2))


def unpack_nchwc(y: np.ndarray) -> np.ndarray:
    """NCHW{block}c -> NCHW (the inverse of ``pack_nchwc``)."""
    if y.ndim != 5:
        raise KernelShapeError(f"unpack_nchwc expects an NCHWc array (5 dimensions), got shape {y.shape}")
    n, outer, h, w, block = y.shape
    return np.ascontiguousarray(y.transpose(0, 1, 4, 2, 3).reshape(n, outer * block, h, w))


def pack_weight(weight: np.ndarray, block: int) -> np.ndarray:
    """OIHW -> OIHW{block}i{block}o: element [o, i, kh, kw] moves to [o//b, i//b, kh, kw, i%b, o%b].

    This is weight *prepacking*: done once when the model loads, not on every call.
    """
    if weight.ndim != 4:
        raise KernelShapeError(f"pack_weight expects an OIHW array (4 dimensions), got shape {weight.shape}")
    o, i, kh, kw = weight.shape
    _check_block(PointwiseShape(i, o, 1, 1), block)
    return np.ascontiguousarray(weight.reshape(o // block, block, i // block, block, kh, kw).transpose(0, 2, 4, 5, 3, 1))


@dataclass
class PointwiseProblem:
    """Seeded data for one shape, PyTorch's answer, and the arguments for each layout."""

    shape: PointwiseShape
    x: np.ndarray = field(repr=False)
    weight: np.ndarray = field(repr=False)
    expected: np.ndarray = field(repr=False)

    @classmethod
    def make(cls, shape: PointwiseShape, seed: int = 0) -> PointwiseProblem:
        rng = np.random.default_rng(seed)
        x = rng.standard_normal((1, shape.c_in, shape.h, shape.w), dtype=np.float32)
        weight = rng.standard_normal((shape.c_out, shape.c_in, 1, 1), dtype=np.float32)
        with torch.inference_mode():
            expected = torch.nn.functional.conv2d(torch.from_numpy(x), torch.from_numpy(weight)).numpy()
        return cls(shape, x, weight, expected)

    def args(self, block: int | None, device: tvm.runtime.Device | None = None) -> list[tvm.runtime.Tensor]:
        """Input, weight and a zeroed output on the device, in NCHW (``block=None``) or NCHW{block}c."""
        device = device or tvm.cpu(0)
        if block is None:
            arrays = [self.x, self.weight, np.zeros_like(self.expected)]
        else:
            out = np.zeros((1, self.shape.c_out // block, self.shape.h, self.shape.w, block), np.float32)
            arrays = [pack_nchwc(self.x, block), pack_weight(self.weight, block), out]
        return [tvm.runtime.tensor(a, device) for a in arrays]

    def torch_runner(self) -> Callable[[], object]:
        """PyTorch's conv2d on the same data and shape (its own multi-threaded CPU kernel)."""
        x, weight = torch.from_numpy(self.x), torch.from_numpy(self.weight)

        def run():
            with torch.inference_mode():
                return torch.nn.functional.conv2d(x, weight)

        return run


def build(kernel: tvm.tirx.PrimFunc | s_tir.Schedule, target: tvm.target.Target | None = None) -> tvm.runtime.Module:
    """Compile a PrimFunc or a schedule's module for this CPU; returns the loaded runtime module."""
    mod = kernel.mod if isinstance(kernel, s_tir.Schedule) else tvm.IRModule({"main": kernel})
    return tvm.compile(mod, target=target or cpu_target()).mod


def relative_error_of(lib: tvm.runtime.Module, problem: PointwiseProblem, block: int | None) -> float:
    """Run the compiled kernel once; max |kernel - PyTorch| / max |PyTorch|."""
    args = problem.args(block)
    lib["main"](*args)
    got = args[2].numpy()
    return relative_error(got if block is None else unpack_nchwc(got), problem.expected)


def check(lib: tvm.runtime.Module, problem: PointwiseProblem, block: int | None, rtol: float = 1e-4) -> float:
    """Raise KernelMismatchError unless the compiled kernel matches PyTorch; return the relative error."""
    error = relative_error_of(lib, problem, block)
    if not error <= rtol:
        raise KernelMismatchError(
            f"the compiled kernel differs from PyTorch's conv2d: relative error {error:.3g} > {rtol:g}. "
            "A schedule must not change what is computed: check splits whose factors do not divide the "
            "extent and loops marked parallel or vectorized that carry the reduction."
        )
    return error


def measure(
    runners: Mapping[str, Callable[[], object]],
    repeats: int | None = None,
    min_sample_ms: float | None = None,
) -> list[Timing]:
    """Milliseconds per call of each runner, interleaved round by round: ``timing.measure`` with samples.

    A kernel call can take microseconds, shorter than the timer is honest for, so
    each sample times a batch of back-to-back calls (enough to last ``min_sample_ms``
    for that runner, sized on a calibration call) and records the time per call.
    """
    return timing.measure(runners, repeats=pick(15, 7) if repeats is None else repeats,
                          min_sample_ms=pick(20.0, 8.0) if min_sample_ms is None else min_sample_ms)


def memory_bandwidth_gbs(megabytes: int | None = None, repeats: int | None = None) -> float:
    """Memory bandwidth of one core in GB/s, measured: the best of ``repeats`` copies of an array much
    larger than the caches (NumPy's copy reads and writes each byte once: 2 x size bytes move).

    One core's streaming copy: a lower bound for the machine, the roof a single-threaded kernel
    sees, and the right order of magnitude for a small machine's memory.
    """
    megabytes = megabytes or pick(256, 64)
    repeats = repeats or pick(5, 3)
    src = np.ones(megabytes * 2**20 // 4, dtype=np.float32)
    dst = np.empty_like(src)
    np.copyto(dst, src)  # touch every page first
    best = min(_seconds(lambda: np.copyto(dst, src)) for _ in range(repeats))
    return 2 * src.nbytes / best / 1e9


def _seconds(run: Callable[[], object]) -> float:
    start = time.perf_counter()
    run()
    return time.perf_counter() - start


def gflops(t: Timing, flops: int) -> float:
    """GFLOP/s at the median time of a Timing record."""
    return flops / (t.median_ms * 1e6)


def speedup(timings: list[Timing], candidate: str, baseline: str) -> float:
    """Baseline median / candidate median, both from one measured run."""
    by = {t.label: t for t in timings}
    missing = [name for name in (candidate, baseline) if name not in by]
    if missing:
        raise KeyError(f"no timing labelled {missing}; labels are {sorted(by)}")
    return by[baseline].median_ms / by[candidate].median_ms


def loop_nest(sch: s_tir.Schedule, block: str = BLOCK_NAME) -> str:
    """The loops around ``block``, outermost first, as ``kind name(extent)``: a schedule at a glance."""
    kinds = {0: "", 1: "parallel ", 2: "vectorized ", 3: "unroll ", 4: "bound "}
    parts = []
    for loop in sch.get_loops(sch.get_sblock(block)):
        node = sch.get(loop)
        parts.append(f"{kinds.get(int(node.kind), '')}{node.loop_var.name}({node.extent})")
    return " > ".join(parts)


def threads() -> int:
    """Threads in TVM's runtime pool (set ``TVM_NUM_THREADS`` before TVM's first parallel call)."""
    return int(tvm.get_global_func("runtime.NumThreads")())


@contextmanager
def thread_pool(n: int) -> Iterator[None]:
    """Run TVM's parallel loops on ``n`` threads inside the block, then restore the pool.

    Grading times kernels on one thread: a parallel kernel waits for its slowest thread, and a
    thread that shares its core with another program makes a correct schedule look slow
    (measured here: 61x over naive on a quiet machine, 2x with one core busy; 31x and 31x on
    one thread).
    """
    if n < 1:
        raise ValueError(f"a thread pool needs at least 1 thread, got {n}")
    configure = tvm.get_global_func("runtime.config_threadpool")
    before = threads()
    configure(1, n)
    try:
        yield
    finally:
        configure(1, before)


__all__ = [
    "BLOCK_NAME", "KernelMismatchError", "KernelShapeError", "PeakEstimate", "PointwiseProblem", "PointwiseShape",
    "build", "check", "estimated_peak", "float32_lanes", "gflops", "loop_nest", "measure", "pack_nchwc", "pack_weight",
    "peak_gflops", "pointwise_nchw", "pointwise_nchwc", "relative_error_of", "speedup", "thread_pool", "threads",
    "tvm_runner",
    "unpack_nchwc",
]


def pointwise_relax(shape: PointwiseShape) -> tvm.IRModule:
    """The same 1x1 convolution as a one-operator Relax module (input ``x``, weight ``w`` as a parameter)."""
    from tvm import relax
    from tvm.script import relax as R

    bb = relax.BlockBuilder()
    x = relax.Var("x", R.Tensor((1, shape.c_in, shape.h, shape.w), "float32"))
    w = relax.Var("w", R.Tensor((shape.c_out, shape.c_in, 1, 1), "float32"))
    with bb.function("main", [x, w], attrs={"num_input": 1}):
        with bb.dataflow():
            out = bb.emit_output(relax.op.nn.conv2d(x, w))
        bb.emit_func_output(out)
    return bb.get()
