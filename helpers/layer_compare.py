"""Where a peer wins: tuned TVM's convolutions against ONNX Runtime's, OpenVINO's or freezing's, layer by layer.

A model's end-to-end ratio says *whether* another engine is faster; the profile of each says
*where*. Both engines run the convolutions of the model in graph order, each in its own layout
(TVM in Day 7's channel blocks, ``[1, C/16, H, W, 16]``; ONNX Runtime in its own ``nchwc`` form),
so each call is read back as the NCHW convolution it computes (channels, height and width in and
out) and paired with the other engine's call of the same shape, in order. The engines fuse
differently: TVM runs a convolution's BatchNorm, activation (SiLU, ReLU6) and residual add in its
kernel, ONNX Runtime runs some as nodes of their own (its SiLU is a ``QuickGelu`` node). So the
elementwise calls that follow a convolution count as part of it, on both sides; everything else
(layout changes, pooling, the classifier) is summed as "the rest".

Both sides are timed call by call (TVM through the VM's instrument hook, as ``helpers.profiling``
does; ONNX Runtime with its own profiler), medians over a few runs: the totals are a little above
the engines' end-to-end times, and the comparison is of layers, not of those times.

OpenVINO is read from its own per-node counters (``openvino_layers``), at float32 or at its default
precision (bf16 on a CPU with AVX-512 BF16, against TVM's bf16 build: ``bf16_model``, whose kernels run
channels last); it fuses a convolution's activation and residual add into it, as TVM does.

int8 builds compare the same way (``tvm_layers(..., channels_last=True)`` for Day 12's int8 MobileNetV2, which
runs channels last throughout): ONNX Runtime's and OpenVINO's int8 are the model quantized by ONNX Runtime's
``quantize_static`` (``quantize.onnx_int8``), read from the quantized model's bytes (``onnx_model=``). A
convolution's requantizing (TVM's ``dequantize`` and ``quantize``, ONNX Runtime's ``QLinearAdd``) counts as part
of it; the model's first quantize and last dequantize are the rest.

PyTorch with Inductor's freezing, the fastest PyTorch, is read the same way (``frozen_pytorch_layers``,
``torch.profiler``): one oneDNN call per convolution, BatchNorm folded into its weights and the
activation and a residual add fused in. It is the one peer on a CPU class imitated on a larger CPU,
where ONNX Runtime cannot be held to the smaller class's vectors.

Introduced on Day 11.
"""

from __future__ import annotations

import json
import statistics
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from .build import CompiledModel
from .ir import op_type
from .peers import (DEFAULT_PRECISION, FROZEN, OPENVINO, ORT, onnx_export, onnx_runtime_session, onnx_session,
                    openvino_compiled, openvino_precision)
from .profiling import BUILTIN_PREFIX, ordered_calls


@dataclass(frozen=True)
class ConvCall:
    """One convolution as an engine ran it, read as NCHW: channels and map size in and out, and its time."""

    name: str
    shape: tuple[int, int, int, int, int, int]  # (C in, H in, W in, C out, H out, W out)
    ms: float
    kernel: tuple[int, int] | None = None  # (kh, kw), where the engine says (ONNX Runtime's weights do)
    groups: int | None = None

    def describe(self) -> str:
        """``3x3 conv 64x56x56 -> 64x56x56`` (``depthwise`` where each channel has its own filter)."""
        c_in, h_in, w_in, c_out, h_out, w_out = self.shape
        size = f"{self.kernel[0]}x{self.kernel[1]} " if self.kernel else ""
        kind = "depthwise" if self.groups and self.groups == c_in and c_in > 1 else "conv"
        return f"{size}{kind} {c_in}x{h_in}x{w_in} -> {c_out}x{h_out}x{w_out}"


