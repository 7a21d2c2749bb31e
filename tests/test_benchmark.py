"""The maintainers' benchmark (helpers.maintainers): where databases live, the table's ratios and text, the shipped results."""

import json
import os

import pytest
import tvm

from helpers import bf16, bf16_model, databases, machine, models, paged_cache, peers, quantize, results, transformer, tuning
from helpers.maintainers import report, stages, table, transformer_large, transformer_table


def _target(mcpu="znver4", cores=2):
    return tvm.target.Target({"kind": "llvm", "mcpu": mcpu, "num-cores": cores})


def _row(model, eager, compiled, untuned, tuned=None, dispatched=None, frozen=None, ort=None, openvino=None, noisy=()):
    """A table row as benchmark_model writes it; without ``frozen``, ``ort`` and ``openvino``, one measured before they joined."""
    row = {"model": model, "batch": 1, "compile_s": {peers.COMPILED: 30.0}, "trials_per_task": 32 if tuned else None,
           "database": "transferred from znver4, 2 cores (shipped, 32 trials/task)" if tuned else None,
           "threads": {"TVM": 2, "PyTorch": 2}}
    for label, ms in ((peers.EAGER, eager), (peers.COMPILED, compiled), (peers.FROZEN, frozen),
                      (peers.ORT, ort), (peers.OPENVINO, openvino), (peers.UNTUNED, untuned), (peers.TUNED, tuned),
                      (table.DISPATCHED, dispatched),
                      (table.EAGER_BESIDE_DISPATCHED, 2 * dispatched if dispatched else None),
                      (table.FROZEN_BESIDE_DISPATCHED, 1.5 * dispatched if dispatched else None)):
        if ms is not None:
            row[label] = {"median_ms": ms, "iqr_ms": ms / 2 if label in noisy else ms / 10, "repeats": 20}
    return row


def test_ratios_hold_tuned_against_the_fastest_pytorch_and_engine_and_name_them():
    r = table.ratios(_row("m", eager=12.0, compiled=10.0, untuned=120.0, tuned=8.0, dispatched=6.0,
                              frozen=9.6, ort=6.4))
    assert r == {"fastest_pytorch": peers.FROZEN, "tuned_vs_fastest_pytorch": 1.2,
                 "fastest_engine": peers.ORT, "tuned_vs_fastest_engine": 0.8,
                 "tuned_vs_eager": 1.5, "untuned_vs_eager": 0.1, "dispatched_vs_eager": 2.0,
                 "dispatched_vs_frozen": 1.5}
    r = table.ratios(_row("m", eager=12.0, compiled=10.0, untuned=120.0))
    assert r["fastest_pytorch"] == r["fastest_engine"] == peers.COMPILED  # still named without a tuned build
    assert r["tuned_vs_fastest_pytorch"] is None and r["tuned_vs_fastest_engine"] is None
    assert r["tuned_vs_eager"] is None and r["dispatched_vs_eager"] is None and r["untuned_vs_eager"] == 0.1


def test_ratios_read_rows_measured_before_freezing_and_onnx_runtime_joined():
    shipped = json.loads((results.RESULTS_ROOT / "benchmark-znver4-2cores.json").read_text())["rows"]
    mnv2 = next(row for row in shipped if row["model"] == "mobilenet_v2")
    for label in (peers.FROZEN, peers.ORT, peers.OPENVINO, table.FROZEN_BESIDE_DISPATCHED):  # a row as tables had it before they joined
        del mnv2[label]
    r = table.ratios(mnv2)
    best = min((peers.EAGER, peers.COMPILED), key=lambda label: mnv2[label]["median_ms"])
    assert r["fastest_pytorch"] == r["fastest_engine"] == best
    assert r["tuned_vs_fastest_engine"] == pytest.approx(mnv2[best]["median_ms"] / mnv2[peers.TUNED]["median_ms"])


