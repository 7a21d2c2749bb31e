"""Shared fixtures: small real models, imported and compiled once per session."""

import pytest
import torch

from helpers import build, models


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
