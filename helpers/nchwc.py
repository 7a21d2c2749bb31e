"""A whole model in NCHW{b}c: Day 7's channel-blocked layout for every convolution, not one kernel.

ONNX Runtime's fastest CPU path (its ``NchwcTransformer``) and oneDNN both keep a CNN's activations in
channel blocks of one vector (16 floats with AVX-512, 8 with AVX2) from one convolution to the next,
depthwise ones included. TVM's import keeps NCHW, and tuning then vectorizes along a row of pixels
(7 or 14 wide in MobileNetV2's late layers). ``layout_passes(block)`` converts a Relax module before
legalization: Relax's ``ConvertLayout`` moves every convolution whose channel counts the block divides to
``NCHW{b}c`` (weights ``OIHW{b}i{b}o``, depthwise ``OIHW{b}o``) and carries the layout through the
element-wise work after it (BatchNorm's arithmetic, ReLU6, residual adds), so layout transforms remain
only where a convolution cannot be blocked (MobileNetV2's first one, on 3 channels). TOPI has no
legalization for blocked convolutions in Relax, so ``legalize_conv2d`` supplies one.

Introduced on Day 7.
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Callable

import tvm
from tvm import relax, s_tir, te, topi
from tvm.relax.transform.legalize_ops import nn as _default_nn
from tvm.s_tir import meta_schedule as ms

from . import build
from .machine import cpu_target, float32_lanes

PLAIN = "NCHW"
_BLOCKED = re.compile(r"NCHW(\d+)c")


def block_for(target: tvm.target.Target | None = None) -> int:
    """The channel block that fills one vector register on ``target`` (default: this CPU): its
    ``machine.float32_lanes``, 16 floats with AVX-512, 8 with AVX2."""
    return float32_lanes(target)


def layout_name(block: int) -> str:
    """``NCHW16c`` for block 16; the name tuning settings record."""
    return f"NCHW{block}c"


def block_of(layout: str) -> int | None:
    """16 for ``NCHW16c``, None for ``NCHW``; an error for anything else."""
    if layout == PLAIN:
        return None
    found = _BLOCKED.fullmatch(layout)
    if not found or int(found.group(1)) < 1:
        raise ValueError(f"Unknown activation layout {layout!r}: use 'NCHW' or 'NCHW<block>c', e.g. 'NCHW16c'.")
    return int(found.group(1))


def _channel_block(channels: int, block: int) -> int | None:
    """The block for a tensor of ``channels``: ``block``, else half of it (24 channels: 8), else all of
    them in one chunk when there are fewer than a block (an RGB image: ``NCHW3c``), else None."""
    for candidate in (block, block // 2):
        if candidate >= 4 and channels % candidate == 0:
            return candidate
    return channels if channels < block else None


def _conv_layouts(block: int):
    """ConvertLayout's per-call choice: each side of a convolution in the largest block that divides it.

    Input and output may differ (144 -> 24 channels: 16 in, 8 out, as ``OIHW16i8o``; the stem's 3 -> 32:
    ``NCHW3c`` in, 16 out), so that an odd channel count costs no layout transform around it. A call no
    block fits (40 channels with a block of 16) keeps NCHW.
    """

    def choose(call: relax.Call) -> dict[str, list[str]]:
        if call.op.name != "relax.nn.conv2d":
            return {}
        x, w = call.args
        c_in, c_out, groups = int(x.ty.shape[1]), int(w.ty.shape[0]), int(call.attrs.groups)
        b_in, b_out = _channel_block(c_in, block), _channel_block(c_out, block)
        if b_in is None or b_out is None or groups not in (1, c_in) or (groups > 1 and c_out != c_in):
            return {"relax.nn.conv2d": [PLAIN, "OIHW", PLAIN]}
        weight = f"OIHW{b_out}o" if groups > 1 else f"OIHW{b_in}i{b_out}o"
        return {"relax.nn.conv2d": [layout_name(b_in), weight, layout_name(b_out)]}

    return choose


def _number(bound) -> float:
    """A clip bound (a ``PrimValue`` holding a ``FloatImm``) as a Python float."""
    while hasattr(bound, "value"):
        bound = bound.value
    return float(bound)


@relax.expr_functor.mutator
class _ClipAsMaxMin(relax.PyExprMutator):
    """``clip`` has no layout rule in ``ConvertLayout``; ``maximum`` then ``minimum`` (element-wise) have."""

    def visit_call_(self, call: relax.Call) -> relax.Expr:
        call = super().visit_call_(call)
        if isinstance(call.op, tvm.ir.Op) and call.op.name == "relax.clip":
            x, low, high = call.args
            dtype = call.ty.dtype
            return relax.op.minimum(relax.op.maximum(x, relax.const(_number(low), dtype)), relax.const(_number(high), dtype))
        return call


@relax.transform.function_pass(opt_level=0, name="ClipAsMaxMin")
def clip_as_max_min(func: relax.Function, _mod: tvm.IRModule, _ctx) -> relax.Function:
    """Every ``clip`` (ReLU6) as ``minimum(maximum(x, low), high)``, so the layout can pass through it."""
    return _ClipAsMaxMin().visit_expr(func)


def layout_passes(layout: str) -> list[tvm.transform.Pass]:
    """The passes that put ``mod``'s convolutions in ``layout`` (none for NCHW); run before ``LegalizeOps``."""
    block = block_of(layout)
    if block is None:
        return []
    return [clip_as_max_min, relax.transform.ConvertLayout({}, _conv_layouts(block))]


