"""bfloat16 dot products on AVX-512 BF16's ``vdpbf16ps``, with a tensor intrinsic TVM 0.27 can build.

A bfloat16 is the upper half of a float32: the same 8-bit exponent, 8 bits of mantissa instead of 24.
``vdpbf16ps`` multiplies 32 pairs of them and adds each pair's two products into one of 16 float32
sums: 32 multiply-adds where a float32 FMA does 16, on CPUs with AVX-512 BF16 (Zen 4 and later; Intel
Xeons of Cooper Lake and from Sapphire Rapids on, not Ice Lake). It is what OpenVINO's default precision
runs on such a CPU.

TVM 0.27 cannot put it into a kernel as it stands, measured here:

* its CPU pipeline rewrites every bfloat16 computation into float32 (``BF16ComputeLegalize``) and stores
  bfloat16 as uint16 (``BF16StorageLegalize``), so an intrinsic written over bfloat16 vectors reaches
  LLVM with float or i16 operands, where LLVM 22's ``llvm.x86.avx512bf16.dpbf16ps.512`` takes
  ``<32 x bfloat>``: "Call parameter type does not match function signature";
* without those two passes the LLVM code generator crashes on bfloat16.

So the course keeps a bfloat16 as its 16 bits in a ``uint16`` tensor, writes the arithmetic as float32
on those bits (``widen``: the bits shifted into the top half of a float32, which is exact), and
``BF16_INTRIN`` calls a four-line LLVM IR function, linked into the kernel through the
``pragma_import_llvm`` attribute, that bitcasts the i16 vectors to bfloat and calls the instruction.
No bfloat16 type appears anywhere in the TIR, so nothing is legalized, and the products are exact:
the result differs from float32 arithmetic on the same bf16 values only in the order of the additions.

Weights are packed ``[N/16, K/2, 16, 2]`` (``pack_weight``): each 16x2 tile 64 contiguous bytes, the
operand the instruction reads.

Introduced on Day 12.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import tvm
from tvm import te
from tvm.s_tir import meta_schedule as ms
from tvm.script import tirx as T

from .errors import CourseError
from .int8 import tensorized_space

BF16_INTRIN = "course_dot_16x2_bf16"
LANES, PAIR = 16, 2  # vdpbf16ps: 16 float32 lanes, each the sum of 2 bf16 x bf16 products
_DOT = "course_vdpbf16ps"
# The instruction on i16 vectors, linked into each kernel that uses it (linkonce_odr: one copy per module).
_LLVM_IR = f"""
declare <16 x float> @llvm.x86.avx512bf16.dpbf16ps.512(<16 x float>, <32 x bfloat>, <32 x bfloat>)
define linkonce_odr <16 x float> @{_DOT}(<16 x float> %c, <32 x i16> %a, <32 x i16> %b) alwaysinline {{
  %a16 = bitcast <32 x i16> %a to <32 x bfloat>
  %b16 = bitcast <32 x i16> %b to <32 x bfloat>
  %sum = call <16 x float> @llvm.x86.avx512bf16.dpbf16ps.512(<16 x float> %c, <32 x bfloat> %a16, <32 x bfloat> %b16)
  ret <16 x float> %sum
}}
"""


def has_bf16(target: tvm.target.Target) -> bool:
    """True when ``target``'s CPU has AVX-512 BF16 (``vdpbf16ps``: Zen 4 and later; Intel Cooper Lake, and
    Sapphire Rapids on, not Ice Lake)."""
    return bool(tvm.target.codegen.target_has_features("avx512bf16", target))


def to_bits(x: np.ndarray) -> np.ndarray:
    """float32 values as the bits of the nearest bfloat16 (round to nearest even), in ``uint16``."""
    return np.asarray(x, dtype=np.float32).astype(ml_dtypes.bfloat16).view(np.uint16)


def from_bits(bits: np.ndarray) -> np.ndarray:
    """The float32 values of bfloat16 bits (exact)."""
    return np.asarray(bits, dtype=np.uint16).view(ml_dtypes.bfloat16).astype(np.float32)


def widen(bits: tvm.tirx.PrimExpr) -> tvm.tirx.PrimExpr:
    """A bfloat16's bits (uint16) as the float32 it is: the bits in the top half of a float32's."""
    return tvm.tirx.reinterpret("float32", bits.astype("uint32") << tvm.tirx.const(16, "uint32"))


@T.prim_func(s_tir=True)
def _dot_desc(
    A: T.Buffer((2,), "uint16", offset_factor=1),
    B: T.Buffer((16, 2), "uint16", offset_factor=1, strides=[2, 1]),
    C: T.Buffer((16,), "float32", offset_factor=1),
) -> None:
    with T.sblock("root"):
        T.reads(C[0:16], A[0:2], B[0:16, 0:2])
        T.writes(C[0:16])
        for i in T.serial(0, 16):
            for k in T.serial(0, 2):
                with T.sblock("update"):
                    vi, vk = T.axis.remap("SR", [i, k])
                    C[vi] = C[vi] + T.reinterpret("float32", T.shift_left(T.Cast("uint32", A[vk]), T.uint32(16))) * \
                        T.reinterpret("float32", T.shift_left(T.Cast("uint32", B[vi, vk]), T.uint32(16)))


@T.prim_func(s_tir=True)
def _dot_16x2_bf16(
    A: T.Buffer((2,), "uint16", offset_factor=1),
    B: T.Buffer((16, 2), "uint16", offset_factor=1, strides=[2, 1]),
    C: T.Buffer((16,), "float32", offset_factor=1),
) -> None:
    with T.sblock("root"):
        T.reads(C[0:16], A[0:2], B[0:16, 0:2])
        T.writes(C[0:16])
        with T.attr(T.int32(0), "pragma_import_llvm", _LLVM_IR):
            # the activation's pair, repeated for all 16 lanes, as 32 halves
            A_pair = T.reinterpret(A.vload([0], "uint16x2"), dtype="uint32")
            A_x32 = T.reinterpret(T.broadcast(A_pair, 16), dtype="uint16x32")
            C[T.ramp(T.int32(0), 1, 16)] = T.call_pure_extern(
                "float32x16", _DOT, C.vload([0], dtype="float32x16"), A_x32, B.vload([0, 0], dtype="uint16x32"))


def register_bf16_intrinsic() -> str:
    """Register ``BF16_INTRIN`` in this process (idempotent) and return its name, for ``sch.tensorize`` or
    MetaSchedule's ``MultiLevelTilingWithIntrin`` (``bf16_space``)."""
    from tvm.s_tir import TensorIntrin

    TensorIntrin.register(BF16_INTRIN, _dot_desc, _dot_16x2_bf16, override=True)
    return BF16_INTRIN


