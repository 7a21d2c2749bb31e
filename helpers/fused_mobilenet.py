"""A whole MobileNetV2 from the course's own kernels, channels last, each inverted residual block one fused kernel
(``block_fusion``), in one Relax module run by TVM's VM (Day 7); EfficientNet too, whose blocks are MobileNetV2's
with SiLU, 5x5 filters in some, and a squeeze-and-excitation.

MobileNetV2 is 19 kernels: the stem (a 3x3 convolution that reads the NCHW image and writes channels last), the
17 blocks (``block_fusion.schedule_fused``: no block's expanded image leaves the cache) and the head (the last
1x1 convolution, the average pool and the classifier); EfficientNet-B0 is 18 (16 blocks). Relax calls each with
``call_tir``; the weights, BatchNorm folded in, are the module's parameters. Nothing is tuned: every schedule is
written by hand, and each block's cut (``Tiling``) is either measured on this machine (``choose="measure"``) or
taken from a rule (the default).

Introduced on Day 7.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch
import tvm
from tvm import relax, s_tir, te, tirx

from . import block_fusion, machine
from .block_fusion import BlockShape, Tiling, activate, finish, tile_pointwise
from .build import CompiledModel
from .kernels import buffer_shapes

LABEL = "TVM, every block fused"
SEPARATE_LABEL = "TVM, the same kernels unfused"
MODELS = ("MobileNetV2", "EfficientNet")  # torchvision's classes this module builds


def stem_function(size: int = 224, c_out: int = 32, activation: str = "relu6") -> tirx.PrimFunc:
    """The stem: 3x3 stride-2 convolution of the NCHW image (BatchNorm folded), ReLU6 (or SiLU), written
    channels last."""
    out = (size - 1) // 2 + 1  # (zero padding of one pixel: an odd size's last row and column have an output too)
    x = te.placeholder((1, 3, size, size), name="X")
    w, b = te.placeholder((3, 3, 3, c_out), name="W"), te.placeholder((c_out,), name="B")
    ci, r, s = te.reduce_axis((0, 3), "ci"), te.reduce_axis((0, 3), "r"), te.reduce_axis((0, 3), "s")

    def pixel(c, i, j):  # zero outside the image
        return te.if_then_else(tirx.all(i >= 0, i < size, j >= 0, j < size), x[0, c, i, j], tirx.const(0.0, "float32"))

    conv = te.compute((out, out, c_out), lambda i, j, c: te.sum(
        pixel(ci, 2 * i + r - 1, 2 * j + s - 1) * w[r, s, ci, c], axis=[ci, r, s]), name="stem")
    act = te.compute((out, out, c_out), lambda i, j, c: activate(activation, conv[i, j, c] + b[c]), name="stem_act")
    return te.create_prim_func([x, w, b, act])


def schedule_stem(func: tirx.PrimFunc, lanes: int) -> s_tir.Schedule:
    """Rows between the cores; a tile of up to 8 pixels x the output channels' vectors sums the 27 taps in registers."""
    sch = s_tir.Schedule(func)
    conv, act = sch.get_sblock("stem"), sch.get_sblock("stem_act")
    i, j, c, ci, r, s = sch.get_loops(conv)
    channels = int(sch.get(c).extent)
    width = block_fusion.vector_lanes(channels, lanes)
    cols, col = sch.split(j, [None, block_fusion.widest_divisor(int(sch.get(j).extent), 8)])
    groups, vector = sch.split(c, [None, width])
    sch.reorder(i, cols, ci, r, s, col, groups, vector)
    sch.parallel(i)
    sch.vectorize(vector)
    for loop in (groups, col):
        sch.unroll(loop)
    finish(sch, conv, ci, act, cols)
    return sch


def classifier_group(classes: int, lanes: int) -> int:
    """Classes per group of the classifier's packed weights: one vector (8 or 16 classes). In the model, where
    its 5 MB come from L3, groups of 8 classes (32 bytes per step of the sum) ran the classifier in about half
    the time of groups of 40 (160 bytes per step)."""
    return block_fusion.vector_lanes(classes, lanes)


