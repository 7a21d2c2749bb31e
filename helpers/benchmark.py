"""The course's benchmark: tune models in stages, and print "is it actually faster?".

Two commands (see the README):

* ``python -m helpers.benchmark tune mobilenet_v2 --stages 8 16 32 64 --keep 1`` tunes a
  model with weight prepacking into the shipped database directory for this
  machine, and after each stage measures tuned TVM against PyTorch eager in the
  same run. The curve (trials per task, tuning time, both latencies) is saved
  beside the database, so Day 8 can show how long tuning takes to reach parity.
  ``--seed-from DIR`` tops up a database made on another CPU instead of
  starting from scratch.
* ``python -m helpers.benchmark table`` measures, for each model, PyTorch's peers
  (eager, torch.compile, torch.compile with freezing, ONNX Runtime: ``helpers.peers``),
  untuned TVM and tuned TVM (with the database ``databases.choose`` picks: this
  CPU's, else one transferred from another CPU, and says which) side by side, names
  the fastest PyTorch and the fastest engine tuned TVM is held against, and writes
  the table with the machine it came from to ``results/``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import tvm

from . import databases, dispatch, kernels, layer_compare, machine, models, nchwc, peers, timing, tuning
from .build import CompiledModel, check_parity, compile_model
from .peers import COMPILED, EAGER, FROZEN, ORT

REPO = Path(__file__).resolve().parent.parent
RESULTS_ROOT = REPO / "results"
CURVE_FILE = "tuning_curve.json"
BENCH_MODELS = ("mobilenet_v2", "resnet50", "efficientnet_b0")
UNTUNED, TUNED = "TVM untuned", "TVM tuned"
# Day 13: the dense convolutions sent to PyTorch's oneDNN (helpers.dispatch), the rest tuned TVM,
# timed against eager in a process of its own (EAGER_BESIDE_DISPATCHED): with a oneDNN call between
# two TVM kernels, TVM's spinning pool threads starve PyTorch's (Day 13 measured 177 ms against
# 10 ms for MobileNetV2 on 2 cores), so that process runs TVM's pool without spinning. The pool reads
# TVM_THREAD_POOL_SPIN_COUNT once, when it starts, and a pool that sleeps after every kernel slows
# models of many small kernels (EfficientNet-B0): the other columns keep TVM's default.
# The dispatched build is the prepacked, fused form (dispatch.offload_convs(prepack=True)): the form
# PyTorch's freezing runs, which is timed beside it (FROZEN_BESIDE_DISPATCHED) as the fair peer.
DISPATCHED = "TVM tuned + oneDNN convs"
EAGER_BESIDE_DISPATCHED = "PyTorch eager (dispatch run)"
FROZEN_BESIDE_DISPATCHED = "torch.compile (freezing) (dispatch run)"
SPIN_ENV = "TVM_THREAD_POOL_SPIN_COUNT"


def slug(text: str) -> str:
    """A name fit for a file name: ``NVIDIA H100 80GB HBM3`` -> ``nvidia-h100-80gb-hbm3``."""
    return re.sub(r"[^A-Za-z0-9]+", "-", text).strip("-").lower()


# ------------------------------------------------------------------ tuning curve


@dataclass
class CurvePoint:
    """The tuned model after a given tuning budget, timed against eager in one run."""

    trials_per_task: int
    records: int
    tuning_s: float
    eager_ms: float
    eager_iqr_ms: float
    tuned_ms: float
    tuned_iqr_ms: float

    @property
    def speedup(self) -> float:
        return self.eager_ms / self.tuned_ms


def read_curve(work_dir: str | Path) -> dict:
    """The tuning curve saved beside a database: ``{"model", "machine", "points": [...]}``."""
    path = Path(work_dir) / CURVE_FILE
    if not path.is_file():
        raise FileNotFoundError(
            f"No tuning curve at {path}: it is written by "
            "`python -m helpers.benchmark tune MODEL --stages ...`."
        )
    return json.loads(path.read_text())


def time_eager_and_tuned(
    model: torch.nn.Module, x: torch.Tensor, compiled: CompiledModel, repeats: int, warmup: int = 5
) -> tuple[timing.Timing, timing.Timing]:
    """PyTorch eager and a tuned TVM build of it, timed interleaved in one run: (eager, tuned)."""
    eager, tuned = timing.measure_engines(
        {EAGER: timing.torch_runner(model, x), TUNED: timing.tvm_runner(compiled, x)},
        batch=x.shape[0],
        warmup=warmup,
        repeats=repeats,
    )
    return eager, tuned


def tuning_dir(model_name: str, target: tvm.target.Target, batch: int = 1) -> Path:
    """Where ``tune_in_stages`` tunes by default: the learner's own databases (``build/tuning/``, the test
    runs' in quick mode), never the shipped ones in ``tuning/``, which only a maintainer writes, on purpose."""
    return databases.database_dir(model_name, target, batch, databases.own_root())


