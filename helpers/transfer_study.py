"""How much tuning travels: a database made on another CPU, used on this one.

``python -m helpers.transfer_study mobilenet_v2 --top-up 8 --scratch 8 16``
takes the database ``databases.choose`` would transfer to this machine (one
tuned on another CPU) and builds the model five ways:

* untuned (TVM's default schedules);
* transferred: the other CPU's schedules replayed here, no tuning at all;
* transferred + top-up: those schedules measured here, then a few trials per
  task of search starting from them (``tuning.tune(seed_from=...)``);
* from scratch, after each of the given budgets (trials per task).

Every build is checked against PyTorch, then all of them and PyTorch eager are
timed interleaved in one run, and the table (with the minutes of tuning each
cost on this machine) goes to ``results/transfer-<model>-<cpu>-<cores>cores.json``.
Day 8 plots it. The tuned databases stay in ``build/transfer-study/``.

``--mcpu znver3`` stands in for a CPU of another kind that this one can imitate:
TVM builds and tunes for that CPU (e.g. AVX2 only on an AVX-512 machine) and
PyTorch is held to the same vector width (``ATEN_CPU_CAPABILITY``,
``ONEDNN_MAX_CPU_ISA``). The instructions are that CPU's, the cores and caches
stay this one's: the file says so (``-on-<this cpu>`` in its name, ``emulated``
inside), and Day 8 prefers a study measured on real hardware.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import time
from collections.abc import Sequence
from pathlib import Path

import pandas as pd
import tvm
from tvm.target import codegen

from . import databases, machine, models, timing, tuning
from .benchmark import EAGER, REPO, RESULTS_ROOT, results_path_here, save_record
from .build import check_parity, compile_model

STUDY_ROOT = REPO / "build" / "transfer-study"
UNTUNED, TRANSFERRED = "untuned", "transferred"
# The widest vectors PyTorch may use, by the target's widest extension: (ATen's capability, oneDNN's ISA).
TORCH_ISA = (("avx512f", "avx512", "AVX512_CORE"), ("avx2", "avx2", "AVX2"))
AVX2_CPUS = ("znver3", "haswell")  # an AMD and an Intel AVX2 CPU class, tried in this order
# LLVM lists tuning hints among a CPU's features ("prefer-256-bit", "slow-3ops-lea"): no instruction depends on them.
TUNING_FLAGS = ("allow-light-", "branchfusion", "ermsb", "false-deps-", "fast-", "faster-", "idiv", "insert-vzeroupper",
                "lea-", "macrofusion", "no-bypass-delay", "pad-short-", "prefer-", "sbb-dep", "slow-", "tuning-", "use-")


def missing_instructions(mcpu: str) -> list[str]:
    """The instructions a CPU of kind ``mcpu`` has and this one lacks (empty: this CPU can imitate it)."""
    known = {str(name) for name in codegen.llvm_get_cpu_archlist(machine.cpu_target())}
    if mcpu not in known:
        raise ValueError(f"LLVM does not know a CPU called {mcpu!r}: use an LLVM name such as znver3 or haswell.")
    wanted = machine.cpu_features(tvm.target.Target({"kind": "llvm", "mcpu": mcpu}))
    return sorted(f for f in wanted - machine.cpu_features() if not f.startswith(TUNING_FLAGS))


def avx2_stand_in() -> str | None:
    """An AVX2 CPU class this one can imitate: ``znver3`` on an AMD CPU, ``haswell`` on an Intel one
    (neither vendor's CPUs have all of the other's instructions); None on a CPU without AVX2."""
    return next((mcpu for mcpu in AVX2_CPUS if not missing_instructions(mcpu)), None)


def emulated_target(mcpu: str) -> tvm.target.Target:
    """The target of a CPU of kind ``mcpu``, to be run on this one, with PyTorch held to its vector width.

    Only a CPU whose instructions this one has can be imitated (a Zen 3 on a Zen 5, not the reverse;
    a Haswell, not a Zen 3, on an Intel Xeon); PyTorch must not have run an operator yet, or it keeps
    the ISA it picked then.
    """
    missing = missing_instructions(mcpu)
    if missing:
        stand_in = avx2_stand_in()
        raise ValueError(f"This {machine.cpu_name()} lacks instructions {mcpu} has ({', '.join(missing[:5])}...): "
                         "it can only imitate a CPU whose instructions it has"
                         + (f" (for AVX2, try {stand_in})." if stand_in else "."))
    target = tvm.target.Target({"kind": "llvm", "mcpu": mcpu, "num-cores": machine.core_count()})
    wanted = machine.cpu_features(target)
    aten, onednn = next(((a, o) for feat, a, o in TORCH_ISA if feat in wanted), ("default", "SSE41"))
    os.environ["ATEN_CPU_CAPABILITY"], os.environ["ONEDNN_MAX_CPU_ISA"] = aten, onednn
    # Inductor's cache does not key its kernels by ATEN_CPU_CAPABILITY: served the host ISA's kernels,
    # torch.compile of MobileNetV2 under avx2 gave a relative error of 8e8 (measured on a Zen 5).
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(REPO / "build" / f"torchinductor-{aten}")
    return target


def top_up_label(trials: int) -> str:
    return f"transferred + {trials} trials/task"


def scratch_label(trials: int) -> str:
    return f"from scratch, {trials} trials/task"


def run_study(model_name: str, top_up: int = 8, scratch: Sequence[int] = (8, 16), repeats: int = 30,
              target: tvm.target.Target | None = None) -> dict:
    """Build the model every way, time all of them against eager in one run, and keep the record.

    ``target`` defaults to this CPU's; an ``emulated_target`` studies a CPU of another kind on this one.
    """
    host = machine.cpu_name()
    target = target or machine.cpu_target()
    model, x, imported = models.load_imported(model_name)
    foreign = [d for d in databases.candidates(model_name, target) if d.transferred]
    if not foreign:
        raise tuning.TuningDatabaseError(
            f"No database for {model_name} tuned on another CPU: nothing to transfer to {target.attrs['mcpu']}."
        )
    source = databases.rank(foreign, target)[0]
    work = STUDY_ROOT / f"{model_name}-{target.attrs['mcpu']}-{target.attrs['num-cores']}cores"
    shutil.rmtree(work, ignore_errors=True)
    builds, arms = {}, {}

    def add(label: str, compiled, minutes: float, trials: float | None) -> None:
        arms[label] = {"tuning_min": round(minutes, 2), "trials_per_task": trials,
                       "relative_error": check_parity(compiled, model, x)}
        builds[label] = compiled
        print(f"{label}: built, {minutes:.1f} min of tuning here", flush=True)

    add(UNTUNED, compile_model(imported, target), 0.0, 0)
    add(TRANSFERRED, source.compile(imported, target), 0.0, source.trials_per_task)
    layout = tuning.tuned_layout(source.path)  # the top-up replays its schedules; the scratch arm tunes the same form
    start = time.perf_counter()
    tuning.tune(imported.mod, target, work / "top-up", max_trials_per_task=top_up, prepack=True, seed_from=source.path,
                layout=layout)
    add(top_up_label(top_up), tuning.compile_tuned(imported, target, work / "top-up"),
        (time.perf_counter() - start) / 60, tuning.budget(work / "top-up"))
    spent, done = 0.0, 0
    for total in sorted(scratch):
        start = time.perf_counter()
        tuning.tune(imported.mod, target, work / "scratch", max_trials_per_task=total - done, prepack=True, layout=layout)
        spent += (time.perf_counter() - start) / 60
        done = total
        add(scratch_label(total), tuning.compile_tuned(imported, target, work / "scratch"), spent, total)
    runners = {EAGER: timing.torch_runner(model, x)}
    runners.update({label: timing.tvm_runner(compiled, x) for label, compiled in builds.items()})
    timings = timing.measure_engines(runners, warmup=3, repeats=repeats)
    by_label = {t.label: t for t in timings}
    eager = by_label[EAGER]
    rows = [{"arm": EAGER, "median_ms": eager.median_ms, "iqr_ms": eager.iqr_ms}]
    for label, arm in arms.items():
        t = by_label[label]
        rows.append({"arm": label, **arm, "median_ms": t.median_ms, "iqr_ms": t.iqr_ms,
                     "speedup_vs_eager": round(eager.median_ms / t.median_ms, 3)})
    path = results_path_here(target, "json", kind=f"transfer-{model_name}")
    emulated = target.attrs["mcpu"] != host
    record = save_record(
        path,
        model=model_name,
        machine=machine.describe().as_dict(),
        target=str(target),
        emulated={"on": host, "torch_isa": os.environ["ONEDNN_MAX_CPU_ISA"]} if emulated else None,
        source={"database": source.path.name, "tuned_for": source.tuned_for, "trials_per_task": source.trials_per_task},
        repeats=repeats,
        rows=rows,
    )
    for row in rows:
        print(f"{row['arm']:<34} {row['median_ms']:8.2f} ms (IQR {row['iqr_ms']:.2f})"
              f"  {row.get('speedup_vs_eager', 1.0):.2f}x eager  {row.get('tuning_min', 0):.1f} min", flush=True)
    print(f"saved {path}")
    return record


def study_label(study: dict) -> str:
    """The CPU a study was measured for, and the one it ran on when imitated: ``znver3 (imitated on a znver5)``."""
    mcpu = json.loads(study["target"])["mcpu"]
    return f"{mcpu} (imitated on a {study['emulated']['on']})" if study.get("emulated") else mcpu


def load_studies(model_name: str, root: Path = RESULTS_ROOT) -> list[dict]:
    """Every study of ``model_name`` kept in ``root``: those measured on real hardware first, each with its ``path``."""
    studies = [{**json.loads(p.read_text()), "path": p} for p in sorted(root.glob(f"transfer-{model_name}-*.json"))]
    return sorted(studies, key=lambda s: bool(s.get("emulated")))


def compare_studies(studies: Sequence[dict]) -> pd.DataFrame:
    """One row per study: the CPU, the database it received, and each build's speedup over eager there."""
    rows = []
    for s in studies:
        row = {"CPU": study_label(s), "database from": f"{s['source']['tuned_for']} ({s['source']['trials_per_task']}/task)"}
        row.update({r["arm"]: r["speedup_vs_eager"] for r in s["rows"] if "speedup_vs_eager" in r})
        rows.append(row)
    return pd.DataFrame(rows)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m helpers.transfer_study", description=__doc__.splitlines()[0])
    parser.add_argument("model", choices=models.available_models())
    parser.add_argument("--top-up", type=int, default=8, help="trials per task of search after the transfer")
    parser.add_argument("--scratch", type=int, nargs="+", default=[8, 16], help="budgets from scratch (cumulative)")
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--mcpu", help="imitate a CPU of this kind (LLVM name, e.g. znver3) whose instructions this one has")
    args = parser.parse_args(argv)
    target = None
    if args.mcpu and args.mcpu != machine.cpu_name():
        try:
            target = emulated_target(args.mcpu)
        except ValueError as err:
            parser.error(str(err))
    run_study(args.model, args.top_up, args.scratch, args.repeats, target)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
