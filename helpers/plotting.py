"""The course's plots: every one with a title, labelled axes and units.

Introduced on Day 4.
"""

from __future__ import annotations

import textwrap
from collections import defaultdict
from collections.abc import Sequence
from typing import TYPE_CHECKING

import matplotlib.pyplot as plt

if TYPE_CHECKING:  # for annotations only: plotting loads neither torch nor TVM
    from .profiling import Profile
    from .timing import Timing


def _by_backend(timings: Sequence[Timing]) -> dict[str, list[Timing]]:
    series: dict[str, list[Timing]] = defaultdict(list)
    for t in timings:
        series[t.label].append(t)
    return {label: sorted(ts, key=lambda t: t.batch) for label, ts in series.items()}


def plot_sweep(timings: Sequence[Timing], title: str = "Batch-size sweep", machine: str | None = None):
    """Latency (median with interquartile range) and throughput against batch size."""
    fig, (lat, thr) = plt.subplots(1, 2, figsize=(11, 4))
    for label, ts in _by_backend(timings).items():
        batches = [t.batch for t in ts]
        lat.errorbar(
            batches,
            [t.median_ms for t in ts],
            yerr=[[t.median_ms - t.q1_ms for t in ts], [t.q3_ms - t.median_ms for t in ts]],
            marker="o",
            capsize=3,
            label=label,
        )
        thr.plot(batches, [t.images_per_s for t in ts], marker="o", label=label)
    for ax, ylabel in ((lat, "latency per batch (ms, median, IQR bars)"), (thr, "throughput (images/s)")):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("batch size")
        ax.set_ylabel(ylabel)
        ax.grid(True, alpha=0.3)
        ax.legend()
    lat.set_yscale("log")
    fig.suptitle(title + (f"\n{machine}" if machine else ""))
    fig.tight_layout()
    return fig


def short_label(text: str, width: int = 34) -> str:
    """Cut a long kernel name to ``width`` characters with an ellipsis, so bars keep their room."""
    return text if len(text) <= width else text[: width - 1] + "\u2026"


def plot_profile(prof: Profile, k: int = 15, title: str = "Slowest kernels"):
    """Horizontal bars of the ``k`` slowest kernels, coloured by operator type."""
    top = prof.top(k)[::-1]
    ops = sorted({kt.op for kt in top})
    colours = {op: plt.cm.tab10(i % 10) for i, op in enumerate(ops)}
    fig, ax = plt.subplots(figsize=(9, 0.35 * len(top) + 1.5))
    ax.barh([f"{short_label(kt.name)} (x{kt.calls})" for kt in top], [kt.ms for kt in top], color=[colours[kt.op] for kt in top])
    for op, colour in colours.items():
        ax.bar(0, 0, color=colour, label=op)
    ax.set_xlabel("time per inference (ms, median)")
    ax.set_title(f"{title}: {prof.kernel_ms:.1f} ms in kernels of {prof.end_to_end_ms:.1f} ms end to end")
    ax.legend(title="operator", loc="lower right")
    fig.tight_layout()
    return fig


def plot_shares(shares_by_build: dict[str, dict[str, float]], title: str = "Share of kernel time by operator"):
    """Percent of kernel time per operator type (``Profile.share_by_op``), one bar per build."""
    if not shares_by_build:
        raise ValueError("plot_shares needs at least one build: {label: profile.share_by_op()}.")
    ops = sorted(
        {op for shares in shares_by_build.values() for op in shares},
        key=lambda op: -max(s.get(op, 0.0) for s in shares_by_build.values()),
    )
    fig, ax = plt.subplots(figsize=(8, 0.45 * len(ops) * len(shares_by_build) + 1.5))
    height = 0.8 / len(shares_by_build)
    for i, (label, shares) in enumerate(shares_by_build.items()):
        ys = [j + i * height for j in range(len(ops))]
        bars = ax.barh(ys, [100 * shares.get(op, 0.0) for op in ops], height=height, label=label)
        ax.bar_label(bars, fmt="%.1f%%", padding=2, fontsize=8)
    ax.set_yticks([j + height * (len(shares_by_build) - 1) / 2 for j in range(len(ops))], ops)
    ax.invert_yaxis()
    ax.set_xlabel("share of kernel time (%)")
    ax.set_ylabel("operator type")
    ax.set_title(title)
    ax.legend(loc="lower right")
    fig.tight_layout()
    return fig