def tune_in_stages(
    model_name: str,
    stages: Sequence[int],
    batch: int = 1,
    work_dir: Path | None = None,
    repeats: int = 50,
    keep: int | None = None,
    seed_from: Path | None = None,
    target: tvm.target.Target | None = None,
    layout: str | None = None,
) -> Path:
    """Tune ``model_name`` with prepacking up to each cumulative budget in ``stages``, into ``work_dir``
    (default: the learner's own place, ``tuning_dir``).

    ``stages`` are trials per task, cumulative (8, 16, 32 means 8, then 8 more,
    then 16 more). After each stage the tuned build is checked against PyTorch
    and timed against eager, and the point is appended to the curve file, so a
    run stopped half-way keeps what it measured. ``keep`` prunes the database
    to the fastest ``keep`` records per kernel at the end (for shipping; tuning
    on from a pruned database starts its cost model almost from scratch).
    ``seed_from`` starts the first stage from another database's best
    schedules, measured here first (a top-up of a database made on another CPU).
    ``target`` defaults to this CPU's; ``transfer_study.emulated_target("znver3")`` tunes for
    a CPU class this one can imitate (AVX2 on an AVX-512 CPU), into that class's directory.
    ``layout`` fuses the convolutions in channel blocks first (``NCHW16c``: ``helpers.nchwc``); by
    default the layout of ``seed_from``, else NCHW.
    """
    target = target or machine.cpu_target()
    work_dir = work_dir or tuning_dir(model_name, target, batch)
    if layout is None:
        layout = tuning.tuned_layout(seed_from) if seed_from is not None else nchwc.PLAIN
    model, x, imported = models.load_imported(model_name, batch)
    curve_path = work_dir / CURVE_FILE
    curve = read_curve(work_dir) if curve_path.is_file() else {
        "model": model_name,
        "batch": batch,
        "target": str(target),
        "machine": machine.describe().as_dict(),
        "points": [],
    }
    done = curve["points"][-1]["trials_per_task"] if curve["points"] else 0
    spent = curve["points"][-1]["tuning_s"] if curve["points"] else 0.0
    for total in stages:
        if total <= done:
            continue
        start = time.perf_counter()
        tuning.tune(imported.mod, target, work_dir, max_trials_per_task=total - done, prepack=True,
                    seed_from=seed_from if done == 0 else None, layout=layout)
        spent += time.perf_counter() - start
        done = total
        compiled = tuning.compile_tuned(imported, target, work_dir)
        check_parity(compiled, model, x)
        eager, tuned = time_eager_and_tuned(model, x, compiled, repeats)
        point = CurvePoint(
            trials_per_task=total,
            records=tuning.database_summary(work_dir)["records"],
            tuning_s=round(spent, 1),
            eager_ms=eager.median_ms,
            eager_iqr_ms=eager.iqr_ms,
            tuned_ms=tuned.median_ms,
            tuned_iqr_ms=tuned.iqr_ms,
        )
        curve["points"].append(asdict(point))
        curve_path.write_text(json.dumps(curve, indent=1) + "\n")
        print(
            f"{total} trials/task, {point.records} records, {spent / 60:.1f} min tuning: "
            f"eager {point.eager_ms:.2f} ms, tuned {point.tuned_ms:.2f} ms, {point.speedup:.2f}x",
            flush=True,
        )
    if keep is not None:
        ship(work_dir, keep)
    return work_dir


def ship(work_dir: Path, keep: int = 1) -> int:
    """Prune a tuned database for the repository and note it in its curve."""
    kept = tuning.prune_database(work_dir, keep)
    curve = read_curve(work_dir)
    curve["shipped_records_per_kernel"] = keep
    (work_dir / CURVE_FILE).write_text(json.dumps(curve, indent=1) + "\n")
    return kept


# ------------------------------------------------------------------------ table


