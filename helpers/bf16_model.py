"""A model's convolutions in bfloat16 on ``vdpbf16ps`` (``helpers.bf16``), in Relax.

The same kind of rewrite as Day 12's int8 (``quantize``), without calibration: bfloat16 keeps float32's
exponent, so a value needs no scale, only rounding to 8 bits of mantissa. The model runs channels
last (``quantize.to_nhwc``); each convolution without groups becomes

    round to bfloat16 bits (uint16) -> products on vdpbf16ps, float32 sums -> float32

with its weight rounded once and packed in 16x2 tiles (``bf16.pack_weight``, ``pack_conv_weight``). The
rounding is an element-wise kernel, so fusion puts it at the end of the kernel that wrote the activation:
the activation crosses memory as bits. Depthwise convolutions read bits and compute in float32 (there is
no sum over channels for the instruction to work on). The classifier is a product on the instruction too
(``is_product_with_constant_weight``); the element-wise operations (the residual additions among them) stay
float32. A squeeze-and-excite's mean over many positions becomes a product (``spatial_mean_product_compute``),
which tunes into a kernel 4 to 7 times faster than a mean's.

Introduced on Day 12.
"""

from __future__ import annotations

import numpy as np
import torch
import tvm
from tvm import relax, te

from . import bf16, models, quantize
from .errors import CourseError
from .models import ImportedModel
from .nchwc import depthwise_nhwc_space, is_depthwise_nhwc



DEFAULT_VECTOR = 64  # the values MetaSchedule's default schedule of an element-wise kernel puts in one vector
LINEAR_TILE_GROUP = 4  # a classifier's tiles of outputs padded to a multiple of this: even over 2 or 4 threads


def database_name(model: str) -> str:
    """The name the bf16 build of ``model`` has in ``databases`` (shipped: ``tuning/<name>-b1-<cpu>-<cores>cores``)."""
    return f"{model}_bf16"


def round_to_bits(x: te.Tensor) -> te.Tensor:
    """float32 ``x`` as the bits of the nearest bfloat16 (round to nearest even), in ``uint16``.

    A float32's top 16 bits are a bfloat16 that rounds towards zero; adding ``0x7FFF`` plus the lowest kept
    bit before dropping the bottom 16 rounds to nearest, ties to even, as ``bf16.to_bits`` does (NaN aside)."""
    def rounded(*index):
        bits = tvm.tirx.reinterpret("uint32", x[index])
        keep = (bits >> tvm.tirx.const(16, "uint32")) & tvm.tirx.const(1, "uint32")
        return ((bits + tvm.tirx.const(0x7FFF, "uint32") + keep) >> tvm.tirx.const(16, "uint32")).astype("uint16")

    return te.compute(x.shape, rounded, name="to_bf16")


def widen_bits(bits: te.Tensor) -> te.Tensor:
    """bfloat16 bits (``uint16``) as the float32 values they are, exactly."""
    return te.compute(bits.shape, lambda *index: bf16.widen(bits[index]), name="from_bf16")


