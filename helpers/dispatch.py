"""Dispatch matched operators to a library: PyTorch's oneDNN convolutions, called from TVM.

The PyPI wheel of TVM 0.27 has no BYOC library compiled in (no DNNL, cuBLAS,
CUTLASS). What BYOC does underneath is still there: ``relax.call_dps_packed``
calls any function registered in the process by name, passing TVM tensors and
the output buffer it must write ("destination-passing style"). Here those
functions run PyTorch's ``conv2d`` (oneDNN on x86) on zero-copy views made with
``torch.from_dlpack``, with BatchNorm folded into the weights and the
bias/residual/activation that follows applied into the output buffer.

With ``prepack=True`` the calls take the form PyTorch's own CPU inference uses
(``torch.compile`` with freezing): each weight is reordered **once**, when the
model is loaded, into the blocked layout oneDNN chose for that convolution
(``torch.ops.mkldnn._reorder_convolution_weight``), and each call runs oneDNN's
fused convolution (``torch.ops.mkldnn._convolution_pointwise``) with the ReLU,
ReLU6 or residual add as oneDNN post-ops instead of separate passes. The packed
weight is a PyTorch tensor TVM cannot hold; TVM holds a one-element *handle*
tensor that names it, made by ``course.torch.pack_conv2d_weight`` inside
``main_transform_params``, and the packed weight lives exactly as long as that
handle (a build, or a loaded library's transformed parameters). The packed calls
take and return NHWC tensors (oneDNN's channels-last order) and return PyTorch's
result through DLPack (``call_pure_packed``) instead of copying it into a buffer;
the rewrite cancels the layout changes between two calls, so a tensor changes
layout only where it leaves or enters a chain of oneDNN calls.

A module compiled with these calls needs the functions registered in the
process that runs it, also after ``export_library`` and loading elsewhere:
``register()`` (or importing this module) does it. Importing this module is
all a loader needs (``python -c "import helpers.dispatch"`` plus its own code).

Introduced on Day 7.
"""

from __future__ import annotations

import itertools
import weakref
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import numpy as np
import torch
import tvm
import tvm_ffi
from tvm import relax
from tvm.relax.dpl import ExternFuncPattern, is_op, is_tuple_get_item, rewrite_call, wildcard

from . import ir, nchwc
from .build import CompiledModel, compile_model, transform_params
from .errors import CourseError
from .machine import cpu_target
from .models import ImportedModel

PREFIX = "course.torch."
ACTIVATIONS = ("", "relu", "relu6")
PACK_WEIGHT = PREFIX + "pack_conv2d_weight"
TO_NHWC, TO_NCHW = PREFIX + "to_nhwc", PREFIX + "to_nchw"  # layout changes around packed calls, by PyTorch
MAX_POOL = PREFIX + "max_pool2d_nhwc"  # a max pooling between two packed calls stays channels-last
# oneDNN's post-op for each activation, as torch.ops.mkldnn._convolution_pointwise names it, and its scalars
_POST_OPS = {"": ("none", []), "relu": ("relu", []), "relu6": ("hardtanh", [0.0, 6.0])}


def function_name(bias: bool = False, add: bool = False, activation: str = "", packed: bool = False) -> str:
    """The registered name of one variant: ``course.torch.conv2d_bias_add_relu``.

    Arguments of the variant, in order: data, weight, [bias], [residual], attrs
    (a shape: stride h/w, padding h/w, dilation h/w), then the output. A
    ``packed`` variant (``course.torch.conv2d_packed_...``) takes the handle of
    a weight packed by ``course.torch.pack_conv2d_weight`` instead of the weight,
    and its data, residual and output are NHWC (channels-last, oneDNN's fast order).
    """
    if activation not in ACTIVATIONS:
        raise CourseError(f"activation must be one of {ACTIVATIONS}, got {activation!r}.")
    parts = ["conv2d"] + ["packed"] * packed + ["bias"] * bias + ["add"] * add + [activation] * bool(activation)
    return PREFIX + "_".join(parts)


