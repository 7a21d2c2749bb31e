"""int8 dot products on the CPU's VNNI instruction (``vpdpbusd``), with a tensor intrinsic that works
on the LLVM 22 inside TVM 0.27: Day 12's int8 kernels (``tuning.intrinsics`` registers it for tuning).

TVM 0.27 ships x86 int8 intrinsics (``tvm.s_tir.tensor_intrin.x86``) that do not work here:

* ``dot_16x4_vnni`` passes ``<16 x i32>`` operands to ``llvm.x86.avx512.vpdpbusd.512``, whose
  signature LLVM 22 changed to ``(<16 x i32>, <64 x i8>, <64 x i8>)``: every build fails the
  LLVM verifier ("Call parameter type does not match function signature").
* Both shipped descriptions declare the 16x4 weight tile without strides, while the
  implementations load 64 contiguous bytes. Tensorize then accepts a tile of a plain ``[N, K]``
  weight (rows ``K`` apart) and reads the wrong bytes: only lane 0 of each 16 comes out right.

``VNNI_INTRIN`` fixes both: the operands have LLVM 22's types, and the tile is declared compact
(``strides=[4, 1]``), so a build tensorized on a plain weight fails ("buffer match constraint for
B.strides_0 unmet") instead of computing wrong numbers, and a packed one,
``[N/16, K/4, 16, 4]`` (``pack_weight``), where each tile is 64 contiguous bytes, builds and is exact.

A CPU with AVX2 and no AVX-512 VNNI (a Zen 3, a Haswell) has no ``vpdpbusd``; ``AVX2_INTRIN`` does the same
4-byte dot products with ``vpmaddubsw`` (pairs of u8 x s8 products summed into int16) and ``vpmaddwd`` by ones
(pairs of those into int32), on 8 lanes. The int16 step saturates unless the activations keep to 7 bits
(``ACTIVATION_MAX_AVX2``), so the int8 model is quantized with 0..127 there (``activation_max``), as PyTorch's
``reduce_range`` does for CPUs without VNNI. Without it, LLVM's own code widens every byte to 32 bits first.

Introduced on Day 12.
"""

from __future__ import annotations

import numpy as np
import tvm
from tvm import te
from tvm.s_tir import meta_schedule as ms
from tvm.script import tirx as T

from .errors import CourseError

VNNI_INTRIN = "course_dot_16x4_vnni_llvm22"
LANES, GROUP = 16, 4  # vpdpbusd: 16 int32 lanes, each the sum of 4 u8 x s8 products
AVX2_INTRIN = "course_dot_8x4_avx2"
AVX2_LANES = 8  # vpmaddubsw + vpmaddwd on 256 bits: 8 int32 lanes, each the sum of 4 products
ACTIVATION_MAX_AVX2 = 127  # vpmaddubsw adds two u8 x s8 products into int16: 2 * 127 * 128 fits, 2 * 255 * 128 does not


def _dot_desc(lanes: int):
    """What both intrinsics compute: ``lanes`` int32 sums, each adding 4 products of a uint8 by an int8, the
    weight tile compact (``strides=[4, 1]``: a tile of an unpacked weight does not match)."""

    @T.prim_func(s_tir=True)
    def desc(
        A: T.Buffer((4,), "uint8", offset_factor=1),
        B: T.Buffer((lanes, 4), "int8", offset_factor=1, strides=[4, 1]),
        C: T.Buffer((lanes,), "int32", offset_factor=1),
    ) -> None:
        with T.sblock("root"):
            T.reads(C[0:lanes], A[0:4], B[0:lanes, 0:4])
            T.writes(C[0:lanes])
            for i in T.serial(0, lanes):
                for k in T.serial(0, 4):
                    with T.sblock("update"):
                        vi, vk = T.axis.remap("SR", [i, k])
                        C[vi] = C[vi] + T.cast(A[vk], "int32") * T.cast(B[vi, vk], "int32")

    return desc


