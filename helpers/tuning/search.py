"""The search: MetaSchedule's evolutionary search over every kernel of a module, under a budget, into a database.

``tune`` extracts the kernels (``tasks``), optionally replays another database's best schedules first
(``seed_with``: a record is a trace of schedule primitives, so it replays on any x86-64 CPU), then runs
MetaSchedule's task scheduler with the in-process builder (``builder``) and a progress bar (``progress``).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

import tvm
from tqdm import tqdm
from tvm import relax
from tvm.s_tir import meta_schedule as ms
from tvm.s_tir.meta_schedule.builder import BuilderInput
from tvm.s_tir.meta_schedule.logging import get_loggers_from_work_dir
from tvm.s_tir.meta_schedule.utils import fork_seed

from .. import nchwc
from ..errors import CourseError, TuningDatabaseError
from .builder import InProcessBuilder
from .intrinsics import import_tensor_intrinsics
from .progress import progress_bar, quiet_metaschedule
from .records import LOG_DIR, database_targets, load_database, mean_secs, measured_records, workloads
from .settings import budget, check_prepared_alike, tuned_layout, write_settings
from .tasks import is_static, num_threads, refuse_prepacking_symbolic, refuse_symbolic_shapes, tunable_tasks


# MetaSchedule's default evolutionary search keeps 512 candidates in its
# population and measures up to 64 of them per round: 8 per measured trial.
# Small budgets keep that ratio with a smaller population, because the search
# costs time in proportion to the population, whatever the budget: on two cores,
# one round for a small conv took about 3 s with 16 candidates, 13 s with 64.
POPULATION_PER_TRIAL = 8


MIN_POPULATION = 16


MAX_TRIALS_PER_ROUND = 64


# A hand-written space (``nchwc.search_space``: a row length and a number of channel blocks) holds a
# few dozen schedules. MetaSchedule stops a task after 5 rounds that find nothing new to measure, and
# each round evolves a population for seconds: with the generic search's population and generations,
# those empty rounds were most of EfficientNet-B0's tuning time in NCHW16c (5 x 2-8 s per kernel).
# A population that covers such a space, evolved once per round, costs a fraction of that.
TEMPLATE_POPULATION = 32


_RUNNER: ms.runner.LocalRunner | None = None


def local_runner() -> ms.runner.LocalRunner:
    """The ``LocalRunner`` every tuning run of this process measures with: its worker process (which
    times each candidate away from this one) is started once, not per run. Starting it imports TVM
    and PyTorch, about 3.5 s on two cores, more than a small tuning run's whole search."""
    global _RUNNER
    if _RUNNER is None:
        _RUNNER = ms.runner.LocalRunner()
    return _RUNNER


