"""Post-training int8 quantization of a model's pointwise convolutions, in Relax (Day 12).

The recipe is the classic one, written out so that each step can be read:

1. **Fold BatchNorm** into the convolutions (``fold_batch_norms``): an inference BatchNorm is
   a per-channel multiply-add, so the quantized weights must already contain it.
2. **Calibrate** (``calibrate``): run the float model on sample inputs and record the range of
   every pointwise convolution's input.
3. **Rewrite** (``quantize_pointwise_convs``): each 1x1 convolution becomes
   ``quantize -> int8 matmul (uint8 x int8 -> int32) -> dequantize``. Activations are
   asymmetric uint8 per tensor, weights symmetric int8 per output channel, packed as
   ``helpers.int8.pack_weight`` lays them out for the VNNI instruction. The activation's
   zero point is folded into the dequantize: ``sum_k (xq - zp) w = sum_k xq w - zp sum_k w``.

4. **Depthwise inputs in uint8** (``quantize_depthwise_inputs``, where ``uint8_depthwise(target)``):
   each depthwise convolution reads its input quantized, so the kernel that writes it (the
   expansion before it) writes bytes, a quarter of float32's traffic for the largest tensors.

Pointwise convolutions carry most of MobileNetV2's arithmetic and are matrix products in
NHWC, the layout ``vpdpbusd`` wants (4 consecutive input channels, 16 consecutive output
channels). Depthwise convolutions (9 products per output, no reduction over channels for
the instruction to work on) compute in float32 (from uint8 inputs after step 4); the stem and
the classifier stay float32.

Introduced on Day 12.
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace

import numpy as np
import torch
import torchvision
import tvm
from tvm import relax, s_tir, te
from tvm.s_tir import meta_schedule as ms

from . import int8, models, peers
from .build import compile_model, relative_error
from .errors import CourseError
from .machine import cpu_target, float32_lanes
from .nchwc import depthwise_nhwc_space, is_depthwise_nhwc
from .models import ImportedModel

U8_MAX, S8_MAX = 255, 127
MODEL = "mobilenet_v2"
CALIBRATION_SEEDS = range(100, 104)  # four batches of four seeded images; held-out inputs use other seeds
CALIBRATION_BATCH = 4


# ------------------------------------------------------------------ the model side


def calibration_inputs() -> list[torch.Tensor]:
    """The sample inputs every calibration in the course uses (seeded, so a database's kernels match)."""
    return [models.example_input(batch=CALIBRATION_BATCH, seed=s) for s in CALIBRATION_SEEDS]


def float_model(name: str = MODEL) -> tuple[torch.nn.Module, bool]:
    """(the float32 model, whether its weights are trained).

    Trained ImageNet weights where they can be had; otherwise seeded random weights with their
    BatchNorm statistics re-estimated on the calibration inputs (``with_batchnorm_statistics``).
    """
    model = models.load_model(name, pretrained=True)
    trained = models.pretrained_available(name)
    return (model if trained else with_batchnorm_statistics(model, calibration_inputs())), trained


def with_batchnorm_statistics(model: torch.nn.Module, inputs: Iterable[torch.Tensor]) -> torch.nn.Module:
    """A copy of ``model`` whose BatchNorm running statistics are re-estimated on ``inputs``.

    A randomly initialised network has running means 0 and variances 1 that fit none of its
    layers: MobileNetV2's logits shrink to about 1e-8 and every input gets the same class.
    Re-estimated statistics normalise each layer as training would, so activations have the
    ranges of a real network and quantization error means something. Trained weights need
    none of this.
    """
    model = copy.deepcopy(model)
    norms = [m for m in model.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)]
    for bn in norms:
        bn.reset_running_stats()
        bn.momentum = None  # a cumulative average over all the batches
    model.train()
    with torch.no_grad():
        for x in inputs:
            model(x)
    return model.eval()