@dataclass(frozen=True)
class EngineLayers:
    """One engine's convolutions in the order it ran them, and the milliseconds of everything else."""

    engine: str
    convs: list[ConvCall]
    rest_ms: float

    @property
    def conv_ms(self) -> float:
        return sum(c.ms for c in self.convs)


def _nchw(shape: Sequence[int], channels_last: bool = False) -> tuple[int, int, int]:
    """(C, H, W) of an activation in NCHW, in channel blocks (``[N, C/b, H, W, b]``) or channels last (NHWC)."""
    if len(shape) == 5:
        return shape[1] * shape[4], shape[2], shape[3]
    if len(shape) == 4 and channels_last:
        return shape[3], shape[1], shape[2]
    if len(shape) == 4:
        return shape[1], shape[2], shape[3]
    raise ValueError(f"not an image activation: shape {tuple(shape)}")


# TVM's kernels that compute a convolution: Relax's conv2d, and the bf16 rewrite's (Day 12), which run channels last.
# Day 12's int8 1x1 convolutions are matrix products named ``int8_conv1x1``, its depthwise ones of uint8 inputs
# ``depthwise_from_u8`` (``quantize``).
TVM_CONV_KERNELS = ("conv2d", "bf16_conv", "depthwise_from_bits", "int8_conv1x1", "depthwise_from_u8")
CHANNELS_LAST_KERNELS = ("bf16_conv", "depthwise_from_bits")
# Calls that finish a convolution's output element by element: counted as part of the convolution
# (``to_bf16``: the bf16 rewrite's rounding of an output a convolution reads next, where it is a kernel of its own).
TVM_EPILOGUE_OPS = {"add", "multiply", "subtract", "divide", "sigmoid", "fast_sigmoid", "relu", "clip", "silu", "tanh", "to_bf16",
                    "maximum", "minimum", "quantize", "dequantize", "strided_slice"}
ORT_EPILOGUE_OPS = {"Add", "Mul", "Sub", "Div", "Sigmoid", "QuickGelu", "Relu", "Clip", "HardSigmoid", "HardSwish", "Sum",
                    "QLinearAdd"}
# Calls that only change a tensor's layout: "the rest", but they do not end a convolution's epilogue.
TVM_LAYOUT_OPS = {"layout_transform"}
ORT_LAYOUT_OPS = {"ReorderInput", "ReorderOutput", "Reshape", "Transpose", "QuantizeLinear", "DequantizeLinear"}
# ONNX Runtime's convolutions: float32 ``Conv`` (its weight the second input) and int8 ``QLinearConv`` (the fourth:
# x, x's scale and zero point, then w), which it runs channels last.
ORT_CONV_WEIGHT = {"Conv": 1, "QLinearConv": 3}
# OpenVINO fuses a convolution's activation, BatchNorm and residual add into it (those nodes do not run);
# what it runs apart is an ``Eltwise`` node or a ``Subgraph`` of element-wise ops it compiled together (an int8
# model's requantizing), and a ``Reorder`` changes a tensor's layout or precision.
OPENVINO_EPILOGUE_OPS = {"Eltwise", "Subgraph", "Add", "Multiply", "Subtract", "Divide", "Clamp", "Sigmoid", "Swish", "Relu"}
OPENVINO_LAYOUT_OPS = {"Reorder", "Reshape", "Transpose"}
# Channel blocks: ONNX Runtime pads a layer's channels to its block (8 or 16), TVM keeps them.
CHANNEL_BLOCK = 16


def _group(calls: Sequence[tuple[str, float, str]]) -> tuple[list[int], list[float], float]:
    """Calls as (kind, ms, ...) with kind "conv", "epilogue", "layout" or "other", in order: the
    index of each convolution, its time with its epilogue's, and the time of the rest."""
    convs, times, rest, open_conv = [], [], 0.0, False
    for i, (kind, ms, _) in enumerate(calls):
        if kind == "conv":
            convs.append(i)
            times.append(ms)
            open_conv = True
        elif kind == "epilogue" and open_conv:
            times[-1] += ms
        else:
            rest += ms
            open_conv = open_conv and kind == "layout"
    return convs, times, rest


