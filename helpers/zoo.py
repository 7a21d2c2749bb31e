"""The capstone (Day 11): one model through the whole pipeline, and what its operators are.

``run_model`` imports, fuses, builds with the tuning database, checks parity,
times eager PyTorch against tuned TVM in one interleaved run and profiles the
tuned build. ``operator_mix`` reads from the Relax module what explains the
results: how the convolutions split into depthwise, pointwise and regular ones
(by count and by FLOPs), and how many sigmoids (squeeze-excite gates and SiLU)
the model has. ``make capstone`` (``helpers.maintainers.capstone``) runs it for the three models
and keeps the table in ``results/``.

Introduced on Day 11.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import tvm
import tvm_ffi
from tvm import relax

from . import build, cache, config, databases, ir, layer_compare, machine, models, peers, profiling, timing
from .ir import conv_gflops  # Day 0 met it as zoo.conv_gflops
from .peers import EAGER, TUNED
from .plotting import plot_layer_losses

# The three models the course compares end to end (Day 11's zoo, and the benchmark table's rows).
ZOO = ("mobilenet_v2", "resnet50", "efficientnet_b0")


def equal_budget(target: tvm.target.Target, names: Sequence[str] = ZOO) -> float | None:
    """The largest budget (trials per task) at which every model has a database of the kind its best
    one is (``databases.kind``: this CPU's vector width, Day 7's channel blocks), or None when none is shared.

    Models compare fairly at equal budgets, or the comparison measures the budgets; a budget that only
    a lesser kind of database meets (NCHW, or another vector width) would measure the kinds instead.
    """
    shared: set[float] | None = None
    for name in names:
        found = databases.candidates(name, target)
        if not found:
            return None
        best = databases.kind(databases.rank(found, target)[0], target)
        budgets = {d.trials_per_task for d in found if d.trials_per_task and databases.kind(d, target) == best}
        shared = budgets if shared is None else shared & budgets
    return max(shared) if shared else None


def _conv_calls(mod: tvm.IRModule) -> list[relax.Call]:
    return [c for c in ir._calls(mod, "main") if c.op.name == "relax.nn.conv2d"]


def conv_kind(call: relax.Call) -> str:
    """``depthwise`` (one filter per channel), ``squeeze-excite`` (a 1x1 conv on a pooled
    1x1 map: the small fully connected layers of an SE gate), ``pointwise`` (1x1) or ``regular``."""
    _, in_per_group, kh, kw = (int(d) for d in call.args[1].ty.shape)
    _, _, oh, ow = (int(d) for d in call.ty.shape)
    if int(call.attrs.groups) > 1 and in_per_group == 1:
        return "depthwise"
    if (kh, kw) == (1, 1):
        return "squeeze-excite" if (oh, ow) == (1, 1) else "pointwise"
    return "regular"


def operator_mix(mod: tvm.IRModule) -> dict:
    """What a model is made of: conv kinds by count and FLOPs, sigmoids, operators, kernels after fusion.

    Counting the kernels after fusion runs the fusion passes (20 s for the three models on 2 cores),
    so the result is kept in the compile cache, keyed by the module, the target and the code that counts.
    """
    code = cache.file_digest(Path(__file__).parent / f for f in ("zoo.py", "build.py", "ir.py"))
    key = cache.key("operator_mix", str(machine.cpu_target()), tvm_ffi.structural_hash(mod), code)
    return cache.load_or_compute_json("operator-mix", key, lambda: _operator_mix(mod))


def _operator_mix(mod: tvm.IRModule) -> dict:
    convs = _conv_calls(mod)
    count = Counter(conv_kind(c) for c in convs)
    flops: Counter = Counter()
    for c in convs:
        flops[conv_kind(c)] += conv_gflops(c)
    total = sum(flops.values())
    ops = ir.op_histogram(mod)
    fused = build.fuse(mod, machine.cpu_target())
    return {
        "operators": sum(ops.values()),
        "kernels after fusion": ir.count_kernel_calls(fused),
        "conv2d": len(convs),
        "depthwise": count["depthwise"],
        "pointwise": count["pointwise"],
        "regular": count["regular"],
        "squeeze-excite": count["squeeze-excite"],
        "GFLOP (conv)": total,
        "depthwise % of conv FLOPs": 100 * flops["depthwise"] / total if total else 0.0,
        "sigmoid": ops.get("sigmoid", 0),  # SE gates and SiLU activations (x * sigmoid(x))
    }


@dataclass
class ZooResult:
    """Everything the capstone measured for one model."""

    name: str
    mix: dict
    database: databases.Database
    relative_error: float
    timings: list[timing.Timing]
    profile: profiling.Profile
    # Tuned TVM's convolutions against each peer's, layer by layer (``layer_compare.table``), by peer:
    # ONNX Runtime's and PyTorch with freezing's (the fastest PyTorch everywhere measured); a peer that
    # was not run has the reason in ``layers_missing`` instead (freezing is compiled in full mode only).
    layers: dict = field(default_factory=dict)
    layers_missing: dict = field(default_factory=dict)

    def row(self) -> dict:
        """One plain record: the model, its operator mix, the latencies, and tuned TVM against eager
        (``speedup``), the fastest PyTorch and the fastest engine of the run, each named."""
        by_label = {t.label: t.median_ms for t in self.timings}
        best = peers.fastest(self.timings)
        return {
            "model": self.name,
            **self.mix,
            **{f"{label} ms": round(ms, 2) for label, ms in by_label.items()},
            "eager ms": round(by_label[EAGER], 2),
            "speedup": round(by_label[EAGER] / by_label[TUNED], 2),
            "fastest PyTorch": best.pytorch,
            "vs fastest PyTorch": round(by_label[best.pytorch] / by_label[TUNED], 2),
            "fastest engine": best.engine,
            "vs fastest engine": round(by_label[best.engine] / by_label[TUNED], 2),
            "trials/task": self.database.trials_per_task,
            "database": self.database.label(),
        }


def run_model(name: str, batch: int = 1, repeats: int | None = None, budget: float | None = None) -> ZooResult:
    """Import, fuse, build tuned, check, time against the peers (``peers.default_peers()``) and profile one model.

    The tuning database comes from ``databases.choose``: the largest budget for
    this CPU, else one transferred from another CPU. ``budget`` (trials per task)
    asks for a database tuned with exactly that budget, to compare models fairly.
    Nothing is tuned here: a model with no database at all is an error.
    """
    target = machine.cpu_target()
    model, x, imported = models.load_imported(name, batch)
    mix = operator_mix(imported.mod)
    database = databases.choose(name, imported, target, batch, tune_if_missing=False, budget=budget)
    compiled = database.compile(imported, target)
    error = build.check_parity(compiled, model, x)
    repeats = repeats or config.pick(20, 5)
    found = peers.peers(model, x)
    runners = {**found.runners, TUNED: timing.tvm_runner(compiled, x)}
    timings = timing.measure_engines(runners, warmup=2, repeats=repeats)
    prof = profiling.profile(compiled, x, repeats=config.pick(10, 3))
    result = ZooResult(name, mix, database, error, timings, prof)
    for peer in (peers.ORT, peers.FROZEN):
        if peer not in found.runners:
            result.layers_missing[peer] = found.missing.get(peer, f"{peer} is compiled in full mode only "
                                                                   "(each compile takes tens of seconds)")
    result.layers = layer_compare.against_peers(compiled, model, x, found.runners, repeats=config.pick(10, 3))
    return result


def show_layer_losses(results: dict[str, ZooResult], peer: str, worst: int = 3):
    """Plot where tuned TVM loses to ``peer`` in each model of ``results``, convolution by convolution
    (``plotting.plot_layer_losses``), print each model's ``worst`` layers, and say which models have no
    such comparison, and why. Returns the figure, or None where no model has one."""
    tables = {name: r.layers.get(peer) for name, r in results.items()}
    for name, r in results.items():
        if tables[name] is None:
            print(f"{name}: no layer comparison with {peer}: {r.layers_missing.get(peer, 'not measured')}")
    if all(frame is None for frame in tables.values()):
        return None
    fig = plot_layer_losses(tables, title=f"Tuned TVM against {peer}, convolution by convolution")
    for name, frame in tables.items():
        if frame is not None:
            print(f"{name}: where tuned TVM loses most to {peer}")
            print(layer_compare.where_time_is_lost(frame, worst).round(3).to_string(index=False))
    return fig