def benchmark_model(model_name: str, batch: int = 1, repeats: int = 20, target: tvm.target.Target | None = None) -> dict:
    """One row of the table: every backend on one model, timed interleaved in one run.

    The peers are ``helpers.peers``' (ONNX Runtime left out, with the reason in ``missing``, when the
    model does not export); a backend whose timing is unreliable is measured once more. Tuned TVM
    uses the database ``databases.choose`` picks (this CPU's, else one transferred from another CPU,
    labelled as such in the row); it is left out (None) only when no database exists for the model
    at all: its absence is part of the answer, not an error. Nothing is tuned here. ``target``
    (default: this CPU's) may be an imitated CPU class (``transfer_study.emulated_target``).
    """
    target = target or machine.cpu_target()
    model, x, imported = models.load_imported(model_name, batch)
    found = peers.peers(model, x, with_onnx_runtime=not _imitated(target))
    runners = dict(found.runners)
    untuned = compile_model(imported, target)
    check_parity(untuned, model, x)
    runners[UNTUNED] = timing.tvm_runner(untuned, x)
    trials, label = None, None
    try:
        database = databases.choose(model_name, imported, target, batch, tune_if_missing=False)
    except tuning.TuningDatabaseError as err:
        print(f"{model_name}: no tuned build ({str(err).split('.')[0]}).", flush=True)
    else:
        tuned = database.compile(imported, target)
        check_parity(tuned, model, x)
        runners[TUNED] = timing.tvm_runner(tuned, x)
        trials, label = database.trials_per_task, database.label()
    load = _load_average()
    timings = timing.measure_engines(runners, batch=batch, warmup=3, repeats=repeats)
    row = {"model": model_name, "batch": batch, "compile_s": {k: round(v, 1) for k, v in found.compile_s.items()},
           "missing": found.missing, "trials_per_task": trials, "database": label,
           "threads": {"TVM": kernels.threads(), "PyTorch": torch.get_num_threads()}}
    row.update(_records(timings))
    row["load_average"] = [load, _load_average()]
    if TUNED in runners:
        row.update(_dispatch_run_in_its_own_process(model_name, batch, repeats, target))
    return row


def _imitated(target: tvm.target.Target) -> bool:
    """Whether ``target`` is another CPU class imitated on this one (``transfer_study.emulated_target``)."""
    return str(target.attrs.get("mcpu")) != machine.cpu_name()


def _target_for(mcpu: str | None) -> tvm.target.Target:
    """This CPU's target, or (``mcpu``) that of a CPU class imitated on this one, PyTorch held to its vectors."""
    if not mcpu or mcpu == machine.cpu_name():
        return machine.cpu_target()
    from .transfer_study import emulated_target  # (it imports this module)

    return emulated_target(mcpu)


def database_label(path: Path) -> str:
    """``TVM resnet50-b1-znver4-2cores (NCHW, 16 trials/task)``: a build named by the database it used."""
    budget = tuning.budget(path)
    return f"TVM {Path(path).name} ({tuning.tuned_layout(path)}, {'?' if budget is None else f'{budget:g}'} trials/task)"


def time_databases(model: torch.nn.Module, x: torch.Tensor, imported, paths: Sequence[Path],
                   target: tvm.target.Target, repeats: int = 30, imitated: bool = False) -> list[timing.Timing]:
    """Tuned TVM built with each database in ``paths`` (transferred where tuned for another CPU, each
    checked for parity), timed beside the peers in one interleaved run: which database a CPU should
    get, or which version to ship. ``imitated``: a CPU class imitated on this one (ONNX Runtime left out)."""
    runners = dict(peers.peers(model, x, with_onnx_runtime=not imitated).runners)
    for path in paths:
        compiled = tuning.compile_tuned(imported, target, Path(path), transfer=True)
        check_parity(compiled, model, x)
        runners[database_label(Path(path))] = timing.tvm_runner(compiled, x)
    return timing.measure_engines(runners, warmup=3, repeats=repeats)


def compare_databases(model_name: str, paths: Sequence[Path], batch: int = 1, repeats: int = 30,
                      mcpu: str | None = None) -> list[timing.Timing]:
    """``time_databases`` for a course model on this CPU, or on a CPU class it imitates (``mcpu``)."""
    target = _target_for(mcpu)
    model, x, imported = models.load_imported(model_name, batch)
    return time_databases(model, x, imported, paths, target, repeats, imitated=_imitated(target))


def _records(timings: Sequence[timing.Timing]) -> dict[str, dict]:
    return {t.label: {"median_ms": t.median_ms, "iqr_ms": t.iqr_ms, "repeats": len(t.times_ms)} for t in timings}


