"""A tuning database's records: reading one (checked), choosing records for a target, pruning, copying, summarising.

A tuning directory (``work_dir``) holds MetaSchedule's two JSON files, ``database_workload.json`` (the
kernels) and ``database_tuning_record.json`` (the measured schedules, each with the target it was tuned
for), and ``logs/`` with MetaSchedule's own per-task logs (``settings`` adds the course's own file).
``MetaScheduleApplyDatabase`` looks records up by workload only: ``database_for_target`` keeps the
records tuned for the target you build for, unless asked to transfer them.
"""

from __future__ import annotations

import json
import math
import re
import shutil
from pathlib import Path

import tvm
from tvm.s_tir import meta_schedule as ms

from ..errors import CourseError, TuningDatabaseError
from .intrinsics import import_tensor_intrinsics
from .settings import budget, read_settings, save_settings, tuned_layout, tuned_with_prepacking


WORKLOAD_FILE = "database_workload.json"


RECORD_FILE = "database_tuning_record.json"


LOG_DIR = "logs"


# A measurement slower than this is MetaSchedule's marker for a failed candidate.
FAILED_RUN_SECS = 1e9


def load_database(work_dir: str | Path) -> ms.database.JSONDatabase:
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
        check_json_lines(work_dir / name)
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


def check_json_lines(path: Path) -> None:
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


def mean_secs(record) -> float:
    secs = [float(s) for s in (record.run_secs or [])]
    return sum(secs) / len(secs) if secs else math.inf


def succeeded(record) -> bool:
    secs = [float(s) for s in (record.run_secs or [])]
    return bool(secs) and all(math.isfinite(s) and s < FAILED_RUN_SECS for s in secs)


def measured_records(db, target: tvm.target.Target | None = None) -> list:
    """Records with a successful measurement, for ``target`` only when given."""
    wanted = None if target is None else str(target)
    return [
        r
        for r in db.get_all_tuning_records()
        if succeeded(r) and (wanted is None or str(r.target) == wanted)
    ]


def workloads(records: list) -> list[tuple[object, list]]:
    """Group records by workload: [(workload, [records...]), ...]."""
    groups: list[tuple[object, list]] = []
    for record in records:
        group = next((g for w, g in groups if w.same_as(record.workload)), None)
        if group is None:
            groups.append((record.workload, [record]))
        else:
            group.append(record)
    return groups


def copy_records(groups: list[tuple[object, list]], into) -> int:
    """Commit each group's workload to the database ``into`` once, then its records (schedule, times, target);
    return how many records. ``groups`` as ``workloads`` gives them, each cut to the records to keep."""
    copied = 0
    for workload, records in groups:
        copy = into.commit_workload(workload.mod)
        for record in records:
            into.commit_tuning_record(
                ms.database.TuningRecord(record.trace, copy, record.run_secs, record.target, record.args_info))
            copied += 1
    return copied


def target_difference(tuned: tvm.target.Target, target: tvm.target.Target) -> str:
    """The target attributes that differ, e.g. ``mcpu: 'znver5' here, 'skylake-avx512' in the database``."""
    ours, theirs = dict(target.export()), dict(tuned.export())
    keys = sorted(k for k in set(ours) | set(theirs) if ours.get(k) != theirs.get(k))
    return "; ".join(f"{k}: {ours.get(k)!r} in your target, {theirs.get(k)!r} in the database" for k in keys)


def database_for_target(db, target: tvm.target.Target, work_dir: Path, transfer: bool = False):
    """An in-memory copy of the records to build with: those tuned for exactly this target.

    With ``transfer``, a kernel that has no record for this target takes the
    records tuned for other targets instead (the fastest of them will be replayed).
    """
    measured = measured_records(db)
    if not measured:
        raise TuningDatabaseError(
            f"The tuning database in {work_dir} has no successful measurement in it. "
            "Tune again (see its logs/ for why the candidates failed)."
        )
    wanted = str(target)
    chosen = []
    for workload, group in workloads(measured):
        mine = [r for r in group if str(r.target) == wanted] or (group if transfer else [])
        if mine:
            chosen.append((workload, mine))
    if not chosen:
        tuned_for = {str(r.target): r.target for r in measured}
        diff = target_difference(next(iter(tuned_for.values())), target)
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
    copy_records(chosen, memory)
    return memory


def prune_database(work_dir: str | Path, keep: int = 1) -> int:
    """Keep only the ``keep`` fastest measured records of each kernel; return how many remain.

    Building replays only the fastest record of each kernel, so a database to
    ship needs no more; the rest (failed and slower candidates, a few megabytes
    per hundred trials) only trains the cost model when tuning goes on.
    """
    if keep < 1:
        raise ValueError(f"keep must be at least 1, got {keep}.")
    work_dir = Path(work_dir)
    db = load_database(work_dir)
    staging = work_dir / "pruning"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir()
    pruned = ms.database.JSONDatabase(work_dir=str(staging))
    kept = copy_records([(w, sorted(group, key=mean_secs)[:keep]) for w, group in workloads(measured_records(db))], pruned)
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
    The copy is recorded in ``course_tuning.json`` (``kernels_from``), with the source's layout and budget (one entry
    per source: copying from it again adds to its count and records its budget now).
    """
    work_dir, source = Path(work_dir), Path(source)
    if source.resolve() == work_dir.resolve():
        raise CourseError(f"add_kernels_from needs another database than {work_dir} to copy from.")
    if tuned_with_prepacking(source) != tuned_with_prepacking(work_dir):
        raise TuningDatabaseError(
            f"{source} was tuned with prepack={tuned_with_prepacking(source)} and {work_dir} with "
            f"prepack={tuned_with_prepacking(work_dir)}: their kernels are prepared differently and would never match."
        )
    into, theirs = load_database(work_dir), load_database(source)
    added = copy_records([(w, [min(group, key=mean_secs)]) for w, group in workloads(measured_records(theirs))
                          if not into.has_workload(w.mod)], into)
    settings = read_settings(work_dir)
    copies = settings.setdefault("kernels_from", [])
    earlier = next((c for c in copies if c["database"] == source.name), None)  # a second copy from it: one entry
    if earlier is not None:
        copies.remove(earlier)
        added_in_all = earlier["kernels"] + added
    else:
        added_in_all = added
    copies.append({"database": source.name, "layout": tuned_layout(source), "trials_per_task": budget(source),
                   "kernels": added_in_all})
    save_settings(work_dir, settings)
    return added


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
        load_database(work_dir)  # raises, saying what is missing
    for name in (WORKLOAD_FILE, RECORD_FILE):
        check_json_lines(work_dir / name)
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
    db = load_database(work_dir)
    records = db.get_all_tuning_records()
    measured = [r for r in records if succeeded(r)]
    kernels = []
    for workload, group in workloads(records):
        best = min((r for r in group if succeeded(r)), key=mean_secs, default=None)
        kernels.append(
            {
                "kernel": _kernel_label(workload),
                "records": len(group),
                "best_us": None if best is None else 1e6 * mean_secs(best),
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
