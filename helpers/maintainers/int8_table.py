"""Day 12's comparison for the results: int8 MobileNetV2 in TVM against PyTorch's own int8 (``make benchmark``)."""

from __future__ import annotations

import torch
import tvm

from .. import accuracy, amx, databases, digits, int8, kernels, machine, models, quantize, timing
from ..build import check_parity
from .report import load_average, print_and_keep


INT8_IMAGES = 32
TVM_INT8 = "TVM int8 tuned"
TVM_FP32 = "TVM fp32 tuned"
TVM_INT8_NO_TILES = "TVM int8 tuned, AMX off (vpdpbusd)"


def int8_run(repeats: int = 30, images: int = INT8_IMAGES, target: tvm.target.Target | None = None) -> dict:
    """Day 12's comparison on MobileNetV2, batch 1: PyTorch fp32 and int8, TVM fp32 and int8 tuned, timed
    in alternating blocks in one run, with the median error of each int8 build's logits on held-out inputs
    (random weights, seeded noise: no accuracy) and each build's top-1 accuracy on real labelled images
    (``digits_accuracy``). ``target``: this CPU's, or another class's imitated here (``_target_for``)."""
    target = target or machine.cpu_target()
    float_model, quantized, _ = quantize.quantized_model(target=target)
    x = models.example_input(seed=1)
    int8_db = databases.choose(quantize.database_model(target), quantized, target, tune_if_missing=False)
    tvm_int8 = {TVM_INT8: int8_db.compile(quantized, target)}
    if amx.has_amx(target, amx.INT8):  # the same build with its 1x1 convolutions on vpdpbusd: what the tiles buy
        no_tiles = amx.without_tiles(target)  # (another target: this CPU's database is then a transferred one)
        no_tiles_db = databases.choose(quantize.database_model(no_tiles), quantized, no_tiles, tune_if_missing=False)
        tvm_int8[TVM_INT8_NO_TILES] = no_tiles_db.compile(quantized, no_tiles)
    float_imported = models.import_to_relax(float_model, x)
    fp32_db = databases.choose("mobilenet_v2", float_imported, target, tune_if_missing=False)
    tvm_fp32 = fp32_db.compile(float_imported, target)
    check_parity(tvm_fp32, float_model, x)
    calibration = quantize.calibration_inputs()
    torch_int8 = quantize.torch_int8(float_model, calibration)
    onnx_engines, onnx_missing = quantize.onnx_int8_engines(quantize.onnx_int8(float_model, calibration))
    held_out = [models.example_input(seed=1000 + i) for i in range(images)]
    errors = quantize.logit_errors(float_model, {"PyTorch int8": lambda i: torch_int8(i).numpy(), **onnx_engines,
                                                 **tvm_int8}, held_out)
    on_digits = digits_accuracy(target)
    load = load_average()
    timings = timing.measure_engines({"PyTorch fp32": timing.torch_runner(float_model, x),
                                      "PyTorch int8": timing.torch_runner(torch_int8, x),
                                      **{label: (lambda run=run: run(x)) for label, run in onnx_engines.items()},
                                      TVM_FP32: timing.tvm_runner(tvm_fp32, x),
                                      **{label: timing.tvm_runner(built, x) for label, built in tvm_int8.items()}},
                                     warmup=3, repeats=repeats)
    by_build = {r["build"]: r for r in on_digits}
    same = {TVM_FP32: "PyTorch fp32", **{label: "TVM int8" for label in tvm_int8}}  # tuning does not change the sums
    top1 = {t.label: by_build[same.get(t.label, t.label)] for t in timings}
    return {"model": "mobilenet_v2", "batch": 1, "held_out_images": images,
            "errors": errors, "digits": on_digits,
            "rows": quantize.tradeoff_rows(timings, {k: r["accuracy"] for k, r in top1.items()}, baseline="PyTorch fp32",
                                           intervals={k: (r["low"], r["high"]) for k, r in top1.items()}),
            "databases": {"int8": int8_db.label(), "fp32": fp32_db.label()}, "missing": onnx_missing,
            "int8_instruction": int8.int8_instruction(target), "activation_max": int8.activation_max(target),
            "tiles": amx.has_amx(target, amx.INT8), "uint8_depthwise": quantize.uint8_depthwise(target),
            "threads": {"TVM": kernels.threads(), "PyTorch": torch.get_num_threads()},
            "load_average": [load, load_average()]}