def test_format_table_has_one_line_per_model_and_says_when_no_database():
    bf16 = f"{peers.OPENVINO}, default: bf16"
    text = table.format_table(
        [{**_row("mobilenet_v2", 12.0, 10.0, 120.0, 8.0, 6.0, frozen=9.6, ort=6.4, openvino=6.6),
          bf16: {"median_ms": 3.2, "iqr_ms": 0.1, "repeats": 20}, "lower_precision": {bf16: 4.5e-3}},
         {**_row("resnet50", 60.0, 50.0, 900.0, frozen=40.0), "missing": {peers.ORT: "ONNX Runtime: no export"}}],
        "test cpu, 2 cores",
    )
    lines = text.splitlines()
    assert lines[0] == "Machine: test cpu, 2 cores"
    assert lines[1] == "Threads: TVM 2, PyTorch 2"  # both libraries on the same threads, said next to the numbers
    mnv2 = next(line for line in lines if line.startswith("| mobilenet_v2"))
    assert "8.00 (0.80)" in mnv2 and "9.60 (0.96)" in mnv2 and "| 6.40 (0.64) | 6.60 (0.66) |" in mnv2 and "| 32 |" in mnv2
    assert "| bf16 3.20 (0.10), error 4.5e-03 |" in mnv2  # OpenVINO's default, apart from the float32 engines
    assert f"| 1.20× ({peers.FROZEN}) | 0.80× ({peers.ORT}) | 1.50× | 0.10× |" in mnv2
    assert "transferred from znver4" in mnv2 and "≈" not in mnv2
    assert "6.00 (0.60)" in mnv2 and "| 2.00× | 1.50× |" in mnv2  # the dense convolutions on oneDNN: 12 / 6, 9 / 6
    r50 = next(line for line in lines if line.startswith("| resnet50"))
    assert "no database" in r50 and "| 40.00 (4.00) | — | — |" in r50  # ONNX Runtime and OpenVINO absent
    assert "ONNX Runtime missing for resnet50: ONNX Runtime: no export" in lines


def test_format_table_marks_unreliable_timings_and_the_speedups_built_on_them():
    row = _row("m", eager=12.0, compiled=10.0, untuned=120.0, tuned=8.0, frozen=9.6, ort=6.4,
               noisy=(peers.ORT,))  # IQR half the median
    line = next(line for line in table.format_table([row], "cpu").splitlines() if line.startswith("| m "))
    assert "| ≈ 6.40 (3.20) |" in line and "| 9.60 (0.96) |" in line
    assert f"| 1.20× ({peers.FROZEN}) | ≈ 0.80× ({peers.ORT}) | 1.50× |" in line


def test_tuning_goes_to_the_learners_own_databases_never_the_shipped_ones(monkeypatch):
    """A top-up run as the README says once wrote into tuning/ and, where a shipped database had that name, tuned nothing."""
    from helpers import config

    monkeypatch.delenv(config.QUICK_ENV, raising=False)
    path = stages.tuning_dir("mobilenet_v2", _target("znver4", 2))
    assert path == databases.OWN_ROOT / "mobilenet_v2-b1-znver4-2cores"
    monkeypatch.setenv(config.QUICK_ENV, "1")
    assert stages.tuning_dir("resnet50", _target("haswell", 2), batch=4) == databases.QUICK_ROOT / "resnet50-b4-haswell-2cores"


def test_results_path_is_per_cpu_and_core_count(tmp_path):
    assert results.results_path(_target("znver4", 2), "md", tmp_path).name == "benchmark-znver4-2cores.md"
    assert results.results_path(_target("znver4", 2), "json", tmp_path, kind="capstone").name == "capstone-znver4-2cores.json"


def test_save_record_stamps_the_time_and_writes_what_it_returns(tmp_path):
    path = tmp_path / "new" / "r.json"
    record = results.save_record(path, machine={"cpu": "znver4"}, rows=[1, 2])
    assert json.loads(path.read_text()) == record
    assert list(record) == ["measured", "machine", "rows"] and record["measured"].endswith("UTC")


def test_read_curve_says_how_to_make_a_missing_curve(tmp_path):
    with pytest.raises(FileNotFoundError, match="helpers.maintainers.benchmark tune"):
        results.read_curve(tmp_path)


def _is_int8(directory) -> bool:
    return f"{quantize.MODEL}_int8" in directory.name


def _is_bf16(directory) -> bool:
    """The models with their convolutions in bf16 (``bf16_model``): like the int8 one, no eager twin to draw a curve against."""
    return any(directory.name.startswith(bf16_model.database_name(m) + "-") for m in models.available_models())


PREFILL_BUCKETS = (transformer.BUCKET_PREFIX, transformer_large.PREFILL_PREFIX)  # static: tuned with prepacking


