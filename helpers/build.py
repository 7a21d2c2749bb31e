"""Compile a Relax module, run it on the VirtualMachine, check it against PyTorch.

Introduced on Day 0.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import tvm
import tvm_ffi
from tvm import relax, te, topi

from . import cache
from .errors import InputShapeError, ParityError
from . import machine
from .machine import cpu_target, require_gpu
from .models import ImportedModel

# A comparison must give every engine the same threads, so TVM's pool (set by importing ``machine``) and
# PyTorch's intra-op pool both get ``machine.thread_count()`` (one per physical core, or TVM_NUM_THREADS
# where the learner set it; Day 4 shows what threads do), and the peers follow PyTorch's
# (helpers/peers.py). PyTorch's is set here, where models are built and run; helpers that never run a
# kernel (grading) do not pay for importing torch.
torch.set_num_threads(machine.thread_count())


def _fast_sigmoid(x: te.Tensor) -> te.Tensor:
    """``1 / (1 + exp(-x))`` with TVM's polynomial ``fast_exp``: plain arithmetic that vectorizes."""
    e = topi.fast_exp(topi.negative(x))
    return te.compute(x.shape, lambda *i: tvm.tirx.const(1.0, x.dtype) / (tvm.tirx.const(1.0, x.dtype) + e(*i)),
                      name="fast_sigmoid")


def _fast_gelu(x: te.Tensor) -> te.Tensor:
    """GELU, ``x / 2 * (1 + erf(x / sqrt(2)))``, with TVM's polynomial ``fast_erf``."""
    erf = topi.fast_erf(topi.multiply(x, tvm.tirx.const(0.7071067811865476, x.dtype)))
    return te.compute(x.shape, lambda *i: x(*i) * tvm.tirx.const(0.5, x.dtype) * (tvm.tirx.const(1.0, x.dtype) + erf(*i)),
                      name="fast_gelu")


# float32 operators whose TVM lowering calls the C library once per element, and their replacements
_FAST = {
    "relax.sigmoid": lambda bb, call: bb.call_te(_fast_sigmoid, call.args[0], primfunc_name_hint="fast_sigmoid"),
    "relax.nn.gelu": lambda bb, call: bb.call_te(_fast_gelu, call.args[0], primfunc_name_hint="fast_gelu"),
    "relax.nn.softmax": lambda bb, call: bb.call_te(topi.nn.fast_softmax, call.args[0], int(call.attrs.axis),
                                                    primfunc_name_hint="fast_softmax"),
}


@relax.expr_functor.mutator
class _FastMath(relax.PyExprMutator):
    def visit_call_(self, call: relax.Call) -> relax.Expr:
        call = self.visit_expr_post_order(call)
        if isinstance(call.op, tvm.ir.Op) and call.op.name in _FAST and call.ty.dtype == "float32":
            return _FAST[call.op.name](self.builder_, call)
        return call


@tvm.transform.module_pass(opt_level=0, name="FastMath")
def fast_math(mod: tvm.IRModule, _ctx) -> tvm.IRModule:
    """float32 ``sigmoid`` (SiLU's, squeeze-excite's), ``gelu`` and ``softmax`` with vectorizable polynomials.

    TVM lowers ``sigmoid`` and ``softmax`` to the C library's ``expf``, and ``gelu`` to ``erff``, one
    call per element: LLVM has no vector ``exp`` or ``erf`` for x86 without a vector math library. So
    every SiLU kernel of EfficientNet-B0 was scalar at its tail (2840 ``expf`` calls in its tuned
    library; results/HISTORY.md, "The CPU goals against eager", has what this pass bought), and in
    Day 14's GPT the GELU kernels were the slowest of the tuned prefill (173 us of 741 on the Intel
    Xeon). ``fast_exp`` and ``fast_erf`` (``relax.transform.FastMathTransform``'s, which covers softmax
    but not GELU) are polynomials accurate to float32 rounding over the range that matters.
    """
    for gv, func in list(mod.functions.items()):
        if isinstance(func, relax.Function):
            mutator = _FastMath(mod)
            new = mutator.visit_expr(func)
            mod = mutator.builder_.get()
            mod[gv] = new
    return mod


