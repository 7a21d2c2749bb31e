"""One MobileNetV2 inverted residual block as one TensorIR kernel: fusion across layers (Day 7).

A block is three convolutions: a 1x1 that expands the channels (16 -> 96 in the first block), a 3x3
depthwise, and a 1x1 that projects them back. Run as three kernels, as every engine runs it, the
expanded image is written out whole and read back (4.8 MB at 112x112x96 in float32), from L2, L3 or
memory. Here the three are one kernel that cuts the block into pieces small enough to stay in the
core's cache, and runs all three stages on one piece before the next (a ``Tiling``):

* bands of output rows: each band expands the input rows it needs, filters and projects them. The
  depthwise filter needs a row above and below, so the rows at a band's edge are expanded twice: the
  band height trades that against the cache. Best where the image is large.
* chunks of expanded channels: each chunk is expanded over the whole image, filtered and projected,
  and the chunks' shares of the projection are added up. Nothing is computed twice, and each weight is
  read once; the cores share out the channels. Best where the image is small and the channels many.

The arithmetic is written once, as a tensor expression (``block_function``); the schedules differ only in
where each stage is computed: ``compute_at`` moves the producers into the loop over the pieces.
Channels last (NHWC), BatchNorm folded into the weights.

EfficientNet's blocks (``MBConv``) are the same three convolutions with SiLU, 5x5 filters in some, and a
squeeze-and-excitation between the filter and the projection: a gate per channel computed from the average of
the whole filtered image. No piece can be projected before every pixel is filtered, so there the pieces stop
at the filter (bands expand and filter; chunks expand, filter and average), and the gates and the projection
follow over the whole image.

Introduced on Day 7.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch
import tvm
from tvm import s_tir, te, tirx

from . import machine, timing
from .build import relative_error
from .kernels import buffer_shapes
from .errors import CourseError
from .timing import Timing

STAGES = ("expand", "expand_act", "depthwise", "depthwise_act", "project", "project_act")
SEPARATE, FUSED = "TVM, three kernels", "TVM, one fused kernel"


class BlockError(CourseError, ValueError):
    """What this helper cannot compile: a module that is not an inverted residual block, a tiling that does not
    cut the block evenly, an input of another shape than the kernel's."""


@dataclass(frozen=True)
class BlockShape:
    """An inverted residual block at batch 1: ``c_in`` channels on a ``size`` x ``size`` image, expanded to
    ``hidden``, filtered 3x3 with ``stride``, projected to ``c_out``."""

    size: int
    c_in: int
    hidden: int
    c_out: int
    stride: int
    expands: bool = True  # False: MobileNetV2's first block, a depthwise and a projection (hidden == c_in)
    kernel: int = 3  # the depthwise filter's height and width (EfficientNet's blocks: 3 or 5)
    activation: str = "relu6"  # after the expansion and the filter: "relu6" (MobileNetV2) or "silu" (EfficientNet)
    squeeze: int = 0  # channels of a squeeze-and-excitation before the projection (EfficientNet's); 0: none

    @property
    def out_size(self) -> int:
        return (self.size - 1) // self.stride + 1

    @property
    def residual(self) -> bool:
        """The block adds its input to its output (same shape in and out), as torchvision's does."""
        return self.stride == 1 and self.c_in == self.c_out

    @property
    def flops(self) -> int:
        """Multiplies and adds of the three convolutions (each once: a fused kernel's recomputed edges not counted)."""
        pixels, out_pixels = self.size**2, self.out_size**2
        return 2 * (pixels * self.c_in * self.hidden * self.expands + out_pixels * self.kernel**2 * self.hidden + out_pixels * self.hidden * self.c_out)

    @property
    def expanded_mb(self) -> float:
        """Megabytes of the expanded image (float32): what three kernels write out and read back."""
        return self.size**2 * self.hidden * 4 / 1e6

    def __str__(self) -> str:
        expanded = f" -> {self.hidden}" if self.expands else ""
        excited = f" -> SE {self.squeeze}" if self.squeeze else ""
        return (f"{self.c_in}x{self.size}x{self.size}{expanded} -> {self.kernel}x{self.kernel}/{self.stride}"
                f"{excited} -> {self.c_out}x{self.out_size}x{self.out_size}")


BLOCK_KINDS = ("InvertedResidual", "MBConv")  # torchvision's MobileNetV2 and EfficientNet blocks


