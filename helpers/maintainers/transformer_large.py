"""A transformer of GPT-2 small's sizes, decoding, TVM against PyTorch and ONNX Runtime in tokens per
second and on the memory roofline (``make benchmark``).

At Day 14's width of 128 a decoding step measures per-call overheads, not the compiler. At GPT-2 small's
sizes (random weights: nothing downloaded) each step's matrix-vector products read every weight once per
token, so the step is bound by memory: its floor is the bytes of weights read per token over the memory
bandwidth. TVM's step is built three times without tuning: with the default pipeline (no schedules);
fused, with the weights' transposes lifted out of the step and DLight's CPU rules (``GEMV``, ``Reduction``):
lifted, the weights lie ``[in, out]``, DLight's ``GEMV`` declines every product and ``Reduction`` takes the
blocks' with a schedule that reads each weight column by column; and fused with each transpose fused into its
product (``FuseTransposeMatmul``: the weights stay ``[out, in]``, as MLC LLM keeps them)
and the course's own row-by-row schedule (``gemv.RowGEMV``), the other kernels with a loop nest each run in
parallel (``gemv.ParallelSpatial``), DLight's ``Reduction`` left out (on one token's layer norm it recomputes
both sums for every output; see ``gemv``). The prefill is timed
for PyTorch's peers and ONNX Runtime, and for TVM as a tuned bucket of the prompt's length where a database for
it exists (``python -m helpers.maintainers.shipping large-prefill``): untuned, TVM's matrix kernels at this size
are plain loops, seconds per prompt.
"""

from __future__ import annotations

import dataclasses

import torch
import tvm

from .. import build, databases, kernels, machine, peers, qgemv, timing, transformer
from ..errors import TuningDatabaseError
from .gemv import ParallelSpatial, RowGEMV
from .report import UNRELIABLE_MARK, load_average, print_and_keep, records

GPT2_SMALL = transformer.GPTConfig(vocab=50257, width=768, layers=12, heads=12, max_len=1024)
UNTUNED = "TVM decode, untuned"
WITH_DLIGHT = "TVM decode, transposes lifted, DLight CPU rules"
WITH_ROW_GEMV = "TVM decode, transposes fused, row GEMV + parallel loops"
TUNED_PREFILL = "TVM prefill, tuned bucket"
PREFILL_PREFIX = "gpt2small_prefill"  # its database's model name, with the prompt's length appended
BANDWIDTH_KIND = "the machine's read bandwidth, every core summing a large array: qgemv.read_bandwidth_gbs"


def prefill_bucket(model: transformer.TinyGPT, length: int):
    """``model``'s prefill with its length bound to ``length`` (``transformer.bind_length``): what is tuned and built."""
    return transformer.bind_length(transformer.import_prefill(model), length)


def tuned_prefill(model: transformer.TinyGPT, ids: torch.Tensor, target: tvm.target.Target):
    """TVM's prefill of ``ids`` as a tuned bucket of their length: (runner, the database's label), or
    (None, why not) where no database for that bucket exists."""
    try:  # nothing is tuned here, so the bucket is imported only once a database is found
        database = databases.choose(f"{PREFILL_PREFIX}{ids.shape[1]}", None, target, tune_if_missing=False)
    except TuningDatabaseError:
        return None, (f"{TUNED_PREFILL}: no tuning database for a bucket of {ids.shape[1]} tokens "
                      f"(python -m helpers.maintainers.shipping large-prefill --length {ids.shape[1]})")
    return timing.tvm_runner(database.compile(prefill_bucket(model, ids.shape[1]), target), ids), database.label()


def dlight_passes(target: tvm.target.Target) -> list[tvm.transform.Pass]:
    """Day 14's: legalize and fuse (``build.fusion_passes``), lift the weights' transposes into
    ``main_transform_params`` (run once at load, not per token), then DLight's CPU rules."""
    from tvm import relax
    from tvm.s_tir import dlight as dl

    return build.fusion_passes(target) + [relax.transform.LiftTransformParams(), relax.transform.FoldConstant(),
                                          dl.ApplyDefaultSchedule(dl.cpu.GEMV(), dl.cpu.Reduction())]