def _variant(bias: bool, add: bool, activation: str) -> Callable:
    conv2d = torch.nn.functional.conv2d

    def run(*args) -> None:
        tensors = [torch.from_dlpack(a) for a in args[:-2]]  # zero-copy views of TVM's buffers
        attrs, out = list(args[-2]), torch.from_dlpack(args[-1])
        data, weight = tensors[0], tensors[1]
        b = tensors[2] if bias else None
        y = conv2d(data, weight, b, attrs[0:2], attrs[2:4], attrs[4:6])
        if y.shape != out.shape:
            raise CourseError(
                f"{function_name(bias, add, activation)}: the convolution gives shape {tuple(y.shape)} with attrs "
                f"(stride, padding, dilation) {attrs}, but the output buffer has shape {tuple(out.shape)}. "
                "Pass the convolution's own attributes (dispatch.conv_attrs) and its output type."
            )
        if add:
            torch.add(y, tensors[-1], out=out)
            y = out
        if activation == "relu":
            torch.clamp_min(y, 0.0, out=out)
        elif activation == "relu6":
            torch.clamp(y, 0.0, 6.0, out=out)
        elif not add:
            out.copy_(y)

    return run


# Packed weights by handle. A handle is a one-element int64 NumPy array that TVM holds through DLPack
# (the DLPack capsule keeps the array object alive): when TVM lets go of it, the array is freed and its
# finalizer drops the packed weight. (A PyTorch tensor would not do: its capsule keeps only the C++ side.)
_PACKED: dict[int, torch.Tensor] = {}
_HANDLES = itertools.count(1)


def pack_onednn_weight(weight: tvm.runtime.Tensor, attrs: Sequence[int]) -> tvm.runtime.Tensor:
    """Reorder one convolution's weight into oneDNN's blocked layout; return a handle to it.

    ``attrs``: stride h/w, padding h/w, dilation h/w, then the input's shape (N, C, H, W),
    from which oneDNN picks the layout. Registered as ``course.torch.pack_conv2d_weight``
    and called from ``main_transform_params``, i.e. once per load, not per inference.
    """
    a = [int(v) for v in attrs]
    packed = torch.ops.mkldnn._reorder_convolution_weight(torch.from_dlpack(weight), a[2:4], a[0:2], a[4:6], 1, a[6:10])
    key = next(_HANDLES)
    buffer = np.empty(16, dtype=np.int64)  # TVM takes 64-byte aligned memory only: view one aligned element
    start = (-buffer.ctypes.data % 64) // 8
    handle = buffer[start:start + 1]
    handle[0] = key
    _PACKED[key] = packed
    weakref.finalize(handle, _PACKED.pop, key, None)
    return tvm.runtime.from_dlpack(handle)


def packed_weights_alive() -> int:
    """How many packed weights this process holds (each lives as long as its handle)."""
    return len(_PACKED)


def _packed_variant(bias: bool, add: bool, activation: str) -> Callable:
    pointwise, binary = torch.ops.mkldnn._convolution_pointwise.default, torch.ops.mkldnn._convolution_pointwise.binary
    post_op, scalars = _POST_OPS[activation]
    name = function_name(bias, add, activation, packed=True)

    def run(*args) -> tvm.runtime.Tensor:
        key = int(torch.from_dlpack(args[1])[0])
        weight = _PACKED.get(key)
        if weight is None:
            raise CourseError(
                f"{name}: no packed weight has handle {key}. The handles come from main_transform_params of the "
                "same loaded module: run it once after loading and pass its outputs, as compile_dispatched does."
            )
        data = _channels_last(args[0])
        b = torch.from_dlpack(args[2]) if bias else None
        stride, padding, dilation = (list(pair) for pair in zip(*[iter(int(v) for v in args[-1])] * 2))
        if add:  # oneDNN fuses an add followed by ReLU (or nothing): the only forms the rules produce
            y = binary(data, _channels_last(args[-2]), weight, b, padding, stride, dilation, 1,
                       "add", None, post_op if activation else None, [], "")
        else:
            y = pointwise(data, weight, b, padding, stride, dilation, 1, post_op, scalars, "")
        return _from_channels_last(y)

    return run


def _channels_last(tensor) -> torch.Tensor:
    """An NHWC TVM tensor as the NCHW PyTorch tensor in channels-last order it is, without a copy."""
    return torch.from_dlpack(tensor).permute(0, 3, 1, 2)


def _from_channels_last(y: torch.Tensor) -> tvm.runtime.Tensor:
    """An NCHW PyTorch tensor as an NHWC TVM tensor: handed over, not copied, when ``y`` is channels-last
    (as oneDNN's results are); reordered once otherwise."""
    return tvm.runtime.from_dlpack(y.permute(0, 2, 3, 1).contiguous())


