"""Tune a Relax module with MetaSchedule, then build it from the tuning database.

Three things about MetaSchedule in TVM 0.27 shape this module:

* ``LocalBuilder`` builds every batch of candidates in a fresh pool of worker
  processes, and each worker imports ``tvm.s_tir.tensor_intrin`` (about 30 s on
  a small machine), so builds hit the 30 s builder timeout and most candidates
  fail. ``InProcessBuilder`` builds each candidate in a fork of this process
  instead (the imports come with it: milliseconds each), and stops one that hangs.
* Importing ``tvm.s_tir.tensor_intrin`` at all (MetaSchedule's ``TuneContext``
  does it) is slow because TVMScript's parser calls ``inspect.stack()`` for every
  kernel it parses, and ``inspect`` rescans ``sys.modules`` for every stack frame
  that is not a module file. With torch imported that takes 40 s or more; the
  import here memoises that lookup and takes a few seconds.
* ``MetaScheduleApplyDatabase`` looks records up by workload only: it would apply
  a database tuned for another CPU without a word. ``apply_database`` keeps only
  the records tuned for the target you build for, and says so when there are none,
  unless asked to *transfer* them (``transfer=True``): a record is a trace of
  schedule primitives, so it replays on any x86-64 CPU, and the build is then
  checked for parity and labelled as transferred. ``tune(seed_from=...)`` goes
  one step further: it replays another database's best schedules, measures them
  on this machine, and starts its search from them.

A tuning directory (``work_dir``) holds MetaSchedule's two JSON files,
``database_workload.json`` (the kernels) and ``database_tuning_record.json``
(the measured schedules, each with the target it was tuned for), ``logs/``
with MetaSchedule's own per-task logs, and ``course_tuning.json``: how the
kernels were prepared (with or without weight prepacking), so that applying the
database prepares them the same way, and the budget it was tuned with (trials
per task, whether in quick mode, and what it was seeded from), so that a test
run's tiny database is never mistaken for a real one.

Weight prepacking (``prepack=True``, TVM's ``cpu_weight_prepack``) lets each
tuned schedule choose the memory layout of its weights (e.g. blocked for the
vector lanes, as on Day 7). The build then has a second function,
``main_transform_params``, that rewrites the weights into those layouts once;
``compile_tuned`` runs it when it loads the model.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import json
import logging
import math
import os
import re
import select
import shutil
import signal
import sys
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path

import tvm
import tvm_ffi
from tqdm import tqdm
from tvm import relax
from tvm.ir.utils import derived_object
from tvm.s_tir import meta_schedule as ms
from tvm.s_tir.meta_schedule.builder import BuilderInput, BuilderResult, PyBuilder, local_builder
from tvm.s_tir.meta_schedule.logging import get_loggers_from_work_dir
from tvm.s_tir.meta_schedule.measure_callback import PyMeasureCallback
from tvm.s_tir.meta_schedule.utils import fork_seed

from . import cache, config, nchwc
from .build import CompiledModel, device_for, fuse, load_executable
from .errors import CourseError, TuningDatabaseError
from .models import ImportedModel

WORKLOAD_FILE = "database_workload.json"
RECORD_FILE = "database_tuning_record.json"
LOG_DIR = "logs"
SETTINGS_FILE = "course_tuning.json"
# the code that fuses a module into kernels: a database's kernels are found by the form it gives them
_FUSION_CODE = [Path(__file__), Path(__file__).with_name("build.py"), Path(__file__).with_name("nchwc.py")]

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
# A measurement slower than this is MetaSchedule's marker for a failed candidate.
FAILED_RUN_SECS = 1e9
MS_LOGGER = "tvm.s_tir.meta_schedule"


# --------------------------------------------------------------------------- setup


@contextlib.contextmanager
def _memoised_frame_modules() -> Iterator[None]:
    """Let ``inspect.getmodule`` remember frames whose file is not a module.

    For such frames (``<frozen importlib._bootstrap>``, a notebook cell) the
    standard library rescans all of ``sys.modules`` on every call; the answer
    for a given file name cannot change while one import runs.
    """
    original = inspect.getmodule
    seen: dict[str, object] = {}

    def getmodule(obj, _filename=None):
        if _filename is None or not inspect.isframe(obj):
            return original(obj, _filename)
        if _filename not in seen:
            seen[_filename] = original(obj, _filename)
        return seen[_filename]

    inspect.getmodule = getmodule
    try:
        yield
    finally:
        inspect.getmodule = original


@functools.cache
def import_tvm_tensor_intrinsics() -> None:
    """Import ``tvm.s_tir.tensor_intrin`` once, in seconds rather than most of a minute.

    MetaSchedule needs the tensor intrinsics registered (its x86 rules name the
    AVX-512 VNNI ones) and imports them itself when it first creates a task.
    """
    with _memoised_frame_modules():
        import tvm.s_tir.tensor_intrin  # noqa: F401  (registers the intrinsics)


_TENSORIZE = re.compile(r'\["Tensorize",\[[^\]]*\],\["([^"]+)"')


def import_tensor_intrinsics(records: Path | None = None) -> None:
    """The tensor intrinsics that tuning, or replaying ``records``, needs registered.

    The course's own int8 intrinsics (Day 12, ``helpers.int8``: VNNI and AVX2) always; TVM's own set
    for tuning, and for a records file only when it names one of them: importing
    TVM's set costs 5 to 10 s per process (the float32 databases name none).
    """
    from .int8 import AVX2_INTRIN, VNNI_INTRIN, register_avx2_intrinsic, register_vnni_intrinsic  # (int8 imports this module)

    named = None if records is None else set(_TENSORIZE.findall(Path(records).read_text()))
    if named is None or named - {VNNI_INTRIN, AVX2_INTRIN}:
        import_tvm_tensor_intrinsics()
    register_vnni_intrinsic()
    register_avx2_intrinsic()


BUILD_TIMEOUT_S = 60.0


def _build_and_export(build_input: BuilderInput) -> str:
    """``LocalBuilder``'s build and export of one candidate: the path of its shared library."""
    module = local_builder.default_build(build_input.mod, build_input.target, None)
    return local_builder.default_export(module)