def pointwise_bf16_compute(A: te.Tensor, W: te.Tensor) -> te.Tensor:
    """``C[..., n] = sum_k A[..., k] * W[n, k]`` in float32 from bfloat16 bits: ``A`` an NHWC activation
    (``uint16``), ``W`` packed ``[n/16, k/2, 16, 2]`` (``bf16.pack_weight``)."""
    *rows, k = (int(d) for d in A.shape)
    n = int(W.shape[0]) * bf16.LANES
    r = te.reduce_axis((0, k), name="k")

    def dot(*index):
        *row, j = index
        return te.sum(bf16.widen(A[(*row, r)]) * bf16.widen(W[j // bf16.LANES, r // bf16.PAIR, j % bf16.LANES, r % bf16.PAIR]),
                      axis=r)

    return te.compute((*rows, n), dot, name="C")


def pack_conv_weight(weight: np.ndarray) -> np.ndarray:
    """A float32 OHWI ``[O, kh, kw, C]`` convolution weight as bfloat16 bits packed ``[O/16, kh, kw, C/2, 16, 2]``
    (``O`` and ``C`` padded with zeros to multiples of 16 and 2): each 16x2 tile 64 contiguous bytes, as
    ``bf16.pack_weight`` lays out a matrix."""
    o, kh, kw, c = weight.shape
    o_pad, c_pad = -(-o // bf16.LANES) * bf16.LANES, -(-c // bf16.PAIR) * bf16.PAIR
    bits = np.zeros((o_pad, kh, kw, c_pad), np.uint16)
    bits[:o, :, :, :c] = bf16.to_bits(weight)
    tiles = bits.reshape(o_pad // bf16.LANES, bf16.LANES, kh, kw, c_pad // bf16.PAIR, bf16.PAIR)
    return np.ascontiguousarray(tiles.transpose(0, 2, 3, 4, 1, 5))


def _pad_bits(X: te.Tensor, padding: tuple[int, int, int, int], channels: int | None = None) -> te.Tensor:
    """``X`` (bits, NHWC) with zeros around its rows and columns (``padding``: top, left, bottom, right) and, given
    ``channels``, after its channels up to that many: zero bits are 0.0."""
    n, h, w, c = (int(d) for d in X.shape)
    top, left, bottom, right = padding

    def inside(i, j, k):
        return tvm.tirx.all(i >= top, i < h + top, j >= left, j < w + left, *([] if channels is None else [k < c]))

    return te.compute((n, h + top + bottom, w + left + right, c if channels is None else channels),
                      lambda b, i, j, k: tvm.tirx.if_then_else(inside(i, j, k), X[b, i - top, j - left, k],
                                                               tvm.tirx.const(0, "uint16")), name="pad_bits")


def conv_bf16_compute(X: te.Tensor, W: te.Tensor, strides: tuple[int, int], padding: tuple[int, int, int, int]) -> te.Tensor:
    """A convolution (no groups) in float32 sums from bfloat16 bits: ``X`` NHWC (``uint16``), ``W`` packed
    ``[O/16, kh, kw, C/2, 16, 2]`` (``pack_conv_weight``). Pairs of input channels meet 16 output channels,
    the intrinsic's shape, at every tap of the kernel."""
    kh, kw, pairs = (int(d) for d in W.shape[1:4])
    padded = _pad_bits(X, padding, pairs * bf16.PAIR)
    out_h, out_w = (int(padded.shape[1]) - kh) // strides[0] + 1, (int(padded.shape[2]) - kw) // strides[1] + 1
    ry, rx = te.reduce_axis((0, kh), name="ry"), te.reduce_axis((0, kw), name="rx")
    rc = te.reduce_axis((0, pairs * bf16.PAIR), name="rc")
    return te.compute((int(X.shape[0]), out_h, out_w, int(W.shape[0]) * bf16.LANES), lambda b, i, j, o: te.sum(
        bf16.widen(padded[b, i * strides[0] + ry, j * strides[1] + rx, rc])
        * bf16.widen(W[o // bf16.LANES, ry, rx, rc // bf16.PAIR, o % bf16.LANES, rc % bf16.PAIR]), axis=[ry, rx, rc]),
        name="C")


def depthwise_from_bits_compute(X: te.Tensor, W: te.Tensor, strides: tuple[int, int],
                                padding: tuple[int, int, int, int]) -> te.Tensor:
    """A depthwise NHWC convolution in float32 of an activation stored as bfloat16 bits (``uint16``): each input
    read once at half float32's size, widened exactly; ``W`` float32 ``[kh, kw, C]``, channels last like the
    activation (``quantize.depthwise_from_uint8_compute``'s layout: a vector of channels' weights is one load)."""
    kh, kw = int(W.shape[0]), int(W.shape[1])
    padded = _pad_bits(X, padding)
    out_h, out_w = (int(padded.shape[1]) - kh) // strides[0] + 1, (int(padded.shape[2]) - kw) // strides[1] + 1
    ry, rx = te.reduce_axis((0, kh), name="ry"), te.reduce_axis((0, kw), name="rx")
    return te.compute((int(X.shape[0]), out_h, out_w, int(X.shape[3])), lambda b, i, j, k: te.sum(
        bf16.widen(padded[b, i * strides[0] + ry, j * strides[1] + rx, k]) * W[ry, rx, k], axis=[ry, rx]),
        name="depthwise")


def spatial_mean_product_compute(X: te.Tensor, share: te.Tensor) -> te.Tensor:
    """The mean of NHWC ``X`` over its positions, ``[1, 1, 1, C]``, as a product: ``share`` (``[H, W]``, each
    ``1/(H*W)``) times ``X``, summed over the positions in float32 like ``mean``. MetaSchedule tiles a product with
    vectors of channels inside the sum over positions (``is_long_spatial_mean`` says why that matters)."""
    _, h, w, c = (int(d) for d in X.shape)
    i, j = te.reduce_axis((0, h), name="i"), te.reduce_axis((0, w), name="j")
    return te.compute((1, 1, 1, c), lambda b, y, x, k: te.sum(share[i, j] * X[b, i, j, k], axis=[i, j]), name="mean")


def linear_outputs(n: int) -> int:
    """The outputs a classifier of ``n`` computes in bf16: ``n`` padded to a multiple of ``LINEAR_TILE_GROUP`` tiles
    of 16. Its weight comes from memory, so the kernel is only as fast as its slowest core's share of the tiles:
    MobileNetV2's 1000 classes are 62.5 tiles, padded to 63 they split three ways over two cores (85 us in the
    model on a Zen 5, float32's was 75), padded to 64 two ways (27 us)."""
    group = LINEAR_TILE_GROUP * bf16.LANES
    return -(-n // group) * group


def is_product_with_constant_weight(call: relax.Call) -> bool:
    """True for ``relax.matmul(x, W)`` with ``x`` ``[rows, K]`` float32 and ``W`` a constant float32 ``[K, N]``, ``K``
    even (pairs for the intrinsic): a classifier, as torch's ``Linear`` imports (its bias is an addition after it)."""
    if not (isinstance(call.op, tvm.ir.Op) and call.op.name == "relax.matmul"):
        return False
    x, w = call.args
    return isinstance(w, tvm.ir.expr.Constant) and len(w.value.shape) == 2 and w.value.dtype == "float32" \
        and int(w.value.shape[0]) % bf16.PAIR == 0 and len(x.ty.shape) == 2 and x.ty.dtype == "float32"


def is_long_spatial_mean(call: relax.Call) -> bool:
    """True for a float32 mean of an NHWC activation over its positions (EfficientNet's squeeze-and-excite) with
    more positions than channels. Tuned alone on a Zen 5 (32 trials each), MetaSchedule's best schedule of such a
    mean took 4 to 7 times a product's: 120 against 17 us for 112x112 positions of 32 channels, 83 against 17 for
    56x56 of 144, 22 against 5 for 28x28 of 240; with fewer positions than channels the mean was as fast or faster
    (14x14 of 480: 2.0 against 3.0 us; 7x7 of 1152: 1.9 against 2.7)."""
    if not (isinstance(call.op, tvm.ir.Op) and call.op.name == "relax.mean" and call.attrs.keepdims):
        return False
    x = call.args[0]
    if len(x.ty.shape) != 4 or str(x.ty.dtype) != "float32" or [int(a) for a in call.attrs.axis] != [1, 2]:
        return False
    _, h, w, c = (int(d) for d in x.ty.shape)
    return h * w > c


@relax.expr_functor.mutator
class _ConvsToBf16(relax.PyExprMutator):
    """Replaces each float32 NHWC conv2d without groups and with a constant weight by its bf16 version (1x1 ones
    only unless ``all_convs``), and (``depthwise``) each depthwise one by a version that reads its input as bits."""

    def __init__(self, mod: tvm.IRModule, depthwise: bool, all_convs: bool, residual_bits: bool = False,
                 linear: bool = True):
        super().__init__(mod)
        self.depthwise, self.all_convs, self.residual_bits, self.linear = depthwise, all_convs, residual_bits, linear
        self.rewritten = 0
        self.bits: dict[relax.Expr, relax.Expr] = {}  # with residual_bits: a rounded activation's bits, by activation

    def _round(self, x: relax.Expr) -> relax.Expr:
        """``x`` rounded to bfloat16 bits for a convolution, a rounding per convolution as without ``residual_bits``
        (an activation two convolutions read, ResNet's max pool, then keeps its tuned kernel and its roundings);
        with ``residual_bits`` the first is kept for a residual addition of ``x``."""
        bits = self.builder_.emit_te(round_to_bits, x, primfunc_name_hint="to_bf16")
        if self.residual_bits:
            self.bits.setdefault(x, bits)
        return bits

    def _residual_from_bits(self, call: relax.Call) -> relax.Call:
        """A residual addition of an activation that a convolution reads as bits: the addition reads the bits
        too, so that the activation is written once, as bits, by the kernel that computes it."""
        if not any(arg in self.bits for arg in call.args):
            return call
        args = [self.builder_.emit_te(widen_bits, self.bits[arg], primfunc_name_hint="from_bf16")
                if arg in self.bits else arg for arg in call.args]
        return relax.op.add(*args)

    def _spatial_mean_as_product(self, x: relax.Expr) -> relax.Expr:
        _, h, w, _ = (int(d) for d in x.ty.shape)
        share = relax.const(np.full((h, w), 1.0 / (h * w), np.float32))
        return self.builder_.emit_te(spatial_mean_product_compute, x, share, primfunc_name_hint="mean_as_product")

    def _linear(self, x: relax.Expr, weight: tvm.ir.expr.Constant) -> relax.Expr:
        """``x @ weight`` (a classifier: ``[rows, K]`` by a constant ``[K, N]``) as products of bits, its outputs
        padded to whole groups of tiles (``linear_outputs``) and sliced back."""
        w = weight.value.numpy()
        k, n = w.shape
        padded = np.zeros((linear_outputs(n), k), np.float32)
        padded[:n] = w.T
        y = self.builder_.emit_te(pointwise_bf16_compute, self._round(x),
                                  relax.const(bf16.pack_weight(bf16.to_bits(padded)), "uint16"),
                                  primfunc_name_hint="bf16_linear")
        self.rewritten += 1
        return self._first_outputs(y, n)

    def _first_outputs(self, y: relax.Expr, n: int) -> relax.Expr:
        """``y`` without the outputs past the first ``n`` on its last axis, those its weight was padded with."""
        axis = len(y.ty.shape) - 1
        if int(y.ty.shape[axis]) == n:
            return y
        return self.builder_.emit(relax.op.strided_slice(y, axes=[axis], begin=[0], end=[n]))

    def _depthwise(self, x: relax.Expr, weight: np.ndarray, a) -> relax.Expr:
        bits = self._round(x)
        weight = quantize.depthwise_weight_channels_last(weight)
        return self.builder_.emit_te(depthwise_from_bits_compute, bits, relax.const(weight, "float32"),
                                     tuple(int(s) for s in a.strides), tuple(int(p) for p in a.padding),
                                     primfunc_name_hint="depthwise_from_bits")

    def visit_call_(self, call: relax.Call) -> relax.Expr:
        call = self.visit_expr_post_order(call)
        if self.residual_bits and isinstance(call.op, tvm.ir.Op) and call.op.name == "relax.add":
            return self._residual_from_bits(call)
        if is_long_spatial_mean(call):
            return self._spatial_mean_as_product(call.args[0])
        if self.linear and is_product_with_constant_weight(call):
            return self._linear(*call.args)
        found = quantize.conv_with_constant_weight(call, (quantize.NHWC,))
        if found is None:
            return call
        x, weight, a = found
        channels = int(x.ty.shape[3])
        if self.depthwise and int(a.groups) == channels == weight.shape[0] and weight.shape[3] == 1 \
                and [int(d) for d in a.dilation] == [1, 1] and weight.dtype == np.float32:
            return self._depthwise(x, weight, a)
        if int(a.groups) != 1 or [int(d) for d in a.dilation] != [1, 1] or weight.dtype != np.float32:
            return call
        n = weight.shape[0]
        bits = self._round(x)
        if weight.shape[1:3] == (1, 1) and [int(s) for s in a.strides] == [1, 1] and not any(int(p) for p in a.padding) \
                and weight.shape[3] % bf16.PAIR == 0:
            packed = pack_conv_weight(weight)[:, 0, 0]  # [O/16, C/2, 16, 2]: bf16.pack_weight's layout of the matrix
            y = self.builder_.emit_te(pointwise_bf16_compute, bits, relax.const(packed, "uint16"),
                                      primfunc_name_hint="bf16_conv1x1")
        elif self.all_convs:
            packed = pack_conv_weight(weight)
            y = self.builder_.emit_te(conv_bf16_compute, bits, relax.const(packed, "uint16"),
                                      tuple(int(s) for s in a.strides), tuple(int(p) for p in a.padding),
                                      primfunc_name_hint="bf16_conv")
        else:
            return call
        self.rewritten += 1
        return self._first_outputs(y, n)


def convs_to_bf16(imported: ImportedModel, depthwise_from_bits: bool = True, all_convs: bool = True,
                  residual_bits: bool = False, linear: bool = True) -> ImportedModel:
    """``imported`` channels last with its convolutions in bfloat16 (weights bound as constants: the result takes
    the input only): every 1x1 convolution with stride 1 as a product (``pointwise_bf16_compute``) and, with
    ``all_convs``, every other one without groups (MobileNetV2's stem, ResNet's 3x3 and strided ones:
    ``conv_bf16_compute``). With ``depthwise_from_bits`` each depthwise convolution reads its input as bfloat16
    bits too, so that the rounding joins the kernel that wrote it and the largest activations cross memory at
    half their size; it still computes in float32. A mean over more positions than channels becomes a product
    (``is_long_spatial_mean``). With ``linear`` the classifier is a product of bits too
    (``is_product_with_constant_weight``): its weight, read once per image from memory, at half the bytes.
    With ``residual_bits`` an activation that a convolution reads and a residual addition adds (a block's
    input) is added from the bits the convolution reads: the kernel that computes it then writes it once, as
    bits, where it wrote float32 and a rounding kernel wrote the bits (every residual stream in bfloat16, as
    OpenVINO keeps it). The kernels change, so only where no database is needed for them: on AMX, where every
    convolution is scheduled by hand (``amx.schedule_products``); the databases tuned without AMX hold the
    kernels of the float32 stream."""
    mod = quantize.to_nhwc(quantize.bind_weights(imported))
    rewriter = _ConvsToBf16(mod, depthwise_from_bits, all_convs, residual_bits, linear)
    out = quantize.rewrite_main(rewriter, mod)
    if not rewriter.rewritten:
        raise CourseError("This model has no convolution to run in bfloat16: none without groups (with all_convs=False, "
                          "none 1x1 with stride 1).")
    return ImportedModel(mod=out, params=[], input_shape=imported.input_shape, input_dtype=imported.input_dtype)


def import_bf16(model: torch.nn.Module, example: torch.Tensor, on_tiles: bool = False) -> ImportedModel:
    """``model`` imported for ``example`` with its BatchNorms folded into the convolutions
    (``quantize.fold_batch_norms``: the weights rounded to bfloat16 must hold them) and its convolutions
    in bfloat16 (``convs_to_bf16``).

    ``on_tiles`` (``amx.has_amx(target)``) says that its convolutions will be scheduled by hand on AMX tiles, so
    that none of them needs a database's records and the build may change them: ResNet's blocks get their
    BatchNorms folded too (``resnet_blocks``: one division per output value fewer) and the residual stream
    crosses memory as bits (``residual_bits``). Without AMX the databases hold the kernels of the model as
    it is without either."""
    folded = quantize.fold_batch_norms(model, resnet_blocks=on_tiles)
    return convs_to_bf16(models.import_to_relax(folded, example), residual_bits=on_tiles)


def is_bf16_kernel(task) -> bool:
    """True for a kernel that multiplies by a packed bfloat16 weight (``[N/16, K/2, 16, 2]`` bits; a task of
    ``tuning.tune``): what ``bf16.bf16_space`` tiles. (A rounding or a depthwise convolution on bits has none.)"""
    func = task.dispatched[0]["main"]
    return any(str(p.ty.dtype) == "uint16" and [int(d) for d in p.ty.shape[-2:]] == [bf16.LANES, bf16.PAIR]
               for p in func.params if hasattr(p.ty, "shape") and len(p.ty.shape) in (4, 6))


def is_ragged_rounding(task) -> bool:
    """True for a kernel that only rounds an activation to bits (``round_to_bits``, fused with nothing: an activation
    that a residual addition reads in float32 and a convolution as bits) whose channels are not a multiple of the
    ``DEFAULT_VECTOR`` values MetaSchedule's default schedule puts in one vector: its vectors then cross from one
    position to the next, and with 24 or 96 channels that cost 15 and 7 times the time of a vector per position
    (``quantize.schedule_quantize_nhwc``, which schedules it: 34 against 2.3 us for 56x56x24 alone on a Zen 5,
    8.2 against 1.2 for 14x14x96; with 32, 40, 112 or 160 channels both were within 0.2 us)."""
    block = quantize.nhwc_block_alone(tvm.s_tir.Schedule(task.dispatched[0]), "to_bf16")
    return block is not None and int(task.dispatched[0]["main"].params[0].ty.shape[-1]) % DEFAULT_VECTOR != 0


def space_for(task):
    """``tuning.tune``'s ``space_for``: ``bf16.bf16_space`` for the bf16 products, ``nchwc.depthwise_nhwc_space`` for
    the depthwise convolutions of bits, ``quantize.quantize_nhwc_space`` for a ragged rounding, the default space for the rest."""
    if is_bf16_kernel(task):
        return bf16.bf16_space()
    if is_depthwise_nhwc(task):
        return depthwise_nhwc_space(bf16.LANES)
    if is_ragged_rounding(task):
        return quantize.quantize_nhwc_space("to_bf16")
    return "post-order-apply"
