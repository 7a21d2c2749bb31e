"""Group-quantized weights and the matrix-vector product that reads them: the kernel an LLM's decoding step
spends its time in.

Decoding one token multiplies every weight matrix of the model by one vector, so each weight is read once
and used once: the step is bound by how fast memory delivers the weights, and 4-bit weights make it about 7x
cheaper than float32 ones. GGUF's Q4_1 format (llama.cpp's, and the SmolLM2 file the course ships) stores a
matrix in groups of 32 weights along a row; each group holds a float16 scale ``d``, a float16 minimum ``m``
and 32 four-bit codes, and weight ``i`` of the group is ``d * code[i] + m``. In the 16 code bytes of a group,
byte ``j`` holds code ``j`` in its low nibble and code ``j + 16`` in its high one.

The helpers here split GGUF's blocks into three arrays TVM can index (codes, scales, minimums), quantize float
weights the same way for any group size, write the dequantize-and-multiply as one tensor expression, schedule
it (TVM's own DLight rule, and one written for the roofline), and measure the machine's read bandwidth, the
roof the kernel is held against.

Introduced on Day 15.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import tvm
from tvm import s_tir, te

from tvm.script import tirx as T

from . import int8, machine, timing
from .config import pick
from .errors import CourseError

GGUF_GROUP = 32     # weights per Q4_1 block in GGUF
CODE_MAX = 15       # four bits
KERNEL_NAME = "y"   # the output block of the product, the one the schedules transform


class QuantizedShapeError(CourseError, ValueError):
    """A matrix whose rows do not split into whole groups, or a group that does not split into two halves."""


@dataclass(frozen=True)
class Q4Matrix:
    """A weight matrix of ``rows`` x ``cols`` in groups of ``group`` weights along each row: ``codes`` holds two
    4-bit codes a byte (rows x cols/2, uint8; in each group, byte ``j`` = code ``j`` low, code ``j + group/2``
    high), ``scale`` and ``minimum`` one float16 each per group (rows x cols/group)."""

    codes: np.ndarray
    scale: np.ndarray
    minimum: np.ndarray
    group: int

    @property
    def shape(self) -> tuple[int, int]:
        return self.codes.shape[0], self.codes.shape[1] * 2

    @property
    def nbytes(self) -> int:
        """The bytes a product reads of this matrix: codes, scales and minimums."""
        return self.codes.nbytes + self.scale.nbytes + self.minimum.nbytes

    def dequantize(self) -> np.ndarray:
        """The float32 weights, computed in NumPy: what the TVM kernel must agree with."""
        rows, cols = self.shape
        half = self.group // 2
        codes = self.codes.reshape(rows, cols // self.group, half)
        both = np.concatenate([codes & 15, codes >> 4], axis=-1).astype(np.float32)
        weights = both * self.scale[..., None].astype(np.float32) + self.minimum[..., None].astype(np.float32)
        return weights.reshape(rows, cols)


def _check_groups(cols: int, group: int) -> None:
    if group < 2 or group % 2:
        raise QuantizedShapeError(f"a group of {group} weights cannot hold two halves of codes: use an even size "
                                  f"such as {GGUF_GROUP}")
    if cols % group:
        raise QuantizedShapeError(f"a row of {cols} weights does not split into groups of {group}: pick a group "
                                  f"size that divides {cols}")


def from_gguf_q4_1(raw: np.ndarray, cols: int) -> Q4Matrix:
    """Split GGUF's Q4_1 blocks (one row of ``cols // 32`` blocks of 20 bytes per matrix row, as
    ``gguf.GGUFReader`` returns a tensor's ``data``) into codes, scales and minimums."""
    _check_groups(cols, GGUF_GROUP)
    blocks = np.ascontiguousarray(raw, dtype=np.uint8).reshape(raw.shape[0], cols // GGUF_GROUP, 4 + GGUF_GROUP // 2)
    scale = blocks[..., 0:2].copy().view(np.float16)[..., 0]
    minimum = blocks[..., 2:4].copy().view(np.float16)[..., 0]
    codes = blocks[..., 4:].reshape(raw.shape[0], cols // 2).copy()
    return Q4Matrix(codes, scale, minimum, GGUF_GROUP)


def quantize(weights: np.ndarray, group: int = GGUF_GROUP) -> Q4Matrix:
    """Quantize float weights (rows x cols) to 4-bit codes in groups of ``group`` along each row, as Q4_1 does:
    the group's minimum is code 0, its maximum code 15, the others rounded to the nearest step in between."""
    weights = np.asarray(weights, dtype=np.float32)
    if weights.ndim != 2:
        raise QuantizedShapeError(f"expected a matrix (rows x cols), got shape {weights.shape}")
    rows, cols = weights.shape
    _check_groups(cols, group)
    groups = weights.reshape(rows, cols // group, group)
    low, high = groups.min(axis=-1), groups.max(axis=-1)
    step = (high - low) / CODE_MAX
    inverse = np.divide(1.0, step, out=np.zeros_like(step), where=step > 0)
    codes = np.clip(np.floor((groups - low[..., None]) * inverse[..., None] + 0.5), 0, CODE_MAX).astype(np.uint8)
    half = group // 2
    packed = codes[..., :half] | (codes[..., half:] << 4)
    return Q4Matrix(packed.reshape(rows, cols // 2), step.astype(np.float16), low.astype(np.float16), group)


def gemv(rows: int, cols: int, group: int = GGUF_GROUP) -> tvm.tirx.PrimFunc:
    """``y = W @ x`` with ``W`` a ``Q4Matrix`` dequantized inside the product, as one tensor expression.

    The reduction runs over three axes, group ``g``, half ``h`` and byte ``j``, so that each weight's code is one
    byte shifted by 0 or 4 bits: no division or branch on the index, which a vectorized loop could not afford."""
    _check_groups(cols, group)
    half = group // 2
    x = te.placeholder((cols,), "float32", name="x")
    codes = te.placeholder((rows, cols // 2), "uint8", name="codes")
    scale = te.placeholder((rows, cols // group), "float16", name="scale")
    minimum = te.placeholder((rows, cols // group), "float16", name="minimum")
    g = te.reduce_axis((0, cols // group), "g")
    h = te.reduce_axis((0, 2), "h")
    j = te.reduce_axis((0, half), "j")

    def weight(n, g, h, j):
        code = (codes[n, g * half + j] >> (h * 4).astype("uint8")) & tvm.tirx.const(CODE_MAX, "uint8")
        return scale[n, g].astype("float32") * code.astype("float32") + minimum[n, g].astype("float32")

    y = te.compute((rows,), lambda n: te.sum(x[g * group + h * half + j] * weight(n, g, h, j), axis=[g, h, j]),
                   name=KERNEL_NAME)
    return te.create_prim_func([x, codes, scale, minimum, y])


def dlight_schedule(func: tvm.tirx.PrimFunc, target: tvm.target.Target | None = None) -> tvm.IRModule:
    """TVM's own CPU rule for matrix-vector products (``s_tir.dlight.cpu.GEMV``) applied to ``func``."""
    from tvm.s_tir import dlight as dl

    target = target or machine.cpu_target()
    with target:
        return dl.ApplyDefaultSchedule(dl.cpu.GEMV())(tvm.IRModule({"main": func}))


def roofline_schedule(func: tvm.tirx.PrimFunc, rows_together: int = 2) -> s_tir.Schedule:
    """A schedule for reading the weights at memory speed: the bytes of a group unpacked 16 or more lanes at a
    time (``rfactor`` turns the reduction over ``j`` into a vector of partial sums), ``rows_together`` rows
    per step sharing each load of ``x``, and the rows spread over the cores."""
    sch = s_tir.Schedule(tvm.IRModule({"main": func}))
    block = sch.get_sblock(KERNEL_NAME)
    *_, j = sch.get_loops(block)
    partial = sch.rfactor(j, factor_axis=1)
    n, g, h, j = sch.get_loops(partial)
    n_outer, n_inner = sch.split(n, [None, rows_together])
    sch.reorder(n_outer, g, h, n_inner, j)
    sch.reverse_compute_at(sch.get_sblock(KERNEL_NAME), n_outer)
    sch.parallel(n_outer)
    sch.unroll(h)
    sch.unroll(n_inner)
    sch.vectorize(j)
    sch.decompose_reduction(partial, g)
    return sch


def build(kernel: tvm.tirx.PrimFunc | tvm.IRModule | s_tir.Schedule,
          target: tvm.target.Target | None = None) -> tvm.runtime.Module:
    """Compile a kernel (a function, a module or a schedule) for this CPU."""
    if isinstance(kernel, s_tir.Schedule):
        kernel = kernel.mod
    if isinstance(kernel, tvm.tirx.PrimFunc):
        kernel = tvm.IRModule({"main": kernel})
    return tvm.compile(kernel, target=target or machine.cpu_target()).mod


def arguments(matrix: Q4Matrix, x: np.ndarray, device: tvm.runtime.Device | None = None) -> list:
    """The kernel's arguments on ``device``: x, codes, scales, minimums and an output to fill."""
    device = device or tvm.cpu()
    rows, _ = matrix.shape
    arrays = (np.asarray(x, dtype=np.float32), matrix.codes, matrix.scale, matrix.minimum,
              np.zeros(rows, dtype=np.float32))
    return [tvm.runtime.tensor(a, device) for a in arrays]


def run(lib: tvm.runtime.Module, matrix: Q4Matrix, x: np.ndarray) -> np.ndarray:
    """``W @ x`` computed by a compiled kernel."""
    args = arguments(matrix, x)
    lib["main"](*args)
    return args[-1].numpy()


@dataclass(frozen=True)
class Int8Vector:
    """A float vector quantized in groups of 32 to int8, as llama.cpp's Q8 dot products take it: ``codes`` laid
    out for ``int8_gemv`` (for each pair of groups, 64 codes: the first 16 values of both groups, then the last 16
    of both), one ``scale`` per group, and each group's ``sums`` (its dequantized values added up)."""

    codes: np.ndarray
    scale: np.ndarray
    sums: np.ndarray

    def dequantize(self) -> np.ndarray:
        """The float32 vector the int8 codes stand for, in its own order."""
        half = GGUF_GROUP // 2
        groups = self.codes.reshape(-1, 2, 2, half).transpose(0, 2, 1, 3).reshape(-1, GGUF_GROUP)
        return (groups.astype(np.float32) * self.scale[:, None]).reshape(-1)


def quantize_activation(x: np.ndarray) -> Int8Vector:
    """Quantize ``x`` to int8 in groups of 32 (scale = the group's largest magnitude / 127), once per token:
    every matrix that reads ``x`` reuses it."""
    x = np.asarray(x, np.float32)
    if x.ndim != 1 or x.shape[0] % (2 * GGUF_GROUP):
        raise QuantizedShapeError(f"int8_gemv takes a vector of a multiple of {2 * GGUF_GROUP} values; got shape {x.shape}")
    groups = x.reshape(-1, GGUF_GROUP)
    scale = np.abs(groups).max(axis=1) / 127
    scale[scale == 0] = 1.0
    codes = np.clip(np.round(groups / scale[:, None]), -127, 127).astype(np.int8)
    half = GGUF_GROUP // 2
    laid_out = codes.reshape(-1, 2, 2, half).transpose(0, 2, 1, 3).reshape(-1)
    sums = scale * codes.astype(np.float32).sum(axis=1)
    return Int8Vector(np.ascontiguousarray(laid_out), scale.astype(np.float32), sums.astype(np.float32))


def byte_dot(acc, a, b, instruction: str):
    """acc (8 int32 lanes) plus the products of 32 unsigned bytes ``a`` by 32 signed bytes ``b``, each lane adding
    four: one ``vpdpbusd`` ("vnni"), or ``vpmaddubsw`` (pairs, in int16) then ``vpmaddwd`` by ones ("avx2"); a
    TIR expression for the kernels written loop by loop."""
    if instruction == "vnni":
        return T.call_llvm_pure_intrin(T.llvm_lookup_intrinsic_id("llvm.x86.avx512.vpdpbusd.256"), acc, a, b,
                                       dtype="int32x8")
    pairs = T.call_llvm_pure_intrin(T.llvm_lookup_intrinsic_id("llvm.x86.avx2.pmadd.ub.sw"), a, b, dtype="int16x16")
    return acc + T.call_llvm_pure_intrin(T.llvm_lookup_intrinsic_id("llvm.x86.avx2.pmadd.wd"), pairs,
                                         T.broadcast(T.int16(1), 16), dtype="int32x8")


def prefetch(buffer, *index):
    """A hint to the CPU to start loading the cache line of ``buffer[index]`` (``llvm.prefetch``: a read, kept in
    every cache level): rows a step ahead arrive while this step's rows are multiplied. Each of a decoding step's
    products is small and starts cold, before the hardware's own prefetcher has seen a pattern."""
    return T.evaluate(T.call_llvm_intrin("void", "llvm.prefetch.p0", T.address_of(buffer[index]), 0, 3, 1))


def pair_products(codes, at: list, xq, x_at, instruction: str):
    """The 8 int32 sums of a pair of groups (lanes 0-3 the first group's, 4-7 the second's): the 32 bytes of
    codes at ``at`` unpacked to their low and high nibbles, each multiplied with 32 int8 activations from
    ``x_at`` by ``byte_dot``. Shared by ``int8_gemv`` and ``int8_gemm``, which index differently."""
    both = codes.vload(at, "uint8x32")
    low = T.bitwise_and(both, T.broadcast(T.uint8(CODE_MAX), 32))
    high = T.shift_right(both, T.broadcast(T.uint8(4), 32))
    first = byte_dot(T.broadcast(T.int32(0), 8), low, xq.vload([x_at], "int8x32"), instruction)
    return byte_dot(first, high, xq.vload([x_at + 32], "int8x32"), instruction)


def pair_offsets(minimum, at: list, xsum, x_at):
    """A pair of groups' two minimum terms: the weight's minimums at ``at`` times the sums of the activation's
    groups at ``x_at``."""
    return T.Cast("float32x2", minimum.vload(at, "float16x2")) * xsum.vload([x_at], "float32x2")


def int8_gemv(rows: int, cols: int, instruction: str | None = None, rows_together: int = 1,
              layers: int | None = None, prefetch_next: bool = True) -> tvm.tirx.PrimFunc:
    """``y = W @ x`` with 4-bit ``W`` (groups of 32) and ``x`` in int8 (``quantize_activation``): the codes are
    multiplied as bytes, four products a lane, by ``vpdpbusd`` (AVX-512 VNNI) or ``vpmaddubsw`` + ``vpmaddwd``
    (AVX2: exact here, since 15 x 127 x 2 fits the int16 it adds pairs in), and each group's integer sum is scaled
    once. 32 bytes of codes hold two groups: their low nibbles are the first 16 codes of both, their high nibbles
    the last 16, which is why ``x`` is laid out in that order.

    Written as a TIR function, loop by loop: no vector value is bound to a name inside the parallel loop (TVM
    turns each such binding into a workspace allocation on every iteration, 4x slower here). The next rows'
    codes are prefetched (``prefetch_next``, see ``prefetch``). ``rows_together`` rows share each load of ``x``;
    one row at a time, the next one prefetched, did best in whole decoding steps: as fast as two for SmolLM2's
    short rows, a third faster than two for TinyLlama-1.1B's (fewer streams of weights open at once). With ``layers``, the
    matrices are every layer's stacked ([layers, rows, ...]) and an integer argument after them picks one."""
    _check_groups(cols, 2 * GGUF_GROUP)
    if rows % rows_together:
        raise QuantizedShapeError(f"{rows} rows do not split into steps of {rows_together} rows")
    instruction = instruction or int8.int8_instruction(machine.cpu_target())
    if instruction not in ("vnni", "avx2"):
        raise CourseError(f"int8_gemv needs AVX-512 VNNI or AVX2 ('vnni' or 'avx2'); this CPU has {instruction!r}: "
                          "use roofline_schedule(gemv(...)), which reads float32 activations")
    groups, pairs, R = cols // GGUF_GROUP, cols // (2 * GGUF_GROUP), rows_together

    def products(codes, xq, n, p):
        return pair_products(codes, [n, p * 32], xq, p * 64, instruction)

    def scales(scale, xscale, n, p):
        """The pair's two scales (the weight's times the activation's, both pairs loaded as one vector), each
        spread over its group's four lanes by a shuffle."""
        both = T.Cast("float32x2", scale.vload([n, 2 * p], "float16x2")) * xscale.vload([2 * p], "float32x2")
        return T.Shuffle([both, both, both, both], [0, 0, 0, 0, 1, 1, 1, 1])

    def offsets(minimum, xsum, n, p):
        return pair_offsets(minimum, [n, 2 * p], xsum, 2 * p)

    @T.macro
    def body(xq, xscale, xsum, codes, scale, minimum, y):
        for c in T.parallel(rows // R):
            # R rows' 8 lanes of partial sums and 2 of minimum terms: small arrays in "global" scope inside the
            # parallel loop stay in registers ("local" would ask TVM's workspace allocator for them on every
            # iteration), and y is written once per row, at the end
            lanes = T.decl_buffer((R, 8), "float32", scope="global")
            mins = T.decl_buffer((R, 2), "float32", scope="global")
            for r in T.unroll(R):
                lanes[r, T.ramp(0, 1, 8)] = T.broadcast(T.float32(0), 8)
                mins[r, T.ramp(0, 1, 2)] = T.broadcast(T.float32(0), 2)
            for p in range(pairs):
                if prefetch_next and p % 2 == 0:   # the next step's rows, a cache line (two pairs of groups) at a time
                    for r in T.unroll(R):
                        prefetch(codes, T.min(c * R + R + r, rows - 1), p * 32)
                for r in T.unroll(R):
                    lanes[r, T.ramp(0, 1, 8)] = lanes[r, T.ramp(0, 1, 8)] + T.Cast(
                        "float32x8", products(codes, xq, c * R + r, p)) * scales(scale, xscale, c * R + r, p)
                    mins[r, T.ramp(0, 1, 2)] = mins[r, T.ramp(0, 1, 2)] + offsets(minimum, xsum, c * R + r, p)
            for r in T.unroll(R):
                y[c * R + r] = mins[r, 0] + mins[r, 1] + lanes[r, 0] + lanes[r, 1] + lanes[r, 2] + lanes[r, 3] + \
                    lanes[r, 4] + lanes[r, 5] + lanes[r, 6] + lanes[r, 7]

    @T.prim_func
    def main(xq: T.Buffer((cols,), "int8"), xscale: T.Buffer((groups,), "float32"),
             xsum: T.Buffer((groups,), "float32"), codes: T.Buffer((rows, cols // 2), "uint8"),
             scale: T.Buffer((rows, groups), "float16"), minimum: T.Buffer((rows, groups), "float16"),
             y: T.Buffer((rows,), "float32")):
        T.func_attr({"global_symbol": "main", "tirx.noalias": True})
        body(xq, xscale, xsum, codes, scale, minimum, y)

    L = layers or 1

    @T.prim_func
    def stacked(xq: T.Buffer((cols,), "int8"), xscale: T.Buffer((groups,), "float32"),
                xsum: T.Buffer((groups,), "float32"), all_codes: T.Buffer((L, rows, cols // 2), "uint8"),
                all_scale: T.Buffer((L, rows, groups), "float16"), all_minimum: T.Buffer((L, rows, groups), "float16"),
                layer: T.int32, y: T.Buffer((rows,), "float32")):
        T.func_attr({"global_symbol": "main", "tirx.noalias": True})
        codes = T.decl_buffer((rows, cols // 2), "uint8", data=all_codes.data, elem_offset=layer * rows * (cols // 2))
        scale = T.decl_buffer((rows, groups), "float16", data=all_scale.data, elem_offset=layer * rows * groups)
        minimum = T.decl_buffer((rows, groups), "float16", data=all_minimum.data, elem_offset=layer * rows * groups)
        body(xq, xscale, xsum, codes, scale, minimum, y)

    if layers is not None:
        return stacked
    return main


SCALE_COPIES = 4   # int8_gemm's activation scales: each group's four times, over its four lanes


def int8_gemm(rows: int, cols: int, tokens: int, instruction: str | None = None, layers: int | None = None,
              tokens_together: int = 8) -> tvm.tirx.PrimFunc:
    """``int8_gemv`` for ``tokens`` vectors at once (a prompt's, a matrix-matrix product): ``xq``, ``xscale`` and
    ``xsum`` hold the tokens' int8 vectors one after another (each scale four times, ``SCALE_COPIES``: one load
    gives a pair of groups' eight lanes), ``y`` their outputs ([token, row], flat). Each row's
    codes are read from memory once for every token instead of once a token, and ``tokens_together`` tokens (or
    all, where fewer) share each unpacking of the codes and each load of the row's scales (the compiler keeps the
    unpacked codes in registers across the unrolled tokens): a decoding step is limited by memory, a prompt by
    this arithmetic. Measured on a Zen 4 (2 cores), 16 tokens a call through SmolLM2's 30 gate-and-up matrices
    (stacked, from memory): 4 tokens together 55 billion multiply-adds a second, 8 95, 16 86 (16 tokens' sums
    no longer fit the registers beside the unpacked codes). The matrices come stacked over ``layers`` layers
    ([layers, rows, ...], one where left out), and an integer argument after them picks one."""
    _check_groups(cols, 2 * GGUF_GROUP)
    TB = min(tokens, tokens_together)
    if tokens % TB:
        raise QuantizedShapeError(f"{tokens} tokens do not split into steps of {TB} tokens")
    instruction = instruction or int8.int8_instruction(machine.cpu_target())
    if instruction not in ("vnni", "avx2"):
        raise CourseError(f"int8_gemm needs AVX-512 VNNI or AVX2 ('vnni' or 'avx2'); this CPU has {instruction!r}")
    groups, pairs, L = cols // GGUF_GROUP, cols // (2 * GGUF_GROUP), layers or 1

    def products(codes, xq, layer, n, t, p):
        return pair_products(codes, [layer, n, p * 32], xq, t * cols + p * 64, instruction)

    def scales(scale, xscale, layer, n, t, p):
        """The row's two scales spread over their groups' lanes (the same for every token: computed once for
        the unrolled tokens) times the token's, which come spread already (``xscale``: four copies each)."""
        weight = T.Cast("float32x2", scale.vload([layer, n, 2 * p], "float16x2"))
        return T.Shuffle([weight, weight, weight, weight], [0, 0, 0, 0, 1, 1, 1, 1]) * xscale.vload(
            [(t * groups + 2 * p) * SCALE_COPIES], "float32x8")

    def offsets(minimum, xsum, layer, n, t, p):
        return pair_offsets(minimum, [layer, n, 2 * p], xsum, t * groups + 2 * p)

    @T.prim_func
    def gemm(xq: T.Buffer((tokens * cols,), "int8"), xscale: T.Buffer((tokens * groups * SCALE_COPIES,), "float32"),
             xsum: T.Buffer((tokens * groups,), "float32"), codes: T.Buffer((L, rows, cols // 2), "uint8"),
             scale: T.Buffer((L, rows, groups), "float16"), minimum: T.Buffer((L, rows, groups), "float16"),
             layer: T.int32, y: T.Buffer((tokens * rows,), "float32")):
        T.func_attr({"global_symbol": "main", "tirx.noalias": True})
        for n in T.parallel(rows):
            for tb in range(tokens // TB):
                lanes = T.decl_buffer((TB, 8), "float32", scope="global")   # registers (see int8_gemv)
                mins = T.decl_buffer((TB, 2), "float32", scope="global")
                for t in T.unroll(TB):
                    lanes[t, T.ramp(0, 1, 8)] = T.broadcast(T.float32(0), 8)
                    mins[t, T.ramp(0, 1, 2)] = T.broadcast(T.float32(0), 2)
                for p in range(pairs):
                    for t in T.unroll(TB):
                        lanes[t, T.ramp(0, 1, 8)] = lanes[t, T.ramp(0, 1, 8)] + T.Cast(
                            "float32x8", products(codes, xq, layer, n, tb * TB + t, p)) * scales(
                            scale, xscale, layer, n, tb * TB + t, p)
                        mins[t, T.ramp(0, 1, 2)] = mins[t, T.ramp(0, 1, 2)] + offsets(
                            minimum, xsum, layer, n, tb * TB + t, p)
                for t in T.unroll(TB):
                    y[(tb * TB + t) * rows + n] = mins[t, 0] + mins[t, 1] + lanes[t, 0] + lanes[t, 1] + \
                        lanes[t, 2] + lanes[t, 3] + lanes[t, 4] + lanes[t, 5] + lanes[t, 6] + lanes[t, 7]

    return gemm


def int8_arguments(matrix: Q4Matrix, x: Int8Vector, device: tvm.runtime.Device | None = None) -> list:
    """``int8_gemv``'s arguments on ``device``: the int8 vector, the matrix, the output."""
    device = device or tvm.cpu()
    rows, _ = matrix.shape
    if matrix.group != GGUF_GROUP:
        raise QuantizedShapeError(f"int8_gemv reads groups of {GGUF_GROUP}; this matrix has groups of {matrix.group}")
    arrays = (x.codes, x.scale, x.sums, matrix.codes, matrix.scale, matrix.minimum, np.zeros(rows, np.float32))
    return [tvm.runtime.tensor(a, device) for a in arrays]


def run_int8(lib: tvm.runtime.Module, matrix: Q4Matrix, x: np.ndarray) -> np.ndarray:
    """``W @ x`` computed by a compiled ``int8_gemv``, ``x`` quantized first."""
    args = int8_arguments(matrix, quantize_activation(x))
    lib["main"](*args)
    return args[-1].numpy()


def run_int8_tokens(lib: tvm.runtime.Module, matrix: Q4Matrix, xs: np.ndarray) -> np.ndarray:
    """``W @ x`` for each row ``x`` of ``xs`` by a compiled ``int8_gemm`` (one matrix: ``layers`` left out or 1),
    each quantized first: [tokens, rows]."""
    qs = [quantize_activation(x) for x in np.asarray(xs, np.float32)]
    rows, _ = matrix.shape
    arrays = [np.concatenate([q.codes for q in qs]), np.concatenate([np.repeat(q.scale, SCALE_COPIES) for q in qs]),
              np.concatenate([q.sums for q in qs])]
    arrays += [matrix.codes[None], matrix.scale[None], matrix.minimum[None]]
    args = [tvm.runtime.tensor(a) for a in arrays]
    y = tvm.runtime.tensor(np.zeros(len(qs) * rows, np.float32))
    lib["main"](*args, 0, y)
    return y.numpy().reshape(len(qs), rows)


def schedules(target: tvm.target.Target | None = None) -> dict:
    """The course's three builds of the product, by label: a function of a matrix shape to what ``build`` takes."""
    instruction = int8.int8_instruction(target or machine.cpu_target())
    return {"DLight cpu.GEMV": lambda shape: dlight_schedule(gemv(*shape), target),
            "roofline schedule, x in float32": lambda shape: roofline_schedule(gemv(*shape)),
            f"int8 dot products ({instruction}), x in int8": lambda shape: int8_gemv(*shape, instruction)}


def token_runner(kernels: dict[tuple[int, int], tvm.runtime.Module], matrices: list[Q4Matrix],
                 int8_input: bool) -> Callable[[], None]:
    """One token's products: each matrix times a vector of its width, back to back, as a decoding step reads
    them (``int8_input``: the vectors quantized beforehand, as a decoder quantizes each layer's input once)."""
    rng = np.random.default_rng(0)
    calls = []
    for m in matrices:
        x = rng.normal(size=m.shape[1]).astype(np.float32)
        args = int8_arguments(m, quantize_activation(x)) if int8_input else arguments(m, x)
        calls.append((kernels[m.shape]["main"], args))

    def run() -> None:
        for fn, args in calls:
            fn(*args)
    return run


def time_products(matrices: list[Q4Matrix], builds: dict, bandwidth_gbs: float, repeats: int) -> dict:
    """Each build (``schedules()``' form) over all ``matrices`` back to back, interleaved (``timing.measure``):
    milliseconds for the lot, GB/s of weights read, and that as a share of ``bandwidth_gbs``. Matrices far
    larger than the caches together are read from memory, as in a real step."""
    shapes = sorted({m.shape for m in matrices})
    runners = {label: token_runner({s: build(make(s)) for s in shapes}, matrices, label.startswith("int8"))
               for label, make in builds.items()}
    nbytes = sum(m.nbytes for m in matrices)
    rows = {}
    for t in timing.measure(runners, repeats=repeats):
        gbs = nbytes / (t.median_ms * 1e6)
        rows[t.label] = {"median_ms": t.median_ms, "q1_ms": t.q1_ms, "q3_ms": t.q3_ms, "gb_per_s": gbs,
                         "share_of_bandwidth": gbs / bandwidth_gbs}
    return {"matrices": len(matrices), "bytes": nbytes, "schedules": rows}


def read_bandwidth_kernel(rows: int, cols: int) -> s_tir.Schedule:
    """A kernel that only reads: the sum of each row of a large float32 array, rows over the cores, 16 lanes a
    step. Its time per byte is the machine's read bandwidth, the roof of a matrix-vector product."""
    a = te.placeholder((rows, cols), "float32", name="a")
    k = te.reduce_axis((0, cols), "k")
    total = te.compute((rows,), lambda r: te.sum(a[r, k], axis=k), name=KERNEL_NAME)
    sch = s_tir.Schedule(tvm.IRModule({"main": te.create_prim_func([a, total])}))
    block = sch.get_sblock(KERNEL_NAME)
    r, k = sch.get_loops(block)
    k_outer, k_inner = sch.split(k, [None, 64])
    partial = sch.rfactor(k_inner, factor_axis=1)
    r, k_outer, k_inner = sch.get_loops(partial)
    sch.parallel(r)
    sch.vectorize(k_inner)
    sch.reverse_compute_at(sch.get_sblock(KERNEL_NAME), r)
    sch.decompose_reduction(partial, k_outer)
    return sch


def read_bandwidth_gbs(megabytes: int | None = None, repeats: int | None = None) -> float:
    """The machine's read bandwidth in GB/s, all cores reading, measured with ``read_bandwidth_kernel`` on an
    array far larger than the caches: the best of ``repeats`` passes (a pass reads every byte once)."""
    import time

    megabytes = megabytes or pick(512, 128)
    repeats = repeats or pick(7, 3)
    rows = 4 * machine.physical_core_count()
    cols = megabytes * 2**20 // 4 // rows // 64 * 64
    lib = build(read_bandwidth_kernel(rows, cols))
    device = tvm.cpu()
    a = tvm.runtime.tensor(np.ones((rows, cols), dtype=np.float32), device)
    out = tvm.runtime.tensor(np.zeros(rows, dtype=np.float32), device)
    lib["main"](a, out)
    if not np.allclose(out.numpy(), cols):
        raise RuntimeError("the bandwidth kernel summed wrongly: its time would mean nothing")
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        lib["main"](a, out)
        best = min(best, time.perf_counter() - start)
    return rows * cols * 4 / best / 1e9
