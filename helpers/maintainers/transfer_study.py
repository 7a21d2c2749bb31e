"""How much tuning travels, measured: ``python -m helpers.maintainers.transfer_study mobilenet_v2 --top-up 8 --scratch 8 16``.

Takes the database ``databases.choose`` would transfer to this machine (one tuned on another CPU) and
builds the model in every arm ``helpers.transfer_study`` describes (untuned, transferred, transferred +
top-up, from scratch after each budget), checks each against PyTorch, times all of them and PyTorch eager
interleaved in one run, and keeps the record (with the minutes of tuning each cost on this machine) in
``results/transfer-<model>-<cpu>-<cores>cores.json``. The tuned databases stay in ``build/transfer-study/``.

``--mcpu znver3`` stands in for a CPU of another kind that this one can imitate
(``machine.imitated_target``): TVM builds and tunes for that CPU (e.g. AVX2 only on an AVX-512 machine)
and PyTorch is held to the same vector width. The instructions are that CPU's, the cores and caches
stay this one's: the file says so (``-on-<this cpu>`` in its name, ``imitated`` inside).
"""

from __future__ import annotations

import argparse
import os
import shutil
import time
from collections.abc import Sequence

import tvm

from .. import databases, machine, models, timing, tuning
from ..build import check_parity, compile_model
from ..config import REPO
from ..peers import EAGER
from ..results import results_path_here, save_record
from ..transfer_study import ARM_TRANSFERRED, ARM_UNTUNED, scratch_label, top_up_label

STUDY_ROOT = REPO / "build" / "transfer-study"


def run_study(model_name: str, top_up: int = 8, scratch: Sequence[int] = (8, 16), repeats: int = 30,
              target: tvm.target.Target | None = None) -> dict:
    """Build the model every way, time all of them against eager in one run, and keep the record.

    ``target`` defaults to this CPU's; ``machine.imitated_target`` studies a CPU of another kind on this one.
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

    add(ARM_UNTUNED, compile_model(imported, target), 0.0, 0)
    add(ARM_TRANSFERRED, source.compile(imported, target), 0.0, source.trials_per_task)
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
    imitated = target.attrs["mcpu"] != host
    record = save_record(
        path,
        model=model_name,
        machine=machine.describe().as_dict(),
        target=str(target),
        imitated={"on": host, "torch_isa": os.environ["ONEDNN_MAX_CPU_ISA"]} if imitated else None,
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
    parser = argparse.ArgumentParser(prog="python -m helpers.maintainers.transfer_study", description=__doc__.split(":")[0])
    parser.add_argument("model", choices=models.available_models())
    parser.add_argument("--top-up", type=int, default=8, help="trials per task of search after the transfer")
    parser.add_argument("--scratch", type=int, nargs="+", default=[8, 16], help="budgets from scratch (cumulative)")
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--mcpu", help="imitate a CPU of this kind (LLVM name, e.g. znver3) whose instructions this one has")
    args = parser.parse_args(argv)
    target = None
    if args.mcpu and args.mcpu != machine.cpu_name():
        try:
            target = machine.imitated_target(args.mcpu)
        except ValueError as err:
            parser.error(str(err))
    run_study(args.model, args.top_up, args.scratch, args.repeats, target)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