def _max_pool2d_now(tensor, attrs) -> tvm.runtime.Tensor:
    """Max pooling of an NHWC tensor by PyTorch (channels-last); ``attrs``: kernel, stride, padding, dilation
    (each h/w), then ceil_mode."""
    a = [int(v) for v in attrs]
    y = torch.nn.functional.max_pool2d(_channels_last(tensor), a[0:2], a[2:4], a[4:6], a[6:8], ceil_mode=bool(a[8]))
    return _from_channels_last(y)


def _to_nhwc_now(tensor) -> tvm.runtime.Tensor:
    return _from_channels_last(torch.from_dlpack(tensor))


def _to_nchw_now(tensor) -> tvm.runtime.Tensor:
    return tvm.runtime.from_dlpack(_channels_last(tensor).contiguous())


def variants(packed: bool = False) -> list[tuple[bool, bool, str]]:
    """Every (bias, add, activation) combination the library side provides.

    The packed side has no residual add followed by ReLU6 (oneDNN does not fuse it,
    and no model of the course has it).
    """
    return [(b, a, act) for b in (False, True) for a in (False, True) for act in ACTIVATIONS
            if not (packed and a and act == "relu6")]


def register() -> list[str]:
    """Register every variant, and the weight packing, as global functions of this process; return their names.

    Idempotent. Must run in any process that calls a module built with ``offload_convs``.
    """
    names = []
    for packed in (False, True):
        for bias, add, act in variants(packed):
            name = function_name(bias, add, act, packed)
            make = _packed_variant if packed else _variant
            tvm_ffi.register_global_func(name, make(bias, add, act), override=True)
            names.append(name)
    tvm_ffi.register_global_func(PACK_WEIGHT, pack_onednn_weight, override=True)
    tvm_ffi.register_global_func(MAX_POOL, _max_pool2d_now, override=True)
    tvm_ffi.register_global_func(TO_NHWC, _to_nhwc_now, override=True)
    tvm_ffi.register_global_func(TO_NCHW, _to_nchw_now, override=True)
    return names + [PACK_WEIGHT, MAX_POOL, TO_NHWC, TO_NCHW]


def is_registered(name: str = function_name()) -> bool:
    """True when ``name`` is a global function in this process (what a dispatched module needs)."""
    return tvm_ffi.get_global_func(name, allow_missing=True) is not None


register()


def aten_conv_paths(model: torch.nn.Module, x: torch.Tensor) -> Counter:
    """Which of ATen's kernels ran ``model``'s convolutions on ``x``, by name, from ``torch.profiler``.

    PyTorch's ``conv2d`` is not always oneDNN on x86: ATen's ``use_mkldnn`` sends some small
    float32 convolutions to its own kernels (``aten::thnn_conv2d``, ``aten::slow_conv_dilated2d``).
    The dispatched calls of this module go through the same ``conv2d``, so they take the same paths.
    Each ``aten::_convolution`` is counted once, under the convolution kernel it called.
    """
    from .export import capture_stderr  # the profiler's C++ side logs its start and stop to fd 2

    with torch.inference_mode(), capture_stderr():
        model(x)
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            model(x)
    paths: Counter = Counter()
    for event in prof.events():
        if event.name == "aten::_convolution":
            kernel = next((c.name for c in event.cpu_children if "conv" in c.name), "(none named)")
            paths[kernel] += 1
    return paths


# ------------------------------------------------------------------ the rewrite


def conv_attrs(conv: relax.Call) -> relax.ShapeExpr | None:
    """Stride, padding and dilation of a dense NCHW float32 conv2d as one shape; None when not dense.

    None for grouped or depthwise convolutions, other layouts, and asymmetric padding
    (PyTorch pads both sides alike), which stay in TVM.
    """
    a = conv.attrs
    if int(a.groups) != 1 or a.data_layout != "NCHW" or a.kernel_layout != "OIHW" or a.out_layout != "NCHW":
        return None
    if conv.ty.dtype != "float32":
        return None
    top, left, bottom, right = (int(p) for p in a.padding)
    if (top, left) != (bottom, right):
        return None
    return relax.ShapeExpr([*(int(s) for s in a.strides), top, left, *(int(d) for d in a.dilation)])