def _build_in_fork(build_input: BuilderInput, timeout_s: float) -> BuilderResult:
    """Build one candidate in a fork of this process and give it ``timeout_s`` seconds.

    The fork starts with everything this process imported (no 30 s import), and it can be killed: one
    candidate of a convolution once spent over 12 minutes in LLVM's code generation, in this process,
    and stopped the whole search with it.
    """
    read_end, write_end = os.pipe()
    with warnings.catch_warnings():  # Python 3.12 warns about forking a process that has threads
        warnings.simplefilter("ignore", DeprecationWarning)
        pid = os.fork()
    if pid == 0:  # the child: build, report on the pipe, leave without running the parent's clean-up
        os.close(read_end)
        try:
            message = "ok:" + _build_and_export(build_input)
        except BaseException as err:  # reported to the parent, which marks the candidate failed
            message = f"error:{type(err).__name__}: {err}"
        with os.fdopen(write_end, "w") as pipe:
            pipe.write(message)
        os._exit(0)
    os.close(write_end)
    message = None
    try:
        with os.fdopen(read_end) as pipe:
            if select.select([pipe], [], [], timeout_s)[0]:
                message = pipe.read()
    finally:  # a build past its time, or an interrupted search, leaves no build running
        if message is None:
            os.kill(pid, signal.SIGKILL)
        _, status = os.waitpid(pid, 0)
    if message is None:
        return BuilderResult(None, f"InProcessBuilder: the build took over {timeout_s:g} s and was stopped")
    if message.startswith("ok:"):
        return BuilderResult(message[3:], None)
    if not message:
        return BuilderResult(None, f"InProcessBuilder: the build process died (wait status {status})")
    return BuilderResult(None, "InProcessBuilder: " + message[len("error:"):])


@derived_object
class InProcessBuilder(PyBuilder):
    """A MetaSchedule builder that builds candidates in this process, or a fork of it, with a time limit.

    Same build and export as ``LocalBuilder`` (``default_build``, ``default_export``), without the
    worker pool that makes every batch pay a 30 s import and time out: each candidate is built in a
    fork of this process (the imports come with it, a few milliseconds each), which is stopped after
    ``timeout_s`` seconds, as ``LocalBuilder`` stops its workers. Where there is no ``fork``
    (Windows), or with ``timeout_s=None``, it builds here, with no limit. A failed build becomes a
    failed candidate, as with ``LocalBuilder``; the measurement still runs in ``LocalRunner``'s separate
    process, so a crashing kernel cannot take the notebook kernel down.
    """

    def __init__(self, timeout_s: float | None = BUILD_TIMEOUT_S) -> None:
        super().__init__()
        self.timeout_s = timeout_s if hasattr(os, "fork") else None

    def build(self, build_inputs: list[BuilderInput]) -> list[BuilderResult]:
        import_tensor_intrinsics()
        if self.timeout_s is not None:
            return [_build_in_fork(build_input, self.timeout_s) for build_input in build_inputs]
        results = []
        for build_input in build_inputs:
            try:
                results.append(BuilderResult(_build_and_export(build_input), None))
            except Exception as err:  # a bad candidate must not stop the search
                results.append(BuilderResult(None, f"InProcessBuilder: {type(err).__name__}: {err}"))
        return results


@derived_object
class _ProgressCallback(PyMeasureCallback):
    """Advance a tqdm bar by the number of candidates measured in each round."""

    def __init__(self, bar: tqdm, task_names: list[str]) -> None:
        super().__init__()
        self.bar = bar
        self.task_names = task_names
        self.measured = 0
        self.failed = 0

    def apply(self, task_scheduler, task_id, measure_candidates, builder_results, runner_results) -> None:
        count = len(measure_candidates)
        failed = sum(
            1
            for built, ran in zip(builder_results, runner_results)
            if built.error_msg is not None or ran.error_msg is not None or not ran.run_secs
        )
        self.measured += count
        self.failed += failed
        self.bar.set_postfix_str(f"{self.task_names[int(task_id)][:40]}, {self.failed} failed", refresh=False)
        self.bar.update(count)


# ------------------------------------------------------------------ preparation