def _is_transformer(directory) -> bool:
    """Day 14's databases (prefill buckets, the decoding step, the paged step) and make benchmark's large prefill."""
    return directory.name.startswith((*PREFILL_BUCKETS, transformer.DECODE_NAME, paged_cache.DATABASE_NAME))


def test_every_shipped_database_comes_with_its_curve_and_matches_its_name():
    shipped = [p for p in databases.SHIPPED_ROOT.iterdir()
               if p.is_dir() and not _is_int8(p) and not _is_bf16(p) and not _is_transformer(p)]
    assert shipped, "the course ships at least one tuning database"
    for directory in shipped:
        curve = results.read_curve(directory)
        target = tvm.target.Target(json.loads(curve["target"]))
        assert directory == databases.database_dir(curve["model"], target, curve["batch"]), directory.name
        summary = tuning.database_summary(directory)
        assert summary["targets"] == [str(target)], f"{directory.name}: records for other targets"
        assert summary["failed_records"] < summary["records"]
        points = curve["points"]
        assert points and [p["trials_per_task"] for p in points] == sorted(p["trials_per_task"] for p in points)
        kept = curve.get("shipped_records_per_kernel")
        assert kept, f"{directory.name}: ship a pruned database (helpers.maintainers.benchmark tune --keep)"
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
        settings = json.loads((directory / tuning.SETTINGS_FILE).read_text())
        targets = [tvm.target.Target(json.loads(t)) for t in summary["targets"]]
        names = [databases.database_dir(quantize.database_model(t), t).name for t in targets]
        assert names.count(directory.name) == 1, f"{directory.name}: no records, or records for several targets, of its own CPU"
        # Tuned on a CPU with AMX, its tile-scheduled kernels' records are borrowed from the databases it names
        assert sorted(n for n in names if n != directory.name) == sorted(b["database"] for b in settings.get("kernels_from", []))
        assert summary["failed_records"] == 0 and summary["records"] == summary["workloads"], directory.name
        assert not settings["quick"] and tuning.budget(directory) == settings["trials_per_task"], directory.name


def test_shipped_bf16_databases_match_their_name_run_where_bf16_does_and_keep_the_best_record_per_kernel():
    """The bf16 models' databases (python -m helpers.maintainers.shipping bf16) have no eager curve either."""
    shipped = [p for p in databases.SHIPPED_ROOT.iterdir() if p.is_dir() and _is_bf16(p)]
    assert {p.name.split("-")[0] for p in shipped} >= {bf16_model.database_name(m) for m in ("mobilenet_v2", "resnet50")}
    for directory in shipped:
        summary = tuning.database_summary(directory)
        assert len(summary["targets"]) == 1, f"{directory.name}: records for several targets"
        target = tvm.target.Target(json.loads(summary["targets"][0]))
        assert bf16.has_bf16(target), f"{directory.name}: tuned for a CPU without AVX-512 BF16"
        assert directory == databases.database_dir(directory.name.split("-")[0], target), directory.name
        assert summary["failed_records"] == 0 and summary["records"] == summary["workloads"], directory.name
        settings = json.loads((directory / tuning.SETTINGS_FILE).read_text())
        seed = settings.get("seeded_from") or {}  # (shipping bf16 --seed-from: the other CPU's trials count too)
        assert not seed or databases.SHIPPED_ROOT.joinpath(seed["database"]).is_dir() or seed.get("retired"), \
            f"{directory.name} was seeded from {seed['database']}, which does not ship and is not said to be retired"
        assert not settings["quick"] and tuning.budget(directory) == settings["trials_per_task"] + seed.get(
            "trials_per_task", 0), directory.name