def pack_weight(bits: np.ndarray) -> np.ndarray:
    """A bfloat16 ``[N, K]`` weight (its bits, ``to_bits``) as ``[N/16, K/2, 16, 2]``: each 16x2 tile 64
    contiguous bytes."""
    n, k = bits.shape
    if n % LANES or k % PAIR:
        raise CourseError(f"pack_weight needs N a multiple of {LANES} and K of {PAIR}; got a [{n}, {k}] weight.")
    return np.ascontiguousarray(np.asarray(bits, np.uint16).reshape(n // LANES, LANES, k // PAIR, PAIR).transpose(0, 2, 1, 3))


def matmul_bf16_compute(A: te.Tensor, W: te.Tensor) -> te.Tensor:
    """``C[m, n] = sum_k A[m, k] * W[n, k]`` in float32 from bfloat16 bits: ``A`` ``[m, k]``, ``W`` packed
    ``[n/16, k/2, 16, 2]`` (``pack_weight``), both ``uint16``."""
    m, k = (int(d) for d in A.shape)
    n = int(W.shape[0]) * LANES
    r = te.reduce_axis((0, k), name="k")
    return te.compute((m, n), lambda i, j: te.sum(
        widen(A[i, r]) * widen(W[j // LANES, r // PAIR, j % LANES, r % PAIR]), axis=r), name="C")


def matmul_bf16(m: int, n: int, k: int) -> tvm.IRModule:
    """``matmul_bf16_compute`` as a module whose ``main(A, W, C)`` writes ``C``."""
    if n % LANES or k % PAIR:
        raise CourseError(f"matmul_bf16 needs n a multiple of {LANES} and k of {PAIR}; got n={n}, k={k}.")
    A = te.placeholder((m, k), "uint16", name="A")
    W = te.placeholder((n // LANES, k // PAIR, LANES, PAIR), "uint16", name="W")
    C = matmul_bf16_compute(A, W)
    return tvm.IRModule({"main": te.create_prim_func([A, W, C]).with_attr("global_symbol", "main")})


def tensorize_matmul(mod: tvm.IRModule, rows: int = 7) -> tvm.IRModule:
    """Schedule ``matmul_bf16`` by hand around ``BF16_INTRIN``: up to ``rows`` rows of 16 outputs kept in
    registers across the reduction (the most that divide the matrix's rows: a ragged block would not match
    the intrinsic), one pair of inputs per instruction, the blocks of rows spread over the cores."""
    register_bf16_intrinsic()
    sch = tvm.s_tir.Schedule(mod)
    block = sch.get_sblock("C")
    i, j, k = sch.get_loops(block)
    m = int(sch.get(i).extent)
    io, ii = sch.split(i, [None, max(r for r in range(1, rows + 1) if m % r == 0)])
    jo, ji = sch.split(j, [None, LANES])
    ko, ki = sch.split(k, [None, PAIR])
    sch.reorder(io, jo, ko, ii, ji, ki)
    sch.parallel(io)
    sch.decompose_reduction(block, ko)
    sch.tensorize(ji, BF16_INTRIN)
    sch.unroll(ii)
    return sch.mod


def bf16_space() -> ms.space_generator.PostOrderApply:
    """A MetaSchedule search space that tiles bfloat16 kernels around ``BF16_INTRIN`` (the course's int8
    spaces' rules, ``int8.tensorized_space``)."""
    return tensorized_space(register_bf16_intrinsic())
