"""The engines a CPU user would pick instead of TVM, as zero-argument runners for ``timing.measure``.

"Faster than PyTorch eager" says little on a CPU where eager is far from the best PyTorch (a Zen 3
ran MobileNetV2 2.4x faster with torch.compile than eager): tuned TVM is compared with the fastest
of PyTorch eager, torch.compile, torch.compile with Inductor's freezing, ONNX Runtime and OpenVINO
(Intel's inference engine for CPUs), each checked against eager on the same input before it is timed.
Every one of them computes in float32, as TVM does here. OpenVINO's own default on a CPU with
bfloat16 instructions is bf16, which is not: ``openvino_default`` builds that one apart, for the
tables that name each engine's precision.

Introduced on Day 4.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

import numpy as np
import torch

from .build import relative_error
from .cache import kept_for_tests
from .config import pick
from .errors import ParityError
from .timing import Timing, torch_runner, versus

EAGER, COMPILED, FROZEN, ORT = "PyTorch eager", "torch.compile", "torch.compile (freezing)", "ONNX Runtime"
OPENVINO = "OpenVINO"  # at float32 (INFERENCE_PRECISION_HINT f32), like every engine here
PYTORCH = (EAGER, COMPILED, FROZEN)
ENGINES = (*PYTORCH, ORT, OPENVINO)
ONNX_ENGINES = (ORT, OPENVINO)  # fed the model's ONNX export
# TVM's builds, as the course's tables label them beside the peers (Day 4's table, Day 11's zoo, the benchmark).
UNTUNED, TUNED = "TVM untuned", "TVM tuned"
RTOL = 1e-4  # the tolerance TVM's builds are held to (build.check_parity)


class PeerUnavailable(RuntimeError):
    """A peer that cannot be built for this model (e.g. ONNX export fails): reported, not fatal."""


def why_missing(label: str, err: BaseException) -> str:
    """One line on why a peer is left out: its label, the error's type and the first line of its message."""
    return f"{label}: {type(err).__name__}: {(str(err).strip().splitlines() or [''])[0]}"


@dataclass
class Peers:
    """Runners that matched eager, the seconds each took to compile (its first call), why any is missing, and
    the model's ONNX export where ONNX Runtime or OpenVINO was asked for (``openvino_default`` takes it)."""

    runners: dict[str, Callable[[], object]]
    compile_s: dict[str, float] = field(default_factory=dict)
    missing: dict[str, str] = field(default_factory=dict)
    exported: bytes | None = None


class FrozenCompiled(torch.nn.Module):
    """``torch.compile`` of a module with Inductor's freezing (weights folded in as constants, conv + BN
    fused, weights prepacked for oneDNN), always called with freezing on and in inference mode.

    Freezing must be on in Inductor's global config while a call compiles: ``options={"freezing": True}``
    alone reaches the freezing pass but not the pre-grad conv + BN fusion (measured: a frozen BN then
    still read its live buffers), and Dynamo compiles again when the mode changes, without freezing.
    The option is passed too, because it makes this compile's backend differ from a plain one's: Dynamo
    caches compiled code on ``forward``'s code object and serves it to any torch.compile with an equal
    backend, so without it a second compile of one model silently ran the first one's code.
    ``options`` adds other Inductor options (on a GPU, ``{"triton.cudagraphs": True}``: CUDA graphs too).
    """

    def __init__(self, module: torch.nn.Module, options: Mapping[str, object] | None = None):
        import torch._inductor.config  # noqa: F401  (for the patch in forward)

        super().__init__()
        self.compiled = torch.compile(module, options={"freezing": True, **(options or {})})

    def forward(self, *inputs: torch.Tensor):
        with torch.inference_mode(), torch._inductor.config.patch(freezing=True):
            return self.compiled(*inputs)


def compiled_runner(model: torch.nn.Module, x: torch.Tensor, freezing: bool = False) -> tuple[Callable[[], object], float]:
    """torch.compile (Inductor) of ``model``, plain or ``FrozenCompiled``, compiled by a first call here:
    (runner, compile seconds)."""
    run = torch_runner(FrozenCompiled(model) if freezing else torch.compile(model), x)
    start = time.perf_counter()
    with torch._inductor.config.patch(freezing=freezing):  # a plain compile stays plain whatever the global config
        run()
    return run, time.perf_counter() - start