def tune(
    mod: tvm.IRModule,
    target: tvm.target.Target,
    work_dir: str | Path,
    max_trials_per_task: int,
    params: dict | None = None,
    progress: bool = True,
    max_trials_global: int | None = None,
    prepack: bool = False,
    seed: int | None = 0,
    seed_from: str | Path | None = None,
    space_for: Callable[[object], object] | None = None,
    runner: object | None = None,
    static_kernels_only: bool = False,
    layout: str = nchwc.PLAIN,
) -> Path:
    """Tune every kernel of a Relax module for ``target``; return the database's directory.

    Budget: a *trial* is one candidate schedule built and timed on this machine.
    Each fused kernel (task) gets at most ``max_trials_per_task`` trials, and the
    whole run at most ``max_trials_global`` (default: ``max_trials_per_task``
    times the number of tasks, so every task can use its full share; a smaller
    global budget lets MetaSchedule's gradient scheduler give the trials to the
    kernels that matter most). Tasks with few possible schedules (a reshape) stop
    early, so a run usually uses fewer trials than the budget.

    ``params`` (name to weight tensor) binds weights as constants before the
    kernels are extracted; leave it None for modules that take weights as inputs
    (as the course's imported models do), and bind the same way before
    ``apply_database`` if you use it, or the kernels will not match.

    The database (``database_workload.json``, ``database_tuning_record.json``)
    goes into ``work_dir``, and tuning into a directory that already has one adds
    to it. MetaSchedule's logs go to ``work_dir/logs``; ``progress`` shows a bar
    over the trials on stdout (stdout, not stderr: graders count stderr as failure).

    ``prepack`` tunes with weight prepacking (see the module's docstring); the
    choice is saved in ``work_dir`` and ``apply_database`` follows it.

    ``seed_from`` names another database, typically one tuned on another CPU:
    the best schedule it holds for each kernel is replayed and measured on this
    machine first (see ``seed_with``), so the search starts from the best known
    schedules instead of from scratch. The budget recorded in ``work_dir`` then
    counts the seed's trials per task too.

    ``seed`` fixes the search's random choices, so the same budget on the same
    machine explores the same candidates (the measured times still vary); pass
    ``None`` for a different search every run.

    ``space_for`` picks a search space per kernel (an extracted task in, a MetaSchedule
    space generator or ``"post-order-apply"`` out), e.g. Day 12's VNNI space for int8
    kernels only; by default every kernel gets the target's default space, except the blocked
    convolutions of a channel-blocked ``layout``: Day 7's schedule with its tile sizes searched
    (``nchwc.search_space``).

    ``runner`` measures the candidates: by default a ``LocalRunner`` on this machine; an
    ``RPCRunner`` measures them on the servers of an RPC tracker (``helpers.rpc_tuning``).

    ``layout`` (default NCHW) fuses the convolutions in another activation layout first, e.g.
    ``nchwc.layout_name(nchwc.block_for(target))`` for ``NCHW16c`` (``helpers.nchwc``); the choice is
    saved in ``work_dir`` with ``prepack``'s, and ``apply_database`` follows it.

    A module with a symbolic dimension is refused (MetaSchedule tunes static shapes only), unless
    ``static_kernels_only``: then the kernels whose shapes are all known are tuned and the others
    keep TVM's default code (Day 14's decoding step: its matmuls on one token are static, its
    attention over the past is not).
    """
    if max_trials_per_task < 1:
        raise ValueError(f"max_trials_per_task must be at least 1, got {max_trials_per_task}.")
    nchwc.block_of(layout)  # a clear error for an unknown layout, before anything runs
    if not static_kernels_only:
        refuse_symbolic_shapes(mod)
    refuse_prepacking_symbolic(mod, prepack)
    work_dir = Path(work_dir)
    work_dir.mkdir(parents=True, exist_ok=True)
    check_prepared_alike(work_dir, prepack, layout)
    import_tensor_intrinsics()
    if params:
        mod = relax.transform.BindParams("main", params)(mod)
    tasks = tunable_tasks(mod, target, prepack, layout)
    if static_kernels_only:
        tasks = [t for t in tasks if is_static(t.dispatched[0])]
    if not tasks:
        raise CourseError(
            "This module has no kernels to tune: after legalization and fusion it has no "
            "unscheduled TIR functions" + (" of static shape" if static_kernels_only else "") +
            ". Pass the imported Relax module (before tvm.compile)."
        )
    budget_trials = max_trials_per_task * len(tasks)
    if max_trials_global is not None:
        budget_trials = min(budget_trials, max_trials_global)
    seeded_from = None
    if seed_from is not None:
        if tuned_layout(seed_from) != layout:
            raise TuningDatabaseError(
                f"{seed_from} was tuned with layout={tuned_layout(seed_from)!r}: none of its kernels is one of "
                f"layout={layout!r}. Pass layout={tuned_layout(seed_from)!r} to seed from it."
            )
        seeded_from = _seed_with(tasks, target, work_dir, Path(seed_from), progress)
    write_settings(work_dir, prepack, 0, seeded_from, layout)  # before tuning: an interrupted run still says how it was prepared
    if space_for is None and nchwc.block_of(layout) is not None:
        space_for = nchwc.search_space
    with quiet_metaschedule():
        _run_tuning(tasks, target, work_dir, max_trials_per_task, budget_trials, progress, seed, space_for, runner)
    write_settings(work_dir, prepack, budget_trials / len(tasks), layout=layout)
    if not measured_records(load_database(work_dir), target):
        raise TuningDatabaseError(
            f"Tuning ran but no candidate was built and measured successfully, so {work_dir} "
            f"holds no usable record. The reasons are in {work_dir / LOG_DIR}/ (search for "
            "'error'); a machine under heavy load can make every measurement time out."
        )
    return work_dir


def _seed_with(tasks: list, target: tvm.target.Target, work_dir: Path, source: Path, progress: bool) -> dict:
    """Measure ``source``'s best schedule of each task on this machine, into ``work_dir``; describe the seed."""
    if source.resolve() == work_dir.resolve():
        raise CourseError(f"seed_from must name another database than the one being tuned ({work_dir}).")
    mods = [t.dispatched[0] for t in tasks]
    replayed, failed = seed_with(source, work_dir, target, mods, progress=progress)
    return {
        "database": source.name,
        "targets": database_targets(source),
        "trials_per_task": budget(source),
        "replayed": replayed,
        "failed": failed,
    }


