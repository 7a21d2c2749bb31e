import matplotlib

matplotlib.use("Agg")

import pytest

from helpers import plotting, profiling, timing


def _sweep():
    return [timing.Timing(label, b, [ms * b, ms * b * 1.1, ms * b * 0.9]) for label, ms in (("eager", 2.0), ("tvm", 1.0))
            for b in (1, 4, 16)]


def test_sweep_plot_has_units_and_both_backends():
    fig = plotting.plot_sweep(_sweep(), machine="test cpu")
    lat, thr = fig.axes
    assert "ms" in lat.get_ylabel() and "images/s" in thr.get_ylabel()
    assert lat.get_xlabel() == "batch size"
    assert {t.get_text() for t in lat.get_legend().get_texts()} == {"eager", "tvm"}
    assert "test cpu" in fig._suptitle.get_text()


def test_profile_plot_shows_the_slowest_first():
    prof = profiling.Profile([profiling.KernelTime(f"k{i}", "conv2d" if i % 2 else "add", 1, float(i)) for i in range(10)],
                             end_to_end_ms=50.0)
    fig = plotting.plot_profile(prof, k=4)
    ax = fig.axes[0]
    labels = [t.get_text() for t in ax.get_yticklabels()]
    assert labels[-1].startswith("k9") and len(labels) == 4
    assert "ms" in ax.get_xlabel()


def test_speedup_plot_labels_ratios():
    fig = plotting.plot_speedups(_sweep(), baseline="eager")
    texts = [t.get_text() for t in fig.axes[0].texts]
    assert "2.00x" in texts and "1.00x" in texts
    with pytest.raises(ValueError, match="No timing labelled"):
        plotting.plot_speedups(_sweep(), baseline="jax")


def test_long_kernel_names_are_shortened():
    name = "fused_conv2d12_add9_clip5_conv2d13_add10_clip6_extra"
    prof = profiling.Profile([profiling.KernelTime(name, "conv2d", 2, 3.0)], end_to_end_ms=4.0)
    label = plotting.plot_profile(prof).axes[0].get_yticklabels()[0].get_text()
    assert label.startswith(name[:20]) and "\u2026" in label and label.endswith("(x2)")
    assert len(label) < len(name)


def test_share_plot_has_one_bar_per_build_and_operator():
    shares = {"default": {"conv2d": 0.75, "add": 0.25}, "fused": {"conv2d": 0.9, "clip": 0.1}}
    ax = plotting.plot_shares(shares).axes[0]
    assert len(ax.patches) == 2 * 3  # 2 builds x 3 operator types
    assert [t.get_text() for t in ax.get_yticklabels()] == ["conv2d", "add", "clip"]
    assert "%" in ax.get_xlabel()
    with pytest.raises(ValueError, match="at least one build"):
        plotting.plot_shares({})


def test_gflops_plot_draws_steps_as_bars_and_peak_and_reference_as_lines():
    steps = [timing.Timing(label, 1, [ms, ms * 1.1, ms * 0.9]) for label, ms in (("naive", 10.0), ("fast", 1.0), ("torch", 2.0))]
    fig = plotting.plot_gflops(steps, flops=2_000_000, peak=100.0, reference="torch")
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["naive", "fast"]
    assert "GFLOP/s" in ax.get_ylabel() and ax.get_title()
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert any("peak: 100" in t for t in legend) and any(t.startswith("torch: 1.0") for t in legend)
    with pytest.raises(ValueError, match="No timing labelled"):
        plotting.plot_gflops(steps, flops=1, reference="jax")


