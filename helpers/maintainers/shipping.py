"""Tuning the databases the course ships for Days 12 and 14 into ``tuning/``, kept to the best record per kernel.

    python -m helpers.maintainers.shipping int8 16 [--mcpu haswell]   # Day 12's int8 MobileNetV2, per int8 instruction
    python -m helpers.maintainers.shipping bf16 16 [--model resnet50] # a model with its convolutions in bf16 (--no-tiles;
                                                                      # --seed-from DIR: start from another CPU's database)
    python -m helpers.maintainers.shipping tiles DIR --into DIR2      # a bf16 or int8 database's register tiles swept
    python -m helpers.maintainers.shipping prefill --length 64 --trials 32   # a TinyGPT prefill bucket (Day 14)
    python -m helpers.maintainers.shipping decode --trials 32         # the static kernels of its decoding step
    python -m helpers.maintainers.shipping paged --trials 32          # those of its decoding step over the paged cache
    python -m helpers.maintainers.shipping large-prefill --trials 16  # make benchmark's GPT-2-small-sized prefill bucket

The float32 models' databases are tuned in stages with their curve (``python -m helpers.maintainers.benchmark
tune ... --into tuning/NAME --keep 1``, ``stages``); these have no eager twin to draw a curve against.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

import tvm

from .. import amx, bf16_model, databases, machine, models, paged_cache, quantize, transformer, tuning
from ..machine import cpu_target
from ..models import ImportedModel
from . import register_tiles, transformer_large
from .report import require_bf16


def tune_int8(trials_per_task: int, target: tvm.target.Target | None = None) -> Path:
    """Tune Day 12's int8 MobileNetV2 for ``target`` (default: this CPU) into the shipped databases, one per int8
    instruction (``quantize.database_model``), with its int8 search space; keep the best record per kernel."""
    target = target or cpu_target()
    _, quantized, _ = quantize.quantized_model(target=target)
    work_dir = databases.database_dir(quantize.database_model(target), target)
    tuning.tune(quantized.mod, target, work_dir, max_trials_per_task=trials_per_task, space_for=quantize.space_for(target))
    kept = tuning.prune_database(work_dir)
    print(f"{work_dir}: {kept} records kept (the best per kernel)")
    _borrow_tile_kernels(work_dir, quantize.database_model(target), target, amx.INT8)
    return work_dir


def _borrow_tile_kernels(work_dir: Path, name: str, target: tvm.target.Target, kind: amx.Kind) -> None:
    """On a CPU with AMX, ``kind``'s convolutions go onto tiles untuned, so a database tuned there has no records for
    them: copy them from the best other shipped ``name`` database, so that it serves CPUs without tiles too."""
    if not amx.has_amx(target, kind):
        return
    others = [d for d in databases.candidates(name, target, places=[(databases.SHIPPED, databases.SHIPPED_ROOT)])
              if d.path != work_dir]
    if not others:  # (the coverage tests of the shipped databases then fail, with this command to run elsewhere)
        print(f"warning: {work_dir.name} has no records for the {kind.name} convolutions (AMX schedules them here) and "
              f"no other shipped {name} database has them: tune one on a CPU without AMX too.")
        return
    source = databases.rank(others, target)[0].path
    print(f"{tuning.add_kernels_from(work_dir, source)} kernels' records copied from {source.name}")


def tune_bf16(model: str, trials_per_task: int, target: tvm.target.Target | None = None,
              seed_from: Path | None = None) -> Path:
    """Tune ``model`` with its convolutions in bf16 (``bf16_model``) for ``target`` (default: this CPU, which must
    have AVX-512 BF16) into the shipped databases, the bf16 products in ``bf16.bf16_space``; ``seed_from`` (a bf16
    database tuned on another CPU) replays its best schedules here first, so the trials start from them."""
    target = target or cpu_target()
    require_bf16(target)
    float_model, _ = quantize.float_model(model)
    half = bf16_model.import_bf16(float_model, models.example_input(), on_tiles=amx.has_amx(target))
    work_dir = databases.database_dir(bf16_model.database_name(model), target)
    tuning.tune(half.mod, target, work_dir, max_trials_per_task=trials_per_task, space_for=bf16_model.space_for,
                seed_from=seed_from)
    print(f"{work_dir}: {tuning.prune_database(work_dir)} records kept (the best per kernel)")
    _borrow_tile_kernels(work_dir, bf16_model.database_name(model), target, amx.BF16)
    return work_dir


def tune_bucket(length: int, trials_per_task: int, target: tvm.target.Target | None = None) -> str:
    """Tune the default TinyGPT's prefill bound to ``length`` into the shipped databases (kept: best per kernel)."""
    target = target or cpu_target()
    bucket = transformer.bind_length(transformer.import_prefill(transformer.TinyGPT()), length)
    return tune_and_ship(bucket, transformer.bucket_name(length), trials_per_task, target, static_kernels_only=False)


def tune_decode(trials_per_task: int, target: tvm.target.Target | None = None) -> str:
    """Tune the static kernels of the default TinyGPT's decoding step (its matmuls on one token) into the
    shipped databases; the kernels over the symbolic past keep TVM's default code."""
    target = target or cpu_target()
    return tune_and_ship(transformer.import_decode(transformer.TinyGPT()), transformer.DECODE_NAME, trials_per_task,
                         target, static_kernels_only=True)


