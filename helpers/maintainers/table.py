"""The benchmark table: for each model, the peers, untuned and tuned TVM side by side (``make benchmark``).

For each model it measures the peers (eager, torch.compile, torch.compile with freezing, ONNX
Runtime and OpenVINO at float32: ``helpers.peers``; OpenVINO at its default precision too, named),
untuned TVM and tuned TVM (with the database ``databases.choose`` picks: this CPU's, else one
transferred from another CPU, and says which) side by side, names the fastest
PyTorch and the fastest engine tuned TVM is held against, and writes the table with the machine it
came from to ``results/``. ``compare_databases`` times tuned TVM built with each of several databases
beside the peers: which database to ship, or which a CPU should get.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import torch
import tvm

from .. import databases, dispatch, kernels, machine, models, peers, timing, tuning
from ..build import check_parity, compile_model
from ..peers import COMPILED, EAGER, FROZEN, OPENVINO, ORT, TUNED, UNTUNED
from ..zoo import ZOO
from .report import UNRELIABLE_MARK, add_openvino_default, load_average, print_and_keep, records


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


def benchmark_model(model_name: str, batch: int = 1, repeats: int = 20, target: tvm.target.Target | None = None) -> dict:
    """One row of the table: every backend on one model, timed interleaved in one run.

    The peers are ``helpers.peers``' (ONNX Runtime left out, with the reason in ``missing``, when the
    model does not export); a backend whose timing is unreliable is measured once more. Tuned TVM
    uses the database ``databases.choose`` picks (this CPU's, else one transferred from another CPU,
    labelled as such in the row); it is left out (None) only when no database exists for the model
    at all: its absence is part of the answer, not an error. Nothing is tuned here. ``target``
    (default: this CPU's) may be an imitated CPU class (``machine.imitated_target``).
    """
    target = target or machine.cpu_target()
    model, x, imported = models.load_imported(model_name, batch)
    imitated = machine.is_imitated(target)
    found = peers.peers(model, x, with_onnx_runtime=not imitated)
    runners = dict(found.runners)
    lower_precision = {} if imitated else add_openvino_default(runners, model, x, found.exported)  # bf16 where the CPU has it
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
    load = load_average()
    timings = timing.measure_engines(runners, batch=batch, warmup=3, repeats=repeats)
    row = {"model": model_name, "batch": batch, "compile_s": {k: round(v, 1) for k, v in found.compile_s.items()},
           "missing": found.missing, "trials_per_task": trials, "database": label,
           "threads": {"TVM": kernels.threads(), "PyTorch": torch.get_num_threads()},
           "lower_precision": lower_precision}
    row.update(records(timings))
    row["load_average"] = [load, load_average()]
    if TUNED in runners:
        row.update(_dispatch_run_in_its_own_process(model_name, batch, repeats, target))
    return row


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
    target = machine.target_for(mcpu)
    model, x, imported = models.load_imported(model_name, batch)
    return time_databases(model, x, imported, paths, target, repeats, imitated=machine.is_imitated(target))


def dispatch_run(model_name: str, batch: int = 1, repeats: int = 20, mcpu: str | None = None) -> dict[str, dict]:
    """Eager and PyTorch with freezing against tuned TVM with its dense convolutions on oneDNN
    (weights prepacked, epilogues fused: the form freezing runs), interleaved in this process.

    Run it in a process whose TVM pool does not spin (``SPIN_ENV`` set to 0 before TVM first runs
    parallel code): ``benchmark_model`` starts one for it. Freezing is left out on an imitated CPU
    class, as in the main table's peers (its Inductor cache would be the host's).
    """
    target = machine.target_for(mcpu)
    model, x, imported = models.load_imported(model_name, batch)
    database = databases.choose(model_name, imported, target, batch, tune_if_missing=False)
    dispatched = dispatch.compile_dispatched(imported, target, database=database, prepack=True)
    check_parity(dispatched, model, x)
    found = peers.peers(model, x, which=[] if machine.is_imitated(target) else [FROZEN])
    renamed = {EAGER: EAGER_BESIDE_DISPATCHED, FROZEN: FROZEN_BESIDE_DISPATCHED}
    runners = {renamed[label]: run for label, run in found.runners.items()}
    timings = timing.measure_engines({**runners, DISPATCHED: timing.tvm_runner(dispatched, x)},
                                     batch=batch, warmup=3, repeats=repeats)
    return records(timings)


def _dispatch_run_in_its_own_process(model_name: str, batch: int, repeats: int,
                                     target: tvm.target.Target) -> dict[str, dict]:
    command = [sys.executable, "-m", "helpers.maintainers.benchmark", "dispatch-run", model_name,
               "--batch", str(batch), "--repeats", str(repeats), "--mcpu", str(target.attrs["mcpu"])]
    done = subprocess.run(command, capture_output=True, text=True, env={**os.environ, SPIN_ENV: "0"})
    if done.returncode != 0:
        print(f"{model_name}: the dispatch run failed: {done.stderr.strip().splitlines()[-1:]}", flush=True)
        return {}
    return json.loads(done.stdout.strip().splitlines()[-1])


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

    def lower_precision(row):
        """OpenVINO at its default precision where that is not float32: label, time, error against eager."""
        found = row.get("lower_precision") or {}
        return "; ".join(f"{peers.precision_of(label)} {cell(row, label)}, error {error:.1e}" for label, error in found.items()) or "—"

    threads = {f"TVM {r['threads']['TVM']}, PyTorch {r['threads']['PyTorch']}" for r in rows if "threads" in r}
    lines = [
        f"Machine: {machine_summary}",
        *(f"Threads: {t}" for t in sorted(threads)),
        "",
        "| model | batch | eager ms | torch.compile ms | torch.compile (freezing) ms | ONNX Runtime ms | OpenVINO ms "
        "| TVM untuned ms | TVM tuned ms | tuned vs fastest PyTorch | tuned vs fastest engine | tuned vs eager "
        "| untuned vs eager | tuned + oneDNN convs ms | + oneDNN convs vs eager | + oneDNN convs vs freezing "
        "| OpenVINO's default precision ms | trials/task | database |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: "
        "| ---: | ---: | --- |",
    ]
    for row in rows:
        r = ratios(row)
        lines.append(
            f"| {row['model']} | {row['batch']} | {cell(row, EAGER)} | {cell(row, COMPILED)} | {cell(row, FROZEN)} "
            f"| {cell(row, ORT)} | {cell(row, OPENVINO)} | {cell(row, UNTUNED)} | {cell(row, TUNED, 'no database')} "
            f"| {ratio(row, r['tuned_vs_fastest_pytorch'], r['fastest_pytorch'], TUNED, named=True)} "
            f"| {ratio(row, r['tuned_vs_fastest_engine'], r['fastest_engine'], TUNED, named=True)} "
            f"| {ratio(row, r['tuned_vs_eager'], EAGER, TUNED)} | {ratio(row, r['untuned_vs_eager'], EAGER, UNTUNED)} "
            f"| {cell(row, DISPATCHED, 'no database')} "
            f"| {ratio(row, r['dispatched_vs_eager'], EAGER_BESIDE_DISPATCHED, DISPATCHED)} "
            f"| {ratio(row, r['dispatched_vs_frozen'], FROZEN_BESIDE_DISPATCHED, DISPATCHED)} "
            f"| {lower_precision(row)} | {row['trials_per_task'] or '—'} | {row.get('database') or '—'} |"
        )
    lines += ["", "Medians of interleaved runs, interquartile range in brackets; speedup > 1 means faster.",
              f"{UNRELIABLE_MARK.strip()} marks a timing (or a speedup built on one) whose interquartile range is over "
              f"{timing.UNRELIABLE_SPREAD:.0%} of its median even after measuring it again: noise, not a result.",
              "Every engine computes in float32 but the last column's. The fastest PyTorch is the fastest of eager, "
              "torch.compile and torch.compile with freezing; the fastest engine adds ONNX Runtime and OpenVINO (at "
              "float32: INFERENCE_PRECISION_HINT f32). A peer not measured (—) does not compete.",
              "OpenVINO's default precision, where it is not float32 (bf16 on a CPU with bfloat16 instructions), is "
              "what a deployer gets without asking: timed in the same run, with its relative error against float32 "
              "eager, and not a float32 result.",
              *(f"{label} missing for {row['model']}: {reason}" for row in rows
                for label, reason in row.get("missing", {}).items()),
              f"Tuned + oneDNN convs (Day 13's dispatch: weights prepacked for oneDNN once, BatchNorm folded, "
              f"ReLU and shortcut add fused as oneDNN post-ops) is timed against eager and torch.compile with "
              f"freezing in a process of its own, with TVM's pool not spinning ({SPIN_ENV}=0); its speedups "
              f"are over that run's eager and freezing."]
    return "\n".join(lines)


def run_table(model_names: Sequence[str] = ZOO, batch: int = 1, repeats: int = 20, save: bool = True,
              mcpu: str | None = None) -> str:
    """Benchmark each model, print the table, and keep it (JSON and Markdown) in results/.

    ``mcpu`` imitates a CPU class this one can run (``znver3``: AVX2 on an AVX-512 CPU); the
    files are then named ``...-on-<this cpu>``, and ONNX Runtime, which cannot be held to the
    smaller class's vectors, is left out.
    """
    target = machine.target_for(mcpu)
    rows = []
    for name in model_names:
        print(f"benchmarking {name} ...", flush=True)
        rows.append(benchmark_model(name, batch, repeats, target))
    return print_and_keep("benchmark", "Benchmark", {"rows": rows}, lambda result, summary: format_table(result["rows"], summary),
                           save, target)
