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
