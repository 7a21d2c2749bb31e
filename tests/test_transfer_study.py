"""The transfer study's own logic: imitating a smaller CPU kind (helpers.machine), and reading the studies back.

The study itself tunes for half an hour; it is run by hand and its results are kept in results/.
These tests check what decides which CPU a study stands for and how Day 8 reads the files.
"""

import json
import os

import pytest
import tvm

from helpers import machine, transfer_study
from helpers.maintainers import transfer_study as study_command


@pytest.fixture
def host_is_a_zen4(monkeypatch):
    """Pretend this machine is a Zen 4 (AVX-512, VNNI), whatever CI runs on; restore PyTorch's ISA variables after."""
    real = machine.cpu_features
    zen4 = tvm.target.Target({"kind": "llvm", "mcpu": "znver4"})
    monkeypatch.setattr(machine, "cpu_features", lambda target=None: real(target if target is not None else zen4))
    monkeypatch.setattr(machine, "cpu_name", lambda: "znver4")
    for var in ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA", "TORCHINDUCTOR_CACHE_DIR"):
        monkeypatch.setenv(var, "unset")


@pytest.mark.parametrize(("mcpu", "aten", "onednn"), [
    ("znver3", "avx2", "AVX2"), ("haswell", "avx2", "AVX2"), ("skylake-avx512", "avx512", "AVX512_CORE")])
def test_imitating_a_smaller_cpu_builds_for_it_and_holds_pytorch_to_its_vectors(host_is_a_zen4, mcpu, aten, onednn):
    target = machine.imitated_target(mcpu)
    assert target.attrs["mcpu"] == mcpu
    assert target.attrs["num-cores"] == machine.physical_core_count()
    assert (os.environ["ATEN_CPU_CAPABILITY"], os.environ["ONEDNN_MAX_CPU_ISA"]) == (aten, onednn)
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"].endswith(f"torchinductor-{aten}")  # kernels of one ISA apart


def test_a_cpu_with_instructions_this_one_lacks_cannot_be_imitated(host_is_a_zen4):
    with pytest.raises(ValueError, match=r"znver4 lacks instructions sapphirerapids has \(.*amx"):
        machine.imitated_target("sapphirerapids")
    with pytest.raises(ValueError, match="LLVM does not know a CPU called 'zen9'"):
        machine.imitated_target("zen9")


@pytest.mark.parametrize(("host", "stand_in"), [("znver4", "znver3"), ("emeraldrapids", "haswell"), ("sandybridge", None)])
def test_the_avx2_stand_in_is_one_this_cpu_can_imitate(monkeypatch, host, stand_in):
    real = machine.cpu_features
    host_target = tvm.target.Target({"kind": "llvm", "mcpu": host})
    monkeypatch.setattr(machine, "cpu_features", lambda target=None: real(target if target is not None else host_target))
    assert machine.avx2_stand_in() == stand_in


def test_the_command_line_refuses_an_unknown_cpu_before_any_work(capsys):
    with pytest.raises(SystemExit) as exit_info:
        study_command.main(["mobilenet_v2", "--mcpu", "zen9"])
    assert exit_info.value.code == 2
    assert "LLVM does not know a CPU called 'zen9'" in capsys.readouterr().err


def _study(mcpu: str, speedups: dict[str, float], imitated_on: str | None = None) -> dict:
    rows = [{"arm": "PyTorch eager", "median_ms": 10.0, "iqr_ms": 0.1}]
    rows += [{"arm": arm, "median_ms": 10.0 / s, "iqr_ms": 0.1, "tuning_min": 1.0, "speedup_vs_eager": s}
             for arm, s in speedups.items()]
    return {"measured": "2026-11-25 00:00 UTC", "model": "mobilenet_v2",
            "target": json.dumps({"kind": "llvm", "mcpu": mcpu, "num-cores": 2}),
            "imitated": {"on": imitated_on, "torch_isa": "AVX2"} if imitated_on else None,
            "source": {"database": "d", "tuned_for": "znver4, 2 cores", "trials_per_task": 64}, "rows": rows}


def test_studies_on_real_hardware_come_first_and_compare_side_by_side(tmp_path):
    # File names sort the imitated Zen 3 first; Day 8 falls back on the first study, so it must be a real one.
    (tmp_path / "transfer-mobilenet_v2-znver3-2cores-on-znver5.json").write_text(
        json.dumps(_study("znver3", {"untuned": 0.05, "transferred": 1.4}, imitated_on="znver5")))
    (tmp_path / "transfer-mobilenet_v2-znver5-2cores.json").write_text(
        json.dumps(_study("znver5", {"untuned": 0.08, "transferred": 2.2})))
    (tmp_path / "transfer-resnet50-znver5-2cores.json").write_text(json.dumps(_study("znver5", {"untuned": 0.01})))
    studies = transfer_study.load_studies("mobilenet_v2", tmp_path)
    assert [transfer_study.study_label(s) for s in studies] == ["znver5", "znver3 (imitated on a znver5)"]
    assert studies[0]["path"].name == "transfer-mobilenet_v2-znver5-2cores.json"
    table = transfer_study.compare_studies(studies)
    assert list(table.columns) == ["CPU", "database from", "untuned", "transferred"]
    assert table["transferred"].tolist() == [2.2, 1.4]
    assert table["database from"].tolist() == ["znver4, 2 cores (64/task)"] * 2


def test_every_kept_study_reads_back_with_eager_and_each_build():
    studies = transfer_study.load_studies("mobilenet_v2")
    assert studies, "results/ should hold at least one transfer study of MobileNetV2"
    assert not studies[0].get("imitated"), "a study measured on real hardware should be kept"
    for study in studies:
        arms = [r["arm"] for r in study["rows"]]
        assert arms[:3] == ["PyTorch eager", transfer_study.ARM_UNTUNED, transfer_study.ARM_TRANSFERRED], study["path"]
        assert all(r["relative_error"] < 1e-4 for r in study["rows"][1:]), study["path"]