def _prepare(mod: tvm.IRModule, target: tvm.target.Target, prepack: bool, layout: str = nchwc.PLAIN) -> tvm.IRModule:
    """Legalize and fuse the module into the TIR kernels that tuning works on.

    ``tune`` and ``apply_database`` must run the same passes: database records
    are found by the exact (structural) form of each fused kernel. With
    ``prepack``, each kernel's weight buffers are marked layout-free, so a
    schedule may store them in whatever layout suits it. ``layout`` is the
    convolutions' activation layout (``helpers.nchwc``).
    """
    if not cache.enabled():
        return _prepare_now(mod, target, prepack, layout)
    # Folding the constants (BatchNorm's statistics) builds and runs a small kernel per constant:
    # about 9 s for any of the course's CNNs, paid by each tuning, task table and tuned build. Kept.
    code = cache.file_digest(_FUSION_CODE)
    key = cache.key("prepared", tvm_ffi.structural_hash(mod), str(target), prepack, layout, code)  # constants' values included
    folder = cache.load_or_compute_files(
        "prepared", key,
        lambda out: (out / "module.json").write_text(tvm.ir.save_json(_prepare_now(mod, target, prepack, layout))),
    )
    return tvm.ir.load_json((folder / "module.json").read_text())


def _prepare_now(mod: tvm.IRModule, target: tvm.target.Target, prepack: bool, layout: str) -> tvm.IRModule:
    fused = fuse(mod, target, layout)
    fused = relax.transform.AttachAttrLayoutFreeBuffers()(fused) if prepack else fused
    return fused if nchwc.block_of(layout) is None else nchwc.schedule_blocked_elementwise(fused)


def _check_prepared_alike(work_dir: Path, prepack: bool, layout: str = nchwc.PLAIN) -> None:
    """Refuse to add kernels prepared one way to a database of kernels prepared another way."""
    if not (work_dir / SETTINGS_FILE).is_file():
        return
    if _read_settings(work_dir).get("prepack") != prepack:
        raise TuningDatabaseError(
            f"{work_dir} holds a database tuned with prepack={not prepack}; its kernels "
            f"differ from those of prepack={prepack}. Tune into another directory."
        )
    if tuned_layout(work_dir) != layout:
        raise TuningDatabaseError(
            f"{work_dir} holds a database tuned with layout={tuned_layout(work_dir)!r}; its kernels "
            f"differ from those of layout={layout!r}. Tune into another directory."
        )


def _write_settings(work_dir: Path, prepack: bool, trials_per_task: float, seeded_from: dict | None = None,
                    layout: str = nchwc.PLAIN) -> None:
    """Record how the kernels were prepared and add this run's budget to the database's."""
    _check_prepared_alike(work_dir, prepack, layout)
    settings = _read_settings(work_dir)
    settings["prepack"] = prepack
    if layout != nchwc.PLAIN:  # databases from before layouts were recorded are NCHW
        settings["layout"] = layout
    settings["trials_per_task"] = _round(settings.get("trials_per_task", 0) + trials_per_task)
    settings["quick"] = bool(settings.get("quick", False) or config.quick())
    if seeded_from is not None:
        settings["seeded_from"] = seeded_from
    _save_settings(work_dir, settings)


def _save_settings(work_dir: Path, settings: dict) -> None:
    (work_dir / SETTINGS_FILE).write_text(json.dumps(settings, indent=1) + "\n")


def _round(value: float) -> float | int:
    return int(value) if float(value).is_integer() else round(value, 2)


def _read_settings(work_dir: Path) -> dict:
    path = Path(work_dir) / SETTINGS_FILE
    return json.loads(path.read_text()) if path.is_file() else {}


def budget(work_dir: str | Path) -> float | None:
    """Trials per task behind a database: tuned into it, plus those of the database it was seeded from.

    None when the database does not say (one tuned before the course recorded budgets).
    A budget capped by ``max_trials_global`` counts as the trials per task it allowed on average.
    """
    settings = _read_settings(Path(work_dir))
    if "trials_per_task" not in settings:
        return None
    seeded = (settings.get("seeded_from") or {}).get("trials_per_task") or 0
    return _round(settings["trials_per_task"] + seeded)


def tuned_with_prepacking(work_dir: str | Path) -> bool:
    """True when the database was tuned with weight prepacking (its builds lift the weight arithmetic out of main)."""
    return bool(_read_settings(Path(work_dir)).get("prepack", False))


def tuned_layout(work_dir: str | Path) -> str:
    """The convolutions' activation layout the database's kernels were fused with: ``NCHW`` or ``NCHW16c``..."""
    return _read_settings(Path(work_dir)).get("layout", nchwc.PLAIN)


def tuned_in_quick_mode(work_dir: str | Path) -> bool:
    """True when any of the database's tuning ran in quick (test) mode: a tiny budget, not for learners."""
    return bool(_read_settings(Path(work_dir)).get("quick", False))


def _refuse_symbolic_shapes(mod: tvm.IRModule) -> None:
    """A clear error for a module with a symbolic dimension, before MetaSchedule fails on it obscurely.

    A candidate schedule is built and timed on inputs of one shape, so MetaSchedule tunes static
    kernels only (on a symbolic one it fails with "The random variable has been produced once").
    """
    names = _symbolic_names(mod)
    if names:
        raise CourseError(
            f"The module has symbolic dimensions ({', '.join(names)}): MetaSchedule tunes kernels of one static "
            "shape, since every candidate is timed on real inputs. Bind each to a size first (a bucket: "
            "relax.transform.BindSymbolicVars({name: size}), or transformer.bind_length) and tune each bucket; "
            "or tune only the kernels whose shapes are static (static_kernels_only=True)."
        )


