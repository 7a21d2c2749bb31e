"""Models in bfloat16: TVM's convolutions on ``vdpbf16ps`` (``bf16_model``) against OpenVINO's default (bf16 on a
CPU with AVX-512 BF16) and PyTorch's bf16, beside each engine's float32
(``python -m helpers.maintainers.benchmark bf16-model [models]``; issue 50).

Every engine timed in alternating blocks in one run, with the median relative error of its logits against
float32 eager on held-out inputs (random weights: no top-1 accuracy), and the precision each one computes in named.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence

import torch
import tvm

from .. import amx, bf16_model, databases, kernels, machine, models, peers, quantize, timing
from ..build import CompiledModel, check_parity
from .report import UNRELIABLE_MARK, load_average, print_and_keep, require_bf16

IMAGES = 32
MODELS = ("mobilenet_v2", "resnet50", "efficientnet_b0")  # those with a shipped bf16 database
EAGER_BF16, FROZEN_BF16, TVM_FP32, TVM_BF16 = "PyTorch eager bf16", "torch.compile (freezing) bf16", "TVM tuned", "TVM bf16 tuned"
TVM_BF16_VDP = "TVM bf16 tuned, AMX off (vdpbf16ps)"  # on a CPU with AMX: what the tiles buy, in the same run
PRECISION = {peers.EAGER: "f32", peers.FROZEN: "f32", peers.ORT: "f32", peers.OPENVINO: "f32", TVM_FP32: "f32",
             EAGER_BF16: "bf16", FROZEN_BF16: "bf16", TVM_BF16: "bf16 (convolutions without groups, classifier), f32 elsewhere",
             TVM_BF16_VDP: "bf16 (convolutions without groups, classifier), f32 elsewhere"}


class Bfloat16Weights(torch.nn.Module):
    """``model`` with its weights in bfloat16, taking and returning float32: PyTorch's bf16 on this CPU
    (oneDNN's bf16 convolutions)."""

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.inner = copy.deepcopy(model).to(torch.bfloat16).eval().requires_grad_(False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.inner(x.to(torch.bfloat16)).float()


def tuned_bf16_build(name: str, target: tvm.target.Target
                     ) -> tuple[torch.nn.Module, torch.Tensor, databases.Database, CompiledModel]:
    """The float model ``name``, the input every bf16 measurement uses, and its bf16 build (``bf16_model.import_bf16``,
    ``on_tiles`` where AMX schedules the convolutions: ResNet's BatchNorms folded, the residual streams in bf16)
    with the database ``databases.choose`` picks for ``target`` (none tuned if missing): (model, x, database, build)."""
    model, _ = quantize.float_model(name)
    x = models.example_input(seed=1)
    half = bf16_model.import_bf16(model, x, on_tiles=amx.has_amx(target))
    database = databases.choose(bf16_model.database_name(name), half, target, tune_if_missing=False)
    return model, x, database, database.compile(half, target)


def bf16_model_run(name: str, repeats: int = 30, images: int = IMAGES, target: tvm.target.Target | None = None) -> dict:
    """The comparison on the model ``name``, batch 1 (see the module's docstring)."""
    target = target or machine.cpu_target()
    model, x, bf16_db, tvm_bf16 = tuned_bf16_build(name, target)
    float_imported = models.import_to_relax(model, x)
    fp32_db = databases.choose(name, float_imported, target, tune_if_missing=False)
    tvm_fp32 = fp32_db.compile(float_imported, target)
    check_parity(tvm_fp32, model, x)
    eager_bf16 = Bfloat16Weights(model)
    frozen_bf16 = peers.FrozenCompiled(eager_bf16)
    found = peers.peers(model, x, which=(peers.FROZEN, peers.ORT, peers.OPENVINO))
    ov_default = peers.openvino_default(model, x, found.exported)
    lower = {EAGER_BF16: lambda i: eager_bf16(i).numpy(), FROZEN_BF16: lambda i: frozen_bf16(i).numpy(), TVM_BF16: tvm_bf16}
    runners = {**found.runners, TVM_FP32: timing.tvm_runner(tvm_fp32, x), EAGER_BF16: timing.torch_runner(eager_bf16, x),
               FROZEN_BF16: timing.torch_runner(frozen_bf16, x), TVM_BF16: timing.tvm_runner(tvm_bf16, x)}
    if amx.has_amx(target):
        _, _, _, tvm_vdp = tuned_bf16_build(name, amx.without_tiles(target))
        lower[TVM_BF16_VDP], runners[TVM_BF16_VDP] = tvm_vdp, timing.tvm_runner(tvm_vdp, x)
    precision = dict(PRECISION)
    if ov_default is not None:
        label, run, _ = ov_default
        runners[label] = run
        precision[label] = peers.precision_of(label)
        engine = peers.OnnxEngine(peers.OPENVINO, found.exported, precision=None)
        lower[label] = lambda i, engine=engine: engine.run([i.numpy()])[0]
    held_out = [models.example_input(seed=1000 + i) for i in range(images)]
    errors = quantize.logit_errors(model, lower, held_out)
    load = load_average()
    timings = timing.measure_engines(runners, warmup=3, repeats=repeats)
    return {"model": name, "batch": 1, "held_out_images": images, "errors": errors,
            "rows": quantize.tradeoff_rows(timings, None, baseline=peers.EAGER), "precision": precision,
            "databases": {"bf16": bf16_db.label(), "fp32": fp32_db.label()}, "missing": found.missing,
            "products": "AMX tiles with tdpbf16ps (amx.schedule_products)" if amx.has_amx(target) else "vdpbf16ps",
            "threads": {"TVM": kernels.threads(), "PyTorch": torch.get_num_threads()},
            "load_average": [load, load_average()]}


def format_bf16_models(result: dict, machine_summary: str) -> str:
    """Every model's comparison as Markdown, under the machine."""
    return "\n\n".join([f"Machine: {machine_summary}"] + [format_bf16_model(r) for r in result["models"]])


def format_bf16_model(result: dict) -> str:
    """One model's comparison as Markdown, the fastest engine per precision named."""
    lines = [f"### {result['model']}", "",
             "| engine | precision | median ms (IQR) | speedup over eager float32 | median error of the logits |",
             "| --- | --- | ---: | ---: | ---: |"]
    for r in result["rows"]:
        mark = UNRELIABLE_MARK if timing.unreliable({"median_ms": r["median_ms"], "iqr_ms": r["q3_ms"] - r["q1_ms"]}) else ""
        error = result["errors"].get(r["backend"])
        lines.append(f"| {r['backend']} | {result['precision'][r['backend']]} | {mark}{r['median_ms']:.2f} "
                     f"({r['q3_ms'] - r['q1_ms']:.2f}) | {r['speedup']:.2f}x | {'' if error is None else f'{error:.1e}'} |")
    by_ms = {r["backend"]: r["median_ms"] for r in result["rows"]}
    lower = [b for b in by_ms if "bf16" in result["precision"][b]]
    floats = [b for b in by_ms if b not in lower]
    fastest_float, fastest_lower = min(floats, key=by_ms.get), min(lower, key=by_ms.get)
    other = other_bf16(result)
    tvm = by_ms[TVM_BF16]
    lines += ["", f"Fastest float32 engine: {fastest_float} ({by_ms[fastest_float]:.2f} ms). Fastest bf16 engine: "
              f"{fastest_lower} ({by_ms[fastest_lower]:.2f} ms). TVM bf16 tuned runs at {by_ms[other] / tvm:.2f}x the "
              f"fastest other bf16 engine ({other}) and {by_ms[TVM_FP32] / tvm:.2f}x TVM's float32 build.",
              "",
              f"Batch 1, one run, timed in alternating blocks; the relative error of the logits against float32 eager "
              f"on {result['held_out_images']} held-out inputs (random weights, seeded noise: no accuracy, which Day 12 "
              "measures on the digits network instead). TVM bf16: every convolution without groups and the classifier on "
              f"{result.get('products', 'vdpbf16ps')}: bf16 weights and inputs, float32 sums; the depthwise ones reading bf16 inputs and computing in "
              "float32, channels last, the activations stored as bf16 between kernels where a convolution reads them, "
              "everything else float32 (bf16_model.convs_to_bf16). PyTorch bf16: the model's weights in bfloat16, eager and compiled by "
              "Inductor with freezing. OpenVINO's default: the plugin's own choice on this CPU. "
              + (f"{TVM_BF16_VDP}: the same build with its convolutions on vdpbf16ps (the tuned schedules), for what the "
                 "tiles buy. " if TVM_BF16_VDP in by_ms else "")
              + f"{UNRELIABLE_MARK.strip()} marks a timing whose spread is over a quarter of its median: noise, not a result.",
              f"Databases: bf16 {result['databases']['bf16']}; fp32 {result['databases']['fp32']}."]
    for label, why in result.get("missing", {}).items():
        lines.append(f"{label}: not measured ({why}).")
    return "\n".join(lines)


def other_bf16(result: dict) -> str:
    """The fastest engine in bf16 that is not TVM's, in one model's comparison: what TVM's bf16 build is held against
    (here and in the results index, ``helpers.instructor.results_index``)."""
    by_ms = {r["backend"]: r["median_ms"] for r in result["rows"]}
    return min((b for b in by_ms if "bf16" in result["precision"][b] and not b.startswith(TVM_BF16)), key=by_ms.get)


def run_bf16_model(names: Sequence[str] = MODELS, repeats: int = 30, save: bool = True) -> str:
    """The comparison for each model, printed and kept in results/bf16-model-<cpu>-<cores>cores.{json,md}."""
    target = machine.cpu_target()
    require_bf16(target)
    result = {"models": [bf16_model_run(name, repeats, target=target) for name in names]}
    return print_and_keep("bf16-model", "Models in bf16 against the engines' bf16 and float32", result, format_bf16_models, save)