def plot_layer_losses(tables: dict, title: str = "Milliseconds tuned TVM loses per convolution"):
    """One panel per model: for each convolution, in the model's order, tuned TVM's milliseconds minus
    the other engine's (``layer_compare.table``; above 0, TVM is slower there), with the rest as a last bar."""
    tables = {name: frame for name, frame in tables.items() if frame is not None}
    if not tables:
        raise ValueError("plot_layer_losses needs at least one table: {model: layer_compare.table(ours, theirs)}.")
    fig, axes = plt.subplots(len(tables), 1, figsize=(9, 2.4 * len(tables) + 0.6), squeeze=False)
    for ax, (name, frame) in zip(axes[:, 0], tables.items()):
        ours, theirs = [c for c in frame.columns if c.endswith(" ms")]
        lost = list(frame[ours] - frame[theirs])
        bars = ax.bar(range(len(lost)), lost, color=["tab:red" if v > 0 else "tab:green" for v in lost])
        bars[-1].set_hatch("//")  # the rest: not one convolution
        ax.axhline(0.0, color="black", linewidth=1)
        ax.set_title(f"{name}: {sum(frame[ours]):.2f} ms against {sum(frame[theirs]):.2f} ({theirs.removesuffix(' ms')})",
                     fontsize=10)
        ax.set_ylabel("ms lost")
    axes[-1, 0].set_xlabel("convolution, in the model's order (hatched: everything else)")
    fig.suptitle(title)
    fig.tight_layout()
    return fig


def plot_speedups(timings: Sequence[Timing], baseline: str, title: str = "Speedup over the baseline"):
    """Bars of baseline median / backend median at one batch size (>1 is faster)."""
    base = {t.batch: t.median_ms for t in timings if t.label == baseline}
    if not base:
        raise ValueError(f"No timing labelled {baseline!r}; labels are {sorted({t.label for t in timings})}.")
    others = [t for t in timings if t.batch in base]
    labels = [f"{t.label} (b={t.batch})" if len(base) > 1 else t.label for t in others]
    crowded = sum(len(label) for label in labels) > 90  # long names side by side would overlap: slant them
    fig, ax = plt.subplots(figsize=(8, 4.8 if crowded else 3.5))
    speedups = [base[t.batch] / t.median_ms for t in others]
    bars = ax.bar(labels, speedups, color=["tab:green" if s >= 1 else "tab:red" for s in speedups])
    ax.bar_label(bars, fmt="%.2fx")
    if crowded:
        plt.setp(ax.get_xticklabels(), rotation=20, ha="right")
    ax.axhline(1.0, color="black", linewidth=1)
    ax.set_ylabel(textwrap.fill(f"speedup over {baseline} (x)", 40))  # a long peer's name on several lines
    ax.set_ylim(0, max(speedups + [1.0]) * 1.15)  # room for the bar labels above the tallest bar
    ax.set_title(textwrap.fill(title, 80))
    fig.tight_layout()
    return fig


