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

import math
import re
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


def served_by(nbytes: int, caches: Mapping[str, int]) -> str:
    """The smallest cache (of ``machine.cache_sizes()``) that holds ``nbytes`` in half of it, the other half left
    to the data streaming past; "DRAM" when none does."""
    return next((level for level, size in caches.items() if nbytes <= size // 2), "DRAM")


def reread_traffic(shape: PointwiseShape, lanes: int, caches: Mapping[str, int]) -> list[dict]:
    """What two loop orders of the NCHWc 1x1 convolution read more than once, and from where.

    Output channel blocks outermost (section 5's schedule): one block's slice of the weights serves every row
    before the next block starts, so the weights come once; the input is read again for every block.
    Rows outermost (the NCHWc template's order where weights are small): one row of the input serves every
    channel block, so the input comes once; all the weights are read again for every row. Each operand read
    again is served by the smallest cache that holds it (``served_by``); the row's intensity counts its bytes
    at that level: the reused operand every time, the other operand and the output once."""
    input_b, weight_b = 4 * shape.c_in * shape.h * shape.w, 4 * shape.c_in * shape.c_out
    output_b = 4 * shape.c_out * shape.h * shape.w
    rows = [("output channel blocks outermost", "the input", shape.c_out // lanes, input_b, weight_b),
            ("rows outermost", "the weights", shape.h, weight_b, input_b)]
    return [{"order": order, "read again": what, "times": times, "MB each time": each / 1e6,
             "from": served_by(each, caches), "FLOP/byte": shape.flops / (times * each + once + output_b)}
            for order, what, times, each, once in rows]


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


def buffer_shapes(func: tvm.tirx.PrimFunc) -> list[tuple[int, ...]]:
    """The shape of each parameter's buffer, in order: what a caller must allocate for the function."""
    if not isinstance(func, tvm.tirx.PrimFunc):
        raise KernelShapeError(f"expected a TensorIR function (te.create_prim_func or @T.prim_func), got {type(func).__name__}")
    return [tuple(int(d) for d in p.shape) for p in func.params]


def run_function(func: tvm.tirx.PrimFunc, inputs: list[np.ndarray], target: tvm.target.Target | None = None) -> np.ndarray:
    """Build ``func`` (inputs first, its output last) and run it once on ``inputs``; returns the output.

    A floating-point output starts filled with NaN, so an element the function never writes shows up
    as NaN instead of passing as a zero that happened to be in memory.
    """
    *in_shapes, out_shape = buffer_shapes(func)
    if len(in_shapes) != len(inputs):
        raise KernelShapeError(f"the function takes {len(in_shapes)} input(s) before its output, got {len(inputs)}")
    for i, (array, shape) in enumerate(zip(inputs, in_shapes)):
        if tuple(array.shape) != shape:
            raise KernelShapeError(f"input {i} has shape {tuple(array.shape)}, the function's buffer {shape}")
    out_dtype = str(func.params[-1].dtype)
    fill = np.nan if np.issubdtype(np.dtype(out_dtype), np.floating) else 0
    out = tvm.runtime.tensor(np.full(out_shape, fill, out_dtype))
    build(func, target)["main"](*(tvm.runtime.tensor(np.ascontiguousarray(a)) for a in inputs), out)
    return out.numpy()


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


# ------------------------------------------------------------------ reading a kernel: its assembly and its schedule

_FMA_MNEMONIC = re.compile(r"vf(?:n)?m(?:add|sub)\w*$")
_ASM_LABEL = re.compile(r"^(\.L\w+):")
_ASM_JUMP = re.compile(r"^\s+j\w+\s+(\.L\w+)\s*$")
FMA_KINDS = ("scalar", "xmm", "ymm", "zmm")  # one value; 128-, 256- and 512-bit vector registers


def _asm_lines(asm: str) -> list[str]:
    return [text for text in (line.split("#", 1)[0].rstrip() for line in asm.splitlines()) if text.strip()]


def _fma_kind(line: str) -> str | None:
    """``scalar``, ``xmm``, ``ymm`` or ``zmm`` for an FMA instruction (by its destination register), else None."""
    parts = line.split(None, 1)
    if not parts or not _FMA_MNEMONIC.match(parts[0]):
        return None
    if parts[0].endswith(("ss", "sd", "sh")):
        return "scalar"
    registers = re.findall(r"%([xyz]mm)\d+", parts[1] if len(parts) > 1 else "")
    return registers[-1] if registers else None


def _is_vector_store(line: str) -> bool:
    """A ``vmov...`` from an xmm, ymm or zmm register to memory (AT&T syntax: the destination is last);
    scalar floats are stored from xmm registers too."""
    parts = line.split(None, 1)
    if len(parts) < 2 or not parts[0].startswith("vmov"):
        return False
    operands = [o.strip() for o in re.split(r",(?![^(]*\))", parts[1])]
    return len(operands) == 2 and re.match(r"%[xyz]mm\d+$", operands[0]) is not None and "(" in operands[1]


def _asm(lib_or_asm) -> str:
    return lib_or_asm if isinstance(lib_or_asm, str) else lib_or_asm.inspect_source("asm")


def fma_counts(lib_or_asm) -> dict[str, int]:
    """FMA instructions in a compiled kernel's assembly, by kind: ``scalar`` (one value) and the vector
    registers they work on, ``xmm`` (128 bits: 4 float32), ``ymm`` (256: 8) and ``zmm`` (512: 16).

    LLVM may pick any width it likes for code it vectorizes on its own, so count every kind, not only
    the widest. Counts are of instructions in the code, not of instructions executed.
    """
    counts = dict.fromkeys(FMA_KINDS, 0)
    for line in _asm_lines(_asm(lib_or_asm)):
        kind = _fma_kind(line)
        if kind:
            counts[kind] += 1
    return counts


@dataclass(frozen=True)
class LoopStats:
    """One loop of a kernel's assembly, as written (one pass through its body)."""

    fmas: int  # FMA instructions
    stores: int  # values written from a vector register (xmm, ymm, zmm) to memory
    instructions: int

    def summary(self) -> str:
        return f"{self.fmas} FMAs and {self.stores} stores to memory in {self.instructions} instructions"


def hot_loop(lib_or_asm) -> LoopStats:
    """The innermost loop of a compiled kernel's assembly with the most FMA instructions: the kernel's hot loop.

    Accumulators that live in registers are stored once, after the loop; accumulators that live in memory
    are written back inside it, so ``stores`` close to ``fmas`` means the sums go through memory.
    A loop is a label and the last backward jump to it; innermost: no other such loop inside it.
    """
    lines = _asm_lines(_asm(lib_or_asm))
    labels: dict[str, int] = {}
    loops = []
    for j, line in enumerate(lines):
        if (label := _ASM_LABEL.match(line)) is not None:
            labels[label.group(1)] = j
        elif (jump := _ASM_JUMP.match(line)) is not None and jump.group(1) in labels:
            loops.append((labels[jump.group(1)], j))
    innermost = [r for r in loops if not any(o != r and r[0] <= o[0] and o[1] <= r[1] for o in loops)]
    best = LoopStats(0, 0, 0)
    for start, end in innermost:
        body = lines[start:end + 1]
        stats = LoopStats(sum(_fma_kind(t) is not None for t in body), sum(map(_is_vector_store, body)),
                          sum(_ASM_LABEL.match(t) is None for t in body))
        if stats.fmas > best.fmas:
            best = stats
    return best


def heap_allocations(lib: tvm.runtime.Module) -> int:
    """Places in a compiled kernel that take a buffer from TVM's workspace (``TVMBackendAllocWorkspace``:
    heap memory) instead of the stack, read from its LLVM IR. A buffer on the heap is memory: LLVM cannot
    keep it in registers the way it does a small stack array."""
    return lib.inspect_source("ll").count("load ptr, ptr @__TVMBackendAllocWorkspace")


_LOOP_KINDS = {0: "", 1: "parallel ", 2: "vectorized ", 3: "unroll ", 4: "bound "}


def loop_tree(kernel: s_tir.Schedule | tvm.tirx.PrimFunc) -> str:
    """A schedule's function at a glance: its buffers (with their scope), and every loop and block, nested.

    Loops read ``kind name(extent)``; blocks ``[name] -> the buffer it writes``. Shorter than
    ``sch.mod.script()``, and enough to see what a primitive changed.
    """
    func = kernel.mod["main"] if isinstance(kernel, s_tir.Schedule) else kernel
    lines: list[str] = []

    def scope_of(buffer) -> str:
        scope = buffer.scope()
        return "" if scope == "global" else f" ({scope})"

    def visit(stmt, depth: int) -> None:
        pad = "  " * depth
        if isinstance(stmt, tvm.tirx.SeqStmt):
            for s in stmt.seq:
                visit(s, depth)
        elif isinstance(stmt, tvm.tirx.For):
            lines.append(f"{pad}{_LOOP_KINDS.get(int(stmt.kind), '')}{stmt.loop_var.name}({stmt.extent})")
            visit(stmt.body, depth + 1)
        elif isinstance(stmt, s_tir.SBlockRealize):
            block = stmt.block
            if block.name_hint == "root":
                for buffer in block.alloc_buffers:
                    lines.append(f"{pad}buffer {buffer.name}{list(int(d) for d in buffer.shape)}{scope_of(buffer)}")
                visit(block.body, depth)
                return
            writes = ", ".join(f"{w.source.name}{scope_of(w.source)}" for w in block.writes)
            lines.append(f"{pad}[{block.name_hint}] -> {writes}")
            for buffer in block.alloc_buffers:
                lines.append(f"{pad}  buffer {buffer.name}{list(int(d) for d in buffer.shape)}{scope_of(buffer)}")
            visit(block.body, depth + 1)
        elif hasattr(stmt, "body"):
            visit(stmt.body, depth)

    visit(func.body, 0)
    return "\n".join(lines)


def _vars_in(expr) -> set[str]:
    return {v.name for v in tvm.tirx.analysis.undefined_vars(expr, [])}


def _block_realizes(stmt) -> Iterator:
    """Every block (its ``SBlockRealize``) under ``stmt``, outermost first."""
    if isinstance(stmt, tvm.tirx.SeqStmt):
        for s in stmt.seq:
            yield from _block_realizes(s)
    elif isinstance(stmt, s_tir.SBlockRealize):
        yield stmt
        yield from _block_realizes(stmt.block.body)
    elif isinstance(stmt, tvm.tirx.IfThenElse):
        yield from _block_realizes(stmt.then_case)
        if stmt.else_case is not None:
            yield from _block_realizes(stmt.else_case)
    elif hasattr(stmt, "body"):
        yield from _block_realizes(stmt.body)


@dataclass(frozen=True)
class RegisterTile:
    """What a schedule of ``pointwise_nchwc`` computes inside its innermost reduction loop."""

    pixels: int  # output pixels (the w axis) updated per pass of the reduction
    channel_blocks: int  # output channel blocks (oc_outer)
    lanes: int  # values per channel block covered there (oc_inner)
    accumulator: str  # the buffer the convolution block adds into
    scope: str  # its storage scope
    into_output: bool  # True: it adds straight into the function's output buffer

    @property
    def vectors(self) -> int:
        """Accumulator vectors of ``lanes`` values: pixels x channel blocks."""
        return self.pixels * self.channel_blocks


def register_tile(sch: s_tir.Schedule, block: str = BLOCK_NAME) -> RegisterTile:
    """Read a schedule of ``pointwise_nchwc``: the tile of outputs its loops inside the innermost reduction
    loop update, and the buffer it accumulates into.

    The loops are matched to the block's axes through the block's bindings, so splits, fusions and
    reorders are all read correctly. ``block`` is the convolution's name (after ``decompose_reduction`` its
    update block, ``conv_update``, is read).
    """
    names = [block, f"{block}_update"]
    realize = [r for r in _block_realizes(sch.mod["main"].body) if r.block.name_hint in names]
    if not realize:
        raise KeyError(f"no block named {block!r} (or {block}_update) in the schedule")
    node = sorted(realize, key=lambda r: names.index(r.block.name_hint))[-1]
    iters, bindings = node.block.iter_vars, node.iter_values
    reduce_vars = set().union(*(_vars_in(v) for i, v in zip(iters, bindings) if int(i.iter_type) == 2))
    loops = [sch.get(loop) for loop in sch.get_loops(sch.get_sblock(node.block.name_hint))]
    last_reduction = max((k for k, loop in enumerate(loops) if loop.loop_var.name in reduce_vars), default=-1)
    inner = loops[last_reduction + 1:]

    def extent_along(axis: int) -> int:
        used = _vars_in(bindings[axis])
        return math.prod(int(loop.extent) for loop in inner if loop.loop_var.name in used)

    buffer = node.block.writes[0].source
    outputs = {param.name for param in sch.mod["main"].params}
    return RegisterTile(extent_along(3), extent_along(1), extent_along(4), buffer.name, buffer.scope(),
                        buffer.name in outputs)


def cache_bandwidth_gbs(kilobytes: int = 256, repeats: int | None = None) -> float:
    """Copy bandwidth of one core in GB/s for data that stays in its caches: an array of ``kilobytes`` (and its
    copy) copied again and again, the best of ``repeats`` samples. 256 KB twice fits a core's L2 cache on
    current x86 CPUs (Zen 4: 1 MB, most Intel server cores: 2 MB); a few MB fit the shared L3."""
    repeats = repeats or pick(7, 3)
    src = np.ones(kilobytes * 1024 // 4, dtype=np.float32)
    dst = np.empty_like(src)
    copies = max(1, (64 * 2**20) // src.nbytes)  # about 64 MB copied per sample
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(copies):
            np.copyto(dst, src)
        best = min(best, time.perf_counter() - start)
    return 2 * src.nbytes * copies / best / 1e9


__all__ += ["FMA_KINDS", "LoopStats", "RegisterTile", "cache_bandwidth_gbs", "fma_counts", "heap_allocations",
            "hot_loop", "loop_tree", "pointwise_relax", "register_tile"]