def _tensors(shapes: list) -> list[tuple]:
    return [shape for shape in shapes if isinstance(shape, tuple)]


def _layers(engine: str, calls: list[tuple[str, list, float]], is_conv: Callable[[str, list], bool],
            op_of: Callable[[str], str], epilogue_ops: set[str], layout_ops: set[str],
            conv: Callable[[str, list, float], ConvCall]) -> EngineLayers:
    """One engine's calls (name, argument shapes, ms) as its convolutions, epilogues counted in, and the rest."""
    kinds = []
    for name, shapes, ms in calls:
        op = op_of(name)
        kind = "conv" if is_conv(name, shapes) else "epilogue" if op in epilogue_ops else "layout" if op in layout_ops else "other"
        kinds.append((kind, ms, name))
    indices, times, rest = _group(kinds)
    return EngineLayers(engine, [conv(*calls[i][:2], ms) for i, ms in zip(indices, times)], rest)


def _medians(runs: list[list[tuple[str, list, float]]]) -> list[tuple[str, list, float]]:
    """Per call, in order: its name and argument shapes (from the first run) and its median time."""
    lengths = {len(run) for run in runs}
    if len(lengths) != 1:
        raise RuntimeError(f"the runs made different numbers of calls ({sorted(lengths)}): profile again")
    return [(name, shapes, statistics.median(run[i][2] for run in runs)) for i, (name, shapes, _) in enumerate(runs[0])]


def in_every_run(runs: list[list[tuple[str, list, float]]]) -> list[list[tuple[str, list, float]]]:
    """The calls of an engine whose calls are named uniquely (OpenVINO's nodes) that ran in every run: OpenVINO's
    counters mark some nodes (a reorder of the input) as run in some requests and not in others, which would leave
    the runs with different numbers of calls (``_medians``)."""
    every = set.intersection(*({name for name, _, _ in run} for run in runs)) if runs else set()
    return [[call for call in run if call[0] in every] for run in runs]


def _tvm_op(kernel: str) -> str:
    """The operator a TVM kernel is named after (``ir.op_type``), the bf16 rewrite's rounding named whole."""
    return "to_bf16" if kernel.removeprefix("fused_").startswith("to_bf16") else op_type(kernel)


def tvm_layers(compiled: CompiledModel, x: torch.Tensor, repeats: int = 5, engine: str = "TVM tuned",
               channels_last: bool = False) -> EngineLayers:
    """Tuned TVM's calls, each convolution (a kernel named after ``conv2d``, or one of the bf16 rewrite's,
    channels last) read from its first argument (the data) and its last (the output), medians of
    ``repeats`` runs after one warm-up; ``engine`` names the build in the tables. ``channels_last``: a build
    whose convolutions all run channels last (Day 12's int8 MobileNetV2), their kernel size and groups read
    from their weights (``OHWI``, or ``[kh, kw, C]`` for a depthwise one of uint8; an ``int8_conv1x1`` is a 1x1
    convolution)."""
    on_device = compiled.to_device(x)
    compiled.run_on_device(on_device)
    calls = [c for c in _medians([ordered_calls(compiled, on_device) for _ in range(repeats)])
             if not c[0].startswith(BUILTIN_PREFIX)]
    def is_conv(name: str, shapes: list) -> bool:
        tensors = _tensors(shapes)
        return (any(op in name for op in TVM_CONV_KERNELS) and len(tensors) >= 2 and len(tensors[0]) in (4, 5)
                and len(tensors[-1]) in (4, 5))

    def conv(name: str, shapes: list, ms: float) -> ConvCall:
        tensors = _tensors(shapes)
        last = channels_last or any(op in name for op in CHANNELS_LAST_KERNELS)
        data, out = _nchw(tensors[0], last), _nchw(tensors[-1], last)
        kernel = groups = None
        if channels_last and "int8_conv1x1" in name:
            kernel, groups = (1, 1), 1
        elif channels_last and len(tensors[1]) == 4:  # OHWI
            kernel, groups = tuple(tensors[1][1:3]), data[0] // tensors[1][3]
        elif channels_last and len(tensors[1]) == 3:  # a depthwise weight channels last, [kh, kw, C]
            kernel, groups = tuple(tensors[1][:2]), tensors[1][2]
        return ConvCall(name, (*data, *out), ms, kernel=kernel, groups=groups)

    return _layers(engine, calls, is_conv, _tvm_op, TVM_EPILOGUE_OPS, TVM_LAYOUT_OPS, conv)