DEPTHWISE_BLOCK = "depthwise_conv2d_NCHWc"  # the name ``_depthwise_nchwc`` gives its computation
DEPTHWISE_PAD = "pad_temp"  # and its padding (part of every depthwise kernel's workload: renaming it retunes them)


def _depthwise_nchwc(data: te.Tensor, kernel: te.Tensor, strides, padding, dilation, out_dtype: str) -> te.Tensor:
    """Depthwise convolution of NCHW{b}c data by an OIHW{b}o kernel (channels/b, 1, kh, kw, b)."""
    n, chunks, height, width, block = data.shape
    _, _, kh, kw, _ = kernel.shape
    top, left, bottom, right = padding
    (sh, sw), (dh, dw) = strides, dilation
    padded = topi.nn.pad(data, [0, 0, top, left, 0], [0, 0, bottom, right, 0], name=DEPTHWISE_PAD)
    out_h = (height + top + bottom - (kh - 1) * dh - 1) // sh + 1
    out_w = (width + left + right - (kw - 1) * dw - 1) // sw + 1
    ry = te.reduce_axis((0, kh), name="ry")
    rx = te.reduce_axis((0, kw), name="rx")
    return te.compute(
        (n, chunks, out_h, out_w, block),
        lambda b, c, y, x, k: te.sum(
            padded[b, c, y * sh + ry * dh, x * sw + rx * dw, k].astype(out_dtype)
            * kernel[c, 0, ry, rx, k].astype(out_dtype),
            axis=[ry, rx],
        ),
        name=DEPTHWISE_BLOCK,
    )


def legalize_conv2d(bb: relax.BlockBuilder, call: relax.Call) -> relax.Expr:
    """``LegalizeOps``' rule for ``conv2d``: TOPI's ``conv2d_NCHWc`` or a depthwise one for blocked layouts."""
    attrs = call.attrs
    if _BLOCKED.fullmatch(attrs.data_layout) is None:
        return _default_nn._nn_conv2d(bb, call)
    data, weight = call.args
    out_dtype = attrs.out_dtype or data.ty.dtype
    geometry = [list(attrs.strides), list(attrs.padding), list(attrs.dilation)]
    if int(attrs.groups) > 1:
        return bb.call_te(_depthwise_nchwc, data, weight, *geometry, out_dtype,
                          primfunc_name_hint="depthwise_conv2d_NCHWc")
    return bb.call_te(topi.nn.conv2d_NCHWc, data, weight, *geometry, attrs.data_layout, attrs.out_layout,
                      out_dtype, primfunc_name_hint="conv2d_NCHWc")


def legalize_map(layout: str) -> dict | None:
    """``LegalizeOps``' ``customize_legalize_map`` for ``layout`` (None: TVM's own rules)."""
    return None if block_of(layout) is None else {"relax.nn.conv2d": legalize_conv2d}