def dispatch_run(model_name: str, batch: int = 1, repeats: int = 20, mcpu: str | None = None) -> dict[str, dict]:
    """Eager and PyTorch with freezing against tuned TVM with its dense convolutions on oneDNN
    (weights prepacked, epilogues fused: the form freezing runs), interleaved in this process.

    Run it in a process whose TVM pool does not spin (``SPIN_ENV`` set to 0 before TVM first runs
    parallel code): ``benchmark_model`` starts one for it. Freezing is left out on an imitated CPU
    class, as in the main table's peers (its Inductor cache would be the host's).
    """
    target = _target_for(mcpu)
    model, x, imported = models.load_imported(model_name, batch)
    database = databases.choose(model_name, imported, target, batch, tune_if_missing=False)
    dispatched = dispatch.compile_dispatched(imported, target, database=database, prepack=True)
    check_parity(dispatched, model, x)
    found = peers.peers(model, x, which=[] if _imitated(target) else [FROZEN])
    renamed = {EAGER: EAGER_BESIDE_DISPATCHED, FROZEN: FROZEN_BESIDE_DISPATCHED}
    runners = {renamed[label]: run for label, run in found.runners.items()}
    timings = timing.measure_engines({**runners, DISPATCHED: timing.tvm_runner(dispatched, x)},
                                     batch=batch, warmup=3, repeats=repeats)
    return _records(timings)


def _dispatch_run_in_its_own_process(model_name: str, batch: int, repeats: int,
                                     target: tvm.target.Target) -> dict[str, dict]:
    command = [sys.executable, "-m", "helpers.benchmark", "dispatch-run", model_name,
               "--batch", str(batch), "--repeats", str(repeats), "--mcpu", str(target.attrs["mcpu"])]
    done = subprocess.run(command, capture_output=True, text=True, env={**os.environ, SPIN_ENV: "0"})
    if done.returncode != 0:
        print(f"{model_name}: the dispatch run failed: {done.stderr.strip().splitlines()[-1:]}", flush=True)
        return {}
    return json.loads(done.stdout.strip().splitlines()[-1])


def _load_average() -> float:
    return round(os.getloadavg()[0], 2)


def ratios(row: dict) -> dict[str, float | str | None]:
    """The headline: speedups (> 1: faster) of tuned TVM over the fastest PyTorch and over the fastest engine,
    each named (``fastest_pytorch``, ``fastest_engine``); then of tuned TVM over eager, of untuned TVM over
    eager, and of tuned TVM with its dense convolutions on oneDNN over the eager of its own run.

    A backend a row lacks counts as absent (rows measured before freezing and ONNX Runtime joined the table).
    """
    medians = {label: r["median_ms"] for label, r in row.items() if isinstance(r, dict) and "median_ms" in r}
    best = peers.fastest(medians)

    def speedup(base: str | None, over: str) -> float | None:
        return medians[base] / medians[over] if base in medians and over in medians else None

    return {
        "fastest_pytorch": best.pytorch,
        "tuned_vs_fastest_pytorch": speedup(best.pytorch, TUNED),
        "fastest_engine": best.engine,
        "tuned_vs_fastest_engine": speedup(best.engine, TUNED),
        "tuned_vs_eager": speedup(EAGER, TUNED),
        "untuned_vs_eager": speedup(EAGER, UNTUNED),
        "dispatched_vs_eager": speedup(EAGER_BESIDE_DISPATCHED, DISPATCHED),
        "dispatched_vs_frozen": speedup(FROZEN_BESIDE_DISPATCHED, DISPATCHED),
    }


UNRELIABLE_MARK = "≈ "