def test_shipped_transformer_databases_match_their_name_and_keep_the_best_record_per_kernel():
    """Day 14's databases and the large prefill's (python -m helpers.maintainers.shipping) have no curve of their own."""
    shipped = [p for p in databases.SHIPPED_ROOT.iterdir() if p.is_dir() and _is_transformer(p)]
    assert {p.name.split("-")[0] for p in shipped} >= {*map(transformer.bucket_name, transformer.BUCKETS), transformer.DECODE_NAME,
                                                      paged_cache.DATABASE_NAME, f"{transformer_large.PREFILL_PREFIX}128"}
    for directory in shipped:
        summary = tuning.database_summary(directory)
        assert len(summary["targets"]) == 1, f"{directory.name}: records for several targets"
        target = tvm.target.Target(json.loads(summary["targets"][0]))
        assert directory == databases.database_dir(directory.name.split("-")[0], target), directory.name
        assert summary["failed_records"] == 0 and summary["records"] == summary["workloads"], directory.name
        settings = json.loads((directory / tuning.SETTINGS_FILE).read_text())
        # weights are prepacked in the static buckets only: with a symbolic past prepacking computes wrong numbers
        assert settings["prepack"] is directory.name.startswith(PREFILL_BUCKETS), directory.name
        assert not settings["quick"], directory.name


def test_shipped_results_name_their_machine():
    for path in results.RESULTS_ROOT.glob("benchmark-*.json"):
        record = json.loads(path.read_text())
        assert record["machine"]["cpu"] and record["machine"]["cores"] >= 1 and record["measured"]
        assert {row["model"] for row in record["rows"]} >= {"mobilenet_v2"}
        assert path.with_suffix(".md").is_file()


def test_the_table_and_tuning_can_target_an_imitated_cpu_class(monkeypatch):
    assert str(machine.target_for(None)) == str(machine.cpu_target())
    assert str(machine.target_for(machine.cpu_name())) == str(machine.cpu_target())
    assert not machine.is_imitated(machine.cpu_target())
    if machine.vector_width_bits() < 512:
        pytest.skip("imitating an AVX2 CPU needs one with AVX-512")
    # machine.imitated_target sets these for the whole process: setenv records them, so they are restored after the test
    # (delenv of an unset variable records nothing, and the AVX2 settings leaked into later tests and notebooks)
    for name in ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA", "TORCHINDUCTOR_CACHE_DIR"):
        monkeypatch.setenv(name, "unset")
    avx2 = machine.avx2_stand_in()  # znver3 on an AMD CPU, haswell on an Intel one
    imitated = machine.target_for(avx2)
    assert imitated.attrs["mcpu"] == avx2 and machine.is_imitated(imitated)
    assert machine.vector_width_bits(imitated) == 256
    # Inductor's cache keeps the kernels of each vector ISA apart: it does not key them by ATEN_CPU_CAPABILITY
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"].endswith("torchinductor-avx2")
    assert results.results_path(imitated, "md").name == f"benchmark-{avx2}-{machine.core_count()}cores.md"


def test_format_transformer_has_rows_per_bucket_and_for_decode_against_eager_and_marks_noise():
    record = lambda median, iqr: {"median_ms": median, "iqr_ms": iqr, "repeats": 10}  # noqa: E731
    bucket = lambda length, tvm_ms, verdict: {  # noqa: E731
        "length": length, "database": f"bucket {length}, tuned for this CPU", "verdict": verdict,
        "engines": {"PyTorch eager": record(1.0, 0.01), "TVM bucket, tuned": record(tvm_ms, 0.01), "torch.compile": record(0.8, 0.5)},
        "missing": {"ONNX Runtime": "ONNX Runtime: not installed"}}
    result = {"model": "TinyGPT", "past": 64, "prefill": [bucket(64, 0.5, "TVM bucket, tuned is 1.60x faster"),
                                                        bucket(128, 0.4, "TVM bucket, tuned is 2.00x faster")],
              "decode": {"PyTorch eager": record(0.3, 0.01), "TVM decode, symbolic past": record(0.6, 0.01)}}
    text = transformer_table.format_transformer(result, "a test machine")
    assert "| prefill, 64 tokens | TVM bucket, tuned | 0.500 (0.010) | 2.00× |" in text
    assert "| prefill, 128 tokens | TVM bucket, tuned | 0.400 (0.010) | 2.50× |" in text
    assert "| decode after 64 | TVM decode, symbolic past | 0.600 (0.010) | 0.50× |" in text
    assert f"| prefill, 64 tokens | torch.compile | {report.UNRELIABLE_MARK}0.800 (0.500) |" in text
    assert "ONNX Runtime not measured: ONNX Runtime: not installed" in text
    assert "Prefill of 128 tokens:\nTVM bucket, tuned is 2.00x faster" in text and "bucket 128, tuned for this CPU" in text