def fusion_passes(target: tvm.target.Target | None = None, layout: str = PLAIN) -> list[tvm.transform.Pass]:
    """``build.fusion_passes`` with the convolutions' activations in ``layout`` (``NCHW16c``: channel blocks)
    first; with ``NCHW``, exactly Day 2's. Run the returned passes under ``with target:``."""
    return build.fusion_passes(target, before_legalize=layout_passes(layout), legalize_map=legalize_map(layout))


def fuse(mod: tvm.IRModule, target: tvm.target.Target | None = None, layout: str = PLAIN) -> tvm.IRModule:
    """``mod`` legalized and fused into kernels for ``target`` (default: this CPU), its convolutions in ``layout``:
    the form tuning works on (``tuning.prepare``)."""
    target = target or cpu_target()
    with target:
        return tvm.transform.Sequential(fusion_passes(target, layout))(mod)


# ------------------------------------------------------------------ Day 7's schedule, tuned

CONV_BLOCK = "conv2d_NCHWc"  # TOPI's name for the blocked convolution's computation


def _inline_epilogue(sch: s_tir.Schedule, conv: s_tir.SBlockRV) -> s_tir.SBlockRV:
    """Inline the element-wise work after ``conv`` into the block that writes the kernel's output; return it.

    BatchNorm's arithmetic, a residual add, ReLU, and SiLU (``x * sigmoid(x)``: a value read twice, so not
    a chain) all become one block that a tile writes once. A bare convolution gets a block of its own
    (``cache_write``), so that its accumulators can live in registers.
    """
    blocks = sch.get_child_blocks(sch.get_sblock("root"))
    names = [sch.get(b).name_hint for b in blocks]
    after = blocks[names.index(sch.get(conv).name_hint) + 1:]
    if not after:
        return sch.cache_write(conv, 0, "global")
    for block in after[:-1]:
        sch.compute_inline(block)
    return after[-1]


# A core reads fastest what it wrote itself. When a kernel's two cores split the output by channel
# blocks, each core of the next kernel reads every channel, half of them just written by the other core:
# on the Intel Xeon a 1x1 convolution of ResNet-50 (512 -> 128 channels, 28x28) took 1.02 ms right after
# the kernel that wrote its input, 0.49 ms alone. Split by rows, each core reads rows it wrote: 0.50 ms.
# But split by rows, each core reads every weight, which costs more where the weights are many times the
# input: ResNet-50's 3x3 convolutions at 14x14 (weights 12x the input: 1.28 against 1.09 ms in such a chain)
# and at 7x7 (94x: 1.56 against 1.33 ms), where a 1x1 convolution with weights 1.25x its input gained.
ROWS_FIRST_MAX_WEIGHT_RATIO = 8


def inline_epilogue(sch: s_tir.Schedule, block: s_tir.SBlockRV) -> list:
    """The element-wise stages fusion left after ``block`` (bias, clip, a residual, a rounding), all but the last
    inlined into it: [the last], for the caller to compute on each finished tile (or [] for a bare block)."""
    epilogue = []
    while consumers := sch.get_consumers(epilogue[-1] if epilogue else block):
        epilogue.append(consumers[0])
    for stage in epilogue[:-1]:
        sch.compute_inline(stage)
    return epilogue[-1:]


def split_by_rows(sch: s_tir.Schedule, conv: s_tir.SBlockRV) -> bool:
    """Whether the cores split ``conv``'s output by rows (True) or by channel blocks: by rows unless
    its weights are over ``ROWS_FIRST_MAX_WEIGHT_RATIO`` times its input activations."""
    data, weight = (sch.get(conv).reads[i].source for i in (0, 1))  # as ``schedule_conv2d_nchwc`` reads them
    size = lambda buffer: math.prod(int(d) for d in buffer.shape)
    return size(weight) <= ROWS_FIRST_MAX_WEIGHT_RATIO * size(data)


def _vectorize_padding(sch: s_tir.Schedule, conv: s_tir.SBlockRV, by_rows: bool) -> None:
    """The zero padding before ``conv``: its own pass, one vector per pixel, split between the cores
    as the convolution splits its output (``by_rows``), so that each core pads what it will read."""
    for producer in sch.get_producers(conv):
        if sch.get(producer).name_hint == "data_pad":
            n, c, h, w, lanes = sch.get_loops(producer)
            sch.vectorize(lanes)
            order = (n, h, c, w) if by_rows else (n, c, h, w)
            sch.reorder(*order)
            sch.parallel(sch.fuse(*order))


