"""helpers.dynamic: one compiled module serving every batch size."""

import numpy as np
import pytest
import torch
import tvm

from helpers import build, dynamic, timing
from helpers.errors import InputShapeError


@pytest.fixture(scope="module")
def dyn_compiled(tiny_model):
    example = torch.randn(1, 3, 32, 32, generator=torch.Generator().manual_seed(3))
    imported = dynamic.import_dynamic_batch(tiny_model, example, max_batch=8)
    return dynamic.compile_dynamic(imported)


def test_the_batch_dimension_is_symbolic(tiny_model):
    imported = dynamic.import_dynamic_batch(tiny_model, torch.randn(1, 3, 32, 32), max_batch=8)
    shape = list(imported.mod["main"].params[0].ty.shape)
    assert isinstance(shape[0], tvm.tirx.Var), f"batch dimension should be a symbolic variable, got {shape[0]}"
    assert [int(d) for d in shape[1:]] == [3, 32, 32]
    assert imported.input_shape == (1, 3, 32, 32) and imported.max_batch == 8


@pytest.mark.parametrize("batch", [1, 3, 8])
def test_one_module_matches_pytorch_at_every_batch(dyn_compiled, tiny_model, batch):
    x = torch.randn(batch, 3, 32, 32, generator=torch.Generator().manual_seed(batch))
    with torch.no_grad():
        expected = tiny_model(x).numpy()
    got = dyn_compiled(x)
    assert got.shape == (batch, 10)
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5)
    assert build.check_parity(dyn_compiled, tiny_model, x) < 1e-4


@pytest.mark.parametrize("shape", [(9, 3, 32, 32), (2, 3, 16, 16), (2, 3, 32), (0, 3, 32, 32)])
def test_wrong_shapes_are_refused_with_the_accepted_range(dyn_compiled, shape):
    with pytest.raises(InputShapeError, match=r"1 <= batch <= 8"):
        dyn_compiled.to_device(np.zeros(shape, dtype="float32"))


def test_wrong_dtype_is_refused(dyn_compiled):
    with pytest.raises(InputShapeError, match="float32"):
        dyn_compiled.to_device(np.zeros((2, 3, 32, 32), dtype="float64"))


def test_timing_runner_accepts_the_dynamic_model(dyn_compiled):
    runs = timing.measure(
        {f"b{b}": timing.tvm_runner(dyn_compiled, torch.randn(b, 3, 32, 32)) for b in (1, 4)}, warmup=1, repeats=2
    )
    assert [t.label for t in runs] == ["b1", "b4"] and all(t.median_ms > 0 for t in runs)


def test_bad_arguments():
    with pytest.raises(ValueError, match="max_batch"):
        dynamic.import_dynamic_batch(torch.nn.ReLU(), torch.randn(1, 4), max_batch=1)
    with pytest.raises(InputShapeError):
        dynamic.import_dynamic_batch(torch.nn.ReLU(), [1.0, 2.0])