def onnx_runtime_layers(model: torch.nn.Module, x: torch.Tensor, repeats: int = 5, onnx_model: bytes | None = None,
                        engine: str = ORT) -> EngineLayers:
    """ONNX Runtime's nodes as its profiler timed them (the course's session, ``peers.onnx_session``,
    profiling on), medians of ``repeats`` runs after one warm-up; a ``Conv`` node's weight
    gives its kernel size and groups. ``onnx_model``: the ONNX model to run (an int8 one,
    ``quantize.onnx_int8``), ``model``'s export without it; ``engine`` names it in the tables."""
    with tempfile.TemporaryDirectory() as tmp:
        prefix = str(Path(tmp) / "ort")
        session = onnx_runtime_session(model, x, prefix) if onnx_model is None else onnx_session(onnx_model, prefix)
        feed = {session.get_inputs()[0].name: x.numpy()}
        for _ in range(repeats + 1):
            session.run(None, feed)
        events = json.loads(Path(session.end_profiling()).read_text())
    nodes = [e for e in events if e.get("cat") == "Node" and e["name"].endswith("_kernel_time")]
    per_run = len(nodes) // (repeats + 1)
    runs = []
    for r in range(1, repeats + 1):  # the first run is the warm-up
        run = []
        for e in nodes[r * per_run:(r + 1) * per_run]:
            shapes = [tuple(next(iter(d.values()))) for d in e["args"].get("input_type_shape", [])]
            shapes += [tuple(next(iter(d.values()))) for d in e["args"].get("output_type_shape", [])]
            run.append((f"{e['args'].get('op_name', '?')}:{e['name'].removesuffix('_kernel_time')}", shapes, e["dur"] / 1000.0))
        runs.append(run)

    def is_conv(name: str, shapes: list) -> bool:
        op = name.split(":", 1)[0]
        if op == "Conv":
            return len(shapes) >= 3 and len(shapes[1]) == 4
        return op in ORT_CONV_WEIGHT and len(shapes) >= 3 and len(shapes[0]) == 4 and len(shapes[-1]) == 4

    return _layers(engine, _medians(runs), is_conv, lambda name: name.split(":", 1)[0], ORT_EPILOGUE_OPS,
                   ORT_LAYOUT_OPS, _ort_conv)


def _ort_conv(name: str, shapes: list, ms: float) -> ConvCall:
    """One of ONNX Runtime's convolution nodes as a ``ConvCall``: its kernel size and groups from its weight where the
    profiler gives the weight's shape (an int8 node's prepacked weight has none), channels last where its output is."""
    weight = shapes[ORT_CONV_WEIGHT[name.split(":", 1)[0]]]
    if len(weight) == 4:
        last = False
        kernel, groups = (weight[2], weight[3]), _nchw(shapes[0])[0] // weight[1]
    else:  # QLinearConv: C out from its per-channel scales or its bias, the only vectors among its inputs
        c_out = next((s[0] for s in shapes[1:-1] if len(s) == 1 and s[0] > 1), None)
        last = c_out is not None and shapes[-1][3] == c_out != shapes[-1][1]
        kernel = groups = None
    return ConvCall(name, (*_nchw(shapes[0], last), *_nchw(shapes[-1], last)), ms, kernel=kernel, groups=groups)


