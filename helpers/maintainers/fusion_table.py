"""Fusion across layers (``python -m helpers.maintainers.benchmark fusion``): every MobileNetV2 inverted residual
block with an expansion as three TVM kernels and as one fused kernel (``helpers.block_fusion``), beside ONNX
Runtime and OpenVINO (float32) running the same block, in one run per block (issue 50).

For each block the fused kernel's tiling is picked first (``block_fusion.time_tilings``: every choice against
the three kernels, one run), then the four are timed together (``block_fusion.compare``). The peers run the
block's ONNX export on PyTorch's NCHW tensor, so their time includes a call's overhead and any layout change
at the block's edges; TVM's kernels read and write channels last. So each engine is also read inside the whole
model (``layer_compare``: ONNX Runtime's profiler, OpenVINO's counters): the block's three convolutions, their
epilogues counted in, as the engine ran them there, where no call or layout change is paid per block.

Then each whole model, MobileNetV2 and EfficientNet-B0 (whose blocks add a squeeze-and-excitation): built from
the course's own kernels, every block fused (``fused_mobilenet``, each block's cut measured here and by the rule)
and the same kernels unfused, beside tuned TVM (its database), PyTorch eager and with freezing, ONNX Runtime and
OpenVINO, each checked against eager, in one run per model; and OpenVINO at its default precision where that is
bf16, the precision named and its error printed.
"""

from __future__ import annotations

import torch

from .. import block_fusion, databases, fused_mobilenet, layer_compare, machine, models, peers, timing
from .report import UNRELIABLE_MARK, add_openvino_default, load_average, print_and_keep, records
from ..timing import unreliable

ENGINES = (block_fusion.SEPARATE, block_fusion.FUSED, peers.ORT, peers.OPENVINO)
IN_MODEL = " in the model"  # after an engine's name: its time for the block read from its profile of the whole model


def _same(engine_shape: tuple[int, ...], ours: tuple[int, ...]) -> bool:
    """An engine's convolution is ours: the same map sizes, and the same channels or as many padded to a whole
    block of 8 or 16 (ONNX Runtime runs 24 channels as 32)."""
    return all(e == o if k % 3 else o <= e < o + 16 for k, (e, o) in enumerate(zip(engine_shape, ours)))


def in_model_ms(layers: layer_compare.EngineLayers,
                blocks: list[tuple[str, block_fusion.BlockShape]]) -> dict[str, float]:
    """Each block's milliseconds in an engine's profile of the whole MobileNetV2: its three convolutions (with
    their epilogues), found in order by their shapes (``_same``); a block not found is left out."""
    times, calls = {}, list(layers.convs)
    for name, shape in blocks:
        want = [(shape.c_in, shape.size, shape.size, shape.hidden, shape.size, shape.size),
                (shape.hidden, shape.size, shape.size, shape.hidden, shape.out_size, shape.out_size),
                (shape.hidden, shape.out_size, shape.out_size, shape.c_out, shape.out_size, shape.out_size)]
        for start in range(len(calls) - 2):
            if all(_same(c.shape, w) for c, w in zip(calls[start:start + 3], want)):
                times[name] = sum(c.ms for c in calls[start:start + 3])
                calls = calls[start + 3:]
                break
    return times


