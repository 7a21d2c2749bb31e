"""helpers.benchmark: where databases live, the table's ratios and text, the shipped results."""

import json

import pytest
import tvm

from helpers import benchmark, databases, quantize, tuning


def _target(mcpu="znver4", cores=2):
    return tvm.target.Target({"kind": "llvm", "mcpu": mcpu, "num-cores": cores})


def _row(model, eager, compiled, untuned, tuned=None, dispatched=None):
    row = {"model": model, "batch": 1, "torch_compile_s": 30.0, "trials_per_task": 32 if tuned else None,
           "database": "transferred from znver4, 2 cores (shipped, 32 trials/task)" if tuned else None,
           "threads": {"TVM": 2, "PyTorch": 2}}
    for label, ms in ((benchmark.EAGER, eager), (benchmark.COMPILED, compiled), (benchmark.UNTUNED, untuned),
                      (benchmark.TUNED, tuned), (benchmark.DISPATCHED, dispatched),
                      (benchmark.EAGER_BESIDE_DISPATCHED, 2 * dispatched if dispatched else None)):
        if ms is not None:
            row[label] = {"median_ms": ms, "iqr_ms": ms / 10, "repeats": 20}
    return row


def test_ratios_are_speedups_and_missing_tuned_is_none():
    r = benchmark.ratios(_row("m", eager=12.0, compiled=10.0, untuned=120.0, tuned=8.0, dispatched=6.0))
    assert r == {"tuned_vs_eager": 1.5, "dispatched_vs_eager": 2.0, "tuned_vs_compile": 1.25, "untuned_vs_eager": 0.1}
    r = benchmark.ratios(_row("m", eager=12.0, compiled=10.0, untuned=120.0))
    assert r["tuned_vs_eager"] is None and r["tuned_vs_compile"] is None and r["untuned_vs_eager"] == 0.1
    assert r["dispatched_vs_eager"] is None


def test_format_table_has_one_line_per_model_and_says_when_no_database():
    text = benchmark.format_table(
        [_row("mobilenet_v2", 12.0, 10.0, 120.0, 8.0, 6.0), _row("resnet50", 60.0, 50.0, 900.0)], "test cpu, 2 cores"
    )
    lines = text.splitlines()
    assert lines[0] == "Machine: test cpu, 2 cores"
    assert lines[1] == "Threads: TVM 2, PyTorch 2"  # both libraries on the same threads, said next to the numbers
    mnv2 = next(line for line in lines if line.startswith("| mobilenet_v2"))
    assert "8.00 (0.80)" in mnv2 and "1.50×" in mnv2 and "1.25×" in mnv2 and "0.10×" in mnv2 and "| 32 |" in mnv2
    assert "transferred from znver4" in mnv2
    assert "6.00 (0.60)" in mnv2 and "| 2.00× |" in mnv2  # the dense convolutions on oneDNN: 12 / 6
    r50 = next(line for line in lines if line.startswith("| resnet50"))
    assert "no database" in r50 and "—" in r50


def test_results_path_is_per_cpu_and_core_count(tmp_path):
    assert benchmark.results_path(_target("znver4", 2), "md", tmp_path).name == "benchmark-znver4-2cores.md"
    assert benchmark.results_path(_target("znver4", 2), "json", tmp_path, kind="capstone").name == "capstone-znver4-2cores.json"


def test_save_record_stamps_the_time_and_writes_what_it_returns(tmp_path):
    path = tmp_path / "new" / "r.json"
    record = benchmark.save_record(path, machine={"cpu": "znver4"}, rows=[1, 2])
    assert json.loads(path.read_text()) == record
    assert list(record) == ["measured", "machine", "rows"] and record["measured"].endswith("UTC")


def test_read_curve_says_how_to_make_a_missing_curve(tmp_path):
    with pytest.raises(FileNotFoundError, match="helpers.benchmark tune"):
        benchmark.read_curve(tmp_path)


def _is_int8(directory) -> bool:
    return f"{quantize.MODEL}_int8" in directory.name


def test_every_shipped_database_comes_with_its_curve_and_matches_its_name():
    shipped = [p for p in databases.SHIPPED_ROOT.iterdir() if p.is_dir() and not _is_int8(p)]
    assert shipped, "the course ships at least one tuning database"
    for directory in shipped:
        curve = benchmark.read_curve(directory)
        target = tvm.target.Target(json.loads(curve["target"]))
        assert directory == databases.database_dir(curve["model"], target, curve["batch"]), directory.name
        summary = tuning.database_summary(directory)
        assert summary["targets"] == [str(target)], f"{directory.name}: records for other targets"
        assert summary["failed_records"] < summary["records"]
        points = curve["points"]
        assert points and [p["trials_per_task"] for p in points] == sorted(p["trials_per_task"] for p in points)
        kept = curve.get("shipped_records_per_kernel")
        assert kept, f"{directory.name}: ship a pruned database (helpers.benchmark tune --keep)"
        assert summary["records"] <= min(points[-1]["records"], kept * summary["workloads"])
        settings = json.loads((directory / tuning.SETTINGS_FILE).read_text())
        assert settings["prepack"] is True and not settings["quick"], directory.name
        assert tuning.budget(directory) == points[-1]["trials_per_task"] + (settings.get("seeded_from") or {}).get(
            "trials_per_task", 0), f"{directory.name}: the budget it says is not the one its curve shows"


def test_shipped_int8_databases_match_their_name_and_keep_the_best_record_per_kernel():
    """Day 12's databases (python -m helpers.quantize tune) have no eager curve: int8 has no eager twin."""
    shipped = [p for p in databases.SHIPPED_ROOT.iterdir() if p.is_dir() and _is_int8(p)]
    assert shipped, "the course ships Day 12's int8 database"
    for directory in shipped:
        summary = tuning.database_summary(directory)
        assert len(summary["targets"]) == 1, f"{directory.name}: records for several targets"
        target = tvm.target.Target(json.loads(summary["targets"][0]))
        assert directory == databases.database_dir(quantize.database_model(target), target), directory.name
        assert summary["failed_records"] == 0 and summary["records"] == summary["workloads"], directory.name
        settings = json.loads((directory / tuning.SETTINGS_FILE).read_text())
        assert not settings["quick"] and tuning.budget(directory) == settings["trials_per_task"], directory.name


def test_shipped_results_name_their_machine():
    for path in benchmark.RESULTS_ROOT.glob("benchmark-*.json"):
        record = json.loads(path.read_text())
        assert record["machine"]["cpu"] and record["machine"]["cores"] >= 1 and record["measured"]
        assert {row["model"] for row in record["rows"]} >= {"mobilenet_v2"}
        assert path.with_suffix(".md").is_file()
