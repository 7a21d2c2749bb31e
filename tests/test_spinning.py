"""Day 13's TVM-only rows with TVM's default thread spinning: timed in a child process of their own."""

import pytest
import torch

from helpers import build, dispatch, models, spinning
from helpers.errors import ParityError


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv, self.bn = torch.nn.Conv2d(3, 8, 3, padding=1, bias=False), torch.nn.BatchNorm2d(8)
        self.head = torch.nn.Linear(8, 4)

    def forward(self, x):
        return self.head(torch.relu(self.bn(self.conv(x))).mean((2, 3)))


@pytest.fixture(scope="module")
def builds():
    torch.manual_seed(0)
    model = Net().eval()
    x = torch.randn(1, 3, 12, 12, generator=torch.Generator().manual_seed(1))
    imported = models.import_to_relax(model, x)
    plain = build.compile_model(imported)
    dispatched = dispatch.compile_dispatched(imported, prepack=True)  # its weights packed at load, by main_transform_params
    return imported, x, {"plain": plain, "dispatched": dispatched}


def test_the_builds_are_timed_in_a_child_that_spins_by_default_and_computes_what_they_compute_here(builds, monkeypatch):
    imported, x, compiled = builds
    monkeypatch.setenv(spinning.SPIN_ENV, "0")  # as Day 13 sets it: the child must not inherit it (it exits if it does)
    found = spinning.time_with_default_spinning(compiled, imported.params, x, repeats=3)
    assert [t.label for t in found] == ["plain", "dispatched"]
    assert all(len(t.times_ms) >= 3 and t.median_ms > 0 for t in found)


def test_weights_other_than_the_build_takes_are_caught(builds):
    imported, x, compiled = builds
    changed = [p.numpy() + 1 if i == 0 else p for i, p in enumerate(imported.params)]
    with pytest.raises(ParityError, match="other numbers in the timing process"):
        spinning.time_with_default_spinning({"plain": compiled["plain"]}, changed, x, repeats=2)


def test_kernels_are_timed_in_a_child_that_spins_by_default_and_their_numbers_are_checked(monkeypatch):
    import numpy as np
    import tvm
    from tvm import te

    from helpers import kernels

    a = te.placeholder((64, 64), name="a")
    doubled = te.compute((64, 64), lambda i, j: a[i, j] * 2, name="doubled")
    kernel = kernels.build(te.create_prim_func([a, doubled]))
    relax_exe = tvm.compile(dispatch.te_module(lambda x: te.compute(x.shape, lambda i, j: x[i, j] * 2), [(64, 64)]))
    x = np.random.default_rng(0).random((64, 64), dtype=np.float32)
    monkeypatch.setenv(spinning.SPIN_ENV, "0")
    found = spinning.time_kernels_with_default_spinning({"kernel": kernel, "relax": relax_exe}, [x], 2 * x, repeats=3)
    assert [t.label for t in found] == ["kernel", "relax"] and all(t.median_ms > 0 for t in found)
    with pytest.raises(ParityError, match="kernel computed other numbers"):
        spinning.time_kernels_with_default_spinning({"kernel": kernel}, [x], 3 * x, repeats=2)