def digits_accuracy(target: tvm.target.Target) -> list[dict]:
    """Day 12's accuracy table: float32 and every engine's int8 of the MobileNetV2-shaped network trained on
    scikit-learn's digits, on its held-out test images (``accuracy.table``'s rows)."""
    model = digits.trained_model()
    images, labels = digits.test_set()
    builds, _ = quantize.int8_builds(model, digits.calibration_inputs(), images[:digits.BATCH], target)
    predicted = {name: digits.predictions(run, images) for name, run in builds.items()}
    return accuracy.table(predicted, labels.numpy(), reference="PyTorch fp32").to_dict("records")


def format_int8(result: dict, machine_summary: str) -> str:
    """The int8 comparison as Markdown."""
    lines = [f"Machine: {machine_summary}", "",
             "| build | median ms (IQR) | speedup over PyTorch fp32 | top-1 accuracy on the digits (95 % interval) |",
             "| --- | ---: | ---: | ---: |"]
    for r in result["rows"]:
        lines.append(f"| {r['backend']} | {r['median_ms']:.2f} ({r['q3_ms'] - r['q1_ms']:.2f}) | {r['speedup']:.2f}x "
                     f"| {100 * r['top1']:.1f} % ({100 * r['top1_low']:.1f}-{100 * r['top1_high']:.1f}) |")
    errors = "; ".join(f"{k}: {v:.3f}" for k, v in result["errors"].items())
    tested = result["digits"][0]["images"]
    differ = "; ".join(f"{r['build']}: {r['differ_from_reference']}" for r in result["digits"][1:])
    lines += ["", f"MobileNetV2, batch 1, one run, timed in alternating blocks. PyTorch int8: PT2E (torchao's "
              "X86InductorQuantizer) on the float model, compiled with Inductor's freezing (quantize.torch_int8). "
              "ONNX Runtime int8 and OpenVINO int8: the model's ONNX export quantized by ONNX Runtime's quantize_static "
              "(QDQ, per-channel int8 weights, uint8 activations from min/max ranges, the same calibration images; "
              "quantize.onnx_int8), run by each engine with float32 for the rest. TVM's int8 quantizes the pointwise "
              "convolutions" + (" and reads the depthwise ones' inputs as uint8 (they compute in float32)"
                                if result.get("uint8_depthwise") else " only") +
              "; the others every convolution and the classifier. "
              f"MobileNetV2 has random weights here, so its int8 builds are judged by the median relative error of "
              f"their logits on {result['held_out_images']} held-out inputs (seeded noise): {errors}. Accuracy is "
              f"measured on real labelled images instead: the MobileNetV2-shaped network trained on scikit-learn's "
              f"handwritten digits (helpers.digits), built by the same steps, on its {tested} held-out test images "
              f"(TVM's int8 build untuned there: tuning does not change the integer sums; TVM fp32 computes the "
              f"float model). Answers that differ from float32's on those images: {differ}.",
              f"Databases: int8 {result['databases']['int8']}; fp32 {result['databases']['fp32']}."]
    for label, why in result.get("missing", {}).items():
        lines.append(f"{label}: not measured ({why}).")
    if "int8_instruction" in result:
        tiles = " (the 1x1 convolutions on AMX tiles, tdpbusd)" if result.get("tiles") else ""
        lines.append(f"TVM's int8 kernels: {result['int8_instruction']} instructions{tiles}, activations quantized to "
                     f"0..{result['activation_max']}.")
    return "\n".join(lines)


def run_int8(repeats: int = 30, save: bool = True, mcpu: str | None = None) -> str:
    """Day 12's int8 comparison, printed and kept in results/int8-<cpu>-<cores>cores.{json,md}."""
    target = machine.target_for(mcpu)
    return print_and_keep("int8", "int8 on MobileNetV2", int8_run(repeats, target=target), format_int8, save, target)