def seed_with(
    source: str | Path,
    work_dir: str | Path,
    target: tvm.target.Target,
    kernels: list[tvm.IRModule] | None = None,
    progress: bool = True,
) -> tuple[int, int]:
    """Replay the best schedule of each kernel in ``source`` on this machine and keep what it measures.

    A tuning record is a trace of schedule primitives (split, reorder, vectorize,
    ...), not machine code: it can be replayed for another CPU. Each replayed
    schedule is built for ``target`` and timed here, and the record goes into
    ``work_dir``'s database with *this* machine's time and target, as if this
    machine had found it. MetaSchedule's search then starts from those
    schedules. ``kernels`` limits the replay to those workloads (default: all).
    Returns ``(replayed, failed)``: schedules measured, and those that failed to
    build or run here (they are left out).
    """
    source_db = load_database(source)
    wanted = ms.database.MemoryDatabase()  # matches kernels the way MetaSchedule does
    for kernel in kernels or []:
        wanted.commit_workload(kernel)
    best = [
        min(group, key=mean_secs)
        for workload, group in workloads(measured_records(source_db))
        if kernels is None or wanted.has_workload(workload.mod)
    ]
    if not best:
        raise TuningDatabaseError(f"{source} holds no measured schedule for any of these kernels: nothing to seed with.")
    import_tensor_intrinsics()
    inputs = []
    for record in best:
        sch = tvm.s_tir.Schedule(record.workload.mod)
        record.trace.apply_to_schedule(sch, remove_postproc=False)
        inputs.append(BuilderInput(sch.mod, target))
    built = [(record, result) for record, result in zip(best, InProcessBuilder().build(inputs)) if result.error_msg is None]
    runner = local_runner()
    bar = tqdm(total=len(best), desc=f"Measuring {len(best)} schedules from {Path(source).name} here",
               unit="kernel", file=sys.stdout, disable=not progress, dynamic_ncols=True)
    bar.update(len(best) - len(built))  # failed builds: nothing to measure
    work_dir = Path(work_dir)
    work_dir.mkdir(parents=True, exist_ok=True)
    db = ms.database.JSONDatabase(work_dir=str(work_dir))
    replayed = 0
    try:
        futures = runner.run(
            [ms.runner.RunnerInput(b.artifact_path, "cpu", r.args_info) for r, b in built]
        )
        for (record, _), future in zip(built, futures):
            result = future.result()
            if result.error_msg is None and result.run_secs:
                workload = db.commit_workload(record.workload.mod)
                db.commit_tuning_record(
                    ms.database.TuningRecord(record.trace, workload, result.run_secs, target, record.args_info)
                )
                replayed += 1
            bar.update(1)
    finally:
        bar.close()
    failed = len(best) - replayed
    return replayed, failed


def _run_tuning(
    tasks: list,
    target: tvm.target.Target,
    work_dir: Path,
    max_trials_per_task: int,
    budget: int,
    progress: bool,
    seed: int | None = None,
    space_for: Callable[[object], object] | None = None,
    runner: object | None = None,
) -> None:
    """MetaSchedule's ``tune_tasks`` with the in-process builder and a progress bar."""
    per_round = min(MAX_TRIALS_PER_ROUND, max_trials_per_task)
    population = min(512, max(MIN_POPULATION, POPULATION_PER_TRIAL * per_round))
    strategy = ms.search_strategy.EvolutionarySearch(
        population_size=population, init_min_unmeasured=min(50, population)
    )
    template_strategy = ms.search_strategy.EvolutionarySearch(
        population_size=TEMPLATE_POPULATION, init_min_unmeasured=TEMPLATE_POPULATION // 4, genetic_num_iters=1
    )
    # MetaSchedule's extracted_tasks_to_tune_contexts, with a search space per kernel
    loggers = get_loggers_from_work_dir(str(work_dir), [t.task_name for t in tasks])
    spaces = [space_for(task) if space_for else "post-order-apply" for task in tasks]
    contexts = [
        ms.TuneContext(mod=task.dispatched[0], target=task.target, space_generator=space,
                       search_strategy=template_strategy if isinstance(space, ms.space_generator.ScheduleFn) else strategy,
                       task_name=task.task_name, logger=logger, rand_state=rand_state,
                       num_threads=num_threads(target)).clone()
        for task, space, logger, rand_state in zip(tasks, spaces, loggers, fork_seed(seed, n=len(tasks)))
    ]
    weights = [task.weight for task in tasks]
    runner = runner if runner is not None else local_runner()
    with progress_bar(tasks, budget, disable=not progress) as callbacks:
        ms.tune_tasks(
            tasks=contexts,
            task_weights=weights,
            work_dir=str(work_dir),
            max_trials_global=budget,
            max_trials_per_task=max_trials_per_task,
            num_trials_per_iter=per_round,
            builder=InProcessBuilder(),
            runner=runner,
            database="json",
            measure_callbacks=callbacks,
            task_scheduler="gradient",
        )