def _symbolic_names(mod: tvm.IRModule) -> list[str]:
    return sorted({str(v) for func in mod.functions.values() if isinstance(func, relax.Function)
                   for v in relax.analysis.defined_symbolic_vars(func)})


def _refuse_prepacking_symbolic(mod: tvm.IRModule, prepack: bool) -> None:
    """Weight prepacking of a module with symbolic dimensions builds, runs, and computes wrong numbers.

    Measured on Day 14's decoding step (a symbolic past), its static kernels tuned with prepacking:
    relative error 1.07 against PyTorch; the same tuned without prepacking matches it.
    """
    names = _symbolic_names(mod)
    if prepack and names:
        raise CourseError(
            f"prepack=True on a module with symbolic dimensions ({', '.join(names)}): TVM's weight prepacking "
            "builds it but computes wrong numbers. Tune and apply it with prepack=False."
        )


def is_static(kernel: tvm.IRModule) -> bool:
    """Whether MetaSchedule can describe the kernel's arguments, i.e. every shape is known at compile time."""
    try:
        ms.arg_info.ArgInfo.from_prim_func(kernel["main"])
    except TypeError:  # "Cannot convert from type Array[index 2: ir.Var] to Array<ir.IntImm>"
        return False
    return True


def kernels_by_shape(mod: tvm.IRModule, target: tvm.target.Target, prepack: bool = True) -> dict[str, list[str]]:
    """The kernels tuning would see in ``mod``, split into ``static`` (tunable) and ``symbolic`` ones."""
    tasks = _tasks(_prepare(mod, target, prepack), target)
    return {"static": sorted(t.task_name for t in tasks if is_static(t.dispatched[0])),
            "symbolic": sorted(t.task_name for t in tasks if not is_static(t.dispatched[0]))}


def _tasks(prepared: tvm.IRModule, target: tvm.target.Target) -> list:
    """The module's kernels to tune (already scheduled ones have nothing to tune)."""
    tasks = ms.relax_integration.extract_tasks(prepared, target)
    return [t for t in tasks if not t.mod.attrs.get("tirx.is_scheduled", False)]


def _tunable_tasks(mod: tvm.IRModule, target: tvm.target.Target, prepack: bool, layout: str = nchwc.PLAIN) -> list:
    """The tasks ``tune`` tunes: with ``prepack``, those of the kernels a call runs (``_per_call_kernels``)."""
    prepared = _prepare(mod, target, prepack, layout)
    return _tasks(_per_call_kernels(prepared) if prepack else prepared, target)


def _per_call_kernels(prepared: tvm.IRModule) -> tvm.IRModule:
    """``prepared`` without the kernels that read weights only (the weights' layout rewrites, above all).

    A prepacked build lifts those into ``main_transform_params`` (``apply_database``), which runs once
    at load: tuning them is time spent on nothing a call runs (89 of EfficientNet-B0's 159 kernels in
    ``NCHW16c``). They keep TVM's default code.
    """
    lifted = relax.transform.LiftTransformParams()(prepared)
    per_call = tvm.IRModule({gv: f for gv, f in lifted.functions.items() if gv.name_hint != "main_transform_params"},
                            attrs=lifted.attrs)
    return relax.transform.DeadCodeElimination(entry_functions=["main"])(per_call)


def _num_threads(target: tvm.target.Target) -> int:
    cores = target.attrs.get("num-cores")
    return int(cores) if cores is not None else max(1, ms.utils.cpu_count(logical=False))


@contextlib.contextmanager
def quiet_metaschedule() -> Iterator[None]:
    """Keep MetaSchedule's progress tables in work_dir/logs and out of the notebook.

    Two channels to close. Its Python loggers: when MetaSchedule sets up the logs
    of a run it gives its console handler the logger's current level (WARNING
    here keeps warnings and errors visible), then sets the logger to DEBUG for the
    files. And in Jupyter it skips the loggers and ``display()``s a pandas table
    plus a C++ printout after every round; it asks ``get_ipython()`` (looked up in
    its ``utils`` module) whether it runs in a notebook, so the answer is no here.
    """
    ms_logger = logging.getLogger(MS_LOGGER)
    ms_logger.setLevel(logging.WARNING)
    # Each run adds a console and a file handler for its own work_dir. Close the previous run's:
    # MetaSchedule would keep writing to its old log file, and a handler it cannot name (pytest's
    # logging reconfigures loggers between tests) breaks its log set-up on the next run.
    for handler in list(ms_logger.handlers):
        ms_logger.removeHandler(handler)
        handler.close()
    ms_utils = ms.utils
    had_own = "get_ipython" in vars(ms_utils)
    previous = vars(ms_utils).get("get_ipython")
    ms_utils.get_ipython = lambda: None
    try:
        yield
    finally:
        if had_own:
            ms_utils.get_ipython = previous
        else:
            del ms_utils.get_ipython


def task_table(mod: tvm.IRModule, target: tvm.target.Target, prepack: bool = False) -> list[dict]:
    """The tasks ``tune`` would tune in ``mod``: one per distinct fused kernel a call runs.

    Each entry: ``task`` (the kernel's name), ``calls`` (how many times the model
    calls it: MetaSchedule's task weight), ``mflop`` (estimated arithmetic of
    one call) and ``mflop_total`` (times the calls). Sorted by total, largest
    first: the tasks where tuning can win the most time.
    """
    import_tensor_intrinsics()
    from tvm.s_tir.analysis import estimate_tir_flops

    rows = []
    for task in _tunable_tasks(mod, target, prepack):
        mflop = float(estimate_tir_flops(task.dispatched[0])) / 1e6
        rows.append(
            {"task": task.task_name, "calls": int(task.weight), "mflop": mflop, "mflop_total": mflop * int(task.weight)}
        )
    return sorted(rows, key=lambda r: -r["mflop_total"])


