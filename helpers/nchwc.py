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
"""

from __future__ import annotations

import re

import tvm
from tvm import relax, te, topi
from tvm.relax.transform.legalize_ops import nn as _default_nn

from .machine import vector_width_bits

PLAIN = "NCHW"
_BLOCKED = re.compile(r"NCHW(\d+)c")


def block_for(target: tvm.target.Target | None = None) -> int:
    """The channel block that fills one vector register on ``target`` (default: this CPU): 16 floats with
    AVX-512, 8 with AVX2. ``kernels.float32_lanes`` is the same number, for one kernel."""
    return vector_width_bits(target) // 32


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


def _depthwise_nchwc(data: te.Tensor, kernel: te.Tensor, strides, padding, dilation, out_dtype: str) -> te.Tensor:
    """Depthwise convolution of NCHW{b}c data by an OIHW{b}o kernel (channels/b, 1, kh, kw, b)."""
    n, chunks, height, width, block = data.shape
    _, _, kh, kw, _ = kernel.shape
    top, left, bottom, right = padding
    (sh, sw), (dh, dw) = strides, dilation
    padded = topi.nn.pad(data, [0, 0, top, left, 0], [0, 0, bottom, right, 0], name="pad_temp")
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
        name="depthwise_conv2d_NCHWc",
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