def _layers(block: torch.nn.Module) -> tuple[list[tuple[torch.nn.Conv2d, torch.nn.BatchNorm2d]],
                                             torch.nn.Module | None, str]:
    """A block's convolutions with their BatchNorms, in order (expansion if any, depthwise, projection), its
    squeeze-and-excitation (or None) and its activation's name; raises ``BlockError`` for any other module."""
    kind = type(block).__name__
    body = list(block.conv if kind == "InvertedResidual" else block.block if kind == "MBConv" else [])
    if kind == "InvertedResidual":  # [*(conv, BatchNorm, ReLU6), projection conv, BatchNorm]
        pairs = [(layer[0], layer[1]) for layer in body[:-2]] + [(body[-2], body[-1])]
    else:  # [*(conv, BatchNorm, SiLU), squeeze-excite, (projection conv, BatchNorm)]
        pairs = [(layer[0], layer[1]) for layer in body if type(layer).__name__ == "Conv2dNormActivation"]
    if kind not in BLOCK_KINDS or len(pairs) not in (2, 3):
        raise BlockError(f"{kind} is not an inverted residual block: pass one of MobileNetV2's features[1:18] or "
                         "one of EfficientNet's MBConv blocks (features[1] to [7], each a sequence of them).")
    excite = next((layer for layer in body if type(layer).__name__ == "SqueezeExcitation"), None)
    activation = type(body[0][2]).__name__.lower()
    if activation not in ("relu6", "silu"):
        raise BlockError(f"this block's activation is {type(body[0][2]).__name__}; the kernels know ReLU6 and SiLU.")
    return pairs, excite, activation


def block_shape(block: torch.nn.Module, size: int) -> BlockShape:
    """The shape of torchvision's ``InvertedResidual`` (MobileNetV2's ``features[1:18]``; the first has no
    expansion) or ``MBConv`` (EfficientNet's) ``block`` on a ``size`` x ``size`` input. Raises ``BlockError``
    for any other module."""
    pairs, excite, activation = _layers(block)
    *expand, (depthwise, _), (project, _) = pairs
    return BlockShape(size, depthwise.in_channels if not expand else expand[0][0].in_channels, depthwise.out_channels,
                      project.out_channels, depthwise.stride[0], expands=bool(expand),
                      kernel=depthwise.kernel_size[0], activation=activation,
                      squeeze=excite.fc1.out_channels if excite is not None else 0)


def model_blocks(model: torch.nn.Module, size: int = 224) -> list[tuple[str, torch.nn.Module, BlockShape]]:
    """A torchvision MobileNetV2's or EfficientNet's inverted residual blocks in order, for a ``size`` x ``size``
    image: each block's name in the model (``features[3]``; EfficientNet's come in stages: ``features[2][1]``),
    the block, and its shape (the first block's size read from the stem run once in PyTorch, the others
    chained from each block's ``out_size``)."""
    with torch.no_grad():
        h = model.features[0](torch.zeros(1, 3, size, size)).shape[-1]
    blocks = []
    for index, layer in enumerate(model.features[1:-1], start=1):
        named = ([(f"features[{index}]", layer)] if type(layer).__name__ in BLOCK_KINDS
                 else [(f"features[{index}][{j}]", block) for j, block in enumerate(layer)])
        for name, block in named:
            shape = block_shape(block, h)
            blocks.append((name, block, shape))
            h = shape.out_size
    return blocks


def _exp(x: tirx.PrimExpr) -> tirx.PrimExpr:
    """e**x as TVM's ``topi.fast_exp`` computes it, for one value: a polynomial, which vectorizes (the C
    library's ``expf``, where ``te.exp`` leads, is called once per value)."""
    f32 = lambda v: tirx.const(v, "float32")  # noqa: E731
    clamped = te.max(te.min(x, f32(88.3762626647950)), f32(-88.3762626647949))
    n = te.floor(clamped * f32(1.44269504088896341) + f32(0.5))
    r = clamped - n * f32(0.6931471805599453)
    y = f32(1.9875691500e-4)
    for p in (1.3981999507e-3, 8.3334519073e-3, 4.1665795894e-2, 1.6666665459e-1, 5.0000001201e-1):
        y = y * r + f32(p)
    y = y * r * r + r + f32(1.0)
    two_to_n = tirx.reinterpret("float32", tirx.shift_left((n + f32(127.0)).astype("int32"), tirx.const(23, "int32")))
    return te.max(two_to_n * y, x)


def _sigmoid(x: tirx.PrimExpr) -> tirx.PrimExpr:
    return tirx.const(1.0, "float32") / (tirx.const(1.0, "float32") + _exp(-x))


def activate(name: str, x: tirx.PrimExpr) -> tirx.PrimExpr:
    """ReLU6 (``min(max(x, 0), 6)``) or SiLU (``x * sigmoid(x)``) of one value."""
    if name == "silu":
        return x * _sigmoid(x)
    return te.min(te.max(x, tirx.const(0.0, "float32")), tirx.const(6.0, "float32"))


EXCITATION = ("pool", "squeeze", "squeeze_act", "excite", "gate", "gated")