# ----------------------------------------------------------------------- tuning


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
        _refuse_symbolic_shapes(mod)
    _refuse_prepacking_symbolic(mod, prepack)
    work_dir = Path(work_dir)
    work_dir.mkdir(parents=True, exist_ok=True)
    _check_prepared_alike(work_dir, prepack, layout)
    import_tensor_intrinsics()
    if params:
        mod = relax.transform.BindParams("main", params)(mod)
    tasks = _tunable_tasks(mod, target, prepack, layout)
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
    _write_settings(work_dir, prepack, 0, seeded_from, layout)  # before tuning: an interrupted run still says how it was prepared
    if space_for is None and nchwc.block_of(layout) is not None:
        space_for = nchwc.search_space
    with quiet_metaschedule():
        _run_tuning(tasks, target, work_dir, max_trials_per_task, budget_trials, progress, seed, space_for, runner)
    _write_settings(work_dir, prepack, budget_trials / len(tasks), layout=layout)
    if not _measured_records(_load_database(work_dir), target):
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
    source_db = _load_database(source)
    wanted = ms.database.MemoryDatabase()  # matches kernels the way MetaSchedule does
    for kernel in kernels or []:
        wanted.commit_workload(kernel)
    best = [
        min(group, key=_mean_secs)
        for workload, group in _workloads(_measured_records(source_db))
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
    runner = ms.runner.LocalRunner()
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
        runner.pool.shutdown()
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
                       num_threads=_num_threads(target)).clone()
        for task, space, logger, rand_state in zip(tasks, spaces, loggers, fork_seed(seed, n=len(tasks)))
    ]
    weights = [task.weight for task in tasks]
    own_runner = runner is None
    runner = ms.runner.LocalRunner() if own_runner else runner
    try:
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
    finally:
        if own_runner:
            runner.pool.shutdown()


@contextlib.contextmanager
def progress_bar(tasks: list, trials: int, disable: bool = False) -> Iterator[list]:
    """A bar over ``trials`` measured candidates, for ``ms.tune_tasks(..., measure_callbacks=...)``.

    Yields MetaSchedule's default measure callbacks (they store each measurement in the database
    and train the cost model) plus one that advances the bar; on stdout, not stderr (graders count
    stderr as failure). Tasks with few possible schedules finish early: the bar then ends short.
    """
    bar = tqdm(total=trials, desc=f"Tuning {len(tasks)} tasks", unit="trial", file=sys.stdout,
               disable=disable, dynamic_ncols=True)
    try:
        yield [*ms.measure_callback.MeasureCallback.create("default"), _ProgressCallback(bar, [t.task_name for t in tasks])]
    finally:
        if bar.n < bar.total:
            bar.total = bar.n
            bar.refresh()
        bar.close()


# ------------------------------------------------------------------- databases


def _load_database(work_dir: str | Path) -> ms.database.JSONDatabase:
    """Open a tuning directory's JSON database, or say exactly what is missing."""
    work_dir = Path(work_dir)
    if not work_dir.is_dir():
        raise TuningDatabaseError(
            f"No tuning directory at {work_dir}. Tune first with tune(mod, target, "
            f"'{work_dir}', max_trials_per_task=...), or point work_dir at the directory "
            f"that holds {WORKLOAD_FILE} and {RECORD_FILE}."
        )
    missing = [name for name in (WORKLOAD_FILE, RECORD_FILE) if not (work_dir / name).is_file()]
    if missing:
        raise TuningDatabaseError(
            f"{work_dir} is not a complete tuning database: {' and '.join(missing)} "
            f"{'is' if len(missing) == 1 else 'are'} missing (a database is the pair "
            f"{WORKLOAD_FILE} + {RECORD_FILE}). Copy both files, or tune again into this directory."
        )
    for name in (WORKLOAD_FILE, RECORD_FILE):
        _check_json_lines(work_dir / name)
    import_tensor_intrinsics(work_dir / RECORD_FILE)  # records that tensorize name their intrinsic
    try:
        return ms.database.JSONDatabase(
            str(work_dir / WORKLOAD_FILE), str(work_dir / RECORD_FILE), allow_missing=False
        )
    except Exception as err:
        raise TuningDatabaseError(
            f"The tuning database in {work_dir} cannot be read ({type(err).__name__}: "
            f"{str(err).strip().splitlines()[-1] if str(err).strip() else err}). "
            "It may be truncated or from another TVM version: delete it and tune again."
        ) from err


def _check_json_lines(path: Path) -> None:
    """One JSON value per line, as MetaSchedule writes them; its C++ reader crashes the process on a blank line."""
    with open(path) as lines:
        for number, line in enumerate(lines, 1):
            try:
                json.loads(line)
            except ValueError:
                raise TuningDatabaseError(
                    f"line {number} of {path.name} in {path.parent} is not a JSON record "
                    f"({'blank' if not line.strip() else 'cut off or edited'}): the file was truncated or edited "
                    "by hand. Restore it (git checkout, or copy it again), or delete the directory and tune again."
                ) from None