def format_table(rows: Sequence[dict], machine_summary: str) -> str:
    """The benchmark as a Markdown table: medians (IQR) in ms, then speedups; noisy numbers marked."""

    def mark(row, *labels):
        return UNRELIABLE_MARK if any(label in row and timing.unreliable(row[label]) for label in labels) else ""

    def cell(row, label, absent="—"):
        return f"{mark(row, label)}{row[label]['median_ms']:.2f} ({row[label]['iqr_ms']:.2f})" if label in row else absent

    def ratio(row, value, base, over, named=False):
        if value is None:
            return "—"
        return f"{mark(row, base, over)}{value:.2f}×" + (f" ({base})" if named else "")

    threads = {f"TVM {r['threads']['TVM']}, PyTorch {r['threads']['PyTorch']}" for r in rows if "threads" in r}
    lines = [
        f"Machine: {machine_summary}",
        *(f"Threads: {t}" for t in sorted(threads)),
        "",
        "| model | batch | eager ms | torch.compile ms | torch.compile (freezing) ms | ONNX Runtime ms | TVM untuned ms "
        "| TVM tuned ms | tuned vs fastest PyTorch | tuned vs fastest engine | tuned vs eager | untuned vs eager "
        "| tuned + oneDNN convs ms | + oneDNN convs vs eager | + oneDNN convs vs freezing | trials/task | database |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    for row in rows:
        r = ratios(row)
        lines.append(
            f"| {row['model']} | {row['batch']} | {cell(row, EAGER)} | {cell(row, COMPILED)} | {cell(row, FROZEN)} "
            f"| {cell(row, ORT)} | {cell(row, UNTUNED)} | {cell(row, TUNED, 'no database')} "
            f"| {ratio(row, r['tuned_vs_fastest_pytorch'], r['fastest_pytorch'], TUNED, named=True)} "
            f"| {ratio(row, r['tuned_vs_fastest_engine'], r['fastest_engine'], TUNED, named=True)} "
            f"| {ratio(row, r['tuned_vs_eager'], EAGER, TUNED)} | {ratio(row, r['untuned_vs_eager'], EAGER, UNTUNED)} "
            f"| {cell(row, DISPATCHED, 'no database')} "
            f"| {ratio(row, r['dispatched_vs_eager'], EAGER_BESIDE_DISPATCHED, DISPATCHED)} "
            f"| {ratio(row, r['dispatched_vs_frozen'], FROZEN_BESIDE_DISPATCHED, DISPATCHED)} "
            f"| {row['trials_per_task'] or '—'} | {row.get('database') or '—'} |"
        )
    lines += ["", "Medians of interleaved runs, interquartile range in brackets; speedup > 1 means faster.",
              f"{UNRELIABLE_MARK.strip()} marks a timing (or a speedup built on one) whose interquartile range is over "
              f"{timing.UNRELIABLE_SPREAD:.0%} of its median even after measuring it again: noise, not a result.",
              "The fastest PyTorch is the fastest of eager, torch.compile and torch.compile with freezing; the fastest "
              "engine adds ONNX Runtime. A peer not measured (—) does not compete.",
              *(f"{label} missing for {row['model']}: {reason}" for row in rows
                for label, reason in row.get("missing", {}).items()),
              f"Tuned + oneDNN convs (Day 13's dispatch: weights prepacked for oneDNN once, BatchNorm folded, "
              f"ReLU and shortcut add fused as oneDNN post-ops) is timed against eager and torch.compile with "
              f"freezing in a process of its own, with TVM's pool not spinning ({SPIN_ENV}=0); its speedups "
              f"are over that run's eager and freezing."]
    return "\n".join(lines)


INT8_IMAGES = 32


def int8_run(repeats: int = 30, images: int = INT8_IMAGES, target: tvm.target.Target | None = None) -> dict:
    """Day 12's comparison on MobileNetV2, batch 1: PyTorch fp32 and int8, TVM fp32 and int8 tuned, timed
    in alternating blocks in one run, with each int8 build's top-1 agreement with float32 on held-out
    inputs (seeded noise of an image's shape: no dataset is at hand). ``target``: this CPU's, or another
    class's imitated here (``_target_for``)."""
    from . import int8, quantize

    target = target or machine.cpu_target()
    float_model, quantized, _ = quantize.quantized_model(target=target)
    x = models.example_input(seed=1)
    int8_db = databases.choose(quantize.database_model(target), quantized, target, tune_if_missing=False)
    tvm_int8 = int8_db.compile(quantized, target)
    float_imported = models.import_to_relax(float_model, x)
    fp32_db = databases.choose("mobilenet_v2", float_imported, target, tune_if_missing=False)
    tvm_fp32 = fp32_db.compile(float_imported, target)
    check_parity(tvm_fp32, float_model, x)
    torch_int8 = quantize.torch_int8(float_model, quantize.calibration_inputs())
    held_out = [models.example_input(seed=1000 + i) for i in range(images)]
    accuracy = quantize.agreement(float_model, {"PyTorch int8": lambda i: torch_int8(i).numpy(), "TVM int8 tuned": tvm_int8},
                                  held_out)
    load = _load_average()
    timings = timing.measure_engines({"PyTorch fp32": timing.torch_runner(float_model, x),
                                      "PyTorch int8": timing.torch_runner(torch_int8, x),
                                      "TVM fp32 tuned": timing.tvm_runner(tvm_fp32, x),
                                      "TVM int8 tuned": timing.tvm_runner(tvm_int8, x)}, warmup=3, repeats=repeats)
    top1 = {"PyTorch fp32": 1.0, "TVM fp32 tuned": 1.0, **{k: v["top1"] for k, v in accuracy.items()}}
    return {"model": "mobilenet_v2", "batch": 1, "held_out_images": images, "accuracy": accuracy,
            "rows": quantize.tradeoff_rows(timings, top1, baseline="PyTorch fp32"),
            "databases": {"int8": int8_db.label(), "fp32": fp32_db.label()},
            "int8_instruction": int8.int8_instruction(target), "activation_max": int8.activation_max(target),
            "threads": {"TVM": kernels.threads(), "PyTorch": torch.get_num_threads()},
            "load_average": [load, _load_average()]}


def format_int8(result: dict, machine_summary: str) -> str:
    """The int8 comparison as Markdown."""
    lines = [f"Machine: {machine_summary}", "",
             "| build | median ms (IQR) | speedup over PyTorch fp32 | top-1 agreement with fp32 |",
             "| --- | ---: | ---: | ---: |"]
    for r in result["rows"]:
        lines.append(f"| {r['backend']} | {r['median_ms']:.2f} ({r['q3_ms'] - r['q1_ms']:.2f}) | {r['speedup']:.2f}x "
                     f"| {100 * r['top1']:.0f} % |")
    errors = "; ".join(f"{k}: {v['error']:.3f}" for k, v in result["accuracy"].items())
    lines += ["", f"MobileNetV2, batch 1, one run, timed in alternating blocks. PyTorch int8: PT2E (torchao's "
              "X86InductorQuantizer) on the float model, compiled with Inductor's freezing (quantize.torch_int8). "
              f"Agreement on {result['held_out_images']} held-out "
              f"inputs (seeded noise, not images); median relative error of the logits: {errors}.",
              f"Databases: int8 {result['databases']['int8']}; fp32 {result['databases']['fp32']}."]
    if "int8_instruction" in result:
        lines.append(f"TVM's int8 kernels: {result['int8_instruction']} instructions, activations quantized to "
                     f"0..{result['activation_max']}.")
    return "\n".join(lines)


def _print_and_keep(kind: str, title: str, result: dict, format_result, save: bool,
                    target: tvm.target.Target | None = None) -> str:
    """Format ``result`` for this machine, print it, and (``save``) keep it in
    results/<kind>-<cpu>-<cores>cores.{json,md}: the record with the machine, the Markdown under ``title``.
    For a ``target`` imitated on this CPU the files are named ``...-on-<this cpu>``."""
    info = machine.describe()
    target = target or machine.cpu_target()
    summary = info.summary() + (f"; imitating {target.attrs['mcpu']} (TVM built for it, PyTorch held to "
                                f"{os.environ.get('ONEDNN_MAX_CPU_ISA')})" if _imitated(target) else "")
    text = format_result(result, summary)
    print(text)
    if save:
        paths = [results_path_here(target, suffix, kind) for suffix in ("json", "md")]
        record = save_record(paths[0], machine=info.as_dict(), target=str(target), imitated=_imitated(target), **result)
        paths[1].write_text(f"# {title}, measured {record['measured']}\n\n{text}\n")
        print(f"saved {paths[1]}")
    return text


def run_int8(repeats: int = 30, save: bool = True, mcpu: str | None = None) -> str:
    """Day 12's int8 comparison, printed and kept in results/int8-<cpu>-<cores>cores.{json,md}."""
    target = _target_for(mcpu)
    return _print_and_keep("int8", "int8 on MobileNetV2", int8_run(repeats, target=target), format_int8, save, target)


def transformer_run(repeats: int = 100) -> dict:
    """Day 14's comparison on TinyGPT: the prefill of each shipped bucket by every engine (the tuned bucket
    and the symbolic build against PyTorch's peers and ``torch.compile(dynamic=True)``), then one decoding
    step, eager against TVM's explicit and paged caches; each set timed in alternating blocks in one run."""
    from . import paged_cache, transformer

    target = machine.cpu_target()
    model = transformer.TinyGPT()
    symbolic = transformer.import_prefill(model)
    any_length = transformer.compile_symbolic(symbolic, target)
    buckets = []
    for length in transformer.BUCKETS:
        bucket = transformer.bind_length(symbolic, length)
        database = databases.choose(transformer.bucket_name(length), bucket, target, tune_if_missing=False)
        runners, missing = transformer.prefill_runners(model, transformer.tokens(length, seed=1),
                                                       database.compile(bucket, target), any_length)
        buckets.append((length, database, runners, missing))
    decode_import = transformer.import_decode(model)
    decode_database = databases.choose(transformer.DECODE_NAME, decode_import, target, tune_if_missing=False)
    decoders = {transformer.DECODE_TVM: transformer.compile_decoder(decode_import, target),
                transformer.DECODE_TUNED: transformer.compile_decoder(decode_import, target, decode_database),
                paged_cache.LABEL: paged_cache.compile_paged(model, target)}
    load = _load_average()
    prefills = []
    for length, database, runners, missing in buckets:
        timings = timing.measure_engines(runners, warmup=3, repeats=repeats)
        prefills.append({"length": length, "engines": _records(timings), "missing": missing, "database": database.label(),
                         "verdict": peers.verdict(timings, candidate=transformer.TUNED_BUCKET)})
    decode = timing.measure_engines(transformer.decode_runners(model, decoders, past=transformer.BUCKET),
                                    warmup=3, repeats=repeats)
    return {"model": f"TinyGPT {model.config}", "prefill": prefills, "decode": _records(decode), "past": transformer.BUCKET,
            "decode_database": decode_database.label(),
            "threads": {"TVM": kernels.threads(), "PyTorch": torch.get_num_threads()},
            "load_average": [load, _load_average()]}


def format_transformer(result: dict, machine_summary: str) -> str:
    """The transformer comparison as Markdown: prefill per bucket and decode, medians (IQR) and speedups over eager."""
    lines = [f"Machine: {machine_summary}", "", "| step | engine | median ms (IQR) | vs eager |", "| --- | --- | ---: | ---: |"]
    steps = [(f"prefill, {p['length']} tokens", p["engines"]) for p in result["prefill"]]
    for step, records in [*steps, (f"decode after {result['past']}", result["decode"])]:
        eager = records[EAGER]["median_ms"]
        for label, r in records.items():
            mark = UNRELIABLE_MARK if timing.unreliable(r) or timing.unreliable(records[EAGER]) else ""
            lines.append(f"| {step} | {label} | {mark}{r['median_ms']:.3f} ({r['iqr_ms']:.3f}) | {mark}{eager / r['median_ms']:.2f}× |")
    lines += ["", f"{result['model']}, batch 1: the prefill of each bucket, and one decoding step after a past of "
              f"{result['past']}. One run, engines timed in alternating blocks. {UNRELIABLE_MARK.strip()} marks noise.",
              *(f"Tuned bucket of {p['length']}: {p['database']}." for p in result["prefill"]),
              "Decoding step, its static kernels tuned (one token's matmuls; those over the symbolic past keep TVM's "
              f"default code): {result.get('decode_database', '—')}. The symbolic builds and the paged cache's step "
              "are otherwise untuned (MetaSchedule needs static shapes; the paged step's matmuls were not tuned).",
              *(f"{label} not measured: {reason}" for p in result["prefill"] for label, reason in p["missing"].items())]
    for p in result["prefill"]:
        lines += ["", f"Prefill of {p['length']} tokens:", *p["verdict"].splitlines()]
    return "\n".join(lines)


def run_transformer(repeats: int = 100, save: bool = True) -> str:
    """Day 14's comparison, printed and kept in results/transformer-<cpu>-<cores>cores.{json,md}."""
    return _print_and_keep("transformer", "A small GPT", transformer_run(repeats), format_transformer, save)


def results_path(target: tvm.target.Target, suffix: str, root: Path = RESULTS_ROOT, kind: str = "benchmark") -> Path:
    """``results/<kind>-<cpu>-<cores>cores.<suffix>``: one file per kind of result and machine kind."""
    mcpu = str(target.attrs.get("mcpu", target.kind.name))
    return root / f"{kind}-{slug(mcpu)}-{target.attrs.get('num-cores')}cores.{suffix}"


def results_path_here(target: tvm.target.Target, suffix: str, kind: str) -> Path:
    """``results_path`` for a result measured on this CPU: named ``...-on-<this cpu>`` when ``target`` is
    a CPU class imitated on this one (its instructions, this CPU's cores, caches and clock)."""
    path = results_path(target, suffix, kind=kind)
    return path.with_name(f"{path.stem}-on-{machine.cpu_name()}{path.suffix}") if _imitated(target) else path


def compare_layers(model_name: str, batch: int = 1, repeats: int = 10, mcpu: str | None = None,
                   save: bool = True) -> dict:
    """Tuned TVM's convolutions (the database ``databases.choose`` picks) against the fastest PyTorch's
    (freezing: oneDNN, BatchNorm folded) and, unless the CPU class is imitated, ONNX Runtime's, layer
    by layer (``helpers.layer_compare``): the profile that says where a model's gap to each peer is.
    Prints where tuned TVM loses most and (``save``) keeps every table in results/layers-<model>-<cpu>-<cores>cores.json."""
    target = _target_for(mcpu)
    model, x, imported = models.load_imported(model_name, batch)
    database = databases.choose(model_name, imported, target, batch, tune_if_missing=False)
    compiled = database.compile(imported, target)
    check_parity(compiled, model, x)
    found = peers.peers(model, x, with_onnx_runtime=not _imitated(target), which=[FROZEN, ORT])
    tables = layer_compare.against_peers(compiled, model, x, found.runners, repeats)
    print(f"{model_name}, batch {batch}, TVM built for {target.attrs['mcpu']} with {database.label()}, "
          f"on {machine.cpu_name()}:")
    for engine, frame in tables.items():
        columns = [c for c in frame.columns if c.endswith(" ms")]
        print(f"\nagainst {engine}: {frame[columns[0]].sum():.2f} ms against {frame[columns[1]].sum():.2f}; "
              "where tuned TVM loses most:")
        print(layer_compare.where_time_is_lost(frame, 8).round(3).to_string(index=False))
    if save:
        path = results_path_here(target, "json", f"layers-{model_name}")
        save_record(path, machine=machine.describe().as_dict(), target=str(target), imitated=_imitated(target),
                    model=model_name, batch=batch, database=database.label(),
                    **{f"layers against {engine}": frame.round(3).to_dict(orient="records") for engine, frame in tables.items()})
        print(f"saved {path}")
    return tables


def save_record(path: Path, **fields: object) -> dict:
    """Write ``fields`` as JSON to ``path``, stamped with the time measured (UTC); return what was written."""
    record = {"measured": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), **fields}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=1) + "\n")
    return record