def sample_row(sch: s_tir.Schedule, loop, max_row: int):
    """A sampled length for a row of output pixels, any from 1 to ``max_row`` (or the width), divisor or not.

    A row that does not divide the width leaves a shorter last tile (the loop's bound checked per pixel).
    Only divisors were allowed until 2026-11-27, and the widths of ResNet-50's deep layers (7 and 14)
    have few: on AVX2's 16 vector registers, 14x14 layers got 2 pixels by 4 channel blocks (8
    accumulators) or 7 by 2 (14, and a register short for the weights and the broadcast value). With
    5 by 2, tails included, its 3x3 256-channel convolution took 1.05 ms against 1.13 (Intel Xeon,
    ``haswell`` code; oneDNN's own kernels handle a row's tail the same way).
    """
    width = int(sch.get(loop).extent)
    rows = list(range(1, min(width, max_row) + 1))
    return sch.sample_categorical(rows, [1.0 / len(rows)] * len(rows))


def schedule_conv2d_nchwc(sch: s_tir.Schedule, max_row: int = 16, max_blocks: int = 4) -> None:
    """Day 7's schedule of a blocked convolution, for a fused kernel, with its two tile sizes sampled.

    Each parallel task computes a tile of ``row`` output pixels by ``blocks`` output channel blocks in
    registers (``row * blocks`` vectors of accumulators): for every input channel and kernel position it
    loads ``blocks`` weight vectors and broadcasts one input value per pixel. The element-wise work after
    the convolution (BatchNorm, ReLU, SiLU, a residual add) is inlined into one block that writes the finished
    tile; the padding is its own parallel, vectorized pass. The cores split the output by rows, or by
    channel blocks where the weights outweigh the input (``split_by_rows``: a choice the search cannot
    make, since a kernel timed alone runs as fast either way). The search picks ``row`` (at most ``max_row``
    pixels: ``sample_row``) and ``blocks`` (a divisor of the channel blocks, at most ``max_blocks``); nothing
    else varies, so a few dozen trials explore the whole space that MetaSchedule's generic tiling rarely reaches.
    """
    conv = sch.get_sblock(CONV_BLOCK)
    by_rows = split_by_rows(sch, conv)
    out = _inline_epilogue(sch, conv)
    _vectorize_padding(sch, conv, by_rows)
    in_block = int(sch.get(conv).reads[0].source.shape[-1])
    n, oc, oh, ow, oc_lanes, ic, kh, kw = sch.get_loops(conv)
    ow_outer, row = sch.split(ow, [None, sample_row(sch, ow, max_row)])
    oc_outer, blocks = sch.split(oc, sch.sample_perfect_tile(oc, n=2, max_innermost_factor=max_blocks))
    ic_outer, ic_inner = sch.split(ic, [None, in_block])
    tasks = (n, oh, oc_outer) if by_rows else (n, oc_outer, oh)
    sch.reorder(*tasks, ow_outer, ic_outer, kh, kw, ic_inner, row, blocks, oc_lanes)
    sch.parallel(sch.fuse(*tasks))
    sch.reverse_compute_at(out, ow_outer, preserve_unit_loops=True)  # unit loops kept: a trace replays alike
    sch.set_scope(conv, 0, "local")  # the accumulators: a small array LLVM keeps in registers
    sch.vectorize(oc_lanes)
    sch.unroll(row)
    sch.unroll(blocks)
    init = sch.decompose_reduction(conv, ic_outer)
    for block in (init, out):
        sch.vectorize(sch.get_loops(block)[-1])


