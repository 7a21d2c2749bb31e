"""Tuning a model in stages, each measured against eager, into a database to ship
(``python -m helpers.maintainers.benchmark tune``).

After each stage (a cumulative budget in trials per task) the tuned build is checked against PyTorch and
timed against eager in one run, and the point goes to the curve beside the database
(``results.read_curve``), so Day 8 can show how long tuning takes to reach parity. ``ship`` prunes the
database to the fastest records per kernel, all a build needs.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import tvm

from .. import databases, machine, models, nchwc, timing, tuning
from ..build import CompiledModel, check_parity
from ..peers import EAGER, TUNED
from ..results import CURVE_FILE, read_curve


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
    ``target`` defaults to this CPU's; ``machine.imitated_target("znver3")`` tunes for
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