@T.prim_func(s_tir=True)
def _dot_16x4_vnni_llvm22(
    A: T.Buffer((4,), "uint8", offset_factor=1),
    B: T.Buffer((16, 4), "int8", offset_factor=1, strides=[4, 1]),
    C: T.Buffer((16,), "int32", offset_factor=1),
) -> None:
    with T.sblock("root"):
        T.reads(C[0:16], A[0:4], B[0:16, 0:4])
        T.writes(C[0:16])
        # the 4 activation bytes, repeated for all 16 lanes, as 64 bytes
        A_i32 = T.reinterpret(A.vload([0], "uint8x4"), dtype="int32")
        A_u8x64 = T.reinterpret(T.broadcast(A_i32, 16), dtype="uint8x64")
        B_i8x64 = B.vload([0, 0], dtype="int8x64")  # the packed 16x4 tile: 64 contiguous bytes
        C[T.ramp(T.int32(0), 1, 16)] = T.call_llvm_pure_intrin(
            T.llvm_lookup_intrinsic_id("llvm.x86.avx512.vpdpbusd.512"),
            C.vload([0], dtype="int32x16"),
            A_u8x64,
            B_i8x64,
            dtype="int32x16",
        )


@T.prim_func(s_tir=True)
def _dot_8x4_avx2(
    A: T.Buffer((4,), "uint8", offset_factor=1),
    B: T.Buffer((8, 4), "int8", offset_factor=1, strides=[4, 1]),
    C: T.Buffer((8,), "int32", offset_factor=1),
) -> None:
    with T.sblock("root"):
        T.reads(C[0:8], A[0:4], B[0:8, 0:4])
        T.writes(C[0:8])
        # the 4 activation bytes, repeated for all 8 lanes, as 32 bytes
        A_i32 = T.reinterpret(A.vload([0], "uint8x4"), dtype="int32")
        A_u8x32 = T.reinterpret(T.broadcast(A_i32, 8), dtype="uint8x32")
        B_i8x32 = B.vload([0, 0], dtype="int8x32")  # an 8x4 tile: 32 contiguous bytes
        # vpmaddubsw: 16 sums of 2 u8 x s8 products, in int16 (saturating); vpmaddwd by ones: 8 sums of 4, in int32
        pairs = T.call_llvm_pure_intrin(T.llvm_lookup_intrinsic_id("llvm.x86.avx2.pmadd.ub.sw"), A_u8x32, B_i8x32,
                                        dtype="int16x16")
        quads = T.call_llvm_pure_intrin(T.llvm_lookup_intrinsic_id("llvm.x86.avx2.pmadd.wd"), pairs,
                                        T.broadcast(T.int16(1), 16), dtype="int32x8")
        C[T.ramp(T.int32(0), 1, 8)] = C.vload([0], dtype="int32x8") + quads


def register_vnni_intrinsic() -> str:
    """Register ``VNNI_INTRIN`` in this process (idempotent) and return its name, for ``sch.tensorize``
    or MetaSchedule's ``MultiLevelTilingWithIntrin``. TVM's own intrinsics are not needed for it."""
    from tvm.s_tir import TensorIntrin

    TensorIntrin.register(VNNI_INTRIN, _dot_desc(LANES), _dot_16x4_vnni_llvm22, override=True)
    return VNNI_INTRIN


def register_avx2_intrinsic() -> str:
    """Register ``AVX2_INTRIN`` (idempotent) and return its name: 8 int32 lanes, each the sum of 4 uint8 x int8
    products, with ``vpmaddubsw`` then ``vpmaddwd``. Exact only for activations up to ``ACTIVATION_MAX_AVX2``:
    ``vpmaddubsw`` saturates its pair sums at int16."""
    from tvm.s_tir import TensorIntrin

    TensorIntrin.register(AVX2_INTRIN, _dot_desc(AVX2_LANES), _dot_8x4_avx2, override=True)
    return AVX2_INTRIN


def int8_instruction(target: tvm.target.Target) -> str:
    """What the course's int8 kernels multiply with on ``target``: ``"vnni"`` (AVX-512 VNNI, ``vpdpbusd``),
    ``"avx2"`` (``vpmaddubsw``, 7-bit activations) or ``"generic"`` (whatever LLVM vectorizes: no AVX2)."""
    if has_vnni(target):
        return "vnni"
    return "avx2" if tvm.target.codegen.target_has_features("avx2", target) else "generic"