def openvino_layers(model: torch.nn.Module, x: torch.Tensor, precision: str | None = "f32", repeats: int = 5,
                    exported: bytes | None = None, engine: str | None = None) -> EngineLayers:
    """OpenVINO's nodes as its own counters timed them (the course's set-up, ``peers.openvino_compiled``, at
    ``precision``; None: its default on this CPU, bf16 where the CPU has it), medians of ``repeats`` runs
    after one warm-up; each node's shapes are read from the graph OpenVINO runs (a convolution's weight
    gives its kernel size and groups). ``exported``: the model's ONNX export, made here without it (or the model
    to run in its place: an int8 one, ``quantize.onnx_int8``); ``engine`` names it in the tables (default: OpenVINO
    and the precision it ran at)."""
    compiled = openvino_compiled(onnx_export(model, x) if exported is None else exported, precision, profile=True)
    shapes = {}
    for op in compiled.get_runtime_model().get_ordered_ops():
        ports = [op.input_value(i).get_partial_shape() for i in range(op.get_input_size())]
        ports += [op.get_output_partial_shape(0)] if op.get_output_size() else []
        shapes[op.get_friendly_name()] = [tuple(d.get_length() for d in port) for port in ports if port.is_static]
    request, feed = compiled.create_infer_request(), {0: x.numpy()}
    request.infer(feed)
    runs = []
    for _ in range(repeats):
        request.infer(feed)
        runs.append([(f"{node.node_type}:{node.node_name}", shapes.get(node.node_name, []),
                      node.real_time.total_seconds() * 1e3)
                     for node in request.get_profiling_info() if node.status.name == "EXECUTED"])

    def is_conv(name: str, shapes: list) -> bool:
        return name.split(":", 1)[0] in ("Convolution", "GroupConvolution") and len(shapes) >= 3 and len(shapes[1]) in (4, 5)

    def conv(name: str, shapes: list, ms: float) -> ConvCall:
        weight = shapes[1]
        groups, kernel = (weight[0], weight[3:5]) if len(weight) == 5 else (1, weight[2:4])
        return ConvCall(name, (*_nchw(shapes[0]), *_nchw(shapes[-1])), ms, kernel=tuple(kernel), groups=groups)

    ran_in = openvino_precision(compiled)
    engine = engine or (OPENVINO if ran_in == "f32" else f"{OPENVINO}{DEFAULT_PRECISION}{ran_in}")
    return _layers(engine, _medians(in_every_run(runs)), is_conv, lambda name: name.split(":", 1)[0], OPENVINO_EPILOGUE_OPS,
                   OPENVINO_LAYOUT_OPS, conv)


# oneDNN's convolutions as Inductor's freezing calls them: (input, weight, bias, padding, stride, dilation,
# groups, ...), with the tensor a residual is added from after the input where the add is fused, or before
# it, as the tensor written in place (``_convolution_pointwise_``).
FROZEN_CONV_OPS = ("mkldnn::_convolution_pointwise", "mkldnn::_convolution_pointwise_")