def tune_paged(trials_per_task: int, target: tvm.target.Target | None = None) -> str:
    """Tune the static kernels of the default TinyGPT over the paged cache (``paged_cache.paged_module``: its
    decoding step's matmuls on one token) into the shipped databases; the kernels over a symbolic length
    (the prefill's, the cache's own attention) keep TVM's default code."""
    target = target or cpu_target()
    mod, _ = paged_cache.paged_module(transformer.TinyGPT(), target)
    work_dir = databases.database_dir(paged_cache.DATABASE_NAME, target)
    tuning.tune(mod, target, work_dir, max_trials_per_task=trials_per_task, static_kernels_only=True)
    tuning.prune_database(work_dir, keep=1)
    return str(work_dir)


def tune_large_prefill(length: int, trials_per_task: int, target: tvm.target.Target | None = None) -> str:
    """Tune the prefill bucket of ``length`` tokens of ``make benchmark``'s GPT-2-small-sized model
    (``transformer_large``) into the shipped databases (kept: best per kernel)."""
    target = target or cpu_target()
    bucket = transformer_large.prefill_bucket(transformer.TinyGPT(transformer_large.GPT2_SMALL), length)
    return tune_and_ship(bucket, f"{transformer_large.PREFILL_PREFIX}{length}", trials_per_task, target,
                         static_kernels_only=False)


def tune_and_ship(imported: ImportedModel, name: str, trials_per_task: int, target: tvm.target.Target,
                  static_kernels_only: bool) -> str:
    """Tune ``imported`` into the shipped database of ``name`` for ``target``, then keep the best record per kernel.
    Weights are prepacked for a static module only: with symbolic dimensions it computes wrong numbers."""
    work_dir = databases.database_dir(name, target)
    tuning.tune(imported.mod, target, work_dir, max_trials_per_task=trials_per_task, prepack=not static_kernels_only,
                static_kernels_only=static_kernels_only)
    tuning.prune_database(work_dir, keep=1)
    return str(work_dir)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m helpers.maintainers.shipping", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    int8 = sub.add_parser("int8", help="tune the int8 MobileNetV2 for this CPU into tuning/ (Day 12)")
    int8.add_argument("trials", type=int, help="trials per kernel")
    int8.add_argument("--mcpu", default=None, help="tune for a CPU class this one can run (e.g. haswell: AVX2)")
    half = sub.add_parser("bf16", help="tune a model with its convolutions in bf16 for this CPU into tuning/")
    half.add_argument("trials", type=int, help="trials per kernel")
    half.add_argument("--model", default=quantize.MODEL, help="a model of models.available_models()")
    half.add_argument("--no-tiles", action="store_true", help="on a CPU with AMX, tune with the tiles off: every kernel, "
                      "the products on vdpbf16ps, for a database that serves CPUs without tiles where no other has them")
    half.add_argument("--seed-from", type=Path, default=None,
                      help="a bf16 database of the same model tuned on another CPU (e.g. tuning/resnet50_bf16-b1-znver4-2cores): "
                           "its best schedules are measured here first and the search starts from them")
    tiles = sub.add_parser("tiles", help="sweep the register tiles of a bf16 or int8 database's products on this CPU "
                           "(helpers.maintainers.register_tiles)")
    tiles.add_argument("database", type=Path, help="a bf16 or int8 database tuned for this CPU, e.g. "
                       "tuning/resnet50_bf16-b1-znver5-2cores")
    tiles.add_argument("--into", type=Path, required=True, help="where the swept database goes (replaced if there)")
    prefill = sub.add_parser("prefill", help="tune a TinyGPT prefill bucket into tuning/ (Day 14)")
    prefill.add_argument("--length", type=int, default=transformer.BUCKET, help="the prefill bucket's length")
    prefill.add_argument("--trials", type=int, default=32, help="trials per task")
    decode = sub.add_parser("decode", help="tune the static kernels of TinyGPT's decoding step into tuning/ (Day 14)")
    decode.add_argument("--trials", type=int, default=32, help="trials per task")
    paged = sub.add_parser("paged", help="tune the static kernels of TinyGPT over the paged cache into tuning/ (Day 14)")
    paged.add_argument("--trials", type=int, default=32, help="trials per task")
    large = sub.add_parser("large-prefill", help="tune make benchmark's GPT-2-small-sized prefill bucket into tuning/")
    large.add_argument("--length", type=int, default=128, help="the bucket's length (the benchmark's prompt)")
    large.add_argument("--trials", type=int, default=16, help="trials per task")
    args = parser.parse_args(argv)
    if args.command == "int8":
        tune_int8(args.trials, machine.target_for(args.mcpu))
    elif args.command == "bf16":
        tune_bf16(args.model, args.trials, amx.without_tiles(cpu_target()) if args.no_tiles else None, args.seed_from)
    elif args.command == "tiles":
        rows = register_tiles.sweep_database(args.database, args.into, cpu_target())
        tuned, swept = sum(r["tuned_ms"] for r in rows), sum(r["swept_ms"] for r in rows)
        print(f"{args.into}: {len(rows)} products swept, alone {tuned:.3f} ms tuned -> {swept:.3f} ms swept")
    elif args.command == "prefill":
        print("tuned into", tune_bucket(args.length, args.trials))
    elif args.command == "large-prefill":
        print("tuned into", tune_large_prefill(args.length, args.trials))
    elif args.command == "decode":
        print("tuned into", tune_decode(args.trials))
    else:
        print("tuned into", tune_paged(args.trials))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