def fusion_passes(target: tvm.target.Target | None = None, before_legalize: Sequence[tvm.transform.Pass] = (),
                  legalize_map: dict | None = None) -> list[tvm.transform.Pass]:
    """The passes that turn an imported module into fused TensorIR kernels.

    Inference decomposition (BatchNorm into arithmetic), legalization into TIR,
    op-pattern annotation, constant folding, then FuseOps/FuseTIR: the first half
    of the ``static_shape_tuning`` pipeline. Tuning and applying a database must
    run exactly these, since database records are found by each kernel's form.
    ``before_legalize`` and ``legalize_map`` (``LegalizeOps``' own rules for some operators) let a layout
    of the convolutions other than NCHW in (Day 7's channel blocks: ``nchwc.fusion_passes``).
    Run the returned passes under ``with target:``.
    """
    target = target or cpu_target()
    return [
        relax.transform.DecomposeOpsForInference(),
        relax.transform.CanonicalizeBindings(),
        *before_legalize,
        *relax.pipeline.library_dispatch_passes(target),
        fast_math,
        relax.transform.LegalizeOps(customize_legalize_map=legalize_map),
        relax.transform.AnnotateTIROpPattern(),
        relax.transform.FoldConstant(),
        relax.transform.FuseOps(),
        relax.transform.FuseTIR(),
    ]


def fuse(mod: tvm.IRModule, target: tvm.target.Target | None = None) -> tvm.IRModule:
    """``mod`` with its operators legalized and fused into kernels for ``target`` (``fusion_passes``)."""
    target = target or cpu_target()
    with target:
        return tvm.transform.Sequential(fusion_passes(target))(mod)


def device_for(target: tvm.target.Target) -> tvm.runtime.Device:
    """The device a target's code runs on; a clear error for CUDA without a GPU."""
    if target.kind.name == "cuda":
        require_gpu("Running a CUDA module")
        return tvm.cuda(0)
    return tvm.cpu(0)


def to_numpy(value) -> np.ndarray:
    """A VM result (a tensor, or a one-element tuple of them) as a NumPy array."""
    if hasattr(value, "numpy"):
        return value.numpy()
    if len(value) == 1:
        return to_numpy(value[0])
    raise TypeError(f"expected one output tensor, got {len(value)}")


@dataclass
class CompiledModel:
    """A built module on its device, callable like the PyTorch model it came from."""

    # a Module when a tuned build is loaded from the compile cache; compiled on demand for a cached untuned one
    executable: tvm.runtime.Executable | tvm.runtime.Module
    vm: relax.VirtualMachine
    device: tvm.runtime.Device
    params: list
    input_shape: tuple[int, ...]
    input_dtype: str
    target: tvm.target.Target
    library: Path | None = None  # the exported library it was loaded from (the compile cache), if any

    def to_device(self, x) -> tvm.runtime.Tensor:
        """Check the input against the compiled signature (``check_input``) and copy it to the device."""
        array = x.detach().cpu().numpy() if isinstance(x, torch.Tensor) else np.asarray(x)
        self.check_input(array)
        return tvm.runtime.tensor(array, self.device)

    def check_input(self, array: np.ndarray) -> None:
        """Raise ``InputShapeError`` unless ``array`` fits the compiled signature (a build with a dynamic
        dimension widens it: ``dynamic.DynamicBatchModel``, ``transformer.SymbolicLengthModel``)."""
        if tuple(array.shape) != tuple(self.input_shape) or str(array.dtype) != self.input_dtype:
            raise InputShapeError(
                f"This module was compiled for input {self.input_shape} {self.input_dtype}, "
                f"but got {tuple(array.shape)} {array.dtype}. Shapes are static in the compiled "
                "code: import and compile again with an example of the shape you need."
            )

    def run_on_device(self, x: tvm.runtime.Tensor):
        """One inference on an input already on the device (what benchmarks time)."""
        return self.vm["main"](x, *self.params)

    def __call__(self, x) -> np.ndarray:
        return to_numpy(self.run_on_device(self.to_device(x)))


def compile_model(
    imported: ImportedModel,
    target: tvm.target.Target | None = None,
    pipeline: str | tvm.transform.Pass = "default",
    pass_config: dict[str, object] | None = None,
) -> CompiledModel:
    """tvm.compile the imported module for ``target`` (default: this CPU) and load it to run.

    ``pass_config`` holds pass-context options for the build (e.g. ``{"relax.backend.use_cuda_graph":
    True}``). To only generate code for a device this machine lacks (CUDA without a GPU),
    call ``tvm.compile`` directly: there is nothing to load it on.
    """
    target = target or cpu_target()
    device_for(target)  # fail before a long compile when the device is missing
    runnable, executable, library = build_runnable(imported.mod, target, pipeline, pass_config)
    compiled = load_executable(runnable, imported, target)
    compiled.executable, compiled.library = executable, library
    return compiled


