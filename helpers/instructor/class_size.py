"""What a class costs the hub's machine: cores and memory per learner, measured (docs/hub.md, "A class's size").

Learners are imitated as the one-machine hub runs them (``hub_spawner.CourseSpawner``): each on one core,
round-robin over the machine's cores, with PyTorch's and TVM's threads sized to it, 8 GB of address space per
process and no compile cache (``TVM_COURSE_NO_CACHE=1``: a learner cannot write the repository's ``build/``).
Each learner runs the days' solution notebooks one after the other, each in a kernel of its own (as JupyterLab
opens one per notebook), at full size (``TVM_COURSE_QUICK`` removed). One learner alone first, then the class at
once; each kernel's peak resident memory is the kernel's own high-water mark (``getrusage``'s ``ru_maxrss``
of the reaped kernel: exact, not sampled), and the machine's memory in use is sampled above what it used
before (``psutil``), which counts the pages the kernels share once.

    python -m helpers.instructor.class_size                        # 3 learners, Days 0 and 3: results/class-size-<cpu>-<n>cores.json
    python -m helpers.instructor.class_size --learners 4 --days 0 1
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from datetime import datetime, timezone
from pathlib import Path

from .. import config, machine
from . import grading
from .days import day_name

GB = 1024 ** 3
ADDRESS_SPACE_GB = 8  # the hub's TVM_HUB_MEM default: RLIMIT_AS per process
# Kernels started at the same moment can pick the same free port (Jupyter picks a port, closes it, and the kernel
# binds it later): the loser dies before its first reply. Such a start is tried again, up to this many times.
START_ATTEMPTS = 3


def run_one(notebook: Path) -> dict:
    """Execute ``notebook`` in its folder in a fresh kernel; its wall time, and the kernel's CPU time and peak
    resident memory (the kernel is this process's child: once reaped, ``RUSAGE_CHILDREN`` holds both)."""
    import nbformat  # (the driver of one notebook: the parent measures without them)
    from nbclient import NotebookClient  # (the same)

    for attempt in range(START_ATTEMPTS):
        nb = nbformat.read(notebook, as_version=4)
        started = time.perf_counter()
        try:
            NotebookClient(nb, timeout=1800, kernel_name="tvm-course",
                           resources={"metadata": {"path": str(notebook.parent)}}).execute()
            break
        except RuntimeError as e:  # a kernel that never started ran none of the learner's code: start another
            if "before replying to kernel_info" not in str(e) or attempt == START_ATTEMPTS - 1:
                raise
            print(f"{notebook.name}: the kernel died while starting ({e}); starting another", file=sys.stderr)
    wall = time.perf_counter() - started
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    return {"notebook": notebook.name, "wall_s": round(wall, 1), "kernel_cpu_s": round(used.ru_utime + used.ru_stime, 1),
            "kernel_peak_rss_gb": round(used.ru_maxrss * 1024 / GB, 2)}


def _as_learner(core: int):
    """What the hub's spawner sets on a learner's server, here on the process that drives their kernels."""
    def preexec() -> None:
        limit = ADDRESS_SPACE_GB * GB
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
        os.sched_setaffinity(0, {core})
    return preexec


def _learner(index: int, notebooks: list[Path], work: Path, out: list[dict]) -> None:
    """One learner: their own copy of each notebook, run in order, each by a driver process of its own."""
    cores = sorted(os.sched_getaffinity(0))
    env = {k: v for k, v in os.environ.items() if k != config.QUICK_ENV}
    env.update(OMP_NUM_THREADS="1", TVM_NUM_THREADS="1", TVM_COURSE_NO_CACHE="1")
    for source in notebooks:
        mine = work / f"learner{index}" / source.parent.name / source.name
        mine.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(source, mine)
        proc = subprocess.run([sys.executable, "-m", "helpers.instructor.class_size", "run-one", str(mine)], env=env,
                              capture_output=True, text=True, preexec_fn=_as_learner(cores[index % len(cores)]))
        if proc.returncode != 0:
            said = proc.stderr if len(proc.stderr) <= 4000 else f"{proc.stderr[:1500]}\n[...]\n{proc.stderr[-2500:]}"
            raise RuntimeError(f"learner {index}, {source.name}: {said}")
        out.append({"learner": index, "core": cores[index % len(cores)], **json.loads(proc.stdout.splitlines()[-1])})


def _in_use() -> int:
    import psutil  # (the parent's sampling only)

    memory = psutil.virtual_memory()
    return memory.total - memory.available


def _busy_s() -> float:
    """CPU seconds the whole machine has run so far, every process's: what else ran beside the class shows."""
    import psutil  # (the same)

    times = psutil.cpu_times()
    return times.user + times.nice + times.system + times.irq + times.softirq


def run_class(notebooks: list[Path], learners: int, sample_s: float = 0.5) -> dict:
    """``learners`` at once, each running ``notebooks`` in order; every run's numbers and the machine's peak."""
    baseline, peak, runs, done, busy = _in_use(), 0, [], threading.Event(), _busy_s()

    def sample() -> None:
        nonlocal peak
        while not done.wait(sample_s):
            peak = max(peak, _in_use() - baseline)

    with tempfile.TemporaryDirectory(prefix="class-size-") as tmp:
        sampler = threading.Thread(target=sample)
        sampler.start()
        started = time.perf_counter()
        threads = [threading.Thread(target=_learner, args=(i, notebooks, Path(tmp), runs)) for i in range(learners)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        wall, busy = time.perf_counter() - started, _busy_s() - busy
        done.set()
        sampler.join()
    if len(runs) != learners * len(notebooks):
        raise RuntimeError("a learner's notebook failed: see the error above")
    # the machine's CPU time against the kernels': the rest is the drivers, Jupyter's own work, and anything else that ran
    return {"learners": learners, "wall_s": round(wall, 1), "machine_memory_peak_gb": round(peak / GB, 2),
            "machine_cpu_s": round(busy, 1), "kernels_cpu_s": round(sum(r["kernel_cpu_s"] for r in runs), 1),
            "runs": sorted(runs, key=lambda r: (r["learner"], r["notebook"]))}


def measure(days: list[str], learners: int) -> dict:
    """One learner alone, then ``learners`` at once, on the days' solution notebooks; the per-learner figures."""
    notebooks = [grading.REPO / grading.SOURCE / day / f"{day}.ipynb" for day in days]
    load_before = os.getloadavg()
    alone = run_class(notebooks, 1)
    together = run_class(notebooks, learners)
    cores = machine.core_count()
    slowdown = {nb.name: round(max(r["wall_s"] for r in together["runs"] if r["notebook"] == nb.name)
                              / next(r["wall_s"] for r in alone["runs"] if r["notebook"] == nb.name), 2) for nb in notebooks}
    return {
        "machine": {"cpu": machine.cpu_name(), "cores": cores, "memory_gb": round(os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") / GB, 1)},
        "measured": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "how": (f"python -m helpers.instructor.class_size --learners {learners} --days {' '.join(days)}: each learner as the "
                "hub's spawner runs one (one core, round-robin; OMP_NUM_THREADS=TVM_NUM_THREADS=1; RLIMIT_AS "
                f"{ADDRESS_SPACE_GB} GB; TVM_COURSE_NO_CACHE=1), the solution notebooks at full size (TVM_COURSE_QUICK unset), "
                "one after the other, each in its own kernel through nbclient; kernel_peak_rss_gb is the kernel's ru_maxrss, "
                "machine_memory_peak_gb the peak of the machine's memory in use (total - available) above the idle "
                "machine's, sampled every 0.5 s"),
        "load_average_before": [round(x, 2) for x in load_before],
        "load_average_after": [round(x, 2) for x in os.getloadavg()],
        "alone": alone,
        "together": together,
        "per_learner": {
            "kernel_peak_rss_gb": max(r["kernel_peak_rss_gb"] for r in together["runs"]),
            "machine_memory_gb": round(together["machine_memory_peak_gb"] / learners, 2),
            "learners_per_core": round(learners / cores, 2),
            "slowdown_together": slowdown,
        },
    }


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m helpers.instructor.class_size", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command")
    sub.add_parser("run-one", help="(internal) execute one notebook and print its numbers").add_argument("notebook")
    parser.add_argument("--learners", type=int, default=3)
    parser.add_argument("--days", nargs="+", default=["0", "3"])
    args = parser.parse_args(argv)
    if args.command == "run-one":
        print(json.dumps(run_one(Path(args.notebook))))
        return 0
    days = [day_name(day, grading.assignments(), "class_size --days") for day in args.days]
    record = measure(days, args.learners)
    path = grading.REPO / "results" / f"class-size-{record['machine']['cpu']}-{record['machine']['cores']}cores.json"
    path.write_text(json.dumps(record, indent=2) + "\n")
    print(json.dumps(record["per_learner"], indent=2))
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
