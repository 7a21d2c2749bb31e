"""Schedules for a decoding step's kernels, where TVM 0.27's DLight has none that works.

One decoding step multiplies one token's vector by every weight matrix once: ``out[s] = sum_r x[r] * W[s, r]``,
bound by the bytes of ``W`` it reads. DLight's CPU rule for it (``dl.cpu.GEMV``) schedules only this form, the
reduction innermost in ``W`` (``relax.transform.FuseTransposeMatmul`` keeps PyTorch's ``[out, in]`` weights so;
lifting the transposes instead stores them ``[in, out]`` and GEMV declines every product), and on that form its
schedule vectorizes 128 outputs at once with the reduction inside, which LLVM did not finish compiling in 100 s
for a ``[384, 96]`` product (a width-96 model's MLP). This rule reads ``W`` as it lies: each output's row is
summed in vector lanes along the reduction (``rfactor``), the lanes added once at the end, the outputs split
between the cores, and a fused epilogue (the bias) computed right after each output. The lanes' partial sums
live in a ``global`` buffer of a few lanes, which TVM places on the stack: in ``local`` scope each row allocated
them from TVM's heap workspace (a runtime call per row, 22 against 30 GB/s on a Zen 4's 768-wide rows).

``ParallelSpatial`` spreads the step's other single-loop-nest kernels (the cache's concatenations, the
attention's products over the past, the transposes) over the cores, which the default pipeline leaves on one.
DLight's CPU ``Reduction`` is not used: on a row of one token (a decoding step's layer norm, ``(1, 1, 768)``)
it puts both sums inside the parallel loop over the outputs, so each of the 768 outputs computes them again
(1.1 ms against 4 us for the plain loops, measured on a Zen 4).
"""

from __future__ import annotations

import tvm
from tvm import s_tir, tirx
from tvm.s_tir.dlight.analysis import normalize_prim_func
from tvm.s_tir.dlight.analysis.gemv import is_gemv, normalize
from tvm.s_tir.dlight.base import ScheduleRule, try_inline, try_inline_contiguous_spatial

from .. import machine


class RowGEMV(ScheduleRule):
    """``W[s, r]`` times a vector, ``r`` innermost in memory: each row summed in ``lanes`` float32 lanes."""

    def __init__(self, lanes: int | None = None) -> None:
        self.lanes = lanes

    def apply(self, func: tirx.PrimFunc, target: tvm.target.Target, _: bool) -> s_tir.Schedule | None:
        if not isinstance(func, tirx.PrimFunc):
            return None
        sch = s_tir.Schedule(func)
        infos = try_inline_contiguous_spatial(sch, normalize_prim_func(sch))
        if infos is None or len(infos) not in (1, 2) or (len(infos) == 2 and not infos[1].is_injective()):
            return None
        main = infos[0]
        if len(main.iters) not in (2, 3) or is_gemv(sch, main) is None or normalize(sch, main) is not True:
            return None
        lanes = self.lanes or machine.float32_lanes(target)
        block = main.block_rv
        _batch, rows, reduce, unit = sch.get_loops(block)
        reduce = sch.fuse(reduce, unit)
        _, lane = sch.split(reduce, factors=[None, lanes])
        partial = sch.rfactor(lane, factor_axis=0)
        _, rows, chunk, lane = sch.get_loops(partial)   # the partial sums' own loop nest, in the split's order
        sch.reverse_compute_at(block, rows)               # the lanes added right after each row's chunks
        if len(infos) == 2:
            sch.reverse_compute_at(infos[1].block_rv, rows)
        sch.parallel(rows)
        sch.set_scope(partial, 0, "global")  # a few lanes: a stack array; "local" would be a heap allocation per row
        sch.vectorize(lane)
        sch.decompose_reduction(partial, chunk)
        return sch


class ParallelSpatial(ScheduleRule):
    """A kernel of one loop nest (a copy, a concatenation, a batched product over the past): its leading spatial
    loops of known extent fused and run in parallel. A pure reshape is left alone: the default pipeline turns it
    into a view (``vm.builtin.reshape``), which a scheduled copy would no longer be."""

    def apply(self, func: tirx.PrimFunc, target: tvm.target.Target, _: bool) -> s_tir.Schedule | None:
        from tvm import relax

        if not isinstance(func, tirx.PrimFunc) or relax.analysis.has_reshape_pattern(func):
            return None
        sch = s_tir.Schedule(func)
        infos = normalize_prim_func(sch)
        if infos is None:
            return None
        infos = try_inline(sch, infos)
        if infos is None or len(infos) != 1:
            return None
        loops = sch.get_loops(infos[0].block_rv)
        leading = []
        for loop, kind in zip(loops, infos[0].dom_kind()):
            if kind != "S" or not isinstance(sch.get(loop).extent, tirx.IntImm):
                break
            leading.append(loop)
        if len(leading) == len(loops):  # the innermost loop stays serial, for LLVM to vectorize
            leading.pop()
        if not leading:
            return None
        sch.parallel(sch.fuse(*leading) if len(leading) > 1 else leading[0])
        return sch
