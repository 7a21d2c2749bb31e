"""Tuned TVM's convolutions against the other engines', layer by layer
(``python -m helpers.maintainers.benchmark layers [--bf16 | --int8]``): where a model's gap to each is."""

from __future__ import annotations

from .. import bf16_model, databases, layer_compare, machine, models, peers, quantize, timing
from ..build import check_parity
from ..peers import FROZEN, OPENVINO, ORT
from ..results import results_path_here, save_record
from .bf16_model_table import TVM_BF16, tuned_bf16_build
from .int8_table import TVM_INT8
from .report import require_bf16


def compare_layers(model_name: str, batch: int = 1, repeats: int = 10, mcpu: str | None = None,
                   save: bool = True) -> dict:
    """Tuned TVM's convolutions (the database ``databases.choose`` picks) against the fastest PyTorch's
    (freezing: oneDNN, BatchNorm folded) and, unless the CPU class is imitated, ONNX Runtime's and OpenVINO's
    at float32, layer by layer (``helpers.layer_compare``): the profile that says where a model's gap to each
    peer is. Prints where tuned TVM loses most and (``save``) keeps every table in
    results/layers-<model>-<cpu>-<cores>cores.json."""
    target = machine.target_for(mcpu)
    model, x, imported = models.load_imported(model_name, batch)
    database = databases.choose(model_name, imported, target, batch, tune_if_missing=False)
    compiled = database.compile(imported, target)
    check_parity(compiled, model, x)
    found = peers.peers(model, x, with_onnx_runtime=not machine.is_imitated(target), which=[FROZEN, ORT, OPENVINO])
    tables = layer_compare.against_peers(compiled, model, x, found.runners, repeats, found.exported)
    print(f"{model_name}, batch {batch}, TVM built for {target.attrs['mcpu']} with {database.label()}, "
          f"on {machine.cpu_name()}:")
    _report(tables, f"layers-{model_name}", target, save, model=model_name, batch=batch, database=database.label())
    return tables


def compare_bf16_layers(model_name: str, repeats: int = 10, save: bool = True) -> dict:
    """TVM's bf16 build of ``model_name`` (``bf16_model``, its shipped database) against OpenVINO's default on this
    CPU (bf16 where it has AVX-512 BF16), layer by layer, batch 1: where TVM's bf16 loses to OpenVINO's.
    Prints it and (``save``) keeps it in results/layers-<model>_bf16-<cpu>-<cores>cores.json."""
    target = machine.cpu_target()
    require_bf16(target)
    model, x, database, compiled = tuned_bf16_build(model_name, target)
    exported = peers.onnx_export(model, x)
    end_to_end = _end_to_end(compiled, model, x, exported, repeats)
    ours = layer_compare.tvm_layers(compiled, x, repeats, engine=TVM_BF16)
    theirs = layer_compare.openvino_layers(model, x, precision=None, repeats=repeats, exported=exported)
    tables = {theirs.engine: layer_compare.table(ours, theirs)}
    print(f"{model_name} in bf16, batch 1, TVM with {database.label()}, on {machine.cpu_name()}; end to end, "
          f"the same process: " + ", ".join(f"{label} {ms:.2f} ms" for label, ms in end_to_end.items()))
    _report(tables, f"layers-{bf16_model.database_name(model_name)}", target, save, model=model_name, batch=1,
            database=database.label(), end_to_end_ms=end_to_end)
    return tables