def _mean_secs(record) -> float:
    secs = [float(s) for s in (record.run_secs or [])]
    return sum(secs) / len(secs) if secs else math.inf


def _succeeded(record) -> bool:
    secs = [float(s) for s in (record.run_secs or [])]
    return bool(secs) and all(math.isfinite(s) and s < FAILED_RUN_SECS for s in secs)


def _measured_records(db, target: tvm.target.Target | None = None) -> list:
    """Records with a successful measurement, for ``target`` only when given."""
    wanted = None if target is None else str(target)
    return [
        r
        for r in db.get_all_tuning_records()
        if _succeeded(r) and (wanted is None or str(r.target) == wanted)
    ]


def _target_difference(tuned: tvm.target.Target, target: tvm.target.Target) -> str:
    """The target attributes that differ, e.g. ``mcpu: 'znver5' here, 'skylake-avx512' in the database``."""
    ours, theirs = dict(target.export()), dict(tuned.export())
    keys = sorted(k for k in set(ours) | set(theirs) if ours.get(k) != theirs.get(k))
    return "; ".join(f"{k}: {ours.get(k)!r} in your target, {theirs.get(k)!r} in the database" for k in keys)


def _database_for_target(db, target: tvm.target.Target, work_dir: Path, transfer: bool = False):
    """An in-memory copy of the records to build with: those tuned for exactly this target.

    With ``transfer``, a kernel that has no record for this target takes the
    records tuned for other targets instead (the fastest of them will be replayed).
    """
    measured = _measured_records(db)
    if not measured:
        raise TuningDatabaseError(
            f"The tuning database in {work_dir} has no successful measurement in it. "
            "Tune again (see its logs/ for why the candidates failed)."
        )
    wanted = str(target)
    records = []
    for _, group in _workloads(measured):
        mine = [r for r in group if str(r.target) == wanted]
        records += mine or (group if transfer else [])
    if not records:
        tuned_for = {str(r.target): r.target for r in measured}
        diff = _target_difference(next(iter(tuned_for.values())), target)
        raise TuningDatabaseError(
            f"The tuning database in {work_dir} holds no records for your target. Records are "
            f"kept per workload and target, and these were tuned for {', '.join(sorted(tuned_for))} "
            f"({diff}). A schedule timed on another CPU (or with another core count) was chosen "
            "for that machine: tune again on this machine into a new directory, e.g. "
            "tune(mod, target, 'tuning_here', max_trials_per_task=...), or transfer the schedules "
            "knowingly with transfer=True (they replay on any x86-64 CPU; check parity, and say "
            "that the result was transferred)."
        )
    memory = ms.database.MemoryDatabase()
    workloads: list[tuple[object, object]] = []  # (workload in db, same workload in memory)
    for record in records:
        copy = next((m for w, m in workloads if w.same_as(record.workload)), None)
        if copy is None:
            copy = memory.commit_workload(record.workload.mod)
            workloads.append((record.workload, copy))
        memory.commit_tuning_record(_record_for(record, copy))
    return memory


def apply_database(
    mod: tvm.IRModule,
    target: tvm.target.Target,
    work_dir: str | Path,
    prepack: bool | None = None,
    transfer: bool = False,
    lift: bool = False,
    layout: str | None = None,
) -> tvm.IRModule:
    """Fuse ``mod`` into kernels and give each the best schedule tuned for ``target``.

    Only records tuned for this exact target are used (MetaSchedule's own pass
    would take the fastest record for a kernel whatever CPU it was tuned on),
    unless ``transfer`` is True: then a kernel with no record for this target
    replays the fastest one tuned for another target. Kernels with no record
    keep TVM's default, untuned code. ``prepack`` defaults to what the database
    was tuned with, and ``layout`` (the convolutions' layout) to the one it was tuned in
    (``tuned_layout``): a build whose convolutions go to a library asks for NCHW (see
    ``add_kernels_from``); with prepacking, the weight layout rewrites are split out of
    the kernels and lifted into ``main_transform_params``. With ``lift`` (always with ``prepack``), every
    kernel that reads weights only (a ``Linear``'s weight transposed for its matmul, an int8 weight
    quantized) is lifted into ``main_transform_params`` too: it runs once at load, not on every call.
    Raises ``TuningDatabaseError`` when the database is missing or unreadable,
    holds no record for ``target`` (and ``transfer`` is off), or has none of
    the module's kernels.
    """
    work_dir = Path(work_dir)
    db = _database_for_target(_load_database(work_dir), target, work_dir, transfer)
    if prepack is None:
        prepack = tuned_with_prepacking(work_dir)
    _refuse_prepacking_symbolic(mod, prepack)
    import_tensor_intrinsics(work_dir / RECORD_FILE)  # records may replay tensorized schedules
    prepared = _prepare(mod, target, prepack, tuned_layout(work_dir) if layout is None else layout)
    tasks = _tasks(prepared, target)
    found = [t.task_name for t in tasks if db.has_workload(t.dispatched[0])]
    if tasks and not found:
        names = ", ".join(t.task_name for t in tasks[:5]) + (", ..." if len(tasks) > 5 else "")
        raise TuningDatabaseError(
            f"0 of this module's {len(tasks)} kernels ({names}) are in the tuning database in "
            f"{work_dir}, which holds {len(_workloads(_measured_records(db)))} tuned kernel(s) "
            f"{'in all' if transfer else 'for your target'}. It was tuned for another model or input "
            "shape (kernels are matched "
            f"by their exact shapes), or with prepack={not prepack}. "
            "Tune this module: tune(mod, target, work_dir, ...)."
        )
    with target, db, tvm.transform.PassContext(opt_level=3):
        passes = [relax.transform.MetaScheduleApplyDatabase(enable_warning=False)]
        if prepack:
            passes.append(relax.transform.SplitLayoutRewritePreproc())
        if prepack or lift:
            passes += [relax.transform.LiftTransformParams(), relax.transform.FoldConstant()]
        return tvm.transform.Sequential(passes)(prepared)