def run_table(model_names: Sequence[str], batch: int = 1, repeats: int = 20, save: bool = True,
              mcpu: str | None = None) -> str:
    """Benchmark each model, print the table, and keep it (JSON and Markdown) in results/.

    ``mcpu`` imitates a CPU class this one can run (``znver3``: AVX2 on an AVX-512 CPU); the
    files are then named ``...-on-<this cpu>``, and ONNX Runtime, which cannot be held to the
    smaller class's vectors, is left out.
    """
    target = _target_for(mcpu)
    rows = []
    for name in model_names:
        print(f"benchmarking {name} ...", flush=True)
        rows.append(benchmark_model(name, batch, repeats, target))
    return _print_and_keep("benchmark", "Benchmark", {"rows": rows}, lambda result, summary: format_table(result["rows"], summary),
                           save, target)


# ------------------------------------------------------------------------- CLI


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m helpers.benchmark", description=__doc__.split("\n\n")[0])
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
    layers_cmd = sub.add_parser("layers", help="tuned TVM against freezing and ONNX Runtime, convolution by convolution")
    layers_cmd.add_argument("model", choices=models.available_models())
    layers_cmd.add_argument("--batch", type=int, default=1)
    layers_cmd.add_argument("--repeats", type=int, default=10)
    layers_cmd.add_argument("--no-save", action="store_true", help="print only; keep results/ as it is")
    layers_cmd.add_argument("--mcpu", default=None, help="build for a CPU class this one can run (AVX2: haswell, or znver3 on an AMD CPU)")
    table_cmd = sub.add_parser("table", help="eager, torch.compile (plain and frozen), ONNX Runtime, TVM untuned and tuned, side by side")
    table_cmd.add_argument("models", nargs="*", help=f"torchvision model names (default: {' '.join(BENCH_MODELS)})")
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
    dispatch_cmd = sub.add_parser("dispatch-run", help="eager against tuned TVM + oneDNN convs, as JSON (run by table)")
    dispatch_cmd.add_argument("model", choices=models.available_models())
    dispatch_cmd.add_argument("--batch", type=int, default=1)
    dispatch_cmd.add_argument("--repeats", type=int, default=20)
    dispatch_cmd.add_argument("--mcpu", default=None)
    args = parser.parse_args(argv)
    if args.command == "tune":
        print(tune_in_stages(args.model, args.stages, args.batch, work_dir=args.into, keep=args.keep,
                             seed_from=args.seed_from, target=_target_for(args.mcpu), layout=args.layout))
    elif args.command == "compare":
        timings = compare_databases(args.model, args.databases, args.batch, args.repeats, args.mcpu)
        best = peers.fastest(timings)
        by_label = {t.label: t for t in timings}
        print(f"{args.model}, batch {args.batch}, built for {args.mcpu or machine.cpu_name()}, on {machine.cpu_name()}:")
        for t in timings:
            print(f"  {t.label:<64} {t.median_ms:8.2f} ms (IQR {t.iqr_ms:.2f})"
                  + (f"  {by_label[best.pytorch].median_ms / t.median_ms:.2f}x {best.pytorch}" if t.label.startswith("TVM ") else ""))
    elif args.command == "layers":
        compare_layers(args.model, args.batch, args.repeats, args.mcpu, save=not args.no_save)
    elif args.command == "int8":
        run_int8(args.repeats, save=not args.no_save, mcpu=args.mcpu)
    elif args.command == "transformer":
        run_transformer(args.repeats, save=not args.no_save)
    elif args.command == "dispatch-run":
        print(json.dumps(dispatch_run(args.model, args.batch, args.repeats, args.mcpu)))
    else:
        run_table(args.models or list(BENCH_MODELS), args.batch, args.repeats, save=not args.no_save, mcpu=args.mcpu)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