def _frozen_conv(name: str, args: tuple, ms: float) -> ConvCall:
    """A oneDNN convolution call of freezing's, from its argument shapes and its lists and numbers."""
    shapes, concrete = args
    at = next(i for i, value in enumerate(concrete) if isinstance(value, list))  # the padding
    (_, c, h, w), weight = shapes[1 if name.endswith("_") else 0], shapes[at - 2]
    padding, stride, dilation, groups = concrete[at:at + 4]
    out = [(size + 2 * p - d * (k - 1) - 1) // s + 1 for size, p, d, k, s in zip((h, w), padding, dilation, weight[2:], stride)]
    return ConvCall(name, (c, h, w, weight[0], *out), ms, kernel=tuple(weight[2:]), groups=groups)


def frozen_pytorch_layers(run: Callable[[], object], repeats: int = 5) -> EngineLayers:
    """PyTorch with Inductor's freezing, call by call: ``run`` is the freezing peer's runner
    (``peers.peers(...).runners[peers.FROZEN]``, or ``peers.compiled_runner(model, x, freezing=True)[0]``),
    timed by ``torch.profiler``, medians of ``repeats`` runs after three warm-ups. Freezing runs each
    convolution as one oneDNN call with BatchNorm folded into its weights and the activation (and a
    residual add) fused in; the rest (pooling, element-wise work it did not fuse) runs in Inductor's C++
    kernels, which the profiler does not name: "the rest" is the compiled graph's time less its named calls."""
    from torch.profiler import ProfilerActivity, profile

    for _ in range(3):
        run()
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        for _ in range(repeats):
            run()
    graphs = [e for e in prof.events() if e.name.startswith("## Call CompiledFxGraph")]
    if len(graphs) != repeats:
        raise RuntimeError(f"{len(graphs)} calls of a compiled graph in the profile of {repeats} runs: "
                           "give the runner of a model compiled whole, with freezing (peers.compiled_runner)")
    runs = []
    for graph in graphs:
        calls = [(f"{e.name}:{i}", (e.input_shapes, e.concrete_inputs), e.cpu_time_total / 1000.0)
                 for i, e in enumerate(graph.cpu_children)]
        runs.append([*calls, ("rest", None, graph.cpu_time_total / 1000.0 - sum(ms for *_, ms in calls))])
    op = lambda name: name.rsplit(":", 1)[0]  # noqa: E731  (the call's index is part of its name)
    return _layers(FROZEN, _medians(runs), lambda name, _: op(name) in FROZEN_CONV_OPS, op, set(), set(),
                   lambda name, args, ms: _frozen_conv(op(name), args, ms))


def against_peers(compiled: CompiledModel, model: torch.nn.Module, x: torch.Tensor, runners: dict,
                  repeats: int = 5, exported: bytes | None = None) -> dict:
    """Tuned TVM's convolutions against each peer in ``runners`` (``peers.peers(...).runners``) that has a
    layer profile, freezing's and ONNX Runtime's, and OpenVINO's at float32 where the model's ONNX export
    (``exported``: ``Peers.exported``) is given: ``{peer: table(...)}``, TVM profiled once. OpenVINO goes
    before PyTorch and ONNX Runtime goes last: their threads spin after each run and slow whatever runs next
    (freezing's calls summed to 7.4 ms on MobileNetV2 against 5.7 end to end when profiled after ONNX Runtime,
    OpenVINO's to 7.0 against 4.1 after freezing), and ONNX Runtime's session ends with it."""
    with_openvino = OPENVINO in runners and exported is not None
    if FROZEN not in runners and ORT not in runners and not with_openvino:
        return {}
    ours = tvm_layers(compiled, x, repeats)
    theirs = [openvino_layers(model, x, "f32", repeats, exported)] if with_openvino else []
    if FROZEN in runners:
        theirs.append(frozen_pytorch_layers(runners[FROZEN], repeats))
    if ORT in runners:
        theirs.append(onnx_runtime_layers(model, x, repeats))
    return {other.engine: table(ours, other) for other in theirs}


def _blocks(c: int) -> int:
    return -(-c // CHANNEL_BLOCK)


def _same_input(a: ConvCall, b: ConvCall) -> bool:
    return (_blocks(a.shape[0]), *a.shape[1:3]) == (_blocks(b.shape[0]), *b.shape[1:3])


def _same_shape(a: ConvCall, b: ConvCall) -> bool:
    return _same_input(a, b) and (_blocks(a.shape[3]), *a.shape[4:]) == (_blocks(b.shape[3]), *b.shape[4:])


def pair(ours: Sequence[ConvCall], theirs: Sequence[ConvCall]) -> tuple[list[tuple[ConvCall, ConvCall]], list[ConvCall], list[ConvCall]]:
    """Each of ``theirs``, in order, with the first of ``ours`` not yet paired that computes the same
    shape (channels compared in blocks: ONNX Runtime pads them), two engines may run a block's
    branches in either order; then those left with the first that reads the same input (a kernel
    that also applies a squeeze-excite gate writes the gated map, not the convolution's 1x1 output).
    Returns the pairs in ``theirs``' order and what is left unpaired on each side."""
    left = list(ours)
    paired: dict[int, ConvCall] = {}
    for alike in (_same_shape, _same_input):
        for j, conv in enumerate(theirs):
            if j in paired:
                continue
            match = next((i for i, mine in enumerate(left) if alike(mine, conv)), None)
            if match is not None:
                paired[j] = left.pop(match)
    pairs = [(paired[j], conv) for j, conv in enumerate(theirs) if j in paired]
    return pairs, left, [conv for j, conv in enumerate(theirs) if j not in paired]


def table(ours: EngineLayers, theirs: EngineLayers):
    """One row per paired convolution, in the other engine's order: what it computes (as the other
    engine names it, or ours where only ours knows its kernel size), both times and ours / theirs (above 1: ours slower); then one row for the rest.
    A pandas DataFrame; the unpaired convolutions' times go to the rest of their engine."""
    import pandas as pd

    pairs, our_left, their_left = pair(ours.convs, theirs.convs)
    rows = [{"layer": i, "convolution": (t if t.kernel or not o.kernel else o).describe(), f"{ours.engine} ms": o.ms, f"{theirs.engine} ms": t.ms,
             "ratio": o.ms / t.ms if t.ms > 0 else float("nan")} for i, (o, t) in enumerate(pairs)]
    rest_ours = ours.rest_ms + sum(c.ms for c in our_left)
    rest_theirs = theirs.rest_ms + sum(c.ms for c in their_left)
    rows.append({"layer": len(pairs), "convolution": "the rest (not convolutions, or not paired)",
                 f"{ours.engine} ms": rest_ours, f"{theirs.engine} ms": rest_theirs,
                 "ratio": rest_ours / rest_theirs if rest_theirs > 0 else float("nan")})
    return pd.DataFrame(rows)


def kind_of(convolution: str) -> str:
    """A row's kind, from what ``ConvCall.describe`` wrote: "depthwise", "1x1 conv", "other conv" or "the rest"."""
    if convolution.startswith("the rest"):
        return "the rest"
    return "depthwise" if " depthwise " in f" {convolution} " else "1x1 conv" if convolution.startswith("1x1 conv") else "other conv"


def by_kind(frame):
    """``table``'s rows summed by kind of layer (``kind_of``): how many, both engines' milliseconds and their ratio,
    the kinds in the order of the milliseconds ours loses there. Where a gap is, in four lines."""
    ours, theirs = [c for c in frame.columns if c.endswith(" ms")]
    kinds = frame.assign(kind=frame["convolution"].map(kind_of)).groupby("kind", sort=False)
    summed = kinds[[ours, theirs]].sum().assign(layers=kinds.size())
    summed["ratio"] = summed[ours] / summed[theirs]
    summed["ms lost"] = summed[ours] - summed[theirs]
    return summed.sort_values("ms lost", ascending=False).reset_index()[["kind", "layers", ours, theirs, "ratio", "ms lost"]]


def where_time_is_lost(frame, count: int = 5):
    """The ``count`` rows of ``table`` where ours loses the most milliseconds, largest loss first."""
    ours, theirs = [c for c in frame.columns if c.endswith(" ms")]
    lost = frame.assign(**{"ms lost": frame[ours] - frame[theirs]})
    return lost.sort_values("ms lost", ascending=False).head(count)