def block_function(shape: BlockShape) -> tirx.PrimFunc:
    """The block as a tensor expression, unscheduled: inputs ``X`` (H, W, c_in) and the folded weights
    (``block_weights``' order), output (H', W', c_out). The depthwise filter reads the expanded image through
    ``pad`` (zero outside it), which the schedules inline: no padded copy is made. With a squeeze-and-excitation,
    the filtered image's average (``pool``) gives each channel a gate, which scales the projection's weights
    (``gated``: hidden x c_out products, not one per pixel), or the filtered image as the projection reads it
    where it has fewer pixels than the projection has output channels."""
    h, c_in, hidden, c_out, stride, k = shape.size, shape.c_in, shape.hidden, shape.c_out, shape.stride, shape.kernel
    out, act, half = shape.out_size, shape.activation, shape.kernel // 2
    x = te.placeholder((h, h, c_in), name="X")
    w2, b2 = te.placeholder((k, k, hidden), name="W2"), te.placeholder((hidden,), name="B2")
    w3, b3 = te.placeholder((hidden, c_out), name="W3"), te.placeholder((c_out,), name="B3")
    if shape.expands:
        w1, b1 = te.placeholder((c_in, hidden), name="W1"), te.placeholder((hidden,), name="B1")
        kk = te.reduce_axis((0, c_in), "k")
        expand = te.compute((h, h, hidden), lambda i, j, c: te.sum(x[i, j, kk] * w1[kk, c], axis=kk), name="expand")
        expand_act = te.compute((h, h, hidden), lambda i, j, c: activate(act, expand[i, j, c] + b1[c]),
                                name="expand_act")
        weights = [w1, b1, w2, b2]
    else:
        expand_act, weights = x, [w2, b2]
    padded = te.compute((h + 2 * half, h + 2 * half, hidden), lambda i, j, c: te.if_then_else(
        tirx.all(i >= half, i < h + half, j >= half, j < h + half), expand_act[i - half, j - half, c],
        tirx.const(0.0, "float32")), name="pad")
    r, s = te.reduce_axis((0, k), "r"), te.reduce_axis((0, k), "s")
    depthwise = te.compute((out, out, hidden), lambda i, j, c: te.sum(
        padded[i * stride + r, j * stride + s, c] * w2[r, s, c], axis=[r, s]), name="depthwise")
    depthwise_act = te.compute((out, out, hidden), lambda i, j, c: activate(act, depthwise[i, j, c] + b2[c]),
                               name="depthwise_act")
    image, projection = depthwise_act, w3
    if shape.squeeze:
        s1, sb1 = te.placeholder((hidden, shape.squeeze), name="S1"), te.placeholder((shape.squeeze,), name="SB1")
        s2, sb2 = te.placeholder((shape.squeeze, hidden), name="S2"), te.placeholder((hidden,), name="SB2")
        pi, pj = te.reduce_axis((0, out), "pi"), te.reduce_axis((0, out), "pj")
        pool = te.compute((hidden,), lambda c: te.sum(depthwise_act[pi, pj, c], axis=[pi, pj]), name="pool")
        m1 = te.reduce_axis((0, hidden), "m1")
        squeeze = te.compute((shape.squeeze,), lambda q: te.sum(pool[m1] * s1[m1, q], axis=m1), name="squeeze")
        squeeze_act = te.compute((shape.squeeze,), lambda q: activate(act, squeeze[q] / float(out * out) + sb1[q]),
                                 name="squeeze_act")
        q1 = te.reduce_axis((0, shape.squeeze), "q1")
        excite = te.compute((hidden,), lambda c: te.sum(squeeze_act[q1] * s2[q1, c], axis=q1), name="excite")
        gate = te.compute((hidden,), lambda c: _sigmoid(excite[c] + sb2[c]), name="gate")
        if out * out < c_out:  # fewer pixels than output channels: gate the filtered image as it is read
            image = te.compute((out, out, hidden), lambda i, j, c: depthwise_act[i, j, c] * gate[c], name="gated")
        else:
            projection = te.compute((hidden, c_out), lambda m, n: w3[m, n] * gate[m], name="gated")
        weights += [s1, sb1, s2, sb2]
    m = te.reduce_axis((0, hidden), "m")
    project = te.compute((out, out, c_out), lambda i, j, n: te.sum(image[i, j, m] * projection[m, n], axis=m),
                         name="project")
    if shape.residual:
        result = te.compute((out, out, c_out), lambda i, j, n: project[i, j, n] + b3[n] + x[i, j, n], name="project_act")
    else:
        result = te.compute((out, out, c_out), lambda i, j, n: project[i, j, n] + b3[n], name="project_act")
    return te.create_prim_func([x, *weights, w3, b3, result])