def row_gemv_passes(target: tvm.target.Target) -> list[tvm.transform.Pass]:
    """Each weight's transpose fused into its product (``NT_matmul``: the weight read ``[out, in]``, as stored),
    legalize and fuse, then the course's ``RowGEMV`` for the products and ``ParallelSpatial`` for the kernels of one
    loop nest; the layer norms and softmaxes (a few microseconds each) keep the default pipeline's loops."""
    from tvm import relax
    from tvm.s_tir import dlight as dl

    return [relax.transform.FuseTransposeMatmul(), *build.fusion_passes(target),
            dl.ApplyDefaultSchedule(RowGEMV(), ParallelSpatial())]


def scheduled_by(mod: tvm.IRModule, target: tvm.target.Target, passes: list[tvm.transform.Pass]) -> dict:
    """What ``passes`` make of ``mod``, and which kernels their schedule rules took and left."""
    with target:
        scheduled_mod = tvm.transform.Sequential(passes)(mod)
    scheduled, left = transformer.scheduled_kernels(scheduled_mod)
    return {"mod": scheduled_mod, "scheduled": scheduled, "left": left}


def weight_bytes_per_token(model: transformer.TinyGPT) -> int:
    """Bytes of weights one decoding step reads: every parameter, except that of the two embedding
    tables it reads one row each."""
    tables = (model.tok.weight, model.pos.weight)
    total = sum(p.numel() * p.element_size() for p in model.parameters())
    return total - sum(t.numel() * t.element_size() for t in tables) + sum(t.shape[1] * t.element_size() for t in tables)


def large_run(config: transformer.GPTConfig = GPT2_SMALL, past: int = 128, prompt: int = 128, repeats: int = 20) -> dict:
    """The decoding step after ``past`` positions by every engine, and the prefill of ``prompt`` tokens by
    PyTorch's peers and ONNX Runtime, each checked against eager, timed in alternating blocks."""
    from tvm.s_tir import dlight as dl

    target = machine.cpu_target()
    model = transformer.TinyGPT(config)
    decode_import = transformer.import_decode(model)
    # each variant's passes run once: their module is built, and says which kernels the rules took
    lifted = scheduled_by(decode_import.mod, target, dlight_passes(target))
    gemv_alone = scheduled_by(decode_import.mod, target, dlight_passes(target)[:-1] + [dl.ApplyDefaultSchedule(dl.cpu.GEMV())])
    rows = scheduled_by(decode_import.mod, target, row_gemv_passes(target))
    decoders = {UNTUNED: transformer.compile_decoder(decode_import, target)}
    for label, variant in ((WITH_DLIGHT, lifted), (WITH_ROW_GEMV, rows)):
        decoders[label] = transformer.Decoder(transformer.compile_with_passes(
            dataclasses.replace(decode_import, mod=variant["mod"]), target, []))
    decode, missing = transformer.decode_peers(model, past)
    decode |= {label: run for label, run in transformer.step_runners(model, decoders, past).items() if label != peers.EAGER}
    ids = transformer.tokens(prompt, config.vocab, seed=1)
    prefill = peers.peers(transformer.Prefill(model), ids)
    tvm_prefill, prefill_database = tuned_prefill(model, ids, target)
    if tvm_prefill is None:
        prefill.missing[TUNED_PREFILL] = prefill_database
    else:
        prefill.runners[TUNED_PREFILL] = tvm_prefill
        peers.check_against_eager(prefill.runners, [TUNED_PREFILL])
    bandwidth = qgemv.read_bandwidth_gbs()
    load = load_average()
    decode_timings = timing.measure_engines(decode, warmup=2, repeats=repeats)
    prefill_timings = timing.measure_engines(prefill.runners, warmup=2, repeats=repeats)
    return {"model": f"TinyGPT {config}", "parameters": sum(p.numel() for p in model.parameters()),
            "weight_bytes_per_token": weight_bytes_per_token(model), "bandwidth_gbs": bandwidth,
            "past": past, "prompt": prompt, "decode": records(decode_timings), "prefill": records(prefill_timings),
            "missing": {**missing, **prefill.missing}, "prefill_database": prefill_database if tvm_prefill else None,
            "dlight": {"scheduled": lifted["scheduled"], "left": lifted["left"], "gemv_alone": gemv_alone["scheduled"]},
            "row_gemv": {"scheduled": rows["scheduled"], "left": rows["left"]},
            "threads": {"TVM": kernels.threads(), "PyTorch": torch.get_num_threads()},
            "load_average": [load, load_average()]}


