"""One timing method for every backend: warm-up, repeats, medians and spread.

Backends are measured interleaved, one timed call of each per round, so that a
background burst on a small machine hits all of them alike and the ratios
between them stay honest even when the absolute times move.

Each timed call follows one untimed *settling* call of the same backend. Two
libraries with thread pools disturb each other when their calls alternate: on
the course's 2-core machine, PyTorch's pool threads were still spinning when
TVM's two threads started, and tuned MobileNetV2 in TVM measured 14 ms right
after a PyTorch call against 6.4 ms after a call of its own (PyTorch: 13 ms
against 10.2 ms). Settling times each backend in its own steady state, as a
model serving requests back to back runs. Calls longer than ``SETTLE_LIMIT_S``
(untuned builds) are not settled: the neighbour's threads have long gone quiet.

One settling call is not always enough between engines with thread pools of their own.
Interleaved call by call with tuned TVM and PyTorch on the 2-core Zen 5 (MobileNetV2),
ONNX Runtime measured 7.7 ms against 2.8 ms alone, PyTorch up to 15.6 ms against 8.5 ms,
and 30 ms of settling calls alone did not cure ONNX Runtime. ``measure_engines`` times
each backend in blocks of ``PEER_BLOCK`` calls after ``PEER_SETTLE_S`` of untimed calls
of its own: there all three measured what they measure alone (eager 10.0 against 10.1 ms,
ONNX Runtime 2.8 against 2.8, TVM 6.7 against 6.6), and the blocks still alternate, so a
burst of other work is spread over every backend.

Introduced on Day 2.
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from .config import pick

if TYPE_CHECKING:  # for annotations only: timing runs whatever has to_device and run_on_device
    import tvm

    from .build import CompiledModel


@dataclass(frozen=True)
class Timing:
    """Latency of one backend at one batch size, in milliseconds."""

    label: str
    batch: int
    times_ms: list[float] = field(repr=False)

    @property
    def median_ms(self) -> float:
        return statistics.median(self.times_ms)

    @property
    def q1_ms(self) -> float:
        return _quantile(self.times_ms, 0.25)

    @property
    def q3_ms(self) -> float:
        return _quantile(self.times_ms, 0.75)

    @property
    def iqr_ms(self) -> float:
        """Spread: the interquartile range (robust to a few slow outliers)."""
        return self.q3_ms - self.q1_ms

    @property
    def images_per_s(self) -> float:
        return self.batch / self.median_ms * 1000.0

    def as_record(self) -> dict:
        """A plain dict for tables, JSON and plots."""
        return {
            "backend": self.label,
            "batch": self.batch,
            "median_ms": self.median_ms,
            "q1_ms": self.q1_ms,
            "q3_ms": self.q3_ms,
            "iqr_ms": self.iqr_ms,
            "min_ms": min(self.times_ms),
            "max_ms": max(self.times_ms),
            "repeats": len(self.times_ms),
            "images_per_s": self.images_per_s,
            "unreliable": unreliable(self),
        }


def _quantile(values: Sequence[float], q: float) -> float:
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=4, method="inclusive")[{0.25: 0, 0.75: 2}[q]]


# An interquartile range over a quarter of the median marks a timing as noise, not a result. In the
# shipped benchmark rows (2 cores, Zen 4 and Zen 5) the spread is 0.3 % to 20 % of the median, under
# 5 % for most; only two pass a quarter (ResNet-50: eager at 27 % on the Zen 4, torch.compile at
# 194 % on the Zen 5), and with a tuning job on the other core eager MobileNetV2 wandered from 24 to
# 49 ms (TVM_NOTES). A spread that wide is larger than the speedups the course weighs (1.1x, 1.3x).
UNRELIABLE_SPREAD = 0.25


def unreliable(t: Timing | Mapping[str, float]) -> bool:
    """True when the IQR exceeds ``UNRELIABLE_SPREAD`` of the median: show it marked, never as a plain result.

    ``t``: a Timing, or a record of one with ``median_ms`` and ``iqr_ms`` (e.g. a benchmark row's).
    """
    median, iqr = (t.median_ms, t.iqr_ms) if isinstance(t, Timing) else (t["median_ms"], t["iqr_ms"])
    return not iqr <= UNRELIABLE_SPREAD * median  # also catches NaN


def versus(timings: Sequence[Timing], candidate: str, baseline: str, called: str | None = None) -> str:
    """``candidate`` against ``baseline`` (two labels of ``timings``, one run) in one sentence: the ratio of the
    medians, and whether it is a lead or the spread: only interquartile ranges that do not overlap show one
    faster (Day 4); a noisy timing (``unreliable``) is named. ``called``: how the sentence names the baseline."""
    by_label = {t.label: t for t in timings}
    for label in (candidate, baseline):
        if label not in by_label:
            raise ValueError(f"No timing labelled {label!r}; labels are {sorted(by_label)}.")
    ours, theirs = by_label[candidate], by_label[baseline]
    ratio, name = theirs.median_ms / ours.median_ms, called or baseline
    if ours.q3_ms < theirs.q1_ms:
        text = f"{candidate} is {ratio:.2f}x faster than {name} (their interquartile ranges apart)"
    elif ours.q1_ms > theirs.q3_ms:
        text = f"{candidate} is {1 / ratio:.2f}x slower than {name} (their interquartile ranges apart)"
    else:
        text = (f"{candidate} runs at {ratio:.2f}x the speed of {name}, inside the spread: their interquartile "
                "ranges overlap, so neither is shown faster")
    noisy = [t.label for t in (theirs, ours) if unreliable(t)]
    return text + (f" (unreliable: {', '.join(noisy)} spread too wide)" if noisy else "")


SETTLE_LIMIT_S = 0.5
# How engines with spinning thread pools are compared (see the module's docstring): the seconds of
# untimed calls before each block, and the timed calls in a block.
PEER_SETTLE_S = 0.03
PEER_BLOCK = 5


def measure(
    backends: Mapping[str, Callable[[], object]],
    batch: int = 1,
    warmup: int | None = None,
    repeats: int | None = None,
    sync: Callable[[], None] | None = None,
    settle: bool = True,
    settle_s: float = 0.0,
    block: int = 1,
    min_sample_ms: float | None = None,
) -> list[Timing]:
    """Time each zero-argument callable, interleaved round by round.

    ``sync`` is called after every call (e.g. ``torch.cuda.synchronize`` or a TVM
    device's ``sync``) so that asynchronous GPU work is inside the measured time.
    With ``settle`` and more than one backend, each timed call of a backend whose
    calls take under ``SETTLE_LIMIT_S`` follows one untimed call of the same
    backend, or as many as take ``settle_s`` seconds (see the module's docstring for why).
    ``block`` times that many calls of a backend in a row per round (the last round may time fewer).

    ``min_sample_ms`` is for calls shorter than the timer is honest for (one kernel: microseconds): each
    sample then times back-to-back calls of a backend, enough to last that long (sized on a warm-up of at
    least as long and three calls), and records the time per call; ``warmup``, ``settle`` and ``block`` do
    not apply, and ``sync`` runs once per sample.
    """
    warmup = pick(3, 1) if warmup is None else warmup
    repeats = pick(20, 5) if repeats is None else repeats
    if repeats < 1:
        raise ValueError(f"repeats must be at least 1, got {repeats}.")
    sync = sync or (lambda: None)
    if min_sample_ms is not None:
        return _measure_samples(backends, batch, repeats, sync, min_sample_ms)

    def call(fn) -> float:
        start = time.perf_counter()
        fn()
        sync()
        return time.perf_counter() - start

    # With one backend, each call already follows a call of its own: nothing to settle.
    unsettled = set() if settle and len(backends) > 1 else set(backends)
    for name, fn in backends.items():
        for _ in range(warmup):
            if call(fn) > SETTLE_LIMIT_S:
                unsettled.add(name)
    if block < 1:
        raise ValueError(f"block must be at least 1, got {block}.")
    times: dict[str, list[float]] = {name: [] for name in backends}
    for first in range(0, repeats, block):
        for name, fn in backends.items():
            if name not in unsettled:
                settled = call(fn)
                while settled < settle_s:
                    settled += call(fn)
            for _ in range(min(block, repeats - first)):
                seconds = call(fn)
                times[name].append(seconds * 1000.0)
                if seconds > SETTLE_LIMIT_S:
                    unsettled.add(name)
    return [Timing(name, batch, t) for name, t in times.items()]


def _measure_samples(backends: Mapping[str, Callable[[], object]], batch: int, repeats: int,
                     sync: Callable[[], None], min_sample_ms: float) -> list[Timing]:
    """``measure`` with samples of back-to-back calls, each lasting at least ``min_sample_ms``."""
    number: dict[str, int] = {}
    for name, fn in backends.items():
        # Warm up for a while, not for one call: a library whose threads went to sleep (PyTorch's
        # pool after ~10 ms idle) wakes slowly, and one slow call would size the samples wrong.
        calls, start = 0, time.perf_counter()
        while calls < 3 or (time.perf_counter() - start) * 1000.0 < min_sample_ms:
            fn()
            calls += 1
        sync()
        once_ms = max((time.perf_counter() - start) * 1000.0 / calls, 1e-3)
        number[name] = max(1, min(10_000, int(min_sample_ms / once_ms)))
    times: dict[str, list[float]] = {name: [] for name in backends}
    for _ in range(repeats):
        for name, fn in backends.items():
            start = time.perf_counter()
            for _ in range(number[name]):
                fn()
            sync()
            times[name].append((time.perf_counter() - start) * 1000.0 / number[name])
    return [Timing(name, batch, t) for name, t in times.items()]


def measure_with_retry(backends: Mapping[str, Callable[[], object]], **options: Any) -> list[Timing]:
    """``measure``, and once more, all backends interleaved again, when any timing is unreliable.

    A burst of other work can spoil a run's rounds. The second run replaces the first whole, so
    that every ratio still compares timings of one run; a backend still unreliable in it stays so
    (``unreliable`` marks it). ``options`` go to both ``measure`` calls.
    """
    first = measure(backends, **options)
    if not any(unreliable(t) for t in first):
        return first
    return measure(backends, **options)


def measure_engines(backends: Mapping[str, Callable[[], object]], **options: Any) -> list[Timing]:
    """``measure_with_retry`` for engines with thread pools of their own (PyTorch, ONNX Runtime, TVM):
    blocks of ``PEER_BLOCK`` timed calls, each after ``PEER_SETTLE_S`` of the backend's own calls."""
    return measure_with_retry(backends, **{"settle_s": PEER_SETTLE_S, "block": PEER_BLOCK, **options})


def torch_runner(model: torch.nn.Module, x: torch.Tensor) -> Callable[[], object]:
    """A zero-argument call of a PyTorch model (eager or torch.compile'd) in inference mode."""

    def run():
        with torch.inference_mode():
            return model(x)

    return run


def tvm_runner(compiled: CompiledModel | tvm.runtime.Module, x) -> Callable[[], object]:
    """A zero-argument call of compiled TVM code: a model (``build.CompiledModel``), its input ``x`` copied to
    the device once, each call synced; or one compiled kernel (a runtime module, Day 7), called on its
    arguments ``x``, already on the device."""
    if not hasattr(compiled, "run_on_device"):
        fn = compiled["main"]
        return lambda: fn(*x)
    on_device = compiled.to_device(x)

    def run():
        out = compiled.run_on_device(on_device)
        compiled.device.sync()
        return out

    return run


def table(timings: Sequence[Timing], baseline: str | None = None):
    """A pandas table of the timings; with ``baseline``, a speedup column against it.

    Speedup > 1 means faster than the baseline at the same batch size.
    """
    import pandas as pd

    frame = pd.DataFrame([t.as_record() for t in timings])
    if baseline is not None:
        base = frame[frame.backend == baseline].set_index("batch")["median_ms"]
        if base.empty:
            raise ValueError(f"No timing labelled {baseline!r}; labels are {sorted(set(frame.backend))}.")
        frame["speedup_vs_" + baseline.replace(" ", "_")] = frame.batch.map(base) / frame.median_ms
    return frame.round(3)


@contextmanager
def busy_cores(n: int) -> Iterator[None]:
    """Keep ``n`` cores busy (spinning processes) while the block runs.

    A stand-in for "something else is running": the course uses it to show why
    backends are timed interleaved, and the tests grade timing exercises under it.
    """
    if n < 0:
        raise ValueError(f"n must be 0 or more, got {n}.")
    spin = "print('spinning', flush=True)\nwhile True: pass"
    procs = [subprocess.Popen([sys.executable, "-c", spin], stdout=subprocess.PIPE, text=True) for _ in range(n)]
    try:
        for p in procs:
            p.stdout.readline()  # each one is running
        time.sleep(0.2)
        yield
    finally:
        for p in procs:
            p.kill()
            p.wait()
            p.stdout.close()