def build_tuned(
    mod: tvm.IRModule,
    target: tvm.target.Target,
    work_dir: str | Path,
    prepack: bool | None = None,
    transfer: bool = False,
    lift: bool = False,
    layout: str | None = None,
) -> tvm.runtime.Executable:
    """Compile ``mod`` with its tuned kernels: fuse, apply the database, then ``tvm.compile``.

    Without prepacking or ``lift`` the result runs like any executable, with the same inputs
    and weights as the untuned build. With either, the weights must first go through
    ``main_transform_params``: ``compile_tuned`` does that for you.
    """
    applied = apply_database(mod, target, work_dir, prepack, transfer, lift, layout)
    return tvm.compile(applied, target=target, relax_pipeline="default")


def compile_tuned(
    imported: ImportedModel,
    target: tvm.target.Target,
    work_dir: str | Path,
    prepack: bool | None = None,
    transfer: bool = False,
    layout: str | None = None,
) -> CompiledModel:
    """Build ``imported`` with its tuned kernels and load it, weights prepacked if tuned so.

    Whatever reads the weights only (prepacking, a ``Linear``'s transposed weight: ``apply_database``'s
    ``lift``) goes to ``main_transform_params``, which runs once here, as a deployed model would run it
    once at start-up; the model is then called like any other. (Left in ``main``, TinyGPT's decoding
    step spent about 0.30 of its 0.47 ms transposing its weights, on the Intel Xeon.)
    The build is kept in the course's compile cache (``helpers.cache``), keyed by
    the module, the target, the database's contents and the code that fuses and
    applies it (this module and ``build``), so a second call with
    the same ones loads it instead of replaying every schedule again.
    ``transfer`` lets kernels with no record for ``target`` use records tuned
    for another CPU (see ``apply_database``): check parity, and say so. ``layout``: see ``apply_database``.
    """
    work_dir = Path(work_dir)
    layout = tuned_layout(work_dir) if layout is None else layout
    device_for(target)  # no such device here: fail before the build
    _load_database(work_dir)  # a clear error for a missing database, before the cache is asked
    cache_key = cache.key(
        "compile_tuned", str(target), tvm_ffi.structural_hash(imported.mod), prepack,
        cache.file_digest([work_dir / WORKLOAD_FILE, work_dir / RECORD_FILE]),
        tuned_with_prepacking(work_dir), layout, transfer,
        cache.file_digest(_FUSION_CODE),  # the fusion passes, the database's use
    )
    executable, _ = cache.load_or_build(
        "tuned", cache_key, lambda: build_tuned(imported.mod, target, work_dir, prepack, transfer, lift=True, layout=layout)
    )
    compiled = load_executable(executable, imported, target)
    if cache.path_for("tuned", cache_key).is_file():
        compiled.library = cache.path_for("tuned", cache_key)
    if _has_function(compiled.vm, "main_transform_params"):
        compiled.params = list(compiled.vm["main_transform_params"](compiled.params))
    return compiled


def _has_function(vm: relax.VirtualMachine, name: str) -> bool:
    try:
        vm[name]
    except (AttributeError, KeyError, RuntimeError, ValueError):
        return False
    return True


def _record_for(record, workload) -> ms.database.TuningRecord:
    """``record`` (its schedule, times and target) for ``workload`` as committed to another database."""
    return ms.database.TuningRecord(record.trace, workload, record.run_secs, record.target, record.args_info)


def prune_database(work_dir: str | Path, keep: int = 1) -> int:
    """Keep only the ``keep`` fastest measured records of each kernel; return how many remain.

    Building replays only the fastest record of each kernel, so a database to
    ship needs no more; the rest (failed and slower candidates, a few megabytes
    per hundred trials) only trains the cost model when tuning goes on.
    """
    if keep < 1:
        raise ValueError(f"keep must be at least 1, got {keep}.")
    work_dir = Path(work_dir)
    db = _load_database(work_dir)
    staging = work_dir / "pruning"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir()
    pruned = ms.database.JSONDatabase(work_dir=str(staging))
    kept = 0
    for workload, group in _workloads(_measured_records(db)):
        copy = pruned.commit_workload(workload.mod)
        for record in sorted(group, key=_mean_secs)[:keep]:
            pruned.commit_tuning_record(_record_for(record, copy))
            kept += 1
    del pruned
    for name in (WORKLOAD_FILE, RECORD_FILE):
        (staging / name).replace(work_dir / name)
    staging.rmdir()
    return kept


