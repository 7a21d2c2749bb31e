"""The course's benchmark, from the command line: tune models in stages, and print "is it actually faster?".

``make benchmark`` runs ``table``, ``int8``, ``transformer`` and ``transformer-large``. The commands (see
docs/maintainers.md):

* ``tune mobilenet_v2 --stages 8 16 32 64 --keep 1`` tunes a model with weight prepacking in stages,
  measuring tuned TVM against eager after each (``stages``); ``--seed-from DIR`` tops up a database
  made on another CPU instead of starting from scratch; ``--into tuning/NAME`` ships it.
* ``table`` measures, for each model, PyTorch's peers, untuned TVM and tuned TVM side by side and keeps
  the table in ``results/`` (``table``); ``compare MODEL DIR...`` times tuned TVM built with each of
  several databases beside the peers.
* ``layers MODEL``: tuned TVM's convolutions against the fastest PyTorch's, ONNX Runtime's and OpenVINO's
  (``layers``); ``--bf16``: TVM's bf16 build against OpenVINO's default (bf16 where the CPU has it); ``--int8``:
  Day 12's int8 MobileNetV2 against ONNX Runtime's and OpenVINO's int8 (``layers mobilenet_v2 --int8``).
* ``int8`` (Day 12, ``int8_table``) and ``transformer`` (Day 14, ``transformer_table``); ``transformer-large``
  decodes with a transformer of GPT-2 small's sizes, in tokens per second and against its memory floor
  (``transformer_large``).
* ``bf16``: matrix products in bf16 on ``vdpbf16ps`` and in float32, tuned, against PyTorch's (``bf16_kernels``);
  ``bf16-model``: models with bf16 convolutions against OpenVINO's and PyTorch's bf16 (``bf16_model_table``).
* ``fusion``: MobileNetV2's inverted residual blocks as three kernels and as one fused kernel, beside ONNX
  Runtime and OpenVINO on the same block; MobileNetV2 and EfficientNet-B0 whole, fused (``fusion_table``).
* ``dispatch-run`` is ``table``'s own: tuned TVM with its convolutions on oneDNN, in a process of its own.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path

from .. import machine, models, peers, quantize
from ..zoo import ZOO
from . import bf16_kernels, bf16_model_table, fusion_table, int8_table, layers, stages, table, transformer_large, transformer_table


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m helpers.maintainers.benchmark", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    tune_cmd = sub.add_parser("tune", help="tune a model in stages into its database directory")
    tune_cmd.add_argument("model", choices=models.available_models())
    tune_cmd.add_argument("--stages", type=int, nargs="+", default=[8, 16, 32])
    tune_cmd.add_argument("--batch", type=int, default=1)
    tune_cmd.add_argument("--keep", type=int, default=None, help="prune to the K fastest records per kernel at the end")
    tune_cmd.add_argument("--seed-from", type=Path, default=None,
                          help="a database (e.g. one shipped for another CPU) whose best schedules start the search")
    tune_cmd.add_argument("--mcpu", default=None, help="tune for a CPU class this one can imitate (e.g. znver3: AVX2)")
    tune_cmd.add_argument("--layout", default=None,
                          help="the convolutions' activation layout: NCHW, or channel blocks such as NCHW16c "
                               "(default: the --seed-from database's, else NCHW)")
    tune_cmd.add_argument("--into", type=Path, default=None,
                          help="the database's directory (default: build/tuning/<model>-b<batch>-<cpu>-<cores>cores, "
                               "your own; a maintainer shipping one passes tuning/<that name>)")
    compare_cmd = sub.add_parser("compare", help="tuned TVM with each of several databases, beside the peers, in one run")
    compare_cmd.add_argument("model", choices=models.available_models())
    compare_cmd.add_argument("databases", type=Path, nargs="+", help="database directories, e.g. tuning/resnet50-b1-znver4-2cores")
    compare_cmd.add_argument("--batch", type=int, default=1)
    compare_cmd.add_argument("--repeats", type=int, default=30)
    compare_cmd.add_argument("--mcpu", default=None, help="build for a CPU class this one can run (AVX2: haswell, or znver3 on an AMD CPU)")
    layers_cmd = sub.add_parser("layers", help="tuned TVM against freezing, ONNX Runtime and OpenVINO, convolution by convolution")
    layers_cmd.add_argument("model", choices=models.available_models())
    layers_cmd.add_argument("--batch", type=int, default=1)
    layers_cmd.add_argument("--repeats", type=int, default=10)
    layers_cmd.add_argument("--no-save", action="store_true", help="print only; keep results/ as it is")
    layers_cmd.add_argument("--mcpu", default=None, help="build for a CPU class this one can run (AVX2: haswell, or znver3 on an AMD CPU)")
    precision = layers_cmd.add_mutually_exclusive_group()
    precision.add_argument("--bf16", action="store_true", help="TVM's bf16 build against OpenVINO's default (bf16 here) instead")
    precision.add_argument("--int8", action="store_true",
                           help="Day 12's int8 MobileNetV2 against ONNX Runtime's and OpenVINO's int8 instead")
    table_cmd = sub.add_parser("table", help="eager, torch.compile (plain and frozen), ONNX Runtime, TVM untuned and tuned, side by side")
    table_cmd.add_argument("models", nargs="*", help=f"torchvision model names (default: {' '.join(ZOO)})")
    table_cmd.add_argument("--batch", type=int, default=1)
    table_cmd.add_argument("--repeats", type=int, default=20)
    table_cmd.add_argument("--no-save", action="store_true", help="print only; keep results/ as it is")
    table_cmd.add_argument("--mcpu", default=None, help="imitate a CPU class this one can run (e.g. znver3: AVX2)")
    int8_cmd = sub.add_parser("int8", help="Day 12: PyTorch fp32 and int8 against TVM fp32 and int8 tuned, MobileNetV2")
    int8_cmd.add_argument("--repeats", type=int, default=30)
    int8_cmd.add_argument("--no-save", action="store_true", help="print only; keep results/ as it is")
    int8_cmd.add_argument("--mcpu", default=None, help="imitate a CPU class this one can run (e.g. haswell: AVX2)")
    transformer_cmd = sub.add_parser("transformer", help="Day 14: a small GPT's prefill bucket and decoding step, TVM against PyTorch")
    transformer_cmd.add_argument("--repeats", type=int, default=100, help="sub-millisecond calls: many, for a stable median")
    transformer_cmd.add_argument("--no-save", action="store_true", help="print only; keep results/ as it is")
    large_cmd = sub.add_parser("transformer-large", help="a GPT-2-small-sized transformer decoding: tokens/s, memory floor")
    large_cmd.add_argument("--repeats", type=int, default=20)
    large_cmd.add_argument("--no-save", action="store_true", help="print only; keep results/ as it is")
    bf16_cmd = sub.add_parser("bf16", help="matrix products in bf16 (vdpbf16ps) and float32, tuned, against PyTorch's")
    bf16_cmd.add_argument("--trials", type=int, default=64)
    bf16_cmd.add_argument("--repeats", type=int, default=30)
    bf16_cmd.add_argument("--no-save", action="store_true", help="print only; keep results/ as it is")
    bf16_model_cmd = sub.add_parser("bf16-model", help="models with bf16 convolutions against OpenVINO's and PyTorch's bf16")
    bf16_model_cmd.add_argument("models", nargs="*", default=list(bf16_model_table.MODELS))
    bf16_model_cmd.add_argument("--repeats", type=int, default=30)
    bf16_model_cmd.add_argument("--no-save", action="store_true", help="print only; keep results/ as it is")
    fusion_cmd = sub.add_parser("fusion", help="MobileNetV2's blocks: three kernels, one fused kernel, ONNX Runtime, OpenVINO; "
                               "MobileNetV2 and EfficientNet-B0 fused whole")
    fusion_cmd.add_argument("--repeats", type=int, default=20)
    fusion_cmd.add_argument("--no-save", action="store_true", help="print only; keep results/ as it is")
    dispatch_cmd = sub.add_parser("dispatch-run", help="eager against tuned TVM + oneDNN convs, as JSON (run by table)")
    dispatch_cmd.add_argument("model", choices=models.available_models())
    dispatch_cmd.add_argument("--batch", type=int, default=1)
    dispatch_cmd.add_argument("--repeats", type=int, default=20)
    dispatch_cmd.add_argument("--mcpu", default=None)
    args = parser.parse_args(argv)
    if args.command == "tune":
        print(stages.tune_in_stages(args.model, args.stages, args.batch, work_dir=args.into, keep=args.keep,
                             seed_from=args.seed_from, target=machine.target_for(args.mcpu), layout=args.layout))
    elif args.command == "compare":
        timings = table.compare_databases(args.model, args.databases, args.batch, args.repeats, args.mcpu)
        best = peers.fastest(timings)
        by_label = {t.label: t for t in timings}
        print(f"{args.model}, batch {args.batch}, built for {args.mcpu or machine.cpu_name()}, on {machine.cpu_name()}:")
        for t in timings:
            print(f"  {t.label:<64} {t.median_ms:8.2f} ms (IQR {t.iqr_ms:.2f})"
                  + (f"  {by_label[best.pytorch].median_ms / t.median_ms:.2f}x {best.pytorch}" if t.label.startswith("TVM ") else ""))
    elif args.command == "layers":
        if args.bf16:
            layers.compare_bf16_layers(args.model, args.repeats, save=not args.no_save)
        elif args.int8:
            if args.model != quantize.MODEL:
                parser.error(f"--int8 compares Day 12's int8 model, {quantize.MODEL}: run `layers {quantize.MODEL} --int8`")
            layers.compare_int8_layers(args.repeats, save=not args.no_save)
        else:
            layers.compare_layers(args.model, args.batch, args.repeats, args.mcpu, save=not args.no_save)
    elif args.command == "int8":
        int8_table.run_int8(args.repeats, save=not args.no_save, mcpu=args.mcpu)
    elif args.command == "transformer":
        transformer_table.run_transformer(args.repeats, save=not args.no_save)
    elif args.command == "transformer-large":
        transformer_large.run_large(args.repeats, save=not args.no_save)
    elif args.command == "bf16":
        bf16_kernels.run_bf16(args.trials, args.repeats, save=not args.no_save)
    elif args.command == "bf16-model":
        bf16_model_table.run_bf16_model(args.models, args.repeats, save=not args.no_save)
    elif args.command == "fusion":
        fusion_table.run_fusion(args.repeats, save=not args.no_save)
    elif args.command == "dispatch-run":
        print(json.dumps(table.dispatch_run(args.model, args.batch, args.repeats, args.mcpu)))
    else:
        table.run_table(args.models or list(ZOO), args.batch, args.repeats, save=not args.no_save, mcpu=args.mcpu)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