def vector_lanes(channels: int, lanes: int) -> int:
    """The widest vector of at most ``lanes`` values that divides ``channels`` (24 channels: 8 lanes)."""
    while channels % lanes:
        lanes //= 2
    return lanes


def widest_divisor(n: int, at_most: int) -> int:
    """The largest divisor of ``n`` up to ``at_most``: a tile that cuts a loop evenly."""
    return max(d for d in range(1, at_most + 1) if n % d == 0)


def finish(sch: s_tir.Schedule, block, zero_at, epilogue=None, epilogue_at=None) -> None:
    """A reduction's last steps: its sums zeroed in a loop of their own before ``zero_at`` (vectorized), and the
    element-wise ``epilogue`` after it moved under ``epilogue_at`` and vectorized, so that it reads each finished
    tile while it is still in registers."""
    init = sch.decompose_reduction(block, zero_at)
    sch.vectorize(sch.get_loops(init)[-1])
    if epilogue is not None:
        sch.reverse_compute_at(epilogue, epilogue_at)
        sch.vectorize(sch.get_loops(epilogue)[-1])


ACCUMULATORS = 24  # vector registers a tile of sums may take (AVX-512 has 32; AVX2's 16 spill a little)


def _register_tile(pixels: int, vectors: int) -> tuple[int, int]:
    """Pixels x vectors of sums per tile: as many sums as ``ACCUMULATORS`` allows, the most pixels first (each
    weight vector loaded is used once per pixel), at most 8 pixels and 4 vectors, each dividing its loop."""
    return max(((p, v) for p in range(1, 9) if pixels % p == 0 for v in range(1, 5) if vectors % v == 0
                and p * v <= ACCUMULATORS), key=lambda pv: (pv[0] * pv[1], pv[0]))