def build_runnable(mod: tvm.IRModule, target: tvm.target.Target, pipeline: str | tvm.transform.Pass = "default",
                   pass_config: dict[str, object] | None = None) -> tuple[object, object, Path | None]:
    """``tvm.compile(mod)`` as ``(what relax.VirtualMachine runs, the executable, the library file or None)``.

    Here the three are one executable. In the suite (quick mode), which builds the same models many
    times, a CPU build with a named pipeline is kept in the compile cache like a tuned build
    (``helpers.cache``): the VM runs the library loaded from it, and the executable is compiled
    again only where something asks for it (exporting it, reading its LLVM code).
    """
    def compile_it() -> tvm.runtime.Executable:
        with tvm.transform.PassContext(config=pass_config) if pass_config else contextlib.nullcontext():
            return tvm.compile(mod, target=target, relax_pipeline=pipeline)

    if not (cache.for_tests() and isinstance(pipeline, str) and not pass_config and target.kind.name == "llvm"):
        executable = compile_it()
        return executable, executable, None
    key = cache.key("build_runnable", str(target), tvm_ffi.structural_hash(mod), pipeline)
    library, _ = cache.load_or_build("untuned", key, compile_it)
    return library, _ExecutableOnDemand(compile_it), cache.path_for("untuned", key)


class _ExecutableOnDemand:
    """A build's ``tvm.runtime.Executable``, compiled at its first use (a build loaded from the cache runs
    without it)."""

    def __init__(self, compile_it) -> None:
        self._compile_it, self._executable = compile_it, None

    def __getattr__(self, name: str):
        if self._executable is None:
            self._executable = self._compile_it()
        return getattr(self._executable, name)


def load_executable(
    executable: tvm.runtime.Executable, imported: ImportedModel, target: tvm.target.Target
) -> CompiledModel:
    """Wrap an executable built from ``imported`` (by any pipeline) for running."""
    device = device_for(target)
    params = [tvm.runtime.tensor(p.numpy(), device) for p in imported.params]
    return CompiledModel(
        executable=executable,
        vm=relax.VirtualMachine(executable, device),
        device=device,
        params=params,
        input_shape=imported.input_shape,
        input_dtype=imported.input_dtype,
        target=target,
    )


def transform_params(compiled: CompiledModel) -> CompiledModel:
    """Run the build's ``main_transform_params`` on its weights once, where it has one (weights prepacked,
    BatchNorm folded, a ``Linear``'s weight transposed: lifted out of ``main``), as a deployed model does at
    start-up; the model is then called like any other."""
    try:
        transform = compiled.vm["main_transform_params"]
    except (AttributeError, KeyError, RuntimeError, ValueError):  # the VM's answer for a function it lacks
        return compiled
    compiled.params = list(transform(compiled.params))
    return compiled


def relative_error(actual: np.ndarray, expected: np.ndarray) -> float:
    """max|actual - expected| / max|expected|: an error on the output's own scale.

    An absolute tolerance is meaningless when outputs are tiny (random-weight
    MobileNetV2 gives logits near 1e-9, so any atol passes) or huge.
    """
    actual, expected = np.asarray(actual), np.asarray(expected)
    if actual.shape != expected.shape:
        raise ParityError(f"Output shapes differ: TVM gives {actual.shape}, PyTorch {expected.shape}.")
    scale = float(np.abs(expected).max()) if expected.size else 0.0
    diff = float(np.abs(actual - expected).max()) if expected.size else 0.0
    if scale == 0.0:
        return diff
    return diff / scale


def check_parity(compiled: CompiledModel, model: torch.nn.Module, x: torch.Tensor, rtol: float = 1e-4) -> float:
    """Raise ParityError unless TVM matches PyTorch on ``x``; return the relative error."""
    with torch.no_grad():
        expected = model(x).numpy()
    error = relative_error(compiled(x), expected)
    if not error <= rtol:  # also catches NaN
        raise ParityError(
            f"TVM output differs from PyTorch: relative error {error:.3g} (max |TVM - PyTorch| / max |PyTorch|) "
            f"is above the tolerance {rtol:g}. Was the module compiled from this model, with these weights?"
        )
    return error