def fold_batch_norms(model: torch.nn.Module, resnet_blocks: bool = False) -> torch.nn.Module:
    """A copy of ``model`` with every ``Conv2d`` followed by a ``BatchNorm2d`` (in a ``Sequential``) fused.

    torchvision's ResNet keeps most of its pairs as attributes instead (``conv1`` and ``bn1`` of the model and of
    each block, ``bn1`` applied to ``conv1``'s output): ``resnet_blocks`` fuses those too. It is a choice because
    the kernels it changes (a bias after each convolution instead of BatchNorm's four operations) are new ones to
    a database tuned on the unfused model."""
    model = copy.deepcopy(model).eval()
    for seq in [m for m in model.modules() if isinstance(m, torch.nn.Sequential)]:
        names = list(seq._modules)
        for a, b in zip(names, names[1:]):
            conv, bn = seq._modules[a], seq._modules[b]
            if isinstance(conv, torch.nn.Conv2d) and isinstance(bn, torch.nn.BatchNorm2d):
                seq._modules[a] = torch.nn.utils.fusion.fuse_conv_bn_eval(conv, bn)
                seq._modules[b] = torch.nn.Identity()
    if resnet_blocks:
        owners = (torchvision.models.ResNet, torchvision.models.resnet.BasicBlock, torchvision.models.resnet.Bottleneck)
        for owner in [m for m in model.modules() if isinstance(m, owners)]:
            for i in (1, 2, 3):
                conv, bn = getattr(owner, f"conv{i}", None), getattr(owner, f"bn{i}", None)
                if isinstance(conv, torch.nn.Conv2d) and isinstance(bn, torch.nn.BatchNorm2d):
                    setattr(owner, f"conv{i}", torch.nn.utils.fusion.fuse_conv_bn_eval(conv, bn))
                    setattr(owner, f"bn{i}", torch.nn.Identity())
    return model


def is_pointwise(conv: torch.nn.Conv2d) -> bool:
    """A 1x1, stride-1, ungrouped convolution: a matrix product over the channels."""
    return conv.kernel_size == (1, 1) and conv.stride == (1, 1) and conv.groups == 1 and conv.padding in ((0, 0), "valid")


def is_depthwise(conv: torch.nn.Conv2d) -> bool:
    """A convolution with one filter per channel (as many groups as input channels)."""
    return conv.groups == conv.in_channels > 1


@dataclass(frozen=True)
class Range:
    """The smallest and largest value a tensor took during calibration."""

    low: float
    high: float


def calibrate(model: torch.nn.Module, inputs: Iterable[torch.Tensor],
              which: Callable[[torch.nn.Conv2d], bool] = is_pointwise) -> dict[str, Range]:
    """The range of every pointwise convolution's input over ``inputs`` (``which``: another kind, e.g.
    ``is_depthwise``), by module name, in call order."""
    ranges: dict[str, Range] = {}
    hooks = []

    def record(name):
        def hook(_module, args):
            x = args[0].detach()
            lo, hi = float(x.min()), float(x.max())
            old = ranges.get(name)
            ranges[name] = Range(lo, hi) if old is None else Range(min(old.low, lo), max(old.high, hi))
        return hook

    for name, module in model.named_modules():
        if isinstance(module, torch.nn.Conv2d) and which(module):
            hooks.append(module.register_forward_pre_hook(record(name)))
    try:
        with torch.no_grad():
            for x in inputs:
                model(x)
    finally:
        for h in hooks:
            h.remove()
    return ranges


# ------------------------------------------------------------------ the arithmetic


def activation_params(r: Range, top: int = U8_MAX) -> tuple[float, int]:
    """Asymmetric uint8: (scale, zero point) that map ``[low, high]`` (widened to hold 0) onto 0..``top``
    (255; 127 where the int8 kernels run ``vpmaddubsw``: ``int8.activation_max``)."""
    low, high = min(r.low, 0.0), max(r.high, 0.0)
    scale = (high - low) / top or 1.0
    zero_point = int(np.clip(round(-low / scale), 0, top))
    return float(scale), zero_point