def _fold_batch_norm(w: relax.Expr, bn: relax.Call) -> tuple[relax.Expr, relax.Expr] | None:
    """(weight, bias) of the convolution with the BatchNorm folded in, as Relax arithmetic on the weights.

    The arithmetic depends on weights only: ``LiftTransformParams`` moves it out of
    ``main``, so it runs once when the model is loaded, not on every call.
    """
    a = bn.attrs
    if int(a.axis) != 1 or not (a.center and a.scale):
        return None
    _, gamma, beta, mean, var = bn.args
    eps = relax.const(float(a.epsilon), "float32")
    scale = relax.op.divide(gamma, relax.op.sqrt(relax.op.add(var, eps)))
    # relax.op.reshape wants its input's type, which a new, not yet normalized call lacks:
    # the Call is built directly, and rewrite_call binds and types the whole expression.
    per_channel = relax.Call(tvm.ir.Op.get("relax.reshape"), [scale, relax.ShapeExpr([int(w.ty.shape[0]), 1, 1, 1])])
    weight = relax.op.multiply(w, per_channel)
    bias = relax.op.subtract(beta, relax.op.multiply(mean, scale))
    return weight, bias


@dataclass(frozen=True)
class _Rule:
    bn: bool
    add: bool
    activation: str
    conv_first: bool = True  # add(conv's result, residual), or add(residual, conv's result)


def _rules(fold_bn: bool, fuse_epilogue: bool) -> list[_Rule]:
    """Most specific first: a later rule must not take a piece of an earlier rule's match.

    The two orders of a residual add are two rules, tried one after the other: in
    ``x + block(x)`` (MobileNetV2) both operands are convolutions with BatchNorm, and
    only the one that nothing else uses can be fused with the add.
    """
    if not fold_bn:
        return [_Rule(False, False, "")]
    if not fuse_epilogue:
        return [_Rule(True, False, ""), _Rule(False, False, "")]
    return [_Rule(True, True, "relu"), _Rule(True, True, "relu", conv_first=False),
            _Rule(True, False, "relu"), _Rule(True, False, "relu6"),
            _Rule(True, True, ""), _Rule(True, True, "", conv_first=False),
            _Rule(True, False, ""), _Rule(False, False, "relu"), _Rule(False, False, "")]


def _pattern(rule: _Rule):
    """The pattern of one rule, and its named pieces; ``inner`` are the values the fused call hides."""
    data, weight = wildcard(), wildcard()
    conv = is_op("relax.nn.conv2d")(data, weight)
    pieces = dict(data=data, weight=weight, conv=conv)
    inner = [conv]
    top = conv
    if rule.bn:
        bn = is_op("relax.nn.batch_norm")(conv, wildcard(), wildcard(), wildcard(), wildcard())
        top = is_tuple_get_item(bn, 0)
        pieces["bn"] = bn
        inner += [bn, top]
    if rule.add:
        residual = wildcard()
        top = is_op("relax.add")(top, residual) if rule.conv_first else is_op("relax.add")(residual, top)
        pieces["residual"] = residual
        inner.append(top)
    if rule.activation == "relu":
        top = is_op("relax.nn.relu")(top)
    elif rule.activation == "relu6":
        top = is_op("relax.clip")(top, wildcard(), wildcard())
    else:
        inner.pop()  # the last piece is the call's own result
    pieces["inner"] = inner
    return top, pieces


class _Uses:
    """How many times each bound value of a function is used: a value another call still
    needs cannot disappear inside a fused call (it would be computed twice)."""

    def __init__(self, func: relax.Function):
        self.var_of: dict = {}
        self.count: Counter = Counter()
        for block in func.body.blocks:
            for binding in block.bindings:
                self.var_of[binding.value] = binding.var
                relax.analysis.post_order_visit(binding.value, self._count)
        relax.analysis.post_order_visit(func.body.body, self._count)

    def _count(self, expr) -> None:
        if isinstance(expr, relax.Var):
            self.count[expr] += 1

    def only_once(self, value: relax.Expr) -> bool:
        var = self.var_of.get(value)
        return var is None or self.count[var] == 1


def _is_relu6(clip: relax.Call) -> bool:
    try:
        return float(clip.args[1].value) == 0.0 and float(clip.args[2].value) == 6.0
    except (AttributeError, TypeError, ValueError):
        return False


