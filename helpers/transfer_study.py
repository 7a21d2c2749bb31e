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
"""

from __future__ import annotations

import argparse
import shutil
import time
from collections.abc import Sequence
from pathlib import Path

from . import databases, machine, models, timing, tuning
from .benchmark import EAGER, REPO, results_path, save_record
from .build import check_parity, compile_model

STUDY_ROOT = REPO / "build" / "transfer-study"
UNTUNED, TRANSFERRED = "untuned", "transferred"


def top_up_label(trials: int) -> str:
    return f"transferred + {trials} trials/task"


def scratch_label(trials: int) -> str:
    return f"from scratch, {trials} trials/task"


def run_study(model_name: str, top_up: int = 8, scratch: Sequence[int] = (8, 16), repeats: int = 30) -> dict:
    """Build the model every way, time all of them against eager in one run, and keep the record."""
    target = machine.cpu_target()
    model = models.load_model(model_name)
    x = models.example_input(1)
    imported = models.import_to_relax(model, x)
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
    start = time.perf_counter()
    tuning.tune(imported.mod, target, work / "top-up", max_trials_per_task=top_up, prepack=True, seed_from=source.path)
    add(top_up_label(top_up), tuning.compile_tuned(imported, target, work / "top-up"),
        (time.perf_counter() - start) / 60, tuning.budget(work / "top-up"))
    spent, done = 0.0, 0
    for total in sorted(scratch):
        start = time.perf_counter()
        tuning.tune(imported.mod, target, work / "scratch", max_trials_per_task=total - done, prepack=True)
        spent += (time.perf_counter() - start) / 60
        done = total
        add(scratch_label(total), tuning.compile_tuned(imported, target, work / "scratch"), spent, total)
    runners = {EAGER: timing.torch_runner(model, x)}
    runners.update({label: timing.tvm_runner(compiled, x) for label, compiled in builds.items()})
    timings = timing.measure(runners, warmup=3, repeats=repeats)
    by_label = {t.label: t for t in timings}
    eager = by_label[EAGER]
    rows = [{"arm": EAGER, "median_ms": eager.median_ms, "iqr_ms": eager.iqr_ms}]
    for label, arm in arms.items():
        t = by_label[label]
        rows.append({"arm": label, **arm, "median_ms": t.median_ms, "iqr_ms": t.iqr_ms,
                     "speedup_vs_eager": round(eager.median_ms / t.median_ms, 3)})
    path = results_path(target, "json", kind=f"transfer-{model_name}")
    record = save_record(
        path,
        model=model_name,
        machine=machine.describe().as_dict(),
        target=str(target),
        source={"database": source.path.name, "tuned_for": source.tuned_for, "trials_per_task": source.trials_per_task},
        repeats=repeats,
        rows=rows,
    )
    for row in rows:
        print(f"{row['arm']:<34} {row['median_ms']:8.2f} ms (IQR {row['iqr_ms']:.2f})"
              f"  {row.get('speedup_vs_eager', 1.0):.2f}x eager  {row.get('tuning_min', 0):.1f} min", flush=True)
    print(f"saved {path}")
    return record


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m helpers.transfer_study", description=__doc__.splitlines()[0])
    parser.add_argument("model", choices=models.available_models())
    parser.add_argument("--top-up", type=int, default=8, help="trials per task of search after the transfer")
    parser.add_argument("--scratch", type=int, nargs="+", default=[8, 16], help="budgets from scratch (cumulative)")
    parser.add_argument("--repeats", type=int, default=30)
    args = parser.parse_args(argv)
    run_study(args.model, args.top_up, args.scratch, args.repeats)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