def add_kernels_from(work_dir: str | Path, source: str | Path) -> int:
    """Copy ``source``'s fastest record of each kernel that ``work_dir`` lacks; return how many kernels.

    A database tuned in channel blocks (``layout='NCHW16c'``) has no schedule for the NCHW kernels
    that a build with its convolutions dispatched to oneDNN (Day 13) leaves in TVM: pooling, the
    classifier, the element-wise work between two library calls. The NCHW database tuned on the same
    CPU has them. Both must be prepared alike (with or without prepacking), or the kernels never match.
    The copy is recorded in ``course_tuning.json`` (``kernels_from``), with the source's layout and budget.
    """
    work_dir, source = Path(work_dir), Path(source)
    if source.resolve() == work_dir.resolve():
        raise CourseError(f"add_kernels_from needs another database than {work_dir} to copy from.")
    if tuned_with_prepacking(source) != tuned_with_prepacking(work_dir):
        raise TuningDatabaseError(
            f"{source} was tuned with prepack={tuned_with_prepacking(source)} and {work_dir} with "
            f"prepack={tuned_with_prepacking(work_dir)}: their kernels are prepared differently and would never match."
        )
    into, theirs = _load_database(work_dir), _load_database(source)
    added = 0
    for workload, group in _workloads(_measured_records(theirs)):
        if into.has_workload(workload.mod):
            continue
        copy = into.commit_workload(workload.mod)
        into.commit_tuning_record(_record_for(min(group, key=_mean_secs), copy))
        added += 1
    settings = _read_settings(work_dir)
    settings.setdefault("kernels_from", []).append(
        {"database": source.name, "layout": tuned_layout(source), "trials_per_task": budget(source), "kernels": added}
    )
    _save_settings(work_dir, settings)
    return added


# --------------------------------------------------------------------- summary


def _workloads(records: list) -> list[tuple[object, list]]:
    """Group records by workload: [(workload, [records...]), ...]."""
    groups: list[tuple[object, list]] = []
    for record in records:
        group = next((g for w, g in groups if w.same_as(record.workload)), None)
        if group is None:
            groups.append((record.workload, [record]))
        else:
            group.append(record)
    return groups


def _kernel_label(workload) -> str:
    """A readable name for a workload: the compute blocks in its kernel."""
    blocks = [b for b in re.findall(r'T\.sblock\("([^"]+)"', workload.mod.script()) if b != "root"]
    return "+".join(blocks) or "kernel"


def database_targets(work_dir: str | Path) -> list[str]:
    """The targets a database's records were measured for (``database_summary``'s ``targets``), read fast.

    Straight from the records file, without building the database: MetaSchedule's reader parses
    every workload's TensorIR (EfficientNet-B0's file is 10 MB), about a second per database, and
    ``databases.candidates`` asks this of every database of a model in every notebook that picks one.
    A database that is not one (a file missing, a line cut off) raises ``TuningDatabaseError``.
    """
    work_dir = Path(work_dir)
    if not all((work_dir / name).is_file() for name in (WORKLOAD_FILE, RECORD_FILE)):
        _load_database(work_dir)  # raises, saying what is missing
    for name in (WORKLOAD_FILE, RECORD_FILE):
        _check_json_lines(work_dir / name)
    seen: dict[str, str] = {}
    with open(work_dir / RECORD_FILE) as lines:
        for line in lines:
            try:
                fields = json.loads(line)[1][2]  # [workload index, [trace, run_secs, target, args_info]]
                config = json.dumps(fields, sort_keys=True)
                if config not in seen:
                    seen[config] = str(tvm.target.Target(fields))
            except (IndexError, KeyError, TypeError, ValueError) as err:
                raise TuningDatabaseError(
                    f"{RECORD_FILE} in {work_dir} holds a record that is not MetaSchedule's ({type(err).__name__}): "
                    "delete the directory and tune again."
                ) from err
    return sorted(set(seen.values()))


def database_summary(work_dir: str | Path) -> dict:
    """What a tuning database holds and which targets it was tuned for.

    Use it to decide whether a shipped database fits this machine: its
    ``targets`` must include your target (see ``apply_database``). Returns
    ``workloads`` (tuned kernels), ``records`` (measured schedules, failed ones
    included), ``failed_records``, ``targets`` and ``mcpus`` (distinct, as
    strings), and ``kernels``: one entry per workload, slowest first, with its
    best measured latency in microseconds and the target of that record.
    """
    work_dir = Path(work_dir)
    db = _load_database(work_dir)
    records = db.get_all_tuning_records()
    measured = [r for r in records if _succeeded(r)]
    kernels = []
    for workload, group in _workloads(records):
        best = min((r for r in group if _succeeded(r)), key=_mean_secs, default=None)
        kernels.append(
            {
                "kernel": _kernel_label(workload),
                "records": len(group),
                "best_us": None if best is None else 1e6 * _mean_secs(best),
                "best_target": None if best is None else str(best.target),
            }
        )
    kernels.sort(key=lambda k: -(k["best_us"] or 0.0))
    targets = sorted({str(r.target) for r in records})
    return {
        "work_dir": str(work_dir),
        "workloads": len(kernels),
        "records": len(records),
        "failed_records": len(records) - len(measured),
        "targets": targets,
        "mcpus": sorted({str(r.target.attrs.get("mcpu", "")) for r in records} - {""}),
        "kernels": kernels,
    }