def schedule_depthwise_nchwc(sch: s_tir.Schedule, max_row: int = 16) -> None:
    """Day 7's idea for a blocked depthwise convolution: a row of output pixels of one channel block in registers.

    A depthwise convolution has no input channels to sum over, only the kernel window, so each weight
    vector serves one channel block and the work is mostly moving data: each parallel task (an output row
    of one channel block) keeps ``row`` accumulator vectors, loads one weight vector per kernel position and
    one input vector per pixel, and writes the finished row through the inlined element-wise work. The
    search picks ``row`` (a divisor of the output width, at most ``max_row``).

    The zero padding is computed per tile, for the few input rows and pixels the tile reads, so that it
    stays in the core's L1 cache: a depthwise convolution reads its input about once, and a padding pass of
    its own (as the dense convolutions have) wrote and read back a padded copy of the whole input, as much
    memory traffic again as the convolution (on the Intel Xeon, EfficientNet-B0's 96x112x112 stride-2
    depthwise convolution with BatchNorm and SiLU as a model of its own, its layout changes included:
    1.32 ms with that pass, which was not even vectorized, 0.95 ms with this).
    """
    conv = sch.get_sblock(DEPTHWISE_BLOCK)
    out = _inline_epilogue(sch, conv)
    n, c, oh, ow, lanes, ry, rx = sch.get_loops(conv)
    ow_outer, row = sch.split(ow, sch.sample_perfect_tile(ow, n=2, max_innermost_factor=max_row))
    sch.reorder(n, oh, c, ow_outer, ry, rx, row, lanes)
    sch.parallel(sch.fuse(n, oh, c))
    sch.reverse_compute_at(out, ow_outer, preserve_unit_loops=True)
    for producer in sch.get_producers(conv):
        if sch.get(producer).name_hint == DEPTHWISE_PAD:
            sch.compute_at(producer, ow_outer, preserve_unit_loops=True)
            sch.vectorize(sch.get_loops(producer)[-1])
    sch.set_scope(conv, 0, "local")
    sch.vectorize(lanes)
    sch.unroll(row)
    init = sch.decompose_reduction(conv, ry)
    for block in (init, out):
        sch.vectorize(sch.get_loops(block)[-1])


# Relax's operator patterns (``op_pattern`` of a fused kernel): element-wise, and broadcast (one operand
# repeated along some axes, as a squeeze-excite gate over a map).
_ELEMENTWISE_PATTERNS = (0, 1)


def schedule_blocked_elementwise(mod: tvm.IRModule) -> tvm.IRModule:
    """Schedule, once and for all, each element-wise kernel over a channel-blocked map: the cores split
    its channel blocks and rows, each row computed one vector (one pixel's channel block) at a time.

    Left to MetaSchedule's generic space, such a kernel (EfficientNet-B0's squeeze-excite gate where it
    is not fused into a convolution: a gate of 480 or 672 values times a 14x14 map) was tuned into one
    loop over every element, 64 at a time, each lane working out its channel from the flat index to find
    its gate value: 121 us for the 480-channel gate on the Intel Xeon, 10 us scheduled here. There is
    nothing to search in such a kernel, so it is marked scheduled and no longer tuned (a database's
    records for it are not used). Kernels of any other kind, or not over ``[N, C/b, H, W, b]``, are left as they are.
    """
    mod = mod.clone()  # the caller's module stays as it was
    for gv, func in list(mod.functions.items()):
        if not isinstance(func, tvm.tirx.PrimFunc) or func.attrs.get("tirx.is_scheduled", False):
            continue
        if int(func.attrs.get("op_pattern", -1)) not in _ELEMENTWISE_PATTERNS:
            continue
        sch = s_tir.Schedule(tvm.IRModule({"main": func}))
        blocks = sch.get_child_blocks(sch.get_sblock("root"))
        if len(blocks) != 1 or len(sch.get_loops(blocks[0])) != 5:
            continue
        n, c, h, w, lanes = sch.get_loops(blocks[0])
        if int(sch.get(lanes).extent) not in (4, 8, 16):
            continue
        sch.parallel(sch.fuse(n, c, h))
        sch.vectorize(lanes)
        mod[gv] = sch.mod["main"].with_attr("tirx.is_scheduled", True)
    return mod


# Channels last (NHWC): Day 12's bf16 and int8 models, whose 1x1 convolutions read and write that layout.
DEPTHWISE_NHWC_BLOCKS = ("depthwise", "group_conv2d_nhwc")  # of bits (bf16_model.depthwise_from_bits_compute); float32


def _depthwise_nhwc_block(sch: s_tir.Schedule):
    """The block of a channels-last depthwise convolution in ``sch`` (one of ``DEPTHWISE_NHWC_BLOCKS``, a grouped one
    with one channel per group), or None."""
    for name in DEPTHWISE_NHWC_BLOCKS:
        try:
            block = sch.get_sblock(name)
        except s_tir.ScheduleError:  # (no block of that name)
            continue
        loops = sch.get_loops(block)
        if len(loops) == 6 or (len(loops) == 7 and int(sch.get(loops[-1]).extent) == 1):
            return block
    return None