def plot_gflops(
    timings: Sequence[Timing],
    flops: int,
    peak: float | None = None,
    reference: str | None = None,
    title: str = "GFLOP/s after each schedule step",
):
    """GFLOP/s of each version (bars, IQR whiskers), with the estimated peak and a reference as lines.

    ``reference`` names the Timing drawn as a horizontal line instead of a bar
    (e.g. PyTorch on the same kernel); ``peak`` is the machine's estimated ceiling.
    """
    if flops <= 0:
        raise ValueError(f"flops must be positive, got {flops}")
    labels = [t.label for t in timings]
    if reference is not None and reference not in labels:
        raise ValueError(f"No timing labelled {reference!r}; labels are {labels}.")
    bars = [t for t in timings if t.label != reference]
    if not bars:
        raise ValueError("plot_gflops needs at least one timing besides the reference.")

    def rate(ms: float) -> float:
        return flops / (ms * 1e6)

    fig, ax = plt.subplots(figsize=(9, 4.5))
    values = [rate(t.median_ms) for t in bars]
    yerr = [[v - rate(t.q3_ms) for v, t in zip(values, bars)], [rate(t.q1_ms) - v for v, t in zip(values, bars)]]
    drawn = ax.bar([t.label for t in bars], values, yerr=yerr, capsize=3, color="tab:blue")
    ax.bar_label(drawn, fmt="%.1f", padding=2, fontsize=8)
    if reference is not None:
        ref = next(t for t in timings if t.label == reference)
        ax.axhline(rate(ref.median_ms), color="tab:orange", linestyle="--", label=f"{reference}: {rate(ref.median_ms):.1f} GFLOP/s")
    if peak is not None:
        ax.axhline(peak, color="tab:red", linestyle=":", label=f"estimated peak: {peak:.0f} GFLOP/s")
    ax.set_ylabel("GFLOP/s (median; whiskers: IQR)")
    ax.set_xlabel("schedule step")
    ax.set_title(title)
    ax.tick_params(axis="x", labelrotation=20)
    if reference is not None or peak is not None:
        ax.legend(loc="upper left", fontsize=8)
    ax.grid(True, axis="y", alpha=0.3)
    fig.tight_layout()
    return fig


def plot_roofline(peak_gflops: float, bandwidth_gbs: float, points: dict[str, tuple[float, float]],
                  title: str = "Roofline"):
    """The roofline: attainable GFLOP/s = min(peak, bandwidth x intensity), log-log, with kernels as points.

    ``points`` maps a label to (arithmetic intensity in FLOP/byte, measured GFLOP/s). A kernel left
    of the ridge (intensity below peak / bandwidth) is bound by memory, right of it by arithmetic.
    """
    if peak_gflops <= 0 or bandwidth_gbs <= 0:
        raise ValueError(f"peak and bandwidth must be positive, got {peak_gflops} GFLOP/s and {bandwidth_gbs} GB/s")
    ridge = peak_gflops / bandwidth_gbs
    intensities = [i for i, _ in points.values()] + [ridge]
    lo, hi = min(intensities) / 8, max(intensities) * 8
    xs = [lo * (hi / lo) ** (k / 200) for k in range(201)]
    fig, ax = plt.subplots(figsize=(11, 4.8))
    ax.plot(xs, [min(peak_gflops, bandwidth_gbs * x) for x in xs], color="black", linewidth=2,
            label=f"roof: {bandwidth_gbs:.0f} GB/s x intensity, capped at the peak {peak_gflops:.0f} GFLOP/s")
    ax.axvline(ridge, color="gray", linestyle=":", label=f"ridge: {ridge:.1f} FLOP/byte")
    for (label, (intensity, rate)), marker in zip(points.items(), "osD^v<>p*hX"):
        ax.scatter([intensity], [rate], s=60, marker=marker, label=f"{label}: {rate:.1f} GFLOP/s", zorder=3)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("arithmetic intensity (FLOP per byte moved, at the minimum traffic)")
    ax.set_ylabel("GFLOP/s")
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))  # beside the plot: points stack at one intensity
    fig.tight_layout()
    return fig


