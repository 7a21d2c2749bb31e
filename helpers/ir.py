"""Look inside a Relax module: which operators, how many kernels, what got fused.

Introduced on Day 0.
"""

from __future__ import annotations

import re
from collections import Counter

import tvm
from tvm import relax
from tvm.tirx import PrimFunc

from .errors import CourseError

CALL_TIR_OPS = {"relax.call_tir", "relax.call_tir_inplace", "relax.call_tir_with_grad"}


def _function(mod: tvm.IRModule, name: str) -> relax.Function:
    names = [gv.name_hint for gv in mod.get_global_vars()]
    if name not in names:
        raise CourseError(f"The module has no function {name!r}; it has {sorted(names)}.")
    func = mod[name]
    if not isinstance(func, relax.Function):
        raise CourseError(f"{name!r} is a {type(func).__name__}, not a Relax function.")
    return func


def _calls(mod: tvm.IRModule, function: str) -> list[relax.Call]:
    found: list[relax.Call] = []

    def visit(expr):
        if isinstance(expr, relax.Call) and isinstance(expr.op, tvm.ir.Op):
            found.append(expr)

    relax.analysis.post_order_visit(_function(mod, function), visit)
    return found


def calls(mod: tvm.IRModule, op: str, function: str = "main") -> list[relax.Call]:
    """The calls of one Relax operator in ``function``, in order, named as ``op_histogram`` names
    them (``"nn.conv2d"``; the ``relax.`` prefix is optional)."""
    name = op if op.startswith("relax.") else "relax." + op
    return [call for call in _calls(mod, function) if call.op.name == name]


def op_histogram(mod: tvm.IRModule, function: str = "main") -> Counter:
    """How often each Relax operator is called in ``function`` (``relax.`` prefix dropped).

    Calls into TensorIR kernels are counted under ``call_tir``.
    """
    return Counter(call.op.name.removeprefix("relax.") for call in _calls(mod, function))


def kernel_names(mod: tvm.IRModule) -> list[str]:
    """Names of the TensorIR functions (kernels) in the module, sorted."""
    return sorted(gv.name_hint for gv, func in mod.functions.items() if isinstance(func, PrimFunc))


def block_names(mod: tvm.IRModule, kernel: str) -> list[str]:
    """The computation blocks of a TensorIR kernel, in order: what one kernel does, step by step."""
    names = [gv.name_hint for gv in mod.get_global_vars()]
    if kernel not in names or not isinstance(mod[kernel], PrimFunc):
        raise CourseError(f"The module has no TensorIR kernel {kernel!r}; its kernels are {kernel_names(mod)}.")
    return [name for name in re.findall(r'T\.sblock\("([^"]+)"\)', mod[kernel].script()) if name != "root"]


def count_kernels(mod: tvm.IRModule) -> int:
    """Distinct TensorIR kernels in the module (each is compiled once)."""
    return len(kernel_names(mod))


def count_kernel_calls(mod: tvm.IRModule, function: str = "main") -> int:
    """Kernel launches per inference: the ``call_tir`` calls in ``function``.

    Right after LegalizeOps and after FuseTIR. In between, FuseOps has moved
    calls into ``Primitive`` Relax functions, which this does not count (Day 2).
    """
    return sum(1 for call in _calls(mod, function) if call.op.name in CALL_TIR_OPS)


def is_fused(kernel: str) -> bool:
    """True for a kernel made of several operators: ``fused_conv2d_add_relu``.

    FuseOps names every group ``fused_<op>_<op>...``, also a group of one
    operator (``fused_conv2d3``), which is not a fusion.
    """
    if not kernel.startswith("fused_"):
        return False
    rest = kernel.removeprefix("fused_").removeprefix("tir_")
    return re.fullmatch(rf"{re.escape(op_type(kernel))}\d*", rest) is None


def fused_function_names(mod: tvm.IRModule) -> list[str]:
    """Kernels that FuseOps/FuseTIR made out of several operators."""
    return [name for name in kernel_names(mod) if is_fused(name)]


# Operator names as they appear in kernel names, longest first so that
# "adaptive_avg_pool2d" wins over "avg_pool2d" and "conv2d_transpose" over "conv2d".
KNOWN_OPS = sorted(
    """conv2d_transpose conv1d conv2d conv3d max_pool2d avg_pool2d adaptive_avg_pool2d
    batch_norm layer_norm group_norm matmul dense add subtract multiply divide relu relu6
    clip sigmoid silu gelu tanh exp mean sum max reshape transpose permute_dims softmax
    concatenate split strided_slice take cast expand_dims squeeze flatten""".split(),
    key=len,
    reverse=True,
)


def op_type(kernel: str) -> str:
    """The operator a kernel is named after: ``fused_conv2d3_add2_relu1`` -> ``conv2d``.

    TVM names a kernel after its operators in order, numbering repeats, and a
    fused kernel after the anchor (heavy) op first; ``tir_`` marks ops legalized
    straight to TensorIR (``tir_clip3`` -> ``clip``).
    """
    name = kernel.removeprefix("fused_").removeprefix("tir_")
    for op in KNOWN_OPS:
        if re.match(rf"{op}\d*(_|$)", name):
            return op
    return re.sub(r"\d+$", "", name.split("_")[0]) or name


def conv_gflops(call: relax.Call) -> float:
    """Multiply-adds of one conv2d, x2, in GFLOP: N*OC*OH*OW * (IC/groups)*KH*KW * 2 (Day 0; Day 11's operator mix)."""
    n, oc, oh, ow = (int(d) for d in call.ty.shape)
    _, in_per_group, kh, kw = (int(d) for d in call.args[1].ty.shape)
    return 2.0 * n * oc * oh * ow * in_per_group * kh * kw / 1e9