def quantize_weight(w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Symmetric int8 per output channel: (int8 weight, one scale per row of ``w``'s first axis)."""
    flat = w.reshape(w.shape[0], -1)
    scale = np.abs(flat).max(axis=1) / S8_MAX
    scale[scale == 0] = 1.0
    q = np.clip(np.round(flat / scale[:, None]), -S8_MAX, S8_MAX).astype("int8")
    return q.reshape(w.shape), scale.astype("float32")


# ------------------------------------------------------------------ the Relax rewrite


def _pad_rows(a: np.ndarray, rows: int) -> np.ndarray:
    return np.concatenate([a, np.zeros((rows - a.shape[0], *a.shape[1:]), a.dtype)]) if rows > a.shape[0] else a


NCHW, NHWC = ("NCHW", "OIHW", "NCHW"), ("NHWC", "OHWI", "NHWC")  # a conv2d's data, kernel and output layouts


def conv_with_constant_weight(call: relax.Call, layouts) -> tuple[relax.Expr, np.ndarray, object] | None:
    """(input, weight in NumPy, attributes) of a ``conv2d`` whose weight is a constant and whose layouts are one of
    ``layouts`` (``NCHW``, ``NHWC``); None for any other call: what the course's rewrites of convolutions match."""
    if not (isinstance(call.op, tvm.ir.Op) and call.op.name == "relax.nn.conv2d"):
        return None
    x, w = call.args
    a = call.attrs
    if not isinstance(w, tvm.ir.expr.Constant) or (a.data_layout, a.kernel_layout, a.out_layout) not in layouts:
        return None
    return x, w.value.numpy(), a


@relax.expr_functor.mutator
class _PointwiseToInt8(relax.PyExprMutator):
    """Replaces each float32 1x1 NCHW conv2d with a constant weight, in order, by its int8 version."""

    def __init__(self, mod: tvm.IRModule, params: list[tuple[float, int]], top: int = U8_MAX):
        super().__init__(mod)
        self.params = list(params)
        self.top = top
        self.rewritten = 0

    def visit_call_(self, call: relax.Call) -> relax.Expr:
        call = self.visit_expr_post_order(call)
        found = conv_with_constant_weight(call, (NCHW, NHWC))
        if found is None:
            return call
        x, weight, a = found
        nhwc = a.data_layout == "NHWC"
        if (weight.shape[1:3] if nhwc else weight.shape[2:4]) != (1, 1) or int(a.groups) != 1 or [int(s) for s in a.strides] != [1, 1] \
                or any(int(p) for p in a.padding) or weight.dtype != np.float32:
            return call
        weight = weight[:, 0, 0, :] if nhwc else weight[:, :, 0, 0]
        self.rewritten += 1  # counted even past the calibrated ones: the caller compares the counts
        if self.rewritten > len(self.params):
            return call
        scale_x, zp = self.params[self.rewritten - 1]
        c = int(x.ty.shape[3 if nhwc else 1])
        n = weight.shape[0]
        n_pad = -(-n // int8.LANES) * int8.LANES
        if c % int8.GROUP:
            return call
        wq, scale_w = quantize_weight(weight)
        wq = _pad_rows(wq, n_pad)
        col_sums = wq.astype("int32").sum(axis=1)
        emit = self.builder_.emit
        data = x if nhwc else emit(relax.op.permute_dims(x, [0, 2, 3, 1]))
        # Scale and zero point as per-channel vectors (all equal), not scalars: a scalar is compiled into the
        # kernel as an immediate, so every calibration would make new kernels that no tuning database knows.
        xq = emit(relax.op.quantize(data, relax.const(np.full(c, scale_x, "float32")),
                                    relax.const(np.full(c, zp, "int32")), axis=3, out_dtype="uint8"))
        if self.top < U8_MAX:  # an input past the calibrated range must not reach vpmaddubsw's saturation
            xq = emit(relax.op.clip(xq, 0, self.top))
        acc = self.builder_.emit_te(int8.matmul_u8s8_compute, xq, relax.const(int8.pack_weight(wq), "int8"),
                                    primfunc_name_hint="int8_conv1x1")
        y = emit(relax.op.dequantize(acc, relax.const(_pad_rows(scale_w, n_pad) * scale_x, "float32"),
                                     relax.const((zp * col_sums).astype("int32"), "int32"), axis=3))
        if n_pad != n:
            y = emit(relax.op.strided_slice(y, axes=[3], begin=[0], end=[n]))
        return y if nhwc else relax.op.permute_dims(y, [0, 3, 1, 2])


def bind_weights(imported: ImportedModel) -> tvm.IRModule:
    """``imported``'s module with its weights bound as constants (the rewrite reads them)."""
    main = imported.mod["main"]
    bindings = {var: tensor for var, tensor in zip(main.params[1:], imported.params)}
    return relax.transform.BindParams("main", bindings)(imported.mod)


def _clip_as_min_max(mod: tvm.IRModule) -> tvm.IRModule:
    """``clip(x, lo, hi)`` as ``minimum(maximum(x, lo), hi)``: ConvertLayout knows no layout for ``clip``
    and would go back to NCHW around every ReLU6; the two element-wise ops follow any layout."""
    from tvm.relax.dpl import is_op, rewrite_call, wildcard

    def rewrite(call: relax.Call, _matches) -> relax.Expr:
        x, lo, hi = call.args
        dtype = x.ty.dtype
        lo, hi = relax.const(float(lo.value), dtype), relax.const(float(hi.value), dtype)
        return relax.op.minimum(relax.op.maximum(x, lo), hi)

    out = mod.clone()
    out["main"] = rewrite_call(is_op("relax.clip")(wildcard(), wildcard(), wildcard()), rewrite, mod["main"])
    return out


def to_nhwc(mod: tvm.IRModule) -> tvm.IRModule:
    """``mod`` with its convolutions in NHWC (channels last), weights bound and re-laid out once, here."""
    mod = relax.transform.ConvertLayout({"relax.nn.conv2d": ["NHWC", "OHWI"]})(_clip_as_min_max(mod))
    return relax.transform.FoldConstant()(mod)


def rewrite_main(rewriter: relax.PyExprMutator, mod: tvm.IRModule) -> tvm.IRModule:
    """``mod`` with its ``main`` visited by ``rewriter`` (a course rewrite: ``_PointwiseToInt8``, ``_DepthwiseFromUint8``,
    ``bf16_model``'s) and tidied: bindings normalized and folded, what no longer feeds the output removed."""
    main = rewriter.visit_expr(mod["main"])
    out = rewriter.builder_.get()
    out["main"] = main
    return relax.transform.DeadCodeElimination()(relax.transform.CanonicalizeBindings()(relax.transform.Normalize()(out)))


def quantize_pointwise_convs(imported: ImportedModel, ranges: dict[str, Range], nhwc: bool = True,
                             target: tvm.target.Target | None = None) -> ImportedModel:
    """``imported`` with every pointwise convolution in int8, calibrated by ``ranges`` (``calibrate``).

    The weights are bound into the module as constants (the int8 ones packed for VNNI); the
    result takes the input only. With ``nhwc`` the whole model runs channels-last, the layout
    the int8 kernels read and write; otherwise each one transposes its input and output.
    The activations use the codes the int8 kernels of ``target`` (default: this CPU) take exactly:
    0..255, or 0..127 where they run ``vpmaddubsw`` (``int8.activation_max``).
    """
    top = int8.activation_max(target or cpu_target())
    mod = bind_weights(imported)
    if nhwc:
        mod = to_nhwc(mod)
    rewriter = _PointwiseToInt8(mod, [activation_params(r, top) for r in ranges.values()], top)
    out = rewrite_main(rewriter, mod)
    if rewriter.rewritten != len(ranges):
        raise CourseError(f"{len(ranges)} pointwise convolutions were calibrated but the module has "
                          f"{rewriter.rewritten}: calibrate the same model that was imported.")
    return ImportedModel(mod=out, params=[], input_shape=imported.input_shape, input_dtype=imported.input_dtype)


def uint8_depthwise(target: tvm.target.Target) -> bool:
    """Whether the course's int8 build reads the depthwise convolutions' inputs as uint8 on ``target``
    (``quantize_depthwise_inputs``): where its int8 products run on VNNI (or AMX), as on the Zen 5 where the step was
    tuned and measured (results/HISTORY.md, "A Zen 5, measured again"); the AVX2 databases hold the kernels without it."""
    return int8.int8_instruction(target) == "vnni"


def depthwise_weight_channels_last(weight: np.ndarray) -> np.ndarray:
    """A depthwise convolution's OHWI weight ``[C, kh, kw, 1]`` as ``[kh, kw, C]`` float32, the layout the course's
    depthwise kernels of bytes and of bfloat16 bits read (a tap's weights for a vector of channels in one load)."""
    return np.ascontiguousarray(weight[:, :, :, 0].transpose(1, 2, 0), dtype="float32")


def depthwise_from_uint8_compute(X: te.Tensor, W: te.Tensor, zero_point: int, strides: tuple[int, int],
                                 padding: tuple[int, int, int, int]) -> te.Tensor:
    """A depthwise NHWC convolution in float32 of a uint8 activation: ``W`` float32 ``[kh, kw, C]``, channels last like
    the activation (a vector of 16 channels' weights is then one load, where OHWI's ``[C, kh, kw, 1]`` would need a
    gather of 16 values strided apart), with the activation's scale folded in; the padding the zero point
    (so that it stands for 0.0). It computes ``sum(xq * W)``; the caller subtracts ``zero_point * sum(W)`` per channel."""
    n, h, w, c = (int(d) for d in X.shape)
    top, left, bottom, right = padding
    padded = te.compute((n, h + top + bottom, w + left + right, c), lambda b, i, j, k: tvm.tirx.if_then_else(
        tvm.tirx.all(i >= top, i < h + top, j >= left, j < w + left), X[b, i - top, j - left, k],
        tvm.tirx.const(zero_point, "uint8")), name="pad_u8")
    kh, kw = int(W.shape[0]), int(W.shape[1])
    out_h, out_w = (int(padded.shape[1]) - kh) // strides[0] + 1, (int(padded.shape[2]) - kw) // strides[1] + 1
    ry, rx = te.reduce_axis((0, kh), name="ry"), te.reduce_axis((0, kw), name="rx")
    return te.compute((n, out_h, out_w, c), lambda b, i, j, k: te.sum(
        padded[b, i * strides[0] + ry, j * strides[1] + rx, k].astype("float32") * W[ry, rx, k], axis=[ry, rx]),
        name="depthwise")


@relax.expr_functor.mutator
class _DepthwiseFromUint8(relax.PyExprMutator):
    """Replaces each float32 NHWC depthwise conv2d with a constant weight, in order, by ``quantize`` and a depthwise
    convolution of the bytes (``depthwise_from_uint8_compute``)."""

    def __init__(self, mod: tvm.IRModule, params: list[tuple[float, int]]):
        super().__init__(mod)
        self.params = list(params)
        self.rewritten = 0

    def visit_call_(self, call: relax.Call) -> relax.Expr:
        call = self.visit_expr_post_order(call)
        found = conv_with_constant_weight(call, (NHWC,))
        if found is None:
            return call
        x, weight, a = found
        c = int(x.ty.shape[3])
        if not (int(a.groups) == c == weight.shape[0] and weight.shape[3] == 1 and weight.dtype == np.float32
                and [int(d) for d in a.dilation] == [1, 1]):
            return call
        self.rewritten += 1
        if self.rewritten > len(self.params):
            return call
        scale, zp = self.params[self.rewritten - 1]
        xq = self.builder_.emit(relax.op.quantize(x, relax.const(np.full(c, scale, "float32")),
                                                  relax.const(np.full(c, zp, "int32")), axis=3, out_dtype="uint8"))
        scaled = depthwise_weight_channels_last(weight * np.float32(scale))
        y = self.builder_.emit_te(depthwise_from_uint8_compute, xq, relax.const(scaled, "float32"), zp,
                                  tuple(int(s) for s in a.strides), tuple(int(p) for p in a.padding),
                                  primfunc_name_hint="depthwise_from_u8")
        zero = (-zp * scaled.sum(axis=(0, 1))).reshape(1, 1, 1, c).astype("float32")
        return relax.op.add(y, relax.const(zero))


def quantize_depthwise_inputs(int8_model: ImportedModel, ranges: dict[str, Range]) -> ImportedModel:
    """``int8_model`` (``quantize_pointwise_convs``'s, channels last) with each depthwise convolution reading its
    input as uint8, calibrated by ``ranges`` (``calibrate(..., which=is_depthwise)``): fusion puts the quantize at the
    end of the kernel that writes the input (an expansion's), which then writes a byte per value instead of four;
    the depthwise kernel widens each byte to float32 and computes as before, the scale folded into its weights."""
    rewriter = _DepthwiseFromUint8(int8_model.mod, [activation_params(r) for r in ranges.values()])
    out = rewrite_main(rewriter, int8_model.mod)
    if rewriter.rewritten != len(ranges):
        raise CourseError(f"{len(ranges)} depthwise convolutions were calibrated but the module has "
                          f"{rewriter.rewritten} in NHWC: calibrate the model that was imported, and pass the module "
                          "quantize_pointwise_convs made (channels last).")
    return replace(int8_model, mod=out)


# ------------------------------------------------------------------ tuning and building


def is_int8_kernel(task) -> bool:
    """True for a kernel that multiplies uint8 activations by int8 weights (a task of ``tuning.tune``)."""
    func = task.dispatched[0]["main"]
    dtypes = {str(p.dtype) for p in func.params}
    return {"uint8", "int8"} <= dtypes


def space_for(target: tvm.target.Target):
    """``tuning.tune``'s ``space_for``: for int8 kernels, the space around the course's intrinsic for
    ``target`` (``int8.int8_instruction``: ``vpdpbusd`` with AVX-512 VNNI, ``vpmaddubsw`` with AVX2), or
    LLVM's generic one without AVX2 (not TVM's default: it puts wrong intrinsics in on CPUs without VNNI);
    for the float32 depthwise convolutions between them, ``nchwc.depthwise_nhwc_space`` (the bf16 model's); the
    default space for every other kernel."""
    spaces = {"vnni": int8.vnni_space, "avx2": int8.avx2_space, "generic": int8.generic_space}
    make = spaces[int8.int8_instruction(target)]
    lanes = float32_lanes(target)

    def space(task):
        if is_int8_kernel(task):
            return make()
        if is_quantize_nhwc(task):
            return quantize_nhwc_space()
        return depthwise_nhwc_space(lanes) if is_depthwise_nhwc(task) else "post-order-apply"

    return space


def nhwc_block_alone(sch: s_tir.Schedule, name: str = "quantized"):
    """The block ``name`` of a kernel that is that one block over four channels-last loops, or None: a quantize, or
    ``bf16_model``'s rounding to bits (``to_bf16``), that fusion left apart because a residual stream needs the
    activation in float32 too."""
    try:
        block = sch.get_sblock(name)
    except s_tir.ScheduleError:  # (no block of that name)
        return None
    alone = len(sch.get_child_blocks(sch.get_sblock("root"))) == 1
    return block if alone and len(sch.get_loops(block)) == 4 else None


def is_quantize_nhwc(task) -> bool:
    """True for a tuning task whose kernel only quantizes an NHWC activation (``schedule_quantize_nhwc``'s): one a
    residual stream needs in float32 too, so that fusion leaves its quantize apart."""
    return nhwc_block_alone(s_tir.Schedule(task.dispatched[0])) is not None


def schedule_quantize_nhwc(sch: s_tir.Schedule, block: str = "quantized") -> None:
    """A channels-last quantize (or ``block``: bf16's rounding, ``to_bf16``) with its rows in parallel and each
    pixel's channels as one vector: each value's scale and zero point (per channel) are then read in order.
    MetaSchedule's default space fuses all four loops and vectorizes by 64 whatever the channels, and with 24, 96 or
    160 of them every vector gathers its scales: on a Zen 5 the 56x56x24 quantize took 0.053 ms that way and 0.004
    this way; the 56x56x24 rounding, whose vectors then cross from one pixel to the next, 43 us against 2.7."""
    n, h, _, c = sch.get_loops(nhwc_block_alone(sch, block))
    sch.parallel(sch.fuse(n, h))
    sch.vectorize(c)


def quantize_nhwc_space(block: str = "quantized") -> ms.space_generator.ScheduleFn:
    """``schedule_quantize_nhwc`` as a MetaSchedule search space (one schedule: nothing to sample)."""
    return ms.space_generator.ScheduleFn(functools.partial(schedule_quantize_nhwc, block=block), sch_rules=[],
                                         mutator_probs={}, postprocs=[ms.postproc.DisallowDynamicLoop()])


def torch_int8(model: torch.nn.Module, inputs: Iterable[torch.Tensor], example: torch.Tensor | None = None) -> torch.nn.Module:
    """PyTorch's own int8 ``model``, the way PyTorch 2 quantizes for x86 CPUs: the baseline TVM's int8 has to beat.

    PT2E quantization (torchao's ``X86InductorQuantizer``, its default static config: uint8
    activations over all 256 codes, one scale per tensor, ranges from histograms; symmetric int8
    weights per output channel: the kinds of number TVM's int8 uses, ``reduce_range`` off as there)
    on ``torch.export`` of the float model itself (its ReLU6 and all), calibrated on ``inputs``
    one image at a time, then ``torch.compile`` with Inductor's freezing, which is what turns the
    quantize/dequantize pairs into oneDNN int8 kernels (without it each pair runs as float32 arithmetic around
    a float32 convolution, slower than the float model).
    The result takes inputs of ``example``'s shape (default: one image) and runs in inference mode.
    """
    import warnings

    with models.quiet("torch.utils._pytree"):  # torchao's import makes torch warn about a type it registers
        from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e
        from torchao.quantization.pt2e.quantizer.x86_inductor_quantizer import (
            X86InductorQuantizer,
            get_default_x86_inductor_quantization_config,
        )

    example = models.example_input() if example is None else example
    quantizer = X86InductorQuantizer().set_global(get_default_x86_inductor_quantization_config())
    with warnings.catch_warnings():  # torchao warns about tensors it copies while converting
        warnings.simplefilter("ignore")
        prepared = prepare_pt2e(torch.export.export(model.eval(), (example,)).module(), quantizer)
        with torch.no_grad():
            for batch in inputs:
                for image in batch.split(example.shape[0]):
                    prepared(image)
        frozen = peers.FrozenCompiled(convert_pt2e(prepared))
        with models.quiet("torch.utils.cpp_extension"):  # Inductor's "No CUDA runtime is found" on a machine without a GPU
            frozen(example)  # compiles here, not in the first timed call
    return frozen


ORT_INT8, OPENVINO_INT8 = f"{peers.ORT} int8", f"{peers.OPENVINO} int8"


def onnx_int8(model: torch.nn.Module, inputs: Iterable[torch.Tensor], example: torch.Tensor | None = None) -> bytes:
    """``model``'s ONNX export quantized by ONNX Runtime's own static post-training tool: the int8 a deployer
    of ONNX Runtime or OpenVINO would make.

    ``quantize_static`` in the QDQ format (each quantized tensor a QuantizeLinear/DequantizeLinear pair, which
    ONNX Runtime and OpenVINO both turn into int8 kernels), with the kinds of number TVM's and PyTorch's int8
    use: uint8 activations over all 256 codes, one scale per tensor, from their minimum and maximum over
    ``inputs`` (fed one image at a time, as ``torch_int8`` is), and symmetric int8 weights per output channel.
    It quantizes every convolution and the classifier. Returns the quantized model's bytes; the export is
    ``peers.onnx_export``'s, on ``example``'s shape (default: one image).
    """
    import tempfile
    from pathlib import Path

    import onnx
    from onnxruntime.quantization import CalibrationDataReader, CalibrationMethod, QuantFormat, QuantType, quantize_static
    from onnxruntime.quantization.shape_inference import quant_pre_process

    example = models.example_input() if example is None else example
    exported = onnx.load_from_string(peers.onnx_export(model, example))
    name = exported.graph.input[0].name
    images = [{name: image.numpy()} for batch in inputs for image in batch.split(example.shape[0])]

    class Images(CalibrationDataReader):
        def __init__(self):
            self.left = iter(images)

        def get_next(self):
            return next(self.left, None)

    with tempfile.TemporaryDirectory() as folder:
        source, prepared, target = (Path(folder) / f"{stage}.onnx" for stage in ("float", "prepared", "int8"))
        onnx.save(exported, source)
        quant_pre_process(source, prepared)  # shapes inferred and the graph simplified, as ONNX Runtime advises
        quantize_static(prepared, target, Images(), quant_format=QuantFormat.QDQ, per_channel=True,
                        activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8,
                        calibrate_method=CalibrationMethod.MinMax)
        return target.read_bytes()


def onnx_int8_engines(quantized: bytes) -> tuple[dict[str, Callable[[torch.Tensor], np.ndarray]], dict[str, str]]:
    """ONNX Runtime and OpenVINO on the int8 model ``onnx_int8`` made, each set up as the course sets up the
    float32 peers (``peers.OnnxEngine``: the parts left in float stay float32):
    ({label: run(x) -> logits}, {label: why it is missing})."""
    engines, missing = {}, {}
    for label, engine in ((ORT_INT8, peers.ORT), (OPENVINO_INT8, peers.OPENVINO)):
        try:
            loaded = peers.OnnxEngine(engine, quantized)
        except Exception as err:  # the engine missing, or unable to load the model: absent, with the reason
            missing[label] = peers.why_missing(label, err)
        else:
            engines[label] = lambda x, loaded=loaded: np.asarray(loaded.run([x])[0])
    return engines, missing


def database_model(target: tvm.target.Target) -> str:
    """The name the int8 model's tuning databases go by on ``target``, one per int8 instruction
    (``int8.int8_instruction``): a VNNI kernel does not run without VNNI, nor an AVX2 one without AVX2."""
    return {"vnni": f"{MODEL}_int8", "avx2": f"{MODEL}_int8_avx2"}.get(int8.int8_instruction(target), f"{MODEL}_int8_generic")


def quantized_model(example: torch.Tensor | None = None, target: tvm.target.Target | None = None,
                    model: torch.nn.Module | None = None, calibration: list[torch.Tensor] | None = None
                    ) -> tuple[torch.nn.Module, ImportedModel, dict[str, Range]]:
    """A float model's int8 build, end to end, for ``target`` (default: this CPU): (float model, int8 Relax
    module, the pointwise convolutions' calibrated ranges); its depthwise inputs in uint8 where
    ``uint8_depthwise``. By default the course's MobileNetV2 (``float_model``) calibrated on
    ``calibration_inputs()``; any MobileNetV2-shaped ``model`` with its own ``calibration`` batches works."""
    model = float_model()[0] if model is None else model.eval()
    calibration = calibration_inputs() if calibration is None else calibration
    folded = fold_batch_norms(model)
    ranges = calibrate(folded, calibration)
    example = models.example_input() if example is None else example
    target = target or cpu_target()
    quantized = quantize_pointwise_convs(models.import_to_relax(folded, example), ranges, target=target)
    if uint8_depthwise(target):
        quantized = quantize_depthwise_inputs(quantized, calibrate(folded, calibration, which=is_depthwise))
    return model, quantized, ranges


def int8_builds(model: torch.nn.Module, calibration: list[torch.Tensor], example: torch.Tensor,
                target: tvm.target.Target | None = None) -> tuple[dict[str, Callable], dict[str, str]]:
    """``model`` in float32 and in every engine's int8, each made as this module makes it, all taking inputs of
    ``example``'s shape: ({label: run(x) -> logits}, {label: why it is missing}). TVM's build is not tuned:
    a schedule changes the order of the integer sums, never their value, so its answers are a tuned build's."""
    target = target or cpu_target()
    _, quantized, _ = quantized_model(example, target, model=model, calibration=calibration)
    onnx_engines, missing = onnx_int8_engines(onnx_int8(model, calibration, example=example))
    builds = {"PyTorch fp32": model.eval(), "PyTorch int8": torch_int8(model, calibration, example=example),
              **onnx_engines, "TVM int8": compile_model(quantized, target)}
    return builds, missing


# ------------------------------------------------------------------ measuring the error


def layer_inputs(model: torch.nn.Module, x: torch.Tensor) -> dict[str, np.ndarray]:
    """The input of every pointwise convolution on ``x``, as ``[pixels, channels]`` matrices, in call order."""
    found: dict[str, np.ndarray] = {}
    hooks = []
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.Conv2d) and is_pointwise(module):
            def hook(_module, args, name=name):
                found[name] = args[0].detach().permute(0, 2, 3, 1).reshape(-1, args[0].shape[1]).numpy()
            hooks.append(module.register_forward_pre_hook(hook))
    try:
        with torch.no_grad():
            model(x)
    finally:
        for h in hooks:
            h.remove()
    return found


def int8_matmul_error(w: np.ndarray, x: np.ndarray, per_channel: bool) -> float:
    """The worst relative error (``build.relative_error``) over the output channels of ``x @ w.T``, computed with
    ``x`` in uint8 (per tensor) and ``w`` in int8 (per channel or per tensor): Day 12's Exercise 2."""
    scale_x, zp = activation_params(Range(float(x.min()), float(x.max())))
    xq = np.clip(np.round(x / scale_x) + zp, 0, U8_MAX).astype(np.int64) - zp
    if per_channel:
        wq, scale_w = quantize_weight(w)
    else:
        m = float(np.abs(w).max()) / S8_MAX or 1.0
        wq, scale_w = np.clip(np.round(w / m), -S8_MAX, S8_MAX).astype("int8"), np.full(w.shape[0], m)
    y = (xq @ wq.astype(np.int64).T) * scale_x * scale_w[None, :]
    want = x.astype(np.float64) @ w.T.astype(np.float64)
    return max(relative_error(y[:, c], want[:, c]) for c in range(w.shape[0]))


def layer_errors(model: torch.nn.Module, inputs: dict[str, np.ndarray], per_channel: bool) -> dict[str, float]:
    """``int8_matmul_error`` of every pointwise convolution of ``model`` on its input (``layer_inputs``)."""
    modules = dict(model.named_modules())
    return {name: int8_matmul_error(modules[name].weight.detach().numpy()[:, :, 0, 0], x, per_channel)
            for name, x in inputs.items()}


def logit_errors(model: torch.nn.Module, outputs: dict, images: Iterable[torch.Tensor]) -> dict[str, float]:
    """For each ``label: run(x) -> logits``: the median relative error of its logits against the float model's
    (``build.relative_error``) over ``images``: what a build's arithmetic adds, the one measure random weights
    allow (accuracy needs trained weights and labelled data: ``helpers.digits``)."""
    images = list(images)
    with torch.no_grad():
        reference = [model(x).numpy() for x in images]
    return {label: float(np.median([relative_error(np.asarray(run(x)), r) for x, r in zip(images, reference)]))
            for label, run in outputs.items()}


def tradeoff_rows(timings, accuracy: dict[str, float] | None, baseline: str,
                  intervals: dict[str, tuple[float, float]] | None = None) -> list[dict]:
    """One row per timing: backend, median and quartiles (ms), speedup over ``baseline``, top-1 accuracy
    (``top1``, unless ``accuracy`` is None: random weights have none), and its 95 % interval (``top1_low``,
    ``top1_high``) where ``intervals`` gives one."""
    base = {t.label: t.median_ms for t in timings}
    if baseline not in base:
        raise CourseError(f"No timing labelled {baseline!r}; the labels are {sorted(base)}.")
    missing = sorted(set(base) - set(accuracy)) if accuracy is not None else []
    if missing:
        raise CourseError(f"No top-1 accuracy for {missing}: give one for every backend timed.")
    rows = []
    for t in timings:
        row = dict(backend=t.label, median_ms=t.median_ms, q1_ms=t.q1_ms, q3_ms=t.q3_ms,
                   speedup=base[baseline] / t.median_ms)
        if accuracy is not None:
            row["top1"] = accuracy[t.label]
        if intervals and t.label in intervals:
            row["top1_low"], row["top1_high"] = intervals[t.label]
        rows.append(row)
    return rows