def onnx_runtime_session(model: torch.nn.Module, x: torch.Tensor, profile_prefix: str | None = None):
    """``model`` exported to ONNX (``onnx_export``) in an ONNX Runtime session (``onnx_session``)."""
    return onnx_session(onnx_export(model, x), profile_prefix)


def onnx_session(onnx_model, profile_prefix: str | None = None):
    """An ONNX model (a path or its bytes) in an ONNX Runtime session on the CPU: all graph
    optimizations, PyTorch's thread count; with ``profile_prefix``, its profiler on, writing there
    (``layer_compare.onnx_runtime_layers``). The one way the course sets ONNX Runtime up."""
    import onnxruntime as ort  # (a second of import, for the one peer that needs it)

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.intra_op_num_threads = torch.get_num_threads()  # the threads PyTorch and TVM get
    options.inter_op_num_threads = 1
    if profile_prefix is not None:
        options.enable_profiling = True
        options.profile_file_prefix = profile_prefix
    return ort.InferenceSession(onnx_model, options, providers=["CPUExecutionProvider"])


class OnnxEngine:
    """An ONNX model (its bytes) in ONNX Runtime (``ORT``: ``onnx_session``) or OpenVINO (``OPENVINO``:
    ``openvino_compiled``, at ``precision``), the course's one set-up of each, fed NumPy arrays or CPU
    tensors in the model's input order and giving every output in the model's order. ``runner(inputs)``
    binds the inputs once, for ``timing.measure``; ``run(inputs)`` calls once. ``precision`` is what
    it computes in, as OpenVINO names it (ONNX Runtime's CPU runs float32 as exported)."""

    def __init__(self, engine: str, onnx_model: bytes, precision: str | None = "f32"):
        if engine == ORT:
            session = onnx_session(onnx_model)
            names = [i.name for i in session.get_inputs()]
            self.precision = "f32"

            def bind(arrays: list[np.ndarray]) -> Callable[[], list[np.ndarray]]:
                feed = dict(zip(names, arrays))
                return lambda: session.run(None, feed)
        elif engine == OPENVINO:
            compiled = openvino_compiled(onnx_model, precision)
            request, outputs = compiled.create_infer_request(), range(len(compiled.outputs))
            self.precision = openvino_precision(compiled)

            def bind(arrays: list[np.ndarray]) -> Callable[[], list[np.ndarray]]:
                feed = dict(enumerate(arrays))

                def run() -> list[np.ndarray]:
                    out = request.infer(feed)
                    return [out[i] for i in outputs]

                return run
        else:
            raise ValueError(f"{engine!r} does not run ONNX models here: choose from {list(ONNX_ENGINES)}.")
        self.engine, self._bind = engine, bind

    def runner(self, inputs: Sequence, output: int | None = None) -> Callable[[], object]:
        """A zero-argument runner on ``inputs``; with ``output``, it gives that output alone."""
        run = self._bind([t.numpy() if isinstance(t, torch.Tensor) else np.asarray(t) for t in inputs])
        return run if output is None else lambda: run()[output]

    def run(self, inputs: Sequence) -> list[np.ndarray]:
        """Every output on ``inputs``, once."""
        return self.runner(inputs)()


def onnx_engine_runner(label: str, model: torch.nn.Module, x: torch.Tensor, exported: bytes | None = None,
                       precision: str | None = "f32") -> tuple[Callable[[], object], float, str]:
    """``model`` on ``x`` in ``label``'s engine (``ORT`` or ``OPENVINO``), fed its ONNX export (``exported``,
    or made here): (runner giving the first output, export + load seconds, the precision it computes in).
    Raises ``PeerUnavailable`` when the model does not export, the engine is not installed, or it cannot
    load the model."""
    start = time.perf_counter()
    try:
        engine = OnnxEngine(label, onnx_export(model, x) if exported is None else exported, precision)
    except Exception as err:  # any exporter, import or loader failure: the peer is absent, with the reason
        raise PeerUnavailable(why_missing(label, err)) from err
    return engine.runner([x], output=0), time.perf_counter() - start, engine.precision