def _layout_call(name: str, x: relax.Expr, shape: Sequence[int], dtype: str) -> relax.Expr:
    return relax.call_pure_packed(name, x, ty_args=relax.TensorType([int(d) for d in shape], dtype))


def _to_nhwc(x: relax.Expr) -> relax.Expr:
    n, c, h, w = (int(d) for d in x.ty.shape)
    return _layout_call(TO_NHWC, x, [n, h, w, c], x.ty.dtype)


def _pool_channels_last(func: relax.Function) -> relax.Function:
    """A max pooling of a packed call's result (ResNet's stem) runs channels-last in PyTorch, so that the
    tensor does not go NCHW and back around it: ``max_pool2d(to_nchw(x))`` -> ``to_nchw(max_pool_nhwc(x))``."""
    nhwc = wildcard()
    pool = is_op("relax.nn.max_pool2d")(is_op("relax.call_pure_packed")(ExternFuncPattern(TO_NCHW), nhwc))

    def rewrite(expr: relax.Call, matches: dict) -> relax.Expr:
        a = expr.attrs
        top, left, bottom, right = (int(v) for v in a.padding)
        if a.layout != "NCHW" or a.out_layout != "NCHW" or (top, left) != (bottom, right):
            return expr
        spec = relax.ShapeExpr([*(int(v) for v in (*a.pool_size, *a.strides)), top, left,
                                *(int(v) for v in a.dilation), int(bool(a.ceil_mode))])
        n, c, h, w = (int(d) for d in expr.ty.shape)
        pooled = relax.call_pure_packed(MAX_POOL, matches[nhwc], spec, ty_args=relax.TensorType([n, h, w, c], expr.ty.dtype))
        return _layout_call(TO_NCHW, pooled, [n, c, h, w], expr.ty.dtype)

    return rewrite_call(pool, rewrite, func)


def _cancel_layout_round_trips(func: relax.Function) -> relax.Function:
    """``to_nhwc(to_nchw(x))`` is ``x``: between two packed calls the round trip goes, and the tensors stay
    channels-last from one oneDNN call to the next. Only the model's edges keep a layout change."""
    inner = is_op("relax.call_pure_packed")(ExternFuncPattern(TO_NCHW), wildcard())
    outer = is_op("relax.call_pure_packed")(ExternFuncPattern(TO_NHWC), inner)
    return rewrite_call(outer, lambda expr, matches: matches[inner].args[1], func)


def _packed_weight(weight: relax.Expr, attrs: relax.ShapeExpr, data: relax.Expr) -> relax.Expr | None:
    """The handle of ``weight`` packed for a convolution on ``data``'s shape; None when that shape is not static."""
    try:
        shape = [int(d) for d in data.ty.shape]
    except (TypeError, AttributeError):
        return None
    spec = relax.ShapeExpr([*(int(v) for v in attrs.values), *shape])
    return relax.call_pure_packed(PACK_WEIGHT, weight, spec, ty_args=relax.TensorType([1], "int64"))


def _rewriter(rule: _Rule, pieces: dict, uses: _Uses, prepack: bool = False) -> Callable:
    def rewrite(expr: relax.Call, matches: dict) -> relax.Expr:
        conv = matches[pieces["conv"]]
        attrs = conv_attrs(conv)
        if attrs is None or (rule.activation == "relu6" and not _is_relu6(expr)):
            return expr
        if not all(uses.only_once(matches[piece]) for piece in pieces["inner"]):
            return expr
        args = [matches[pieces["data"]], matches[pieces["weight"]]]
        if rule.bn:
            folded = _fold_batch_norm(args[1], matches[pieces["bn"]])
            if folded is None:
                return expr
            args = [args[0], *folded]
        if rule.add:
            residual = matches[pieces["residual"]]
            if [int(d) for d in residual.ty.shape] != [int(d) for d in conv.ty.shape]:
                return expr
            args.append(residual)
        packed = None
        if prepack and not (rule.add and rule.activation == "relu6"):
            packed = _packed_weight(args[1], attrs, args[0])
        if packed is not None:  # channels-last around the call; the layout changes between two calls cancel later
            n, c, h, w = (int(d) for d in conv.ty.shape)
            args = [_to_nhwc(args[0]), packed, *args[2:]]
            if rule.add:
                args[-1] = _to_nhwc(args[-1])
            name = function_name(rule.bn, rule.add, rule.activation, packed=True)
            call = relax.call_pure_packed(name, *args, attrs, ty_args=relax.TensorType([n, h, w, c], conv.ty.dtype))
            return _layout_call(TO_NCHW, call, [n, c, h, w], conv.ty.dtype)
        name = function_name(rule.bn, rule.add, rule.activation)
        out = relax.TensorType(conv.ty.shape, conv.ty.dtype)
        return relax.call_dps_packed(name, relax.Tuple([*args, attrs]), out_ty=out)

    return rewrite


