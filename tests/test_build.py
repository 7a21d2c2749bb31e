import numpy as np
import pytest
import torch

from helpers import build, machine
from helpers.errors import InputShapeError, NoGPUError


def test_compiled_model_matches_pytorch(tiny_compiled, tiny_model, tiny_input):
    diff = build.check_parity(tiny_compiled, tiny_model, tiny_input)
    assert diff < 1e-4


def test_parity_check_catches_a_different_model(tiny_compiled, tiny_model, tiny_input):
    other = type(tiny_model)().eval()  # same architecture, other random weights
    with pytest.raises(AssertionError, match="differs from PyTorch"):
        build.check_parity(tiny_compiled, other, tiny_input)


def test_numpy_input_works_and_wrong_shapes_are_explained(tiny_compiled, tiny_input):
    np.testing.assert_allclose(tiny_compiled(tiny_input.numpy()), tiny_compiled(tiny_input))
    with pytest.raises(InputShapeError, match=r"compiled for input \(2, 3, 32, 32\) float32.*\(1, 3, 32, 32\)"):
        tiny_compiled(torch.randn(1, 3, 32, 32))
    with pytest.raises(InputShapeError, match="float64"):
        tiny_compiled(tiny_input.double())


@pytest.mark.skipif(machine.has_gpu(), reason="checks the no-GPU path")
def test_cuda_module_builds_but_does_not_run_without_gpu(tiny_imported):
    with pytest.raises(NoGPUError, match="Running a CUDA module needs an NVIDIA GPU"):
        build.compile_model(tiny_imported, machine.cuda_target("sm_80"), pipeline="zero")