def tile_channels(pixels: int, channels: int, lanes: int) -> int:
    """How many output channels ``tile_pointwise``'s register tile covers on rows of ``pixels``: the group in
    which a 1x1 convolution's weights can be stored together, so that each tile reads its weights as one
    stream (``fused_mobilenet.pack_weight``)."""
    width = vector_lanes(channels, lanes)
    return width * _register_tile(pixels, channels // width)[1]


def tile_pointwise(sch: s_tir.Schedule, conv, epilogue, lanes: int, parallel: bool = False,
                   zero_at=None, channels_outer: bool = False) -> None:
    """A 1x1 convolution's innermost loops (rows, columns, channels, reduction) tiled for registers: a tile of
    pixels along a row x vectors of channels, the reduction outside it, the epilogue (if any) on each finished
    tile; ``parallel``: the rows split between the cores (with ``channels_outer``, the groups of output
    channels: each core then reads only its share of the weights, once, for a small image of many channels);
    ``zero_at``: the loop before which the sums are zeroed, when the reduction goes on outside these loops
    (default: just before them)."""
    i, j, c, k = sch.get_loops(conv)[-4:]
    channels = int(sch.get(c).extent)
    width = vector_lanes(channels, lanes)
    p, v = _register_tile(int(sch.get(j).extent), channels // width)
    cols, col = sch.split(j, [None, p])
    groups, group, vector = sch.split(c, [None, v, width])
    sch.reorder(*((groups, i, cols) if channels_outer else (i, cols, groups)), k, col, group, vector)
    if parallel:  # (groups and rows as one loop: a few groups would not share evenly between the cores)
        sch.parallel(sch.fuse(groups, i) if channels_outer else i)
    sch.vectorize(vector)
    sch.unroll(group)
    sch.unroll(col)
    finish(sch, conv, k if zero_at is None else zero_at, epilogue, cols if channels_outer else groups)


def tile_depthwise(sch: s_tir.Schedule, conv, epilogue, lanes: int) -> None:
    """The depthwise convolution's innermost loops: up to 8 pixels x one vector of sums over the 9 taps, the
    zero padding read in place."""
    i, j, c, r, s = sch.get_loops(conv)[-5:]
    cols, col = sch.split(j, [None, widest_divisor(int(sch.get(j).extent), 8)])
    groups, vector = sch.split(c, [None, vector_lanes(int(sch.get(c).extent), lanes)])
    sch.reorder(i, cols, groups, r, s, col, vector)
    sch.vectorize(vector)
    for loop in (col, s, r):
        sch.unroll(loop)
    finish(sch, conv, r, epilogue, groups)


def _sblock(sch: s_tir.Schedule, name: str):
    """A stage's block, or None where the block has no such stage (no expansion, no excitation)."""
    try:
        return sch.get_sblock(name)
    except s_tir.ScheduleError:
        return None


def _stages(sch: s_tir.Schedule) -> list:
    """The six stages' blocks (the padding inlined into the depthwise one); None for a block's missing expansion."""
    sch.compute_inline(sch.get_sblock("pad"))
    return [_sblock(sch, name) for name in STAGES]


def tile_sums(sch: s_tir.Schedule, block, lanes: int, epilogue=None) -> None:
    """A small reduction (the pool, the squeeze, the excitation: its own loops are the output's channels, then
    its sums) as independent adds: for each step of the sum, every vector of the output's sums gets one add, the
    sums kept in memory (L1). A vector summed to the end before the next would wait for each add. The element-wise
    ``epilogue``, if any, follows, vectorized."""
    spatial, *reductions = sch.get_loops(block)[-len(sch.get(block).iter_vars):]
    groups, vector = sch.split(spatial, [None, vector_lanes(int(sch.get(spatial).extent), lanes)])
    sch.reorder(*reductions, groups, vector)
    sch.vectorize(vector)
    finish(sch, block, reductions[0])
    if epilogue is not None:
        loop = sch.get_loops(epilogue)[-1]
        sch.vectorize(sch.split(loop, [None, vector_lanes(int(sch.get(loop).extent), lanes)])[1])


def schedule_excitation(sch: s_tir.Schedule, lanes: int, pooled: bool = False) -> None:
    """The squeeze-and-excitation's small stages: the average of the filtered image (unless ``pooled``: a fused
    kernel already summed each chunk), the two small products (the squeeze and the excitation, each with its
    activation) and the gate, over vectors of channels, and the gated projection weights (or, for a small
    image, the gate applied as the projection reads it)."""
    squeeze, squeeze_act, excite, gate, gated = (sch.get_sblock(name) for name in EXCITATION[1:])
    if not pooled:
        tile_sums(sch, sch.get_sblock("pool"), lanes)
    tile_sums(sch, squeeze, lanes, squeeze_act)
    tile_sums(sch, excite, lanes, gate)
    if len(sch.get_loops(gated)) == 3:  # the image gated: as the projection reads it
        sch.compute_inline(gated)
        return
    m, n = sch.get_loops(gated)
    sch.parallel(m)
    sch.vectorize(sch.split(n, [None, vector_lanes(int(sch.get(n).extent), lanes)])[1])


def schedule_separate(shape: BlockShape, lanes: int | None = None) -> s_tir.Schedule:
    """Three kernels one after another, each over the whole image, rows split between the cores: the
    expanded and the filtered images go out to memory (or the largest cache they fit in) between them."""
    lanes = lanes or machine.float32_lanes()
    sch = s_tir.Schedule(block_function(shape))
    expand, expand_act, depthwise, depthwise_act, project, project_act = _stages(sch)
    sch.parallel(sch.get_loops(depthwise)[0])  # (before the reduction is split, as parallel needs)
    if expand is not None:
        tile_pointwise(sch, expand, expand_act, lanes, parallel=True)
    tile_depthwise(sch, depthwise, depthwise_act, lanes)
    if shape.squeeze:
        schedule_excitation(sch, lanes)
    tile_pointwise(sch, project, project_act, lanes, parallel=True)
    return sch


@dataclass(frozen=True)
class Tiling:
    """How a fused kernel cuts the block: into bands of ``rows`` output rows (the input rows each band needs
    are expanded in it, the edges twice), or into chunks of ``channels`` expanded channels (each chunk
    expanded, filtered and projected over the whole image, its share of the projection added up; nothing
    computed twice)."""

    rows: int | None = None
    channels: int | None = None

    def __post_init__(self) -> None:
        if (self.rows is None) == (self.channels is None):
            raise BlockError(f"give a tiling rows or channels, not both or neither (got {self!r}).")

    def __str__(self) -> str:
        return f"rows={self.rows}" if self.rows else f"channels={self.channels}"

    @staticmethod
    def parse(label: str) -> Tiling:
        """``Tiling.parse(str(t)) == t``: a timing's label back to its tiling."""
        kind, _, number = label.partition("=")
        if kind not in ("rows", "channels") or not number.isdigit():
            raise BlockError(f"{label!r} is not a tiling's label (rows=R or channels=C).")
        return Tiling(**{kind: int(number)})


def _parts(shape: BlockShape, cores: int) -> int:
    """How many cores share a channel-chunked kernel's expanded channels (each needs a whole share)."""
    return cores if shape.hidden % cores == 0 else 1


def tilings(shape: BlockShape, cores: int | None = None, lanes: int | None = None) -> list[Tiling]:
    """Tilings worth trying: band heights that divide the output's rows and leave every core a band (at most
    16 rows), and chunks of expanded channels, whole vectors, that divide each core's share (at most 192)."""
    cores = cores or machine.physical_core_count()
    lanes = lanes or machine.float32_lanes()
    out, share = shape.out_size, shape.hidden // _parts(shape, cores)
    step = vector_lanes(share, lanes)
    return ([Tiling(rows=r) for r in range(1, min(out, 16) + 1) if out % r == 0 and out // r >= min(cores, out)]
            + [Tiling(channels=c) for c in range(step, min(share, 192) + 1, step) if share % c == 0])


def schedule_fused(shape: BlockShape, tiling: Tiling, lanes: int | None = None,
                   cores: int | None = None) -> s_tir.Schedule:
    """One kernel for the whole block, cut as ``tiling`` says (``compute_at`` moves every stage into the
    loop over bands or chunks)."""
    lanes, cores = lanes or machine.float32_lanes(), cores or machine.physical_core_count()
    share = shape.hidden // _parts(shape, cores)
    if (tiling.rows and shape.out_size % tiling.rows) or (tiling.channels and share % tiling.channels):
        raise BlockError(f"{tiling} does not cut this block ({shape}) evenly: bands must divide its "
                         f"{shape.out_size} output rows, chunks each core's {share} expanded channels; "
                         f"try one of {[str(t) for t in tilings(shape, cores, lanes)]}.")
    sch = s_tir.Schedule(block_function(shape))
    if tiling.rows:
        _fuse_by_rows(sch, tiling.rows, lanes)
    else:
        _fuse_by_channels(sch, tiling.channels, lanes, _parts(shape, cores))
    return sch


def _fuse_by_rows(sch: s_tir.Schedule, rows: int, lanes: int) -> None:
    """Bands of ``rows`` output rows, split between the cores; in each band the input rows it needs are
    expanded, filtered and projected before the next band starts. With a squeeze-and-excitation the bands
    end at the filter: its gates need the whole filtered image before the projection can start."""
    expand, expand_act, depthwise, depthwise_act, project, project_act = _stages(sch)
    excited = _sblock(sch, "pool") is not None
    anchor = depthwise if excited else project_act
    bands, _ = sch.split(sch.get_loops(anchor)[0], [None, rows])
    producers = (expand_act, expand) if excited else (project, depthwise_act, depthwise, expand_act, expand)
    for producer in producers:  # consumers first
        if producer is not None:
            sch.compute_at(producer, bands, preserve_unit_loops=True)
    sch.parallel(bands)
    if expand is not None:
        tile_pointwise(sch, expand, expand_act, lanes)
    tile_depthwise(sch, depthwise, depthwise_act, lanes)
    if excited:
        schedule_excitation(sch, lanes)
    tile_pointwise(sch, project, project_act, lanes, parallel=excited)


def _fuse_by_channels(sch: s_tir.Schedule, channels: int, lanes: int, parts: int) -> None:
    """The expanded channels split between ``parts`` cores; each core, chunk by chunk of ``channels``, expands
    the whole image into them, filters them and adds their share of the projection to sums of its own
    (``rfactor``); the cores' sums are added at the end, with the bias and the residual. With a
    squeeze-and-excitation each chunk is expanded, filtered and averaged (its channels' share of the pool);
    the projection follows the gates, over the whole image."""
    expand, expand_act, depthwise, depthwise_act, project, project_act = _stages(sch)
    if _sblock(sch, "pool") is not None:
        i, j, c, *_ = sch.get_loops(depthwise)
        part, chunks, chunk = sch.split(c, [parts, None, channels])
        sch.reorder(part, chunks, i, j, chunk)
        sch.parallel(part)
        producers, partial = (expand_act, expand), None
    else:
        *_, reduction = sch.get_loops(project)
        part, chunks, chunk = sch.split(reduction, [parts, None, channels])
        partial = sch.rfactor(part, 0)  # partial[part, i, j, n]: each core's share of the projection
        i, j, n, part, chunks, chunk = sch.get_loops(partial)
        sch.reorder(part, chunks, i, j, n, chunk)
        sch.parallel(part)
        producers = (depthwise_act, depthwise, expand_act, expand)
    for producer in producers:  # consumers first
        if producer is not None:
            sch.compute_at(producer, chunks, preserve_unit_loops=True)
    if expand is not None:
        tile_pointwise(sch, expand, expand_act, lanes)
    tile_depthwise(sch, depthwise, depthwise_act, lanes)
    if partial is None:
        pool = sch.get_sblock("pool")
        sch.reverse_compute_at(pool, chunks, preserve_unit_loops=True)
        tile_sums(sch, pool, lanes)
        schedule_excitation(sch, lanes, pooled=True)
        few_rows = int(sch.get(sch.get_loops(project)[0]).extent) < 14  # the cores share the channels instead
        tile_pointwise(sch, project, project_act, lanes, parallel=True, channels_outer=few_rows)
        return
    tile_pointwise(sch, partial, None, lanes, zero_at=chunks)
    i, j, n, part = sch.get_loops(project)  # the cores' sums added, vector by vector
    outer, vector = sch.split(n, [None, vector_lanes(int(sch.get(n).extent), lanes)])
    sch.reorder(i, j, outer, part, vector)
    sch.vectorize(vector)
    finish(sch, project, part, project_act, outer)


def outline(sch: s_tir.Schedule, depth: int = 2) -> str:
    """The kernel's outer loops, ``depth`` deep, and below them the stages each loop runs, in order: what
    ``compute_at`` changed, without the register tiles' loops (``sch.mod.script()`` prints all of it)."""
    lines: list[str] = []

    def stages_in(stmt, names: list[str] | None = None) -> list[str]:
        names = [] if names is None else names
        if isinstance(stmt, s_tir.SBlockRealize):
            name = stmt.block.name_hint.removesuffix("_update")
            if not name.endswith("_init") and name not in names:
                names.append(name)
            stages_in(stmt.block.body, names)
        elif isinstance(stmt, tirx.SeqStmt):
            for part in stmt:
                stages_in(part, names)
        elif hasattr(stmt, "body"):
            stages_in(stmt.body, names)
        return names

    def walk(stmt, level: int) -> None:
        if isinstance(stmt, tirx.For):
            kind = "parallel" if stmt.kind == tirx.ForKind.PARALLEL else "range"
            if not stages_in(stmt):  # (only zeroing sums)
                return
            if level < depth:
                lines.append(f"{'    ' * level}for {stmt.loop_var.name} in {kind}({stmt.extent}):")
                walk(stmt.body, level + 1)
            else:
                lines.append(f"{'    ' * level}{', '.join(stages_in(stmt))}")
        elif isinstance(stmt, tirx.SeqStmt):
            for part in stmt:
                walk(part, level)
        elif isinstance(stmt, s_tir.SBlockRealize):
            if stmt.block.name_hint == "root":
                walk(stmt.block.body, level)
            else:
                lines.append(f"{'    ' * level}{', '.join(stages_in(stmt))}")
        elif hasattr(stmt, "body"):
            walk(stmt.body, level)

    walk(sch.mod["main"].body, 0)
    return "\n".join(lines)


def block_weights(block: torch.nn.Module) -> list[np.ndarray]:
    """The block's weights with BatchNorm folded in, in ``block_function``'s order and layouts: W1 (c_in,
    hidden), B1 (where the block expands), W2 (k, k, hidden), B2, the squeeze-and-excitation's S1 (hidden,
    squeeze), SB1, S2 (squeeze, hidden), SB2 (where it has one), W3 (hidden, c_out), B3."""
    pairs, excite, _ = _layers(block)
    folded = [torch.nn.utils.fusion.fuse_conv_bn_eval(conv.eval(), bn.eval()) for conv, bn in pairs]
    *expand, depthwise, projection = [(f.weight.detach().numpy(), f.bias.detach().numpy()) for f in folded]
    arrays = [expand[0][0][:, :, 0, 0].T, expand[0][1]] if expand else []
    arrays += [depthwise[0][:, 0].transpose(1, 2, 0), depthwise[1]]
    if excite is not None:
        arrays += [excite.fc1.weight.detach().numpy()[:, :, 0, 0].T, excite.fc1.bias.detach().numpy(),
                   excite.fc2.weight.detach().numpy()[:, :, 0, 0].T, excite.fc2.bias.detach().numpy()]
    arrays += [projection[0][:, :, 0, 0].T, projection[1]]
    return [np.ascontiguousarray(a, dtype="float32") for a in arrays]


@dataclass
class CompiledBlock:
    """A block's kernel, compiled, with its weights and an output buffer on the CPU."""

    shape: BlockShape
    library: tvm.runtime.Module
    weights: list

    def run(self, x_nhwc: tvm.runtime.Tensor, out: tvm.runtime.Tensor) -> None:
        self.library["main"](x_nhwc, *self.weights, out)

    def runner(self, x: torch.Tensor) -> Callable[[], object]:
        """A zero-argument call on ``x`` (NCHW, batch 1), already moved to channels last: the kernel alone."""
        x_nhwc, out = self._buffers(x)
        return lambda: self.run(x_nhwc, out)

    def __call__(self, x: torch.Tensor) -> np.ndarray:
        """The block on ``x`` (NCHW, batch 1), the result in NCHW like PyTorch's."""
        x_nhwc, out = self._buffers(x)
        self.run(x_nhwc, out)
        return out.numpy().transpose(2, 0, 1)[None]

    def _buffers(self, x: torch.Tensor):
        want = (1, self.shape.c_in, self.shape.size, self.shape.size)
        if tuple(x.shape) != want:
            raise BlockError(f"the block was compiled for an input of shape {want}, got {tuple(x.shape)}.")
        dev = tvm.cpu()
        out = (self.shape.out_size, self.shape.out_size, self.shape.c_out)
        return (tvm.runtime.tensor(np.ascontiguousarray(x[0].permute(1, 2, 0).numpy()), dev),
                tvm.runtime.tensor(np.zeros(out, "float32"), dev))


def compile_block(block: torch.nn.Module, size: int, tiling: Tiling | None = None,
                  target: tvm.target.Target | None = None) -> CompiledBlock:
    """``block`` compiled for this CPU on a ``size`` x ``size`` input: one kernel cut as ``tiling`` says, or
    three kernels when ``tiling`` is None."""
    shape = block_shape(block, size)
    target = target or machine.cpu_target()
    lanes = machine.float32_lanes(target)
    cores = int(target.attrs.get("num-cores", machine.physical_core_count()))
    sch = schedule_separate(shape, lanes) if tiling is None else schedule_fused(shape, tiling, lanes, cores)
    return compile_schedule(sch, block, target)


def compile_schedule(sch: s_tir.Schedule, block: torch.nn.Module, target: tvm.target.Target | None = None) -> CompiledBlock:
    """A schedule of your own of ``block_function`` for ``block``'s shape, compiled with ``block``'s folded
    weights: call it on an NCHW tensor like the block, or ``check`` it. Raises ``BlockError`` when the schedule's
    input is not the block's."""
    have = buffer_shapes(sch.mod["main"])
    shape = block_shape(block, have[0][0])
    want = buffer_shapes(block_function(shape))
    if have != want:
        raise BlockError(f"this schedule's buffers are {have}; the block ({shape}) needs {want}: schedule "
                         "block_function(block_shape(block, size)).")
    weights = block_weights(block)
    dev = tvm.cpu()
    return CompiledBlock(shape, tvm.compile(sch.mod, target=target or machine.cpu_target()),
                         [tvm.runtime.tensor(w, dev) for w in weights])


def check(compiled: CompiledBlock, block: torch.nn.Module, x: torch.Tensor, rtol: float = 1e-4) -> float:
    """The kernel's relative error against PyTorch's block on ``x``; raises ``AssertionError`` above ``rtol``."""
    with torch.no_grad():
        want = block.eval()(x).numpy()
    err = relative_error(compiled(x), want)
    if not err <= rtol:
        raise AssertionError(f"the compiled block differs from PyTorch's: relative error {err:.2e} > {rtol:.0e}.")
    return err


def time_tilings(block: torch.nn.Module, x: torch.Tensor, choices: Sequence[Tiling] | None = None,
                 repeats: int | None = None) -> list[Timing]:
    """The fused kernel with each tiling (default ``tilings``) beside the three separate kernels, interleaved in
    one run, each checked against PyTorch first. Labels: ``SEPARATE`` and each tiling's (``"rows=4"``)."""
    shape = block_shape(block, x.shape[-1])
    runners = {}
    for tiling in [None, *(choices or tilings(shape))]:
        compiled = compile_block(block, shape.size, tiling)
        check(compiled, block, x)
        runners[SEPARATE if tiling is None else str(tiling)] = compiled.runner(x)
    return timing.measure(runners, repeats=repeats, min_sample_ms=20)


def best_tiling(timings: Sequence[Timing]) -> Tiling:
    """The tiling of the fastest fused kernel in ``time_tilings``' timings."""
    return Tiling.parse(min((t for t in timings if t.label != SEPARATE), key=lambda t: t.median_ms).label)


def compare(block: torch.nn.Module, x: torch.Tensor, tiling: Tiling, peers: Sequence[str] = ("ONNX Runtime", "OpenVINO"),
            repeats: int | None = None) -> list[Timing]:
    """The block on ``x`` as three kernels, as one fused kernel (cut as ``tiling`` says), and in each peer engine
    (fed the block's ONNX export, float32, run on PyTorch's NCHW tensor), interleaved in one run. A peer that
    is not installed or cannot run the block is left out, with the reason printed."""
    from . import peers as engines  # (the engines load only when compared)

    shape = block_shape(block, x.shape[-1])
    runners = {}
    for label, how in ((SEPARATE, None), (FUSED, tiling)):
        compiled = compile_block(block, shape.size, how)
        check(compiled, block, x)
        runners[label] = compiled.runner(x)
    for label in peers:
        try:
            runners[label], _, _ = engines.onnx_engine_runner(label, block.eval(), x)
        except engines.PeerUnavailable as why:
            print(why)
    return timing.measure_engines(runners, **({} if repeats is None else {"repeats": repeats}))
