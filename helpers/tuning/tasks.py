"""From a Relax module to the kernels tuning works on: preparation (legalize, fuse, prepack) and task extraction.

``tune`` and ``apply_database`` must prepare a module alike: database records are found by the exact
(structural) form of each fused kernel. ``BUILD_CODE`` lists the files whose code shapes a tuned build
(this preparation, applying a database, the intrinsics it may replay): the compile cache's keys digest
them, so that a change to any of them builds again (``tests/test_tuning_package.py``).
"""

from __future__ import annotations

from pathlib import Path

import tvm
import tvm_ffi
from tvm import relax
from tvm.s_tir import meta_schedule as ms

from .. import amx, cache, nchwc
from ..errors import CourseError
from .intrinsics import import_tensor_intrinsics

_HERE = Path(__file__).resolve().parent
# The code that turns a module and a database into a tuned build: a database's kernels are found by the form it
# gives them, and the build is what it makes of them. The compile cache's keys digest these files' contents.
BUILD_CODE = [
    _HERE / "tasks.py", _HERE / "apply.py", _HERE / "records.py", _HERE / "settings.py", _HERE / "intrinsics.py",
    _HERE.parent / "build.py", _HERE.parent / "nchwc.py", _HERE.parent / "int8.py", _HERE.parent / "bf16.py",
    _HERE.parent / "amx.py",
]


def prepare(mod: tvm.IRModule, target: tvm.target.Target, prepack: bool, layout: str = nchwc.PLAIN) -> tvm.IRModule:
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
    folder = cache.load_or_compute_files(
        "prepared", prepared_key(mod, target, prepack, layout),
        lambda out: (out / "module.json").write_text(tvm.ir.save_json(_prepare_now(mod, target, prepack, layout))),
    )
    return tvm.ir.load_json((folder / "module.json").read_text())


def prepared_key(mod: tvm.IRModule, target: tvm.target.Target, prepack: bool, layout: str) -> str:
    """The compile cache's key of ``prepare``: the module (its constants' values included), the target, the
    preparation asked for, and every file of ``BUILD_CODE``."""
    return cache.key("prepared", tvm_ffi.structural_hash(mod), str(target), prepack, layout, cache.file_digest(BUILD_CODE))


def _prepare_now(mod: tvm.IRModule, target: tvm.target.Target, prepack: bool, layout: str) -> tvm.IRModule:
    fused = nchwc.fuse(mod, target, layout)
    fused = relax.transform.AttachAttrLayoutFreeBuffers()(fused) if prepack else fused
    tiles = amx.kinds_on(target)
    if tiles:  # bf16 and int8 convolutions on AMX tiles, scheduled by hand, not tuned
        fused = amx.schedule_products(fused, tiles)
    return fused if nchwc.block_of(layout) is None else nchwc.schedule_blocked_elementwise(fused)


def refuse_symbolic_shapes(mod: tvm.IRModule) -> None:
    """A clear error for a module with a symbolic dimension, before MetaSchedule fails on it obscurely.

    A candidate schedule is built and timed on inputs of one shape, so MetaSchedule tunes static
    kernels only (on a symbolic one it fails with "The random variable has been produced once").
    """
    names = symbolic_names(mod)
    if names:
        raise CourseError(
            f"The module has symbolic dimensions ({', '.join(names)}): MetaSchedule tunes kernels of one static "
            "shape, since every candidate is timed on real inputs. Bind each to a size first (a bucket: "
            "relax.transform.BindSymbolicVars({name: size}), or transformer.bind_length) and tune each bucket; "
            "or tune only the kernels whose shapes are static (static_kernels_only=True)."
        )


def symbolic_names(mod: tvm.IRModule) -> list[str]:
    return sorted({str(v) for func in mod.functions.values() if isinstance(func, relax.Function)
                   for v in relax.analysis.defined_symbolic_vars(func)})


def refuse_prepacking_symbolic(mod: tvm.IRModule, prepack: bool) -> None:
    """Weight prepacking of a module with symbolic dimensions builds, runs, and computes wrong numbers.

    Measured on Day 14's decoding step (a symbolic past), its static kernels tuned with prepacking:
    relative error 1.07 against PyTorch; the same tuned without prepacking matches it.
    """
    names = symbolic_names(mod)
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
    tasks = extract_tasks(prepare(mod, target, prepack), target)
    return {"static": sorted(t.task_name for t in tasks if is_static(t.dispatched[0])),
            "symbolic": sorted(t.task_name for t in tasks if not is_static(t.dispatched[0]))}


def extract_tasks(prepared: tvm.IRModule, target: tvm.target.Target) -> list:
    """The module's kernels to tune (already scheduled ones have nothing to tune: the mark is the kernel's own
    attribute, which MetaSchedule's extraction keeps on the function, not on the task's module)."""
    tasks = ms.relax_integration.extract_tasks(prepared, target)
    return [t for t in tasks if not t.mod.attrs.get("tirx.is_scheduled", False) and not _is_scheduled(t.dispatched[0])]


def _is_scheduled(kernel: tvm.IRModule) -> bool:
    """Whether a task's kernel is marked scheduled (``tirx.is_scheduled``) by the course's own schedules."""
    attrs = kernel["main"].attrs
    return bool(attrs is not None and attrs.get("tirx.is_scheduled", False))


def tunable_tasks(mod: tvm.IRModule, target: tvm.target.Target, prepack: bool, layout: str = nchwc.PLAIN) -> list:
    """The tasks ``tune`` tunes: with ``prepack``, those of the kernels a call runs (``per_call_kernels``)."""
    prepared = prepare(mod, target, prepack, layout)
    return extract_tasks(per_call_kernels(prepared) if prepack else prepared, target)


def per_call_kernels(prepared: tvm.IRModule) -> tvm.IRModule:
    """``prepared`` without the kernels that read weights only (the weights' layout rewrites, above all).

    A prepacked build lifts those into ``main_transform_params`` (``apply_database``), which runs once
    at load: tuning them is time spent on nothing a call runs (89 of EfficientNet-B0's 159 kernels in
    ``NCHW16c``). They keep TVM's default code.
    """
    lifted = relax.transform.LiftTransformParams()(prepared)
    per_call = tvm.IRModule({gv: f for gv, f in lifted.functions.items() if gv.name_hint != "main_transform_params"},
                            attrs=lifted.attrs)
    return relax.transform.DeadCodeElimination(entry_functions=["main"])(per_call)


def num_threads(target: tvm.target.Target) -> int:
    cores = target.attrs.get("num-cores")
    return int(cores) if cores is not None else max(1, ms.utils.cpu_count(logical=False))


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
    for task in tunable_tasks(mod, target, prepack):
        mflop = float(estimate_tir_flops(task.dispatched[0])) / 1e6
        rows.append(
            {"task": task.task_name, "calls": int(task.weight), "mflop": mflop, "mflop_total": mflop * int(task.weight)}
        )
    return sorted(rows, key=lambda r: -r["mflop_total"])
