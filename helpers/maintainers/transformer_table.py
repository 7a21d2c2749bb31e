"""Day 14's comparison for the results: a small GPT's prefill buckets and decoding step, TVM against PyTorch
(``make benchmark``)."""

from __future__ import annotations

import torch

from .. import databases, kernels, machine, paged_cache, peers, timing, transformer
from ..peers import EAGER
from .report import UNRELIABLE_MARK, load_average, print_and_keep, records


def transformer_run(repeats: int = 100) -> dict:
    """Day 14's comparison on TinyGPT: the prefill of each shipped bucket by every engine (the tuned bucket
    and the symbolic build against PyTorch's peers and ``torch.compile(dynamic=True)``), then one decoding
    step: TVM's explicit and paged caches against eager, ``torch.compile(dynamic=True)``, ONNX Runtime and
    OpenVINO (``transformer.decode_peers``), each TVM step timed like with like (``transformer.step_runners``);
    each set timed in alternating blocks in one run."""
    target = machine.cpu_target()
    model = transformer.TinyGPT()
    symbolic = transformer.import_prefill(model)
    any_length = transformer.compile_symbolic(symbolic, target)
    buckets = []
    for length in transformer.BUCKETS:
        bucket = transformer.bind_length(symbolic, length)
        database = databases.choose(transformer.bucket_name(length), bucket, target, tune_if_missing=False)
        runners, missing = transformer.prefill_runners(model, transformer.tokens(length, vocab=model.config.vocab, seed=1),
                                                       database.compile(bucket, target), any_length)
        buckets.append((length, database, runners, missing))
    decode_import = transformer.import_decode(model)
    decode_database = databases.choose(transformer.DECODE_NAME, decode_import, target, tune_if_missing=False)
    paged_database = databases.choose(paged_cache.DATABASE_NAME, None, target, tune_if_missing=False)
    decoders = {transformer.DECODE_TVM: transformer.compile_decoder(decode_import, target),
                transformer.DECODE_TUNED: transformer.compile_decoder(decode_import, target, decode_database),
                paged_cache.LABEL: paged_cache.compile_paged(model, target),
                paged_cache.TUNED_LABEL: paged_cache.compile_paged(model, target, database=paged_database)}
    decode_peers, decode_missing = transformer.decode_peers(model, past=transformer.BUCKET)
    load = load_average()
    prefills = []
    for length, database, runners, missing in buckets:
        timings = timing.measure_engines(runners, warmup=3, repeats=repeats)
        prefills.append({"length": length, "engines": records(timings), "missing": missing, "database": database.label(),
                         "verdict": peers.verdict(timings, candidate=transformer.TUNED_BUCKET)})
    decode = timing.measure_engines(decode_peers | transformer.step_runners(model, decoders, past=transformer.BUCKET),
                                    warmup=3, repeats=repeats)
    return {"model": f"TinyGPT {model.config}", "prefill": prefills, "decode": records(decode), "past": transformer.BUCKET,
            "decode_database": decode_database.label(), "paged_database": paged_database.label(),
            "decode_missing": decode_missing,
            "decode_verdict": peers.verdict(decode, candidate=transformer.DECODE_TUNED),
            "threads": {"TVM": kernels.threads(), "PyTorch": torch.get_num_threads()},
            "load_average": [load, load_average()]}


def format_transformer(result: dict, machine_summary: str) -> str:
    """The transformer comparison as Markdown: prefill per bucket and decode, medians (IQR) and speedups over eager."""
    lines = [f"Machine: {machine_summary}", "", "| step | engine | median ms (IQR) | vs eager |", "| --- | --- | ---: | ---: |"]
    steps = [(f"prefill, {p['length']} tokens", p["engines"]) for p in result["prefill"]]
    for step, engines in [*steps, (f"decode after {result['past']}", result["decode"])]:
        eager = engines[EAGER]["median_ms"]
        for label, r in engines.items():
            mark = UNRELIABLE_MARK if timing.unreliable(r) or timing.unreliable(engines[EAGER]) else ""
            lines.append(f"| {step} | {label} | {mark}{r['median_ms']:.3f} ({r['iqr_ms']:.3f}) | {mark}{eager / r['median_ms']:.2f}× |")
    lines += ["", f"{result['model']}, batch 1: the prefill of each bucket, and one decoding step after a past of "
              f"{result['past']}. One run, engines timed in alternating blocks. {UNRELIABLE_MARK.strip()} marks noise.",
              *(f"Tuned bucket of {p['length']}: {p['database']}." for p in result["prefill"]),
              "Decoding step, its static kernels tuned (one token's matmuls; those over the symbolic past keep TVM's "
              f"default code): {result.get('decode_database', '—')}; the paged cache's step, its static kernels "
              f"tuned: {result.get('paged_database', 'not measured')}. The symbolic builds are otherwise untuned "
              "(MetaSchedule needs static shapes).",
              *(f"{label} not measured: {reason}" for p in result["prefill"] for label, reason in p["missing"].items()),
              *(f"{label} not measured for decoding: {reason}" for label, reason in result.get("decode_missing", {}).items())]
    for p in result["prefill"]:
        lines += ["", f"Prefill of {p['length']} tokens:", *p["verdict"].splitlines()]
    if "decode_verdict" in result:
        lines += ["", f"Decoding after {result['past']}:", *result["decode_verdict"].splitlines()]
    return "\n".join(lines)


def run_transformer(repeats: int = 100, save: bool = True) -> str:
    """Day 14's comparison, printed and kept in results/transformer-<cpu>-<cores>cores.{json,md}."""
    return print_and_keep("transformer", "A small GPT", transformer_run(repeats), format_transformer, save)