def is_depthwise_nhwc(task) -> bool:
    """True for a tuning task whose kernel is a channels-last depthwise convolution (``schedule_depthwise_nhwc``'s)."""
    return _depthwise_nhwc_block(s_tir.Schedule(task.dispatched[0])) is not None


def schedule_depthwise_nhwc(sch: s_tir.Schedule, lanes: int = 16) -> None:
    """A channels-last depthwise convolution tiled for registers: each thread takes rows of the output; a tile of
    rows x columns x ``lanes``-channel vectors (sizes searched) sums the kernel's taps in registers, the padding
    read in place, and the element-wise work after it (bias, clip, a rounding or a quantization) is done on the
    tile before it is written. MetaSchedule's default space did not find this shape of loop nest in 16 trials:
    the bf16 MobileNetV2's depthwise kernels ran 1.1-3x slower on a Zen 4 with its schedules, and the int8 one's,
    with the Zen 5's, took 1.6x as long on an Intel Xeon as with this space tuned there."""
    block = _depthwise_nhwc_block(sch)
    epilogue = inline_epilogue(sch, block)
    for producer in sch.get_producers(block):  # the padding: read in place, zero outside the map
        sch.compute_inline(producer)
    b, i, j, k, *taps = sch.get_loops(block)  # taps: the kernel's rows and columns (and a float32 one's unit loop)
    channels, vector = sch.split(k, [None, lanes])
    rows, row = sch.split(i, sch.sample_perfect_tile(i, n=2, max_innermost_factor=2))
    cols, col = sch.split(j, sch.sample_perfect_tile(j, n=2, max_innermost_factor=16))
    groups, group = sch.split(channels, sch.sample_perfect_tile(channels, n=2, max_innermost_factor=4))
    sch.reorder(b, rows, cols, groups, *taps, row, col, group, vector)
    if epilogue:
        sch.reverse_compute_at(epilogue[-1], groups, preserve_unit_loops=True)  # as many loops whatever the tiles
        sch.vectorize(sch.get_loops(epilogue[-1])[-1])
    sch.vectorize(vector)
    for loop in (group, col, row, *reversed(taps)):
        sch.unroll(loop)
    sch.parallel(sch.fuse(b, rows))
    init = sch.decompose_reduction(block, taps[0])
    sch.vectorize(sch.get_loops(init)[-1])


def depthwise_nhwc_space(lanes: int = 16) -> ms.space_generator.ScheduleFn:
    """``schedule_depthwise_nhwc`` as a MetaSchedule search space: its tile sizes searched, LLVM's mutators."""
    post = ms.postproc
    return ms.space_generator.ScheduleFn(functools.partial(schedule_depthwise_nhwc, lanes=lanes), sch_rules=[],
                                         mutator_probs="llvm",
                                         postprocs=[post.DisallowDynamicLoop(), post.RewriteParallelVectorizeUnroll()])


_TEMPLATES = {CONV_BLOCK: schedule_conv2d_nchwc, DEPTHWISE_BLOCK: schedule_depthwise_nchwc}


def template_for(kernel: tvm.IRModule) -> Callable[[s_tir.Schedule], None] | None:
    """Day 7's schedule for a fused kernel: ``schedule_conv2d_nchwc`` for a blocked convolution,
    ``schedule_depthwise_nchwc`` for a blocked depthwise one, None for any other kernel."""
    sch = s_tir.Schedule(kernel)
    for name, schedule in _TEMPLATES.items():
        try:
            sch.get_sblock(name)
        except s_tir.ScheduleError:
            continue
        return schedule
    return None


def search_space(task) -> ms.space_generator.SpaceGenerator | str:
    """A tuning task's search space: its kernel's ``template_for``, MetaSchedule's generic one
    (``post-order-apply``) for a kernel with none (``tuning.tune``'s ``space_for``)."""
    schedule = template_for(task.dispatched[0])
    return "post-order-apply" if schedule is None else ms.space_generator.ScheduleFn(schedule)