def plot_tuning_curve(points: Sequence[dict], title: str = "Tuning: end-to-end latency against tuning time"):
    """Tuned latency after each tuning budget, against the eager latency measured beside it.

    ``points`` are the records of a tuning curve (``helpers.results.read_curve``): each has
    ``tuning_s``, ``trials_per_task``, ``tuned_ms``, ``eager_ms`` and their IQRs.
    Eager is drawn per point because it was re-measured in the same run each time.
    """
    if not points:
        raise ValueError("plot_tuning_curve needs at least one point of a tuning curve.")
    points = sorted(points, key=lambda p: p["tuning_s"])
    minutes = [p["tuning_s"] / 60 for p in points]
    fig, ax = plt.subplots(figsize=(8, 4))
    for key, label, color in (("tuned_ms", "TVM tuned", "tab:green"), ("eager_ms", "PyTorch eager", "tab:orange")):
        values = [p[key] for p in points]
        spread = [p[key.replace("_ms", "_iqr_ms")] / 2 for p in points]
        ax.errorbar(minutes, values, yerr=spread, marker="o", capsize=3, color=color, label=label)
    for m, p in zip(minutes, points):
        ax.annotate(f"{p['trials_per_task']}/task", (m, p["tuned_ms"]), textcoords="offset points", xytext=(4, 6), fontsize=8)
    ax.set_xlabel("tuning time on this machine (minutes)")
    ax.set_ylabel("latency, batch 1 (ms, median; bars: IQR)")
    ax.set_ylim(bottom=0)
    ax.set_title(title)
    ax.legend()
    ax.grid(True, alpha=0.3)
    fig.tight_layout()
    return fig


def plot_transfer_study(rows: Sequence[dict], title: str = "A tuning database on another CPU"):
    """Each way of building the model against eager PyTorch, with the minutes of tuning it cost here.

    ``rows`` are the records of a transfer study (``helpers.transfer_study``): ``arm``, ``median_ms``,
    ``iqr_ms`` and, for TVM's builds, ``tuning_min``. Bars are latencies measured
    in one interleaved run; eager's is the dashed line to beat.
    """
    eager = next((r for r in rows if "tuning_min" not in r), None)
    builds = [r for r in rows if "tuning_min" in r]
    if eager is None or not builds:
        raise ValueError("plot_transfer_study needs eager's row and at least one TVM build's row.")
    fig, ax = plt.subplots(figsize=(8, 0.55 * len(builds) + 1.6))
    labels = [f"{r['arm']}  ({r['tuning_min']:.0f} min here)" for r in builds]
    colors = ["tab:gray" if r["arm"] == "untuned" else "tab:green" for r in builds]
    ax.barh(labels, [r["median_ms"] for r in builds], xerr=[r["iqr_ms"] / 2 for r in builds], color=colors, capsize=3)
    ax.axvline(eager["median_ms"], color="tab:orange", linestyle="--", label=f"PyTorch eager, {eager['median_ms']:.1f} ms")
    for y, r in enumerate(builds):
        ax.annotate(f"{eager['median_ms'] / r['median_ms']:.2f}x eager", (r["median_ms"], y), textcoords="offset points",
                    xytext=(6, -3), fontsize=8)
    ax.set_xscale("log")
    ax.set_xlabel("latency, batch 1 (ms, median, log scale; bars: IQR)")
    ax.invert_yaxis()
    ax.set_title(title)
    ax.legend(loc="lower right")
    fig.tight_layout()
    return fig


def plot_ranges(ranges: dict[str, tuple[float, float]], title: str = "Calibrated input ranges"):
    """One vertical bar per layer from its smallest to its largest calibrated input, in call order."""
    names = list(ranges)
    lows = [ranges[n][0] for n in names]
    highs = [ranges[n][1] for n in names]
    fig, ax = plt.subplots(figsize=(9, 3.5))
    ax.bar(range(len(names)), [h - lo for lo, h in zip(lows, highs)], bottom=lows, color="tab:blue")
    ax.axhline(0.0, color="black", linewidth=1)
    ax.set_xticks(range(len(names)), [short_label(n, 18) for n in names], rotation=90, fontsize=7)
    ax.set_xlabel("pointwise convolution (in call order)")
    ax.set_ylabel("input value")
    ax.set_title(title)
    fig.tight_layout()
    return fig