def activation_max(target: tvm.target.Target) -> int:
    """The largest uint8 activation code the int8 kernels can take exactly on ``target``: 255, or 127 where
    they run ``vpmaddubsw`` (the reason PyTorch's x86 configurations offer ``reduce_range``)."""
    return ACTIVATION_MAX_AVX2 if int8_instruction(target) == "avx2" else 255


def has_vnni(target: tvm.target.Target) -> bool:
    """True when ``target``'s CPU has AVX-512 VNNI (``vpdpbusd`` on 512 bits: Cascade Lake, Zen 4 and later).

    AVX-VNNI (the same instruction on 256 bits, Alder Lake class, without AVX-512) does not count: the
    course's intrinsic is the 512-bit one, and such a CPU gets ``generic_space`` (exact, no ``vpdpbusd``)."""
    return bool(tvm.target.codegen.target_has_features("avx512vnni", target))


def pack_weight(weight: np.ndarray) -> np.ndarray:
    """An int8 ``[N, K]`` weight as ``[N/16, K/4, 16, 4]``: each 16x4 tile 64 contiguous bytes."""
    n, k = weight.shape
    if n % LANES or k % GROUP:
        raise CourseError(f"pack_weight needs N a multiple of {LANES} and K of {GROUP}; got a [{n}, {k}] weight.")
    return np.ascontiguousarray(weight.reshape(n // LANES, LANES, k // GROUP, GROUP).transpose(0, 2, 1, 3))


def matmul_u8s8_compute(A: te.Tensor, W: te.Tensor) -> te.Tensor:
    """The TE compute of ``C[..., n] = sum_k A[..., k] * W[n, k]`` in int32, ``A`` uint8 (a matrix, or an
    NHWC activation for a 1x1 convolution), ``W`` int8, plain ``[n, k]`` or packed ``[n/16, k/4, 16, 4]``
    (``pack_weight``)."""
    *rows, k = (int(d) for d in A.shape)
    r = te.reduce_axis((0, k), name="k")
    if len(W.shape) == 4:
        n = int(W.shape[0]) * LANES
        weight = lambda j, kk: W[j // LANES, kk // GROUP, j % LANES, kk % GROUP]  # noqa: E731
    else:
        n = int(W.shape[0])
        weight = lambda j, kk: W[j, kk]  # noqa: E731

    def dot(*index):
        *row, j = index
        return te.sum(A[(*row, r)].astype("int32") * weight(j, r).astype("int32"), axis=r)

    return te.compute((*rows, n), dot, name="C")


def matmul_u8s8(m: int, n: int, k: int, packed: bool = True) -> tvm.IRModule:
    """``C[m, n] = sum_k A[m, k] * W[n, k]`` in int32, for uint8 activations and int8 weights
    (plain ``[n, k]``, or packed as ``pack_weight`` does)."""
    A = te.placeholder((m, k), "uint8", name="A")
    shape = (n // LANES, k // GROUP, LANES, GROUP) if packed else (n, k)
    W = te.placeholder(shape, "int8", name="W")
    C = matmul_u8s8_compute(A, W)
    return tvm.IRModule({"main": te.create_prim_func([A, W, C]).with_attr("global_symbol", "main")})


def tensorize_matmul(mod: tvm.IRModule, intrin: str = VNNI_INTRIN, lanes: int | None = None) -> tvm.IRModule:
    """Schedule ``matmul_u8s8`` by hand around an intrinsic: 16 (VNNI) or 8 (AVX2) outputs by 4 inputs per
    instruction; an 8x4 tile of the packed 16x4 weight is 32 contiguous bytes, so both take ``pack_weight``'s layout.
    Another registered intrinsic over ``lanes`` outputs by 4 inputs (``lanes`` dividing 16) takes it too."""
    known = {VNNI_INTRIN: LANES, AVX2_INTRIN: AVX2_LANES}
    if intrin in known:
        (register_vnni_intrinsic if intrin == VNNI_INTRIN else register_avx2_intrinsic)()
        lanes = known[intrin]
    elif lanes is None or lanes <= 0 or LANES % lanes:
        raise CourseError(f"tensorize_matmul knows {VNNI_INTRIN} and {AVX2_INTRIN}; for {intrin!r} give its number of "
                          f"output lanes (a divisor of {LANES}), got lanes={lanes!r}.")
    sch = tvm.s_tir.Schedule(mod)
    block = sch.get_sblock("C")
    i, j, k = sch.get_loops(block)
    jo, ji = sch.split(j, [None, lanes])
    ko, ki = sch.split(k, [None, GROUP])
    sch.reorder(i, jo, ko, ji, ki)
    sch.decompose_reduction(block, ko)
    sch.tensorize(ji, intrin)
    return sch.mod


def generic_space() -> ms.space_generator.PostOrderApply:
    """LLVM's generic search space (tiling, inlining, parallel, vectorize, unroll; no tensor intrinsic),
    for int8 kernels on a CPU without AVX-512 VNNI.

    MetaSchedule's default space tensorizes int8 kernels with TVM's own intrinsics: on an AVX-VNNI CPU
    without AVX-512 (Alder Lake) the 512-bit ``dot_16x4_vnni``, which does not build with TVM 0.27's
    LLVM; on an AVX-512 CPU without VNNI (Skylake-X) ``dot_16x4_avx512``, whose ``vpmaddubsw`` adds pairs
    of uint8 x int8 products into int16 and saturates with full-range activations (and whose weight tile
    is declared without strides). Measured on a u8 x s8 matmul tuned for ``skylake-avx512``: all 4096
    outputs wrong. Here LLVM vectorizes the integer loops itself (bytes widened, then ``vpmaddwd``):
    exact, on any x86 CPU.
    """
    return ms.space_generator.PostOrderApply(sch_rules="llvm", postprocs="llvm", mutator_probs="llvm")


def vnni_space() -> ms.space_generator.PostOrderApply:
    """A MetaSchedule search space that tiles int8 kernels around ``VNNI_INTRIN``.

    The default x86 space puts TVM's own, broken VNNI rule into every int8 search (each candidate
    then fails to build: "Cannot broadcast lanes=16 to 32"). This one uses the course's intrinsic:
    multi-level tiling with the intrinsic innermost, vectorising with no nested extent (the init
    loop's broadcast breaks otherwise), and RewriteTensorize to put the instruction in. Its
    mutators are LLVM's (tile sizes, compute locations, unrolling, parallel extents): without
    them the evolutionary search never changes a candidate and is random sampling ranked by
    the cost model.
    """
    return tensorized_space(register_vnni_intrinsic())


def avx2_space() -> ms.space_generator.PostOrderApply:
    """``vnni_space`` around ``AVX2_INTRIN`` (``vpmaddubsw`` + ``vpmaddwd``), for CPUs with AVX2 and no AVX-512
    VNNI: four multiply-adds of bytes per int32 lane and instruction pair, where LLVM's own code widens every byte
    to 32 bits first. Exact for activations up to ``ACTIVATION_MAX_AVX2`` only."""
    return tensorized_space(register_avx2_intrinsic())


def tensorized_space(intrin: str) -> ms.space_generator.PostOrderApply:
    """Multi-level tiling around the tensor intrinsic ``intrin``, LLVM's mutators, ``RewriteTensorize``."""
    rule, post = ms.schedule_rule, ms.postproc
    rules = [
        rule.AutoInline(into_producer=False, into_consumer=True, inline_const_tensor=True, disallow_if_then_else=True,
                        require_injective=True, require_ordered=True, disallow_op=None),
        rule.AddRFactor(max_jobs_per_core=16, max_innermost_factor=64),
        rule.MultiLevelTilingWithIntrin(intrin, structure="SSRSRS", tile_binds=None, max_innermost_factor=64,
                                        vector_load_lens=None, reuse_read=None,
                                        reuse_write=rule.ReuseType(req="may", levels=[1, 2], scope="global")),
        rule.ParallelizeVectorizeUnroll(max_jobs_per_core=16, max_vectorize_extent=-1,
                                        unroll_max_steps=[0, 16, 64, 512], unroll_explicit=True),
    ]
    postprocs = [post.DisallowDynamicLoop(), post.RewriteParallelVectorizeUnroll(), post.RewriteReductionBlock(),
                 post.RewriteTensorize(vectorize_init_loop=True)]
    return ms.space_generator.PostOrderApply(sch_rules=rules, postprocs=postprocs, mutator_probs="llvm")