def offload_convs(mod: tvm.IRModule, fold_bn: bool = True, fuse_epilogue: bool = True,
                  function: str = "main", prepack: bool = False) -> tvm.IRModule:
    """``mod`` with its dense conv2d calls dispatched to the registered PyTorch (oneDNN) functions.

    With ``fold_bn`` a following inference BatchNorm is folded into the weight and
    bias (weights-only arithmetic, lifted out of ``main`` at build time); with
    ``fuse_epilogue`` a following residual add and ReLU/ReLU6 run inside the same
    call, into its output buffer. With ``prepack`` each weight is packed once for
    oneDNN (a ``course.torch.pack_conv2d_weight`` call, lifted out of ``main`` with
    the folding) and the calls run oneDNN's fused convolution, the epilogue as its
    post-ops, on channels-last tensors: layout changes stay only where a tensor
    leaves or enters a chain of packed calls, and a max pooling inside a chain
    (ResNet's stem) runs channels-last in PyTorch too. Depthwise and grouped
    convolutions stay in TVM.
    """
    if function not in [gv.name_hint for gv in mod.functions]:
        raise CourseError(f"The module has no function {function!r}; it has "
                          f"{sorted(gv.name_hint for gv in mod.functions)}.")
    func = mod[function]
    for rule in _rules(fold_bn, fuse_epilogue):
        pattern, pieces = _pattern(rule)
        func = rewrite_call(pattern, _rewriter(rule, pieces, _Uses(func), prepack), func)
    if prepack:
        func = _cancel_layout_round_trips(_pool_channels_last(func))
    out = relax.transform.DeadCodeElimination()(_with_function(mod, function, func))
    convs_before = len(ir.calls(mod, "nn.conv2d", function))
    convs_after = len(ir.calls(out, "nn.conv2d", function)) + sum(dispatched_calls(out, function).values())
    if convs_after != convs_before:  # a convolution dispatched twice, or lost: never hand that on
        raise CourseError(f"The rewrite turned {convs_before} convolutions into {convs_after} "
                          "(TVM's and the library's together): a rule took a value still used elsewhere.")
    return out


def _with_function(mod: tvm.IRModule, name: str, func: relax.Function) -> tvm.IRModule:
    out = mod.clone()
    out[name] = func
    return out


def dispatched_calls(mod: tvm.IRModule, function: str = "main") -> Counter:
    """How many calls of each library convolution ``function`` makes: the ``call_dps_packed`` ones, and the
    packed ones (``call_pure_packed``: they return PyTorch's result instead of writing into a buffer)."""
    found: Counter = Counter()
    ops = (tvm.ir.Op.get("relax.call_dps_packed"), tvm.ir.Op.get("relax.call_pure_packed"))

    def visit(expr):
        if isinstance(expr, relax.Call) and any(expr.op.same_as(op) for op in ops):
            name = str(expr.args[0].global_symbol)
            if expr.op.same_as(ops[0]) or name.startswith(PREFIX + "conv2d"):
                found[name] += 1

    relax.analysis.post_order_visit(mod[function].body, visit)
    return found


# ------------------------------------------------------------------ building