def plot_layer_errors(errors: dict[str, dict[str, float]], title: str = "Quantization error per layer"):
    """One line per scheme (``{"per tensor": {layer: error}, ...}``), layers in order, error on a log axis."""
    fig, ax = plt.subplots(figsize=(9, 3.5))
    for scheme, by_layer in errors.items():
        ax.plot(range(len(by_layer)), list(by_layer.values()), marker="o", markersize=3, label=scheme)
    ax.set_yscale("log")
    ax.set_xlabel("pointwise convolution (in call order)")
    ax.set_ylabel("relative error of the output")
    ax.set_title(title)
    ax.legend()
    fig.tight_layout()
    return fig


def plot_tradeoff(rows: Sequence[dict], title: str = "Speed against accuracy",
                  accuracy_label: str = "top-1 accuracy (%)"):
    """Each backend a point: speedup over the baseline (x) against its top-1 accuracy (y), with the accuracy's
    95 % interval as a bar where the rows carry one (``top1_low``, ``top1_high``)."""
    fig, ax = plt.subplots(figsize=(7, 4))
    for row in rows:
        y = 100 * row["top1"]
        if "top1_low" in row:
            ax.errorbar(row["speedup"], y, yerr=[[y - 100 * row["top1_low"]], [100 * row["top1_high"] - y]],
                        fmt="o", markersize=7, capsize=3)
        else:
            ax.scatter(row["speedup"], y, s=60)
        ax.annotate(row["backend"], (row["speedup"], y), textcoords="offset points", xytext=(6, 4))
    ax.axvline(1.0, color="black", linewidth=1)
    ax.set_xlabel("speedup over the baseline (x)")
    ax.set_ylabel(accuracy_label)
    ax.set_xlim(left=0)
    ax.set_title(textwrap.fill(title, 80))
    fig.tight_layout()
    return fig


def plot_accuracy(table, title: str = "Top-1 accuracy on the test set"):
    """Each build's accuracy (``accuracy.table``'s rows) as a point with its 95 % interval, on one axis."""
    fig, ax = plt.subplots(figsize=(7, 0.5 * len(table) + 1.5))
    names = list(table["build"])
    ax.errorbar(100 * table["accuracy"], range(len(names)), fmt="o", capsize=4,
                xerr=[100 * (table["accuracy"] - table["low"]), 100 * (table["high"] - table["accuracy"])])
    ax.set_yticks(range(len(names)), names)
    ax.invert_yaxis()
    ax.set_xlabel(f"top-1 accuracy (%), with its 95 % interval ({int(table['images'].iloc[0])} images)")
    ax.set_title(textwrap.fill(title, 80))
    fig.tight_layout()
    return fig


def plot_tilings(timings: Sequence[Timing], baseline: str, title: str = "One fused kernel, cut each way"):
    """Bars of a fused kernel's time (microseconds, median with IQR) for each way of cutting it (``"rows=4"``,
    ``"channels=48"``), coloured by kind, and the ``baseline`` (the same work as separate kernels) as a line."""
    base = next((t for t in timings if t.label == baseline), None)
    if base is None:
        raise ValueError(f"No timing labelled {baseline!r}; labels are {sorted(t.label for t in timings)}.")
    fused = [t for t in timings if t is not base]
    fig, ax = plt.subplots(figsize=(max(6, 0.8 * len(fused) + 2), 3.8))
    colors = ["tab:blue" if t.label.startswith("rows") else "tab:orange" for t in fused]
    ax.bar([t.label for t in fused], [1000 * t.median_ms for t in fused], color=colors,
           yerr=[[1000 * (t.median_ms - t.q1_ms) for t in fused], [1000 * (t.q3_ms - t.median_ms) for t in fused]],
           capsize=3)
    ax.axhline(1000 * base.median_ms, color="black", linestyle="--", label=f"{baseline}: {1000 * base.median_ms:.0f} us")
    plt.setp(ax.get_xticklabels(), rotation=20, ha="right")
    ax.set_xlabel("tiling: bands of output rows (blue), chunks of expanded channels (orange)")
    ax.set_ylabel("time per call (us, median, IQR bars)")
    ax.set_ylim(0, 1.2 * 1000 * max(t.q3_ms for t in timings))  # room for the legend above the bars and the line
    ax.legend(loc="upper left")
    ax.set_title(textwrap.fill(title, 80))
    fig.tight_layout()
    return fig