def openvino_compiled(onnx_model: bytes, precision: str | None = "f32", profile: bool = False):
    """An ONNX model compiled by OpenVINO's CPU plugin: the latency hint, PyTorch's thread count, and
    ``precision`` as its inference precision ("f32"; None: the plugin's default for this CPU, bf16 where the
    CPU has bfloat16 instructions); ``profile``: its per-node counters on (``layer_compare.openvino_layers``).
    The one way the course sets OpenVINO up."""
    import openvino as ov  # (imported for the one peer that needs it)

    core = ov.Core()
    config = {"PERFORMANCE_HINT": "LATENCY", "INFERENCE_NUM_THREADS": torch.get_num_threads()}
    if precision is not None:
        config["INFERENCE_PRECISION_HINT"] = precision
    if profile:
        config["PERF_COUNT"] = True
    return core.compile_model(core.read_model(onnx_model), "CPU", config)


def openvino_precision(compiled) -> str:
    """The precision an OpenVINO compiled model computes in, as OpenVINO names it (f32, bf16, f16)."""
    return str(compiled.get_property("INFERENCE_PRECISION_HINT").to_string())


DEFAULT_PRECISION = ", default: "  # between the engine and its precision in a lower-precision label


def precision_of(label: str) -> str:
    """The precision a lower-precision label (``openvino_default``'s, "OpenVINO, default: bf16") names."""
    return label.rpartition(DEFAULT_PRECISION)[2]


def openvino_default(model: torch.nn.Module, x: torch.Tensor, exported: bytes | None = None
                     ) -> tuple[str, Callable[[], object], float] | None:
    """OpenVINO at its default precision on this CPU, labelled with it ("OpenVINO, default: bf16"), as
    (label, runner, relative error against eager), or None where that default is float32 (then it is
    ``OPENVINO``) or OpenVINO cannot run the model. Not a float32 engine: it is held to no tolerance, and
    its error is reported beside its time. ``exported``: the model's ONNX export (``Peers.exported``),
    made again here without it."""
    try:
        run, _, precision = onnx_engine_runner(OPENVINO, model, x, exported, precision=None)
    except PeerUnavailable:
        return None
    if precision == "f32":
        return None
    with torch.inference_mode():
        expected = model(x).numpy()
    return f"{OPENVINO}{DEFAULT_PRECISION}{precision}", run, relative_error(np.asarray(run()), expected)


def onnx_export(model: torch.nn.Module, x: torch.Tensor) -> bytes:
    """``model`` exported to ONNX (Day 1's road), serialized for ONNX Runtime; in the suite
    (``cache.for_tests``) once per weights and input shape, then read back."""

    def export() -> bytes:
        return torch.onnx.export(model, (x,), dynamo=True, verbose=False).model_proto.SerializeToString()

    folder = kept_for_tests("onnx", model, (tuple(x.shape), x.dtype), Path(__file__),
                            lambda out: (out / "model.onnx").write_bytes(export()))
    return export() if folder is None else (folder / "model.onnx").read_bytes()


def default_peers() -> tuple[str, ...]:
    """Every peer; in quick mode (CI) eager, ONNX Runtime and OpenVINO only.

    Each torch.compile costs tens of seconds per model on a small CPU, and a frozen compile is
    never served from Inductor's cache, so a notebook that runs in CI three times would pay it
    every time; the ONNX export costs seconds, made once for both engines that run it, and those
    two are the fastest of the five.
    """
    return pick(ENGINES, (EAGER, ORT, OPENVINO))


def peers(model: torch.nn.Module, x: torch.Tensor, with_onnx_runtime: bool = True,
          which: Sequence[str] | None = None) -> Peers:
    """Every peer of ``model`` on ``x``, each checked against eager; ONNX Runtime and OpenVINO are missing (with
    the reason) when the model does not export, or when ``with_onnx_runtime`` is False (a CPU class imitated on a
    larger one: neither has a switch that holds it to the smaller class's vectors, as PyTorch has).
    ``which`` (default ``default_peers()``) names the peers to build; eager always comes.
    Raises ``ParityError`` for a peer that runs but gives other numbers."""
    which = default_peers() if which is None else which
    unknown = set(which) - set(ENGINES)
    if unknown:
        raise ValueError(f"Unknown peers {sorted(unknown)}: choose from {list(ENGINES)}.")
    result = Peers({EAGER: torch_runner(model, x)})
    for label, freezing in ((COMPILED, False), (FROZEN, True)):
        if label in which:
            result.runners[label], result.compile_s[label] = compiled_runner(model, x, freezing)
    onnx_engines = [label for label in ONNX_ENGINES if label in which]
    if onnx_engines and not with_onnx_runtime:
        for label in onnx_engines:
            result.missing[label] = f"{label}: not measured on an imitated CPU: it cannot be held to that CPU's vectors"
    elif onnx_engines:
        _onnx_peers(model, x, onnx_engines, result)
    check_against_eager(result.runners)
    return result


