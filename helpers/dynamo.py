"""TVM as a ``torch.compile`` backend: the successor of the old ``torch_tvm``.

``torch.compile(model, backend=TVMBackend())`` lets Dynamo capture the model's
Python into FX graphs (one per stretch of code between graph breaks) and hands
each graph to the backend, which compiles it with TVM and returns a function
that Dynamo calls in its place.

TVM ships its own backend, ``tvm.relax.frontend.torch.relax_dynamo()``. With
torch 2.15 it fails on MobileNetV2 (Dynamo now inlines ``BatchNorm2d`` into a
``batch_norm`` call its FX importer does not know), hard-codes its CPU target
and cannot use a tuning database. This backend instead:

- re-exports each captured graph with ``torch.export`` and imports it with the
  same ``helpers.models.to_relax`` path as Days 1-3, so any model the explicit
  path imports works here too;
- treats the model's weights (Dynamo passes them as graph inputs) as frozen
  parameters, so the compiled kernels are exactly those of the explicit path
  and a tuning database tuned on them applies (``database=...``);
- compiles for this machine's real CPU (``machine.cpu_target()``);
- records what it compiled (``backend.graphs``) so a notebook can show it.

Inference only: the weights are read once, when a graph is compiled.

Introduced on Day 10.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

import torch
import tvm

from . import build, machine, models, tuning
from .errors import CourseError


class BackendInputError(CourseError, ValueError):
    """A captured graph this backend cannot compile as it is (for instance dynamic shapes)."""


@dataclass
class CapturedGraph:
    """One graph Dynamo captured and TVM compiled: what it held and what it cost."""

    index: int
    ops: list[str]  # the FX calls Dynamo captured, in order
    input_shapes: list[tuple[int, ...]]  # the inputs the graph takes on each call
    num_weights: int  # tensors frozen into the compiled graph
    compile_s: float  # export + import + tvm.compile
    tuned: bool
    module: tvm.IRModule = field(repr=False)  # the graph as imported into Relax, before compilation

    @property
    def num_ops(self) -> int:
        return len(self.ops)


def _op_name(node: torch.fx.Node) -> str:
    target = node.target
    if node.op == "call_method":
        return f".{target}"
    return getattr(target, "__name__", str(target))


def _captured_ops(gm: torch.fx.GraphModule) -> list[str]:
    return [_op_name(n) for n in gm.graph.nodes if n.op in ("call_function", "call_method", "call_module")]


def _placeholders(gm: torch.fx.GraphModule) -> list[torch.fx.Node]:
    return [n for n in gm.graph.nodes if n.op == "placeholder"]


def _is_weight(node: torch.fx.Node, value: object) -> bool:
    """Dynamo lifts parameters and buffers into graph inputs; recognise them by type and name."""
    return isinstance(value, torch.nn.Parameter) or "_buffers_" in node.name or "_parameters_" in node.name


def _check_static(gm: torch.fx.GraphModule, example_inputs: Sequence[object]) -> None:
    for node, value in zip(_placeholders(gm), example_inputs):
        fake = node.meta.get("example_value")
        shape = getattr(fake, "shape", ())
        if not isinstance(value, torch.Tensor) or any(isinstance(s, torch.SymInt) for s in shape):
            raise BackendInputError(
                f"Dynamo captured a graph with a dynamic shape (input {node.name!r}). This backend "
                "compiles static shapes only: call torch.compile(model, backend=..., dynamic=False); "
                "each new input shape is then compiled once."
            )


class _FrozenGraph(torch.nn.Module):
    """The captured graph with its weights held as buffers, taking only the real inputs."""

    def __init__(self, gm: torch.fx.GraphModule, example_inputs: Sequence[torch.Tensor], weight_at: list[bool]):
        super().__init__()
        self.gm = gm
        self.weight_at = weight_at
        for i, (value, is_weight) in enumerate(zip(example_inputs, weight_at)):
            # As in the model: parameters stay parameters (Relax weights), buffers stay buffers
            # (constants), so the kernels are those of the explicit export path.
            if isinstance(value, torch.nn.Parameter):
                self.register_parameter(f"w{i}", torch.nn.Parameter(value.detach(), requires_grad=False))
            elif is_weight:
                self.register_buffer(f"w{i}", value.detach())

    def forward(self, *inputs: torch.Tensor):
        given = iter(inputs)
        args = [getattr(self, f"w{i}") if w else next(given) for i, w in enumerate(self.weight_at)]
        return self.gm(*args)


def _to_torch(value) -> tuple[torch.Tensor, ...]:
    if isinstance(value, torch.Tensor):
        return (value,)
    if isinstance(value, tvm.runtime.Tensor):
        return (torch.from_dlpack(value),)
    return tuple(t for item in value for t in _to_torch(item))


@dataclass
class TVMBackend:
    """A ``torch.compile`` backend that compiles every captured graph with TVM.

    ``database``: a MetaSchedule tuning database (Day 8) to build with; kernels
    it does not hold keep TVM's untuned code. ``transfer`` lets it use records
    tuned for another CPU (``databases.Database.transferred`` says when that is
    needed). ``target`` defaults to this CPU.
    """

    target: tvm.target.Target | None = None
    database: str | Path | None = None
    transfer: bool = False
    graphs: list[CapturedGraph] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.target = self.target or machine.cpu_target()
        build.device_for(self.target)  # no GPU for a CUDA target: fail now, not inside Dynamo
        if self.database is not None:
            tuning.load_database(Path(self.database))  # a clear error for a missing database

    def __call__(self, gm: torch.fx.GraphModule, example_inputs: Sequence[torch.Tensor]) -> Callable:
        start = time.perf_counter()
        _check_static(gm, example_inputs)
        weight_at = [_is_weight(n, v) for n, v in zip(_placeholders(gm), example_inputs)]
        inputs = tuple(v for v, w in zip(example_inputs, weight_at) if not w)
        frozen = _FrozenGraph(gm, example_inputs, weight_at).eval()
        with torch.no_grad():
            program = torch.export.export(frozen, inputs)
        mod, params = models.to_relax(program)
        imported = models.ImportedModel(
            mod=mod,
            params=params,
            input_shape=tuple(inputs[0].shape) if inputs else (),
            input_dtype=models.dtype_name(inputs[0]) if inputs else "float32",
        )
        if self.database is not None:
            compiled = tuning.compile_tuned(imported, self.target, self.database, transfer=self.transfer)
        else:
            compiled = build.compile_model(imported, self.target)
        self.graphs.append(
            CapturedGraph(
                index=len(self.graphs),
                ops=_captured_ops(gm),
                input_shapes=[tuple(t.shape) for t in inputs],
                num_weights=len(params),
                compile_s=time.perf_counter() - start,
                tuned=self.database is not None,
                module=mod,
            )
        )
        main, weights = compiled.vm["main"], compiled.params

        def run(*args: torch.Tensor) -> tuple[torch.Tensor, ...]:
            given = [a for a, w in zip(args, weight_at) if not w]
            # torch tensors go in as they are (DLPack, no copy on the CPU), and come out as torch.
            return _to_torch(main(*[a.detach().contiguous() for a in given], *weights))

        return run

    @property
    def compile_s(self) -> float:
        """Seconds spent compiling all graphs so far."""
        return sum(g.compile_s for g in self.graphs)

    def summary(self) -> list[dict]:
        """One plain record per compiled graph, to print or tabulate."""
        return [
            {
                "graph": g.index,
                "ops captured": g.num_ops,
                "inputs": g.input_shapes,
                "weights": g.num_weights,
                "compile s": round(g.compile_s, 2),
                "tuned": g.tuned,
            }
            for g in self.graphs
        ]


def compile_with_tvm(
    model: torch.nn.Module,
    target: tvm.target.Target | None = None,
    database: str | Path | None = None,
    transfer: bool = False,
) -> tuple[Callable, TVMBackend]:
    """``torch.compile`` the model with a fresh TVM backend: (compiled model, backend).

    Dynamo's caches are reset first: a model compiled again with another
    backend would otherwise reuse, or after 8 recompilations silently skip,
    what was compiled before. Compilation happens on the first call.
    """
    torch._dynamo.reset()
    backend = TVMBackend(target=target, database=database, transfer=transfer)
    return torch.compile(model.eval(), backend=backend, dynamic=False), backend