def plot_block_comparison(comparisons: dict[str, Sequence[Timing]], title: str = "One block, four ways"):
    """Grouped bars: for each block (a key of ``comparisons``), each backend's time in microseconds (median,
    IQR bars), the backends in the order of the first block's timings."""
    backends = [t.label for t in next(iter(comparisons.values()))]
    fig, ax = plt.subplots(figsize=(max(7, 2.6 * len(comparisons)), 4))
    width = 0.8 / len(backends)
    for b, backend in enumerate(backends):
        xs, heights, errors = [], [], [[], []]
        for g, timings in enumerate(comparisons.values()):
            t = next((t for t in timings if t.label == backend), None)
            if t is None:  # (an engine that could not run this block)
                continue
            xs.append(g + (b - (len(backends) - 1) / 2) * width)
            heights.append(1000 * t.median_ms)
            errors[0].append(1000 * (t.median_ms - t.q1_ms))
            errors[1].append(1000 * (t.q3_ms - t.median_ms))
        bars = ax.bar(xs, heights, width, yerr=errors, capsize=3, label=backend)
        ax.bar_label(bars, fmt="%.0f", fontsize=8)
    ax.set_xticks(range(len(comparisons)), [textwrap.fill(k, 30) for k in comparisons])
    ax.set_ylabel("time per call (us, median, IQR bars)")
    ax.legend(fontsize=8)
    ax.set_title(textwrap.fill(title, 80))
    fig.tight_layout()
    return fig


def plot_bandwidth_shares(rows: dict[str, dict], bandwidth_gbs: float,
                          title: str = "One token's 4-bit products: GB/s of weights read"):
    """Bars of each build's GB/s (``qgemv.time_products``' rows) under the measured read bandwidth, the roof."""
    fig, ax = plt.subplots(figsize=(8, 3.5))
    labels = [textwrap.fill(label, 22) for label in rows]
    speeds = [row["gb_per_s"] for row in rows.values()]
    bars = ax.bar(labels, speeds, color="tab:blue")
    ax.bar_label(bars, labels=[f"{row['share_of_bandwidth']:.0%}" for row in rows.values()])
    ax.axhline(bandwidth_gbs, color="black", linestyle="--", label=f"read bandwidth, {bandwidth_gbs:.1f} GB/s")
    ax.set_ylabel("GB/s")
    ax.set_ylim(0, bandwidth_gbs * 1.15)
    ax.legend(loc="upper left")
    ax.set_title(textwrap.fill(title, 80))
    fig.tight_layout()
    return fig


def plot_tokens_per_s(rows: dict[str, dict], ceiling: float | None = None,
                      title: str = "Tokens per second, the whole answer"):
    """Bars of each engine's tokens/s (``generation.compare``'s rows) with its range, and the memory ceiling."""
    fig, ax = plt.subplots(figsize=(8, 3.5))
    labels = [textwrap.fill(label, 24) for label in rows]
    medians = [row["tokens_per_s"] for row in rows.values()]
    low = [m - row["tokens_per_s_range"][0] for m, row in zip(medians, rows.values())]
    high = [row["tokens_per_s_range"][1] - m for m, row in zip(medians, rows.values())]
    bars = ax.bar(labels, medians, yerr=[low, high], capsize=4, color="tab:green")
    ax.bar_label(bars, fmt="%.0f", label_type="center", color="white")
    if ceiling:
        ax.axhline(ceiling, color="black", linestyle="--", label=f"memory ceiling, {ceiling:.0f} tokens/s")
        ax.legend(loc="upper left")
    ax.set_ylabel("tokens/s")
    ax.set_title(textwrap.fill(title, 80))
    fig.tight_layout()
    return fig
