"""Building with a database: fuse a module, give each kernel its best schedule for the target, compile, load.

Weight prepacking (``prepack=True``, TVM's ``cpu_weight_prepack``) lets each tuned schedule choose the
memory layout of its weights (e.g. blocked for the vector lanes, as on Day 7). The build then has a
second function, ``main_transform_params``, that rewrites the weights into those layouts once;
``compile_tuned`` runs it when it loads the model, and keeps the build in the compile cache.
"""

from __future__ import annotations

from pathlib import Path

import tvm
import tvm_ffi
from tvm import relax

from .. import cache
from ..build import CompiledModel, device_for, load_executable, transform_params
from ..errors import TuningDatabaseError
from ..models import ImportedModel
from .intrinsics import import_tensor_intrinsics
from .records import RECORD_FILE, WORKLOAD_FILE, database_for_target, load_database, measured_records, workloads
from .settings import tuned_layout, tuned_with_prepacking
from .tasks import BUILD_CODE, extract_tasks, prepare, refuse_prepacking_symbolic


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
    db = database_for_target(load_database(work_dir), target, work_dir, transfer)
    if prepack is None:
        prepack = tuned_with_prepacking(work_dir)
    refuse_prepacking_symbolic(mod, prepack)
    import_tensor_intrinsics(work_dir / RECORD_FILE)  # records may replay tensorized schedules
    prepared = prepare(mod, target, prepack, tuned_layout(work_dir) if layout is None else layout)
    tasks = extract_tasks(prepared, target)
    found = [t.task_name for t in tasks if db.has_workload(t.dispatched[0])]
    if tasks and not found:
        names = ", ".join(t.task_name for t in tasks[:5]) + (", ..." if len(tasks) > 5 else "")
        raise TuningDatabaseError(
            f"0 of this module's {len(tasks)} kernels ({names}) are in the tuning database in "
            f"{work_dir}, which holds {len(workloads(measured_records(db)))} tuned kernel(s) "
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
    applies it (``tuned_build_key``), so a second call with
    the same ones loads it instead of replaying every schedule again.
    ``transfer`` lets kernels with no record for ``target`` use records tuned
    for another CPU (see ``apply_database``): check parity, and say so. ``layout``: see ``apply_database``.
    """
    work_dir = Path(work_dir)
    layout = tuned_layout(work_dir) if layout is None else layout
    device_for(target)  # no such device here: fail before the build
    load_database(work_dir)  # a clear error for a missing database, before the cache is asked
    cache_key = tuned_build_key(imported.mod, target, work_dir, prepack, transfer, layout)
    executable, _ = cache.load_or_build(
        "tuned", cache_key, lambda: build_tuned(imported.mod, target, work_dir, prepack, transfer, lift=True, layout=layout)
    )
    compiled = load_executable(executable, imported, target)
    if cache.path_for("tuned", cache_key).is_file():
        compiled.library = cache.path_for("tuned", cache_key)
    return transform_params(compiled)


def tuned_build_key(mod: tvm.IRModule, target: tvm.target.Target, work_dir: Path, prepack: bool | None,
                    transfer: bool, layout: str) -> str:
    """The compile cache's key of ``compile_tuned``'s build: the module, the target, the database's contents
    and settings, and every file of ``BUILD_CODE`` (the fusion passes, the database's use)."""
    return cache.key(
        "compile_tuned", str(target), tvm_ffi.structural_hash(mod), prepack,
        cache.file_digest([work_dir / WORKLOAD_FILE, work_dir / RECORD_FILE]),
        tuned_with_prepacking(work_dir), layout, transfer, cache.file_digest(BUILD_CODE),
    )
