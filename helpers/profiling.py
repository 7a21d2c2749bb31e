"""Per-kernel profiles built on the VirtualMachine's instrument hook.

TVM 0.27 removed the VM profiler and the debug executor. What is left is
``vm.set_instrument(fn)``: the VM calls ``fn`` before and after every function
it calls. Timing the pairs around each kernel gives a per-kernel profile.

Introduced on Day 5.
"""

from __future__ import annotations

import json
import statistics
import time
from collections import defaultdict
from dataclasses import asdict, dataclass
from pathlib import Path

from .build import CompiledModel
from .config import pick
from .ir import op_type
from .timing import measure, tvm_runner

BUILTIN_PREFIX = "vm.builtin."


@dataclass(frozen=True)
class KernelTime:
    """One kernel's time per inference (median over the profiled runs)."""

    name: str
    op: str
    calls: int
    ms: float


@dataclass
class Profile:
    """Kernels sorted slowest first, and the end-to-end time measured without the hook."""

    kernels: list[KernelTime]
    end_to_end_ms: float
    runtime_ms: float = 0.0  # time in VM builtins (allocation, shape checks)

    @property
    def kernel_ms(self) -> float:
        return sum(k.ms for k in self.kernels)

    def top(self, k: int = 10) -> list[KernelTime]:
        return sorted(self.kernels, key=lambda kt: kt.ms, reverse=True)[:k]

    def share_by_op(self) -> dict[str, float]:
        """Fraction of kernel time per operator type, largest first; sums to 1."""
        per_op: dict[str, float] = defaultdict(float)
        for kt in self.kernels:
            per_op[kt.op] += kt.ms
        total = sum(per_op.values()) or 1.0
        return dict(sorted(((op, ms / total) for op, ms in per_op.items()), key=lambda p: -p[1]))

    def records(self) -> list[dict]:
        return [asdict(k) for k in self.top(len(self.kernels))]

    def save(self, path: str | Path) -> None:
        data = {"end_to_end_ms": self.end_to_end_ms, "runtime_ms": self.runtime_ms, "kernels": self.records()}
        Path(path).write_text(json.dumps(data, indent=1))

    @classmethod
    def load(cls, path: str | Path) -> Profile:
        data = json.loads(Path(path).read_text())
        return cls(
            kernels=[KernelTime(**k) for k in data["kernels"]],
            end_to_end_ms=data["end_to_end_ms"],
            runtime_ms=data.get("runtime_ms", 0.0),
        )


def ordered_calls(compiled: CompiledModel, on_device) -> list[tuple[str, list, float]]:
    """Every function the VM called in one inference, in order: its name, its arguments' shapes (a
    tensor's as a tuple, anything else by its type's name) and its milliseconds."""
    done: list[tuple[str, list, float]] = []
    started: list[tuple[str, list, float]] = []
    sync = compiled.device.sync

    def hook(func, name, before_run, ret_value, *args):
        if before_run:
            shapes = [tuple(a.shape) if hasattr(a, "shape") else type(a).__name__ for a in args]
            sync()
            started.append((name, shapes, time.perf_counter()))
        else:
            sync()
            name, shapes, start = started.pop()
            done.append((name, shapes, (time.perf_counter() - start) * 1000.0))
        return 0  # 0: let the VM run the call as usual

    compiled.vm.set_instrument(hook)
    try:
        compiled.run_on_device(on_device)
    finally:
        compiled.vm.set_instrument(None)  # no hook: later timings pay no Python call per kernel
    return done


def _one_run(compiled: CompiledModel, on_device) -> tuple[dict[str, float], dict[str, int]]:
    """Milliseconds and call counts per called function, for one inference."""
    spent: dict[str, float] = defaultdict(float)
    calls: dict[str, int] = defaultdict(int)
    for name, _, ms in ordered_calls(compiled, on_device):
        spent[name] += ms
        calls[name] += 1
    return spent, calls


def profile(compiled: CompiledModel, x, repeats: int | None = None) -> Profile:
    """Profile ``compiled`` on input ``x``: per-kernel medians over ``repeats`` runs or more.

    The hooked runs and the end-to-end calls without the hook take turns (``timing.measure``), so that
    both see the same machine: a burst of other work lands on both, not on one of the two totals."""
    repeats = pick(5, 3) if repeats is None else repeats
    on_device = compiled.to_device(x)
    runs, warmup = [], pick(3, 1)
    _, e2e = measure({"profiled": lambda: runs.append(_one_run(compiled, on_device)),
                      "end to end": tvm_runner(compiled, x)}, warmup=warmup, repeats=repeats)
    runs = runs[warmup:]
    names = runs[0][0].keys()
    median = {n: statistics.median(run[0].get(n, 0.0) for run in runs) for n in names}
    kernels = [
        KernelTime(name=n, op=op_type(n), calls=runs[0][1][n], ms=median[n])
        for n in names
        if not n.startswith(BUILTIN_PREFIX)
    ]
    runtime = sum(ms for n, ms in median.items() if n.startswith(BUILTIN_PREFIX))
    return Profile(kernels=sorted(kernels, key=lambda k: -k.ms), end_to_end_ms=e2e.median_ms, runtime_ms=runtime)