def pack_weight(weight: np.ndarray, group: int) -> np.ndarray:
    """A weight of (outputs, inputs), a Linear's or a 1x1 convolution's, as (outputs / group, inputs, group):
    the weights of each group of outputs contiguous, so that the kernel reads them as one stream, in order."""
    outputs, inputs = weight.shape
    return np.ascontiguousarray(weight.reshape(outputs // group, group, inputs).transpose(0, 2, 1))


def head_function(size: int = 7, c_in: int = 320, c_mid: int = 1280, classes: int = 1000,
                  group: int = 8, activation: str = "relu6", conv_group: int = 32) -> tirx.PrimFunc:
    """The head: 1x1 convolution (BatchNorm folded; its weight packed by ``pack_weight`` in groups of
    ``conv_group`` channels, the register tile's) and ReLU6 (or SiLU), the average over the image, the
    classifier (its weight packed in groups of ``group`` classes)."""
    x = te.placeholder((size, size, c_in), name="X")
    w, b = te.placeholder((c_mid // conv_group, c_in, conv_group), name="W"), te.placeholder((c_mid,), name="B")
    wl = te.placeholder((classes // group, c_mid, group), name="WL")
    bl = te.placeholder((classes,), name="BL")
    k = te.reduce_axis((0, c_in), "k")
    conv = te.compute((size, size, c_mid), lambda i, j, c: te.sum(x[i, j, k] * w[c // conv_group, k, c % conv_group],
                                                                  axis=k), name="head")
    act = te.compute((size, size, c_mid), lambda i, j, c: activate(activation, conv[i, j, c] + b[c]), name="head_act")
    pi, pj = te.reduce_axis((0, size), "pi"), te.reduce_axis((0, size), "pj")
    pooled = te.compute((c_mid,), lambda c: te.sum(act[pi, pj, c], axis=[pi, pj]), name="pool")
    m = te.reduce_axis((0, c_mid), "m")
    summed = te.compute((1, classes), lambda _, n: te.sum(pooled[m] * wl[n // group, m, n % group], axis=m),
                        name="classifier")
    logits = te.compute((1, classes), lambda _, n: summed[0, n] / (size * size) + bl[n], name="logits")
    return te.create_prim_func([x, w, b, wl, bl, logits])


def schedule_head(func: tirx.PrimFunc, lanes: int) -> s_tir.Schedule:
    """The 1x1 convolution tiled like a block's (the cores share the channels: each reads its groups' weights
    once); the pool's sums as in a block; the classifier vectorized along the classes (its 5 MB of weights
    read once, group after group, split between the cores)."""
    sch = s_tir.Schedule(func)
    conv, act, pool, classifier, logits = (sch.get_sblock(n) for n in ("head", "head_act", "pool", "classifier",
                                                                        "logits"))
    tile_pointwise(sch, conv, act, lanes, parallel=True, channels_outer=True)
    block_fusion.tile_sums(sch, pool, lanes)
    _, n, m = sch.get_loops(classifier)
    classes = int(sch.get(n).extent)
    width = block_fusion.vector_lanes(classes, lanes)
    groups, group, vector = sch.split(n, [None, classifier_group(classes, lanes) // width, width])
    sch.reorder(groups, m, group, vector)
    sch.parallel(groups)
    sch.vectorize(vector)
    sch.unroll(group)
    finish(sch, classifier, m, logits, groups)
    return sch


def default_tiling(shape: BlockShape, cores: int | None = None, lanes: int | None = None) -> Tiling:
    """A block's cut without measuring: bands of about 7 rows where the image is 28x28 or larger (its expanded
    image is large), chunks of at most 64 channels where it is smaller (what the course's measurements favour)."""
    choices = block_fusion.tilings(shape, cores, lanes)
    rows = [t for t in choices if t.rows]
    chunks = [t for t in choices if t.channels and t.channels <= 64]
    if shape.out_size >= 28 or not chunks:
        return min(rows, key=lambda t: (abs(t.rows - 7), t.rows))
    return max(chunks, key=lambda t: t.channels)


def _folded(conv: torch.nn.Conv2d, bn: torch.nn.BatchNorm2d) -> tuple[np.ndarray, np.ndarray]:
    fused = torch.nn.utils.fusion.fuse_conv_bn_eval(conv.eval(), bn.eval())
    return fused.weight.detach().numpy(), fused.bias.detach().numpy()


def compile_fused(model: torch.nn.Module, x: torch.Tensor,
                  choose: str | Callable[[str, BlockShape], Tiling | None] = "rule",
                  target: tvm.target.Target | None = None) -> tuple[CompiledModel, dict[str, Tiling | None]]:
    """torchvision's MobileNetV2 or EfficientNet ``model`` as the course's own kernels, for inputs shaped like
    ``x`` (batch 1): the compiled model (called like the PyTorch one, on an NCHW tensor) and each block's cut,
    by the block's name (``block_fusion.model_blocks``). ``choose``: "rule" (``default_tiling``), "measure"
    (``block_fusion.time_tilings`` on each block, a few seconds each), "separate" (every block as its three
    kernels, the same schedules unfused: what fusion alone buys), or a function of (name, shape) giving a
    ``Tiling``, or None for three kernels."""
    if not callable(choose) and choose not in ("rule", "measure", "separate"):
        raise block_fusion.BlockError(f"choose={choose!r}: give \"rule\", \"measure\", \"separate\" or a function "
                                      "of (name, shape) giving a Tiling or None.")
    if type(model).__name__ not in MODELS or tuple(x.shape[:2]) != (1, 3) or x.shape[2] != x.shape[3]:
        raise block_fusion.BlockError("compile_fused takes torchvision's MobileNetV2 or EfficientNet and one square "
                                      f"RGB image (1, 3, S, S); got {type(model).__name__} and {tuple(x.shape)}.")
    model = model.eval()
    target = target or machine.cpu_target()
    lanes = machine.float32_lanes(target)
    cores = int(target.attrs.get("num-cores", machine.physical_core_count()))
    calls, params, tilings = _kernels(model, x.shape[-1], choose, lanes, cores)
    executable = tvm.compile(_module(calls, params, tuple(x.shape)), target=target)
    device = tvm.cpu()
    compiled = CompiledModel(executable, relax.VirtualMachine(executable, device), device,
                             [tvm.runtime.tensor(p, device) for p in params], tuple(x.shape), "float32", target)
    return compiled, tilings


Call = tuple[tirx.PrimFunc, int, tuple[int, ...]]  # a scheduled kernel, how many weights it takes, its output's shape


def _cut(choose, name: str, block: torch.nn.Module, shape: BlockShape, lanes: int, cores: int) -> Tiling | None:
    """The block's cut as ``compile_fused``'s ``choose`` says."""
    if choose == "rule":
        return default_tiling(shape, cores, lanes)
    if choose == "separate":
        return None
    if choose == "measure":
        seed = sum(map(ord, name))
        probe = torch.rand(1, shape.c_in, shape.size, shape.size, generator=torch.Generator().manual_seed(seed)) * 3
        return block_fusion.best_tiling(block_fusion.time_tilings(block, probe, repeats=5))
    return choose(name, shape)


def _kernels(model: torch.nn.Module, size: int, choose, lanes: int,
             cores: int) -> tuple[list[Call], list[np.ndarray], dict[str, Tiling | None]]:
    """The model's kernels in order (stem, blocks, head), their weights (BatchNorm folded, in the kernels'
    layouts), and each block's cut."""
    stem_w, stem_b = _folded(model.features[0][0], model.features[0][1])
    activation = type(model.features[0][2]).__name__.lower()  # ReLU6 or SiLU, as in the blocks
    stem = stem_function(size, stem_w.shape[0], activation)
    calls: list[Call] = [(schedule_stem(stem, lanes).mod["main"], 2, buffer_shapes(stem)[-1])]
    params = [stem_w.transpose(2, 3, 1, 0), stem_b]
    tilings: dict[str, Tiling | None] = {}
    for name, block, shape in block_fusion.model_blocks(model, size):
        tiling = tilings[name] = _cut(choose, name, block, shape, lanes, cores)
        weights = block_fusion.block_weights(block)
        kernel = (block_fusion.schedule_separate(shape, lanes) if tiling is None
                  else block_fusion.schedule_fused(shape, tiling, lanes, cores))
        h = shape.out_size
        calls.append((kernel.mod["main"], len(weights), (h, h, shape.c_out)))
        params += weights
    last, classifier = model.features[-1], model.classifier[-1]
    head_w, head_b = _folded(last[0], last[1])
    group = classifier_group(classifier.out_features, lanes)
    conv_group = block_fusion.tile_channels(h, head_w.shape[0], lanes)
    head = schedule_head(head_function(h, head_w.shape[1], head_w.shape[0], classifier.out_features, group,
                                       activation, conv_group), lanes)
    calls.append((head.mod["main"], 4, (1, classifier.out_features)))
    params += [pack_weight(head_w[:, :, 0, 0], conv_group), head_b,
               pack_weight(classifier.weight.detach().numpy(), group), classifier.bias.detach().numpy()]
    return calls, [np.ascontiguousarray(p, dtype="float32") for p in params], tilings


def _module(calls: list[Call], params: list[np.ndarray], input_shape: tuple[int, ...]) -> tvm.IRModule:
    """One Relax ``main(x, *weights)`` that calls the kernels in order, each on the last one's output."""
    bb = relax.BlockBuilder()
    image = relax.Var("x", relax.TensorType(input_shape, "float32"))
    weights = [relax.Var(f"w{i}", relax.TensorType(p.shape, "float32")) for i, p in enumerate(params)]
    with bb.function("main", [image, *weights]):
        with bb.dataflow():
            value, used = image, 0
            for i, (func, count, out_shape) in enumerate(calls):
                kernel = bb.add_func(func.with_attr("tirx.is_scheduled", True).without_attr("global_symbol"),
                                     f"kernel{i}")
                value = bb.emit(relax.call_tir(kernel, [value, *weights[used:used + count]],
                                               relax.TensorType(out_shape, "float32")))
                used += count
            output = bb.emit_output(value)
        bb.emit_func_output(output)
    return bb.get()