def _onnx_peers(model: torch.nn.Module, x: torch.Tensor, labels: Sequence[str], result: Peers) -> None:
    """ONNX Runtime and OpenVINO (of ``labels``) into ``result``, from one ONNX export; what fails is missing."""
    start = time.perf_counter()
    try:
        exported = onnx_export(model, x)
    except Exception as err:  # the exporter's failure: both engines are absent, with the reason
        result.missing.update({label: why_missing(label, err) for label in labels})
        return
    export_s = time.perf_counter() - start
    result.exported = exported
    for label in labels:
        try:
            run, seconds, _ = onnx_engine_runner(label, model, x, exported)
        except PeerUnavailable as err:
            result.missing[label] = str(err)
        else:
            result.runners[label], result.compile_s[label] = run, export_s + seconds


def check_against_eager(runners: Mapping[str, Callable[[], object]], labels: Iterable[str] | None = None) -> None:
    """Raise ``ParityError`` for a runner (of ``labels``, default every one) whose output differs from the
    ``EAGER`` runner's by more than ``RTOL``: what every runner passes before it is timed."""
    expected = _first_output(runners[EAGER]())
    for label in runners if labels is None else labels:
        if label != EAGER:
            check_outputs(label, [_first_output(runners[label]())], [expected])


def check_outputs(label: str, got: Sequence, want: Sequence[np.ndarray], names: Sequence[str] | None = None) -> None:
    """Raise ``ParityError`` unless each of ``got`` has the shape of PyTorch eager's ``want`` and matches it
    within ``RTOL``; ``names`` (e.g. logits, keys, values) say which output differs where there are several."""
    for i, (g, w) in enumerate(zip(got, want)):
        g, name = np.asarray(g), names[i] if names else None
        if g.shape != w.shape:
            what = f"its {name} have" if name else "its output has"
            raise ParityError(f"{label}: {what} shape {g.shape}, PyTorch eager's {w.shape}.")
        error = relative_error(g, w)
        if not error <= RTOL:  # also catches NaN
            what = f"{label}: its {name} differ from PyTorch eager's" if name else f"{label} differs from PyTorch eager"
            raise ParityError(f"{what}: relative error {error:.2e} > {RTOL:.0e}.")


def _first_output(out) -> object:
    """A model's output as NumPy; of a model with several outputs (a transformer's logits and cache, as a
    tuple or a TVM array), the first, which is the one ONNX Runtime's runner returns."""
    if not hasattr(out, "numpy") and not isinstance(out, np.ndarray):
        out = out[0]
    return out.numpy() if hasattr(out, "numpy") else out


class Fastest(NamedTuple):
    """The labels of the fastest PyTorch and of the fastest engine; None where none was timed."""

    pytorch: str | None
    engine: str | None


def fastest(timings: Sequence[Timing] | Mapping[str, float]) -> Fastest:
    """The fastest PyTorch (eager, torch.compile, freezing) and engine (those, ONNX Runtime and OpenVINO, all
    at float32), by median.

    ``timings``: Timings, or backend -> median ms (a benchmark row's). Backends not timed are left out.
    """
    medians = timings if isinstance(timings, Mapping) else {t.label: t.median_ms for t in timings}

    def best(labels: Sequence[str]) -> str | None:
        return min((label for label in labels if label in medians), key=medians.__getitem__, default=None)

    return Fastest(best(PYTORCH), best(ENGINES))


def verdict(timings: Sequence[Timing], candidate: str = "TVM tuned") -> str:
    """"Is it actually faster?" in one sentence per peer: ``candidate`` against the fastest PyTorch and the
    fastest engine timed in the same run, each named, with a warning where a timing is noise."""
    by_label = {t.label: t for t in timings}
    if candidate not in by_label:
        raise ValueError(f"No timing labelled {candidate!r}; labels are {sorted(by_label)}.")
    best = fastest(timings)
    lines = []
    for kind, peer in (("the fastest PyTorch", best.pytorch), ("the fastest engine", best.engine)):
        if peer is None:
            continue
        lines.append(versus(timings, candidate, peer, called=f"{kind} measured here, {peer}"))
    missing = [label for label in ENGINES if label not in by_label]
    if missing:
        lines.append(f"(not measured in this run: {', '.join(missing)})")
    return "\n".join(lines)