def compile_dispatched(imported: ImportedModel, target: tvm.target.Target | None = None,
                       database=None, **rewrite) -> CompiledModel:
    """Offload ``imported``'s dense convolutions and build the rest with TVM, ready to run.

    ``database`` (a ``helpers.databases.Database``) tunes the kernels left in TVM;
    without one they get TVM's default code. The weight arithmetic (BatchNorm
    folding, prepacking) runs once here through ``main_transform_params``.
    ``rewrite`` goes to ``offload_convs`` (``fold_bn``, ``fuse_epilogue``, ``prepack``).
    """
    target = target or cpu_target()
    if rewrite.get("prepack") and database is not None and not database.prepacked():
        raise CourseError(f"{database.label()} was tuned without weight prepacking, so its build keeps the weight "
                          "arithmetic in main and would pack every weight on every call. Use a database tuned "
                          "with prepack=True (all shipped ones are), or dispatch without prepack.")
    offloaded = ImportedModel(mod=offload_convs(imported.mod, **rewrite), params=imported.params,
                              input_shape=imported.input_shape, input_dtype=imported.input_dtype)
    if database is not None:  # the kernels left in TVM stay NCHW, whatever layout the database was tuned in
        return database.compile(offloaded, target, layout=nchwc.PLAIN)
    lifted = relax.transform.LiftTransformParams()(offloaded.mod)
    return transform_params(compile_model(replace(offloaded, mod=lifted), target))


# ------------------------------------------------------------------ operators of your own


def te_module(compute: Callable, shapes: Sequence[Sequence[int]], *args, dtype: str = "float32") -> tvm.IRModule:
    """A Relax module whose ``main`` takes tensors of ``shapes`` and returns ``compute(*tensors, *args)``.

    ``compute`` is a tensor-expression function (``te.compute``); ``emit_te`` turns it
    into a TensorIR function called from ``main`` with ``call_tir``.
    """
    bb = relax.BlockBuilder()
    inputs = [relax.Var(f"in{i}", relax.TensorType([int(d) for d in shape], dtype)) for i, shape in enumerate(shapes)]
    with bb.function("main", inputs):
        with bb.dataflow():
            out = bb.emit_output(bb.emit_te(compute, *inputs, *args))
        bb.emit_func_output(out)
    return bb.get()


def run_module(mod: tvm.IRModule, *arrays: np.ndarray, target: tvm.target.Target | None = None) -> np.ndarray:
    """Compile ``mod`` (default pipeline) for this CPU and run ``main`` on NumPy arrays."""
    executable = tvm.compile(mod, target=target or cpu_target(), relax_pipeline="default")
    vm = relax.VirtualMachine(executable, tvm.cpu())
    return vm["main"](*(tvm.runtime.tensor(np.ascontiguousarray(a)) for a in arrays)).numpy()


# ------------------------------------------------------------------ the decision


def time_saved_ms(rows: Sequence[dict], offload: Sequence[str], overhead_ms: float) -> float:
    """Milliseconds per inference saved by offloading the named rows of a dispatch table.

    A row is ``{"kernel", "calls", "tvm_ms", "library_ms"}`` (``library_ms`` None when the
    library cannot run it); each offloaded call also pays ``overhead_ms``.
    """
    by_name = {r["kernel"]: r for r in rows}
    unknown = [k for k in offload if k not in by_name]
    if unknown:
        raise CourseError(f"No row named {unknown[0]!r} in the table; kernels are {sorted(by_name)}.")
    saved = 0.0
    for name in set(offload):
        row = by_name[name]
        if row["library_ms"] is None:
            raise CourseError(f"{name} has no library implementation (library_ms is None): it cannot be offloaded.")
        saved += row["tvm_ms"] - row["library_ms"] - row["calls"] * overhead_ms
    return saved


def choose_offload(rows: Sequence[dict], overhead_ms: float) -> list[str]:
    """The rows of a dispatch table worth offloading, sorted by name.

    A row is worth it when the library's time plus ``calls × overhead_ms`` is below TVM's. When
    each row's saving (``time_saved_ms``) does not depend on the others, these rows together save
    the most; rows whose cost depends on their neighbours (packed calls: the layout changes cancel
    between two offloaded ones) must be grouped into one row first. Rows the library cannot run
    (``library_ms`` None) stay.
    """
    return sorted(r["kernel"] for r in rows
                  if r["library_ms"] is not None and r["library_ms"] + r["calls"] * overhead_ms < r["tvm_ms"])


def random_conv_problem(shape: tuple[int, int, int, int], c_out: int, kernel: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Seeded (data, weight) arrays for a dense convolution, for tests and the notebook's checks."""
    rng = np.random.default_rng(seed)
    data = rng.standard_normal(shape, dtype=np.float32)
    weight = rng.standard_normal((c_out, shape[1], kernel, kernel), dtype=np.float32) / np.sqrt(shape[1] * kernel**2)
    return data, weight.astype(np.float32)
