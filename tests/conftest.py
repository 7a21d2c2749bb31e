"""Shared fixtures: small real models, imported and compiled once per session."""

import os

import pytest
import torch

from helpers import build, models

# `make test` runs the suite from make: a test that runs make itself (make -n student, a handout's make test)
# must see what a shell sees, not the outer make's flags ("Entering directory" lines) or its DAY=.
for _name in ("MAKEFLAGS", "MAKELEVEL", "MFLAGS", "DAY"):
    os.environ.pop(_name, None)


class TinyNet(torch.nn.Module):
    """Conv + BN + ReLU + pool + linear: every op family the course profiles, in milliseconds."""

    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 16, 3, padding=1)
        self.bn = torch.nn.BatchNorm2d(16)
        self.fc = torch.nn.Linear(16, 10)

    def forward(self, x):
        y = torch.relu(self.bn(self.conv(x)))
        return self.fc(torch.flatten(torch.nn.functional.adaptive_avg_pool2d(y, 1), 1))


@pytest.fixture(scope="session")
def tiny_model():
    torch.manual_seed(0)
    return TinyNet().eval()


@pytest.fixture(scope="session")
def tiny_input():
    return torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(1))


@pytest.fixture(scope="session")
def tiny_imported(tiny_model, tiny_input):
    return models.import_to_relax(tiny_model, tiny_input)


@pytest.fixture(scope="session")
def tiny_compiled(tiny_imported):
    return build.compile_model(tiny_imported)


@pytest.fixture(scope="session")
def mobilenet():
    """MobileNetV2 with seeded random weights (the course's running model)."""
    return models.load_model("mobilenet_v2", pretrained=False)


@pytest.fixture(scope="session")
def mobilenet_compiled(mobilenet):
    return build.compile_model(models.import_to_relax(mobilenet, models.example_input()))


@pytest.fixture(scope="session")
def retarget():
    """Copy a tuning database with every record stamped as tuned for another target: a database from another CPU."""
    from tvm.s_tir import meta_schedule as ms

    def copy(src_dir, dst_dir, target):
        src = ms.database.JSONDatabase(work_dir=str(src_dir), allow_missing=False)
        dst_dir.mkdir(parents=True)
        dst = ms.database.JSONDatabase(work_dir=str(dst_dir))
        for record in src.get_all_tuning_records():
            workload = dst.commit_workload(record.workload.mod)
            dst.commit_tuning_record(
                ms.database.TuningRecord(record.trace, workload, record.run_secs, target, record.args_info)
            )
        settings = src_dir / "course_tuning.json"
        if settings.is_file():
            (dst_dir / settings.name).write_text(settings.read_text())

    return copy