def compare_int8_layers(repeats: int = 10, save: bool = True) -> dict:
    """Day 12's int8 MobileNetV2 in TVM (its shipped database) against ONNX Runtime's and OpenVINO's int8 (the model
    quantized by ONNX Runtime's ``quantize_static`` on the same calibration images: ``quantize.onnx_int8``), layer by
    layer, batch 1: where TVM's int8 loses to the engines' own. TVM quantizes the 1x1 convolutions only; the others
    every convolution, so their depthwise layers are int8 too. Prints it and (``save``) keeps it in
    results/layers-mobilenet_v2_int8-<cpu>-<cores>cores.json."""
    target = machine.cpu_target()
    float_model, quantized, _ = quantize.quantized_model(target=target)
    x = models.example_input(seed=1)
    database = databases.choose(quantize.database_model(target), quantized, target, tune_if_missing=False)
    compiled = database.compile(quantized, target)
    onnx_int8 = quantize.onnx_int8(float_model, quantize.calibration_inputs())
    engines, missing = quantize.onnx_int8_engines(onnx_int8)
    runners = {TVM_INT8: timing.tvm_runner(compiled, x), **{label: (lambda run=run: run(x)) for label, run in engines.items()}}
    end_to_end = {t.label: round(t.median_ms, 3) for t in timing.measure_engines(runners, warmup=3, repeats=max(repeats, 20))}
    ours = layer_compare.tvm_layers(compiled, x, repeats, engine=TVM_INT8, channels_last=True)
    theirs = []  # OpenVINO before ONNX Runtime, whose threads spin after its runs (``layer_compare.against_peers``)
    if quantize.OPENVINO_INT8 in engines:
        theirs.append(layer_compare.openvino_layers(float_model, x, "f32", repeats, onnx_int8, engine=quantize.OPENVINO_INT8))
    if quantize.ORT_INT8 in engines:
        theirs.append(layer_compare.onnx_runtime_layers(float_model, x, repeats, onnx_int8, engine=quantize.ORT_INT8))
    tables = {other.engine: layer_compare.table(ours, other) for other in theirs}
    print(f"{quantize.MODEL} in int8, batch 1, TVM with {database.label()}, on {machine.cpu_name()}; end to end, "
          f"the same process: " + ", ".join(f"{label} {ms:.2f} ms" for label, ms in end_to_end.items()))
    for label, why in missing.items():
        print(f"{label}: not compared ({why})")
    _report(tables, f"layers-{quantize.database_model(target)}", target, save, model=quantize.MODEL, batch=1,
            database=database.label(), end_to_end_ms=end_to_end)
    return tables


def _end_to_end(compiled, model, x, exported: bytes, repeats: int) -> dict[str, float]:
    """TVM's bf16 build and OpenVINO's default, timed whole in alternating blocks just before their profiles: a
    profile times each call apart (and OpenVINO's counters cost it time), so its sums are not the models' times."""
    label, run, _ = peers.openvino_default(model, x, exported) or (None, None, None)
    runners = {TVM_BF16: timing.tvm_runner(compiled, x), **({label: run} if label else {})}
    return {t.label: round(t.median_ms, 3) for t in timing.measure_engines(runners, warmup=3, repeats=max(repeats, 20))}


def _report(tables: dict, name: str, target, save: bool, **about) -> None:
    """Each table's totals, its kinds of layer and where TVM loses most, printed; kept under results/ with ``save``."""
    kinds = {engine: layer_compare.by_kind(frame).round(3) for engine, frame in tables.items()}
    for engine, frame in tables.items():
        ours, theirs = [c for c in frame.columns if c.endswith(" ms")]
        print(f"\nagainst {engine}: {frame[ours].sum():.2f} ms against {frame[theirs].sum():.2f}, by kind of layer:")
        print(kinds[engine].to_string(index=False))
        print("where TVM loses most:")
        print(layer_compare.where_time_is_lost(frame, 8).round(3).to_string(index=False))
    if save:
        path = results_path_here(target, "json", name)
        save_record(path, machine=machine.describe().as_dict(), target=str(target), imitated=machine.is_imitated(target),
                    **about, **{f"layers against {engine}": frame.round(3).to_dict(orient="records")
                                for engine, frame in tables.items()},
                    **{f"by kind against {engine}": kind.to_dict(orient="records") for engine, kind in kinds.items()})
        print(f"saved {path}")