def test_tuning_curve_plot_draws_both_latencies_against_minutes():
    points = [
        {"trials_per_task": 16, "tuning_s": 1200.0, "tuned_ms": 12.0, "tuned_iqr_ms": 0.2, "eager_ms": 13.0, "eager_iqr_ms": 1.0},
        {"trials_per_task": 8, "tuning_s": 600.0, "tuned_ms": 20.0, "tuned_iqr_ms": 0.4, "eager_ms": 12.0, "eager_iqr_ms": 0.8},
    ]
    fig = plotting.plot_tuning_curve(points)
    ax = fig.axes[0]
    assert "minutes" in ax.get_xlabel() and "ms" in ax.get_ylabel()
    assert {t.get_text() for t in ax.get_legend().get_texts()} == {"TVM tuned", "PyTorch eager"}
    tuned = next(c for c in ax.containers if c.get_label() == "TVM tuned")  # errorbar: line, caps, bars
    assert list(tuned.lines[0].get_xdata()) == [10.0, 20.0]  # sorted by tuning time, in minutes
    assert list(tuned.lines[0].get_ydata()) == [20.0, 12.0]
    assert {t.get_text() for t in ax.texts} == {"8/task", "16/task"}
    with pytest.raises(ValueError, match="at least one point"):
        plotting.plot_tuning_curve([])


def test_transfer_study_plot_draws_each_build_against_eager_with_its_tuning_minutes():
    rows = [
        {"arm": "PyTorch eager", "median_ms": 12.0, "iqr_ms": 1.0},
        {"arm": "untuned", "median_ms": 190.0, "iqr_ms": 2.0, "tuning_min": 0.0},
        {"arm": "transferred", "median_ms": 11.0, "iqr_ms": 0.2, "tuning_min": 0.0},
        {"arm": "transferred + 8 trials/task", "median_ms": 10.0, "iqr_ms": 0.2, "tuning_min": 5.4},
    ]
    fig = plotting.plot_transfer_study(rows)
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_yticklabels()] == [
        "untuned  (0 min here)", "transferred  (0 min here)", "transferred + 8 trials/task  (5 min here)"]
    assert [round(p.get_width(), 1) for p in ax.patches] == [190.0, 11.0, 10.0]
    assert [t.get_text() for t in ax.texts] == ["0.06x eager", "1.09x eager", "1.20x eager"]
    assert ax.get_legend().get_texts()[0].get_text() == "PyTorch eager, 12.0 ms"
    with pytest.raises(ValueError, match="eager's row"):
        plotting.plot_transfer_study(rows[1:])


def test_roofline_draws_the_roof_the_ridge_and_each_kernel():
    fig = plotting.plot_roofline(100.0, 20.0, {"naive": (10.0, 2.0), "tuned": (10.0, 60.0)}, title="t")
    ax = fig.axes[0]
    roof = ax.lines[0]
    xs, ys = roof.get_xdata(), roof.get_ydata()
    assert max(ys) == 100.0 and abs(ys[0] - 20.0 * xs[0]) < 1e-9  # memory slope, then the flat peak
    assert ax.lines[1].get_xdata()[0] == 5.0  # the ridge: 100 GFLOP/s / 20 GB/s
    assert len(ax.collections) == 2 and ax.get_xscale() == ax.get_yscale() == "log"
    with pytest.raises(ValueError, match="positive"):
        plotting.plot_roofline(0.0, 20.0, {})


def test_tiling_plot_draws_each_tiling_against_the_separate_kernels():
    timings = [timing.Timing("three", 1, [0.4, 0.41]), timing.Timing("rows=4", 1, [0.3, 0.31]),
               timing.Timing("channels=48", 1, [0.5, 0.52])]
    fig = plotting.plot_tilings(timings, baseline="three")
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["rows=4", "channels=48"]
    assert [round(p.get_height()) for p in ax.patches] == [305, 510]
    assert "us" in ax.get_ylabel() and "three: 405 us" in ax.get_legend().get_texts()[0].get_text()
    with pytest.raises(ValueError, match="No timing labelled"):
        plotting.plot_tilings(timings, baseline="four")


def test_block_comparison_groups_each_blocks_backends_and_skips_a_missing_one():
    comparisons = {"big": [timing.Timing(b, 1, [ms]) for b, ms in (("tvm", 0.3), ("ort", 0.6), ("ov", 0.5))],
                   "small": [timing.Timing(b, 1, [ms]) for b, ms in (("tvm", 0.1), ("ort", 0.2))]}
    fig = plotting.plot_block_comparison(comparisons)
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["tvm", "ort", "ov"]
    assert sorted(round(p.get_height()) for p in ax.patches) == [100, 200, 300, 500, 600]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["big", "small"]