def fusion_run(repeats: int = 20) -> dict:
    """Each block's timings and its chosen cut, the engines' times for it in their whole-model profiles, and the
    whole model's comparison, as records."""
    model = models.load_model("mobilenet_v2")
    blocks = [(name, block, shape) for name, block, shape in block_fusion.model_blocks(model) if shape.expands]
    rows = []
    load_before = load_average()
    whole = models.example_input(1)
    in_model = {}
    for engine, read in ((peers.ORT, layer_compare.onnx_runtime_layers), (peers.OPENVINO, layer_compare.openvino_layers)):
        try:
            in_model[engine + IN_MODEL] = in_model_ms(read(model, whole, repeats=repeats),
                                                      [(name, shape) for name, _, shape in blocks])
        except Exception as err:  # an engine missing or failing: its column stays empty, with the reason
            print(peers.why_missing(engine, err))
    for seed, (name, block, shape) in enumerate(blocks):
        x = torch.rand(1, shape.c_in, shape.size, shape.size, generator=torch.Generator().manual_seed(seed)) * 3
        best = block_fusion.best_tiling(block_fusion.time_tilings(block, x, repeats=max(5, repeats // 2)))
        timings = block_fusion.compare(block, x, best, repeats=repeats)
        rows.append({"block": name, "shape": str(shape), "expanded_mb": round(shape.expanded_mb, 2),
                     "tiling": str(best), "timings": records(timings),
                     "in_model_ms": {engine: ms[name] for engine, ms in in_model.items() if name in ms}})
        print(f"{name} {shape}: {best}, "
              + ", ".join(f"{t.label} {t.median_ms:.3f} ms" for t in timings), flush=True)
    return {"model": "mobilenet_v2", "blocks": rows,
            "whole_models": {name: whole_model(name, repeats) for name in WHOLE_MODELS},
            "load_before": load_before, "load_after": load_average()}


FUSED_MEASURED = "TVM, every block fused (cuts measured here)"
FUSED_RULE = "TVM, every block fused (cuts by the rule)"
TUNED = "TVM tuned"
UNFUSED = "TVM, the same kernels unfused (three per block)"
WHOLE_MODELS = {"mobilenet_v2": "MobileNetV2", "efficientnet_b0": "EfficientNet-B0"}


def whole_model(name: str, repeats: int) -> dict:
    """One model end to end: the fused builds, tuned TVM and the peers, checked against eager, timed in one run; and
    OpenVINO at its default precision where that is not float32 (bf16 on a CPU with AVX-512 BF16), its error against
    eager kept beside it."""
    model = models.load_model(name)
    x = models.example_input(1)
    target = machine.cpu_target()
    found = peers.peers(model, x, which=(peers.EAGER, peers.FROZEN, peers.ORT, peers.OPENVINO))
    runners = dict(found.runners)
    tilings = {}
    for label, choose in ((FUSED_MEASURED, "measure"), (FUSED_RULE, "rule"), (UNFUSED, "separate")):
        compiled, cuts = fused_mobilenet.compile_fused(model, x, choose=choose, target=target)
        runners[label] = timing.tvm_runner(compiled, x)
        if choose != "separate":
            tilings[label] = cuts
    imported = models.import_to_relax(model, x)
    database = databases.choose(name, imported, target, tune_if_missing=False)  # (shipped: always one)
    runners[TUNED] = timing.tvm_runner(database.compile(imported, target), x)
    peers.check_against_eager(runners)
    lower_precision = add_openvino_default(runners, model, x, found.exported)  # bf16 where the CPU has it
    timings = timing.measure_engines(runners, repeats=repeats)
    return {"timings": records(timings), "missing": found.missing,
            "lower_precision": lower_precision,
            "tilings": {label: {block: str(t) for block, t in cut.items()} for label, cut in tilings.items()},
            "database": database.label(), "verdict": peers.verdict(timings, candidate=FUSED_MEASURED)}


def _cell(record: dict | None) -> str:
    if record is None:
        return "-"
    mark = UNRELIABLE_MARK if unreliable(record) else ""
    return f"{mark}{record['median_ms'] * 1000:.0f} ({record['iqr_ms'] * 1000:.0f})"


IN_MODEL_ENGINES = tuple(engine + IN_MODEL for engine in (peers.ORT, peers.OPENVINO))


def _times(row: dict) -> dict[str, float]:
    """A block's milliseconds by column: the four timed on the block, and the engines' in the whole model."""
    return {**{e: r["median_ms"] for e, r in row["timings"].items()}, **row.get("in_model_ms", {})}


def format_fusion(result: dict, machine_summary: str) -> str:
    """The blocks as a Markdown table: microseconds (median, IQR where timed on the block), the fused kernel
    against the three kernels and against the fastest engine, on the block alone and inside the whole model,
    and the totals over all blocks."""
    columns = (*ENGINES, *IN_MODEL_ENGINES)
    head = ["block", "shape", "expanded (MB)", "fused tiling", *(f"{c} (us)" for c in columns),
            "fused / three kernels", "fused / fastest engine, block alone", "fused / fastest engine in the model"]
    lines = [f"Machine: {machine_summary}. MobileNetV2's inverted residual blocks with an expansion, batch 1, "
             "float32; medians in microseconds (IQR); ratios > 1: the fused kernel is faster. \"in the model\": "
             "the block's three convolutions in the engine's own profile of the whole model.", "",
             "| " + " | ".join(head) + " |", "|" + " --- |" * 2 + " ---: |" * (len(head) - 2)]

    def ratios(times: dict[str, float]) -> str:
        fused = times[block_fusion.FUSED]
        cells = [f"{times[block_fusion.SEPARATE] / fused:.2f}x"]
        for engines in ((peers.ORT, peers.OPENVINO), IN_MODEL_ENGINES):
            present = [times[e] for e in engines if e in times]
            cells.append(f"{min(present) / fused:.2f}x" if present else "-")
        return " | ".join(cells)

    for row in result["blocks"]:
        times, timed = _times(row), row["timings"]
        cells = [_cell(timed[c]) if c in timed else f"{times[c] * 1000:.0f}" if c in times else "-" for c in columns]
        lines.append(f"| {row['block']} | {row['shape']} | {row['expanded_mb']} | {row['tiling']} | "
                     + " | ".join(cells) + f" | {ratios(times)} |")
    # Totals over all blocks, for each column with a time for every block.
    every = [_times(row) for row in result["blocks"]]
    totals = {c: sum(t[c] for t in every) for c in columns if all(c in t for t in every)}
    lines.append("| all | | | | " + " | ".join(f"{totals[c] * 1000:.0f}" if c in totals else "-" for c in columns)
                 + f" | {ratios(totals)} |")
    for name, whole in result.get("whole_models", {}).items():
        lines += ["", *format_whole_model(whole, WHOLE_MODELS[name])]
    lines += ["", f"Load average: {result['load_before']} before, {result['load_after']} after."]
    return "\n".join(lines)


def format_whole_model(whole: dict, model: str) -> list[str]:
    """A whole model's table: medians in ms (IQR), each against the fused build with measured cuts."""
    t = whole["timings"]
    fused = t[FUSED_MEASURED]["median_ms"]
    lines = [f"The whole model ({model}, batch 1, float32 unless a row names its precision; medians in ms, IQR; "
             "\"fused / it\" > 1: the fused build is faster):", "", "| build | median ms (IQR) | fused / it |", "| --- | ---: | ---: |"]
    for label, record in sorted(t.items(), key=lambda item: item[1]["median_ms"]):
        mark = UNRELIABLE_MARK if unreliable(record) else ""
        lines.append(f"| {label} | {mark}{record['median_ms']:.2f} ({record['iqr_ms']:.2f}) | "
                     f"{record['median_ms'] / fused:.2f}x |")
    lines += ["", whole["verdict"].replace("\n", "; ") + "."]
    for label, error in whole.get("lower_precision", {}).items():
        ratio = t[label]["median_ms"] / fused
        lines.append(f"Against {label} (a lower precision; its logits' relative error against float32 eager {error:.1e}): "
                     f"the fused float32 build is {max(ratio, 1 / ratio):.2f}x {'faster' if ratio >= 1 else 'slower'}.")
    lines += [f"Tuned TVM's database: {whole['database']}.",
              "Cuts measured here: " + ", ".join(f"{block} {cut}" for block, cut in whole["tilings"][FUSED_MEASURED].items())
              + "."]
    lines += [f"Missing: {why}" for why in whole.get("missing", {}).values()]
    return lines


def run_fusion(repeats: int = 20, save: bool = True) -> str:
    return print_and_keep("fusion", "MobileNetV2's blocks: three kernels, one fused kernel, and the engines; "
                          "MobileNetV2 and EfficientNet-B0 fused",
                          fusion_run(repeats), format_fusion, save)