def memory_floor_ms(result: dict) -> float:
    """The decoding step's floor in ms: the bytes of weights it reads per token over the measured bandwidth."""
    return result["weight_bytes_per_token"] / (result["bandwidth_gbs"] * 1e9) * 1e3


def format_large(result: dict, machine_summary: str) -> str:
    """Tokens per second of each engine, the fastest named, and the decoding step against its memory floor."""
    floor_ms = memory_floor_ms(result)
    lines = [f"Machine: {machine_summary}", "",
             "| step | engine | median ms (IQR) | tokens/s | vs eager | memory floor / median |",
             "| --- | --- | ---: | ---: | ---: | ---: |"]
    for step, engines, tokens in [(f"decode after {result['past']}", result["decode"], 1),
                                  (f"prefill of {result['prompt']}", result["prefill"], result["prompt"])]:
        eager = engines[peers.EAGER]["median_ms"]
        for label, r in sorted(engines.items(), key=lambda item: item[1]["median_ms"]):
            mark = UNRELIABLE_MARK if timing.unreliable(r) or timing.unreliable(engines[peers.EAGER]) else ""
            roof = f"{floor_ms / r['median_ms']:.0%}" if tokens == 1 else "—"
            lines.append(f"| {step} | {label} | {mark}{r['median_ms']:.2f} ({r['iqr_ms']:.2f}) "
                         f"| {tokens / r['median_ms'] * 1e3:.1f} | {mark}{eager / r['median_ms']:.2f}× | {roof} |")
    lines += ["", f"{result['model']}: {result['parameters'] / 1e6:.0f} M parameters, random weights, batch 1, float32; "
              "the rows of each step from fastest to slowest, from one run in alternating blocks. "
              f"{UNRELIABLE_MARK.strip()} marks noise.",
              f"Memory floor of a decoding step: {result['weight_bytes_per_token'] / 1e6:.0f} MB of weights read per token "
              f"over {result['bandwidth_gbs']:.1f} GB/s ({BANDWIDTH_KIND}) = {floor_ms:.1f} ms; "
              "the last column is the share of that floor an engine reaches.",
              "TVM's decoding steps are untuned. Default pipeline: no kernel scheduled. Transposes lifted out of the step (run once "
              "at load), DLight's CPU rules: the weights lie [in, out], so DLight's GEMV took "
              f"{len(result['dlight'].get('gemv_alone', [])) or 'none'} of the products and its Reduction "
              f"{len(result['dlight']['scheduled'])} of the step's {len(result['dlight']['scheduled']) + len(result['dlight']['left'])} "
              "kernels (the blocks' products among them, read column by column), leaving as plain loops: "
              f"{', '.join(k for k in result['dlight']['left'] if 'matmul' in k) or 'none'}. "
              "Transposes fused into the products (FuseTransposeMatmul, weights read [out, in] as stored), the course's "
              f"RowGEMV, the other kernels of one loop nest in parallel (the course's ParallelSpatial; DLight's Reduction left out: "
              "on one token's layer norm it computes both sums again for each output): "
              f"{len(result['row_gemv']['scheduled'])} kernels scheduled, the products "
              f"left as plain loops: {', '.join(k for k in result['row_gemv']['left'] if 'matmul' in k) or 'none'}.",
              f"TVM's prefill: a bucket of {result['prompt']} tokens, {result['prefill_database']}." if result.get("prefill_database")
              else "TVM's prefill is not timed: untuned, its matrix kernels at this size are plain loops (seconds per prompt).",
              *(f"{label} missing: {reason}" for label, reason in result["missing"].items())]
    return "\n".join(lines)


def run_large(repeats: int = 20, save: bool = True) -> str:
    """``large_run`` printed, and (``save``) kept in results/transformer-large-<cpu>-<cores>cores.{json,md}."""
    return print_and_keep("transformer-large", "A GPT-2-small-sized transformer, decoding and prefill",
                          large_run(repeats=repeats), format_large, save)
