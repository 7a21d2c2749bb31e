import numpy as np
import pytest
import torch

from helpers import build, machine
from helpers.errors import InputShapeError, NoGPUError, ParityError


def test_compiled_model_matches_pytorch(tiny_compiled, tiny_model, tiny_input):
    error = build.check_parity(tiny_compiled, tiny_model, tiny_input)
    assert 0 <= error < 1e-4


def test_parity_is_judged_on_the_output_scale():
    ref = np.array([1e-9, -3e-9, 2e-9])
    # An absolute tolerance of 1e-4 would call a 50 % error a match on outputs this small.
    assert build.relative_error(ref * 1.5, ref) == pytest.approx(0.5)
    assert build.relative_error(ref, ref) == 0.0
    assert build.relative_error(np.full(3, np.nan), ref) != build.relative_error(np.full(3, np.nan), ref)  # NaN
    with pytest.raises(ParityError, match=r"shapes differ.*\(2,\).*\(3,\)"):
        build.relative_error(ref[:2], ref)


def test_parity_check_catches_a_different_model(tiny_compiled, tiny_model, tiny_input):
    other = type(tiny_model)().eval()  # same architecture, other random weights
    with pytest.raises(ParityError, match="differs from PyTorch: relative error"):
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


def _expf_calls(executable, tmp_path, function: str = "expf") -> int:
    """Calls of the C library's ``function`` in the executable's machine code."""
    import subprocess

    path = tmp_path / "lib.so"
    executable.export_library(str(path))
    disassembly = subprocess.run(["objdump", "-d", "--no-show-raw-insn", str(path)], capture_output=True, text=True).stdout
    return sum(f"<{function}@plt>" in line for line in disassembly.splitlines() if "call" in line)


def test_the_fused_pipeline_computes_sigmoid_without_the_c_librarys_expf(tmp_path):
    """SiLU in TVM's default lowering calls expf per element; the course's kernels (tuning's form) do not."""
    import tvm

    from helpers import models

    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.SiLU(), torch.nn.Conv2d(8, 4, 1), torch.nn.Sigmoid()).eval()
    x = 20 * torch.randn(1, 3, 16, 16, generator=torch.Generator().manual_seed(0))  # far into both tails
    imported = models.import_to_relax(model, x)
    target = machine.cpu_target()
    default = tvm.compile(imported.mod, target=target)
    fused = tvm.compile(build.fuse(imported.mod, target), target=target)
    assert _expf_calls(default, tmp_path) > 0
    assert _expf_calls(fused, tmp_path) == 0
    with torch.no_grad():
        want = model(x).numpy()
    assert build.relative_error(build.load_executable(fused, imported, target)(x), want) < 1e-6


def test_the_fused_pipeline_computes_gelu_and_softmax_without_the_c_librarys_erff_and_expf(tmp_path):
    """A transformer's GELU (erff per element) and softmax (expf) in the course's kernels: vectorizable, same numbers."""
    import tvm

    from helpers import models

    class Mlp(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc, self.out = torch.nn.Linear(16, 64), torch.nn.Linear(64, 16)

        def forward(self, x):
            return torch.softmax(self.out(torch.nn.functional.gelu(self.fc(x))), dim=-1)

    model = Mlp().eval()
    x = 4 * torch.randn(8, 16, generator=torch.Generator().manual_seed(0))
    imported = models.import_to_relax(model, x)
    target = machine.cpu_target()
    default = tvm.compile(imported.mod, target=target)
    fused = tvm.compile(build.fuse(imported.mod, target), target=target)
    assert _expf_calls(default, tmp_path, "erff") > 0 and _expf_calls(default, tmp_path) > 0
    assert _expf_calls(fused, tmp_path, "erff") == 0 and _expf_calls(fused, tmp_path) == 0
    with torch.no_grad():
        want = model(x).numpy()
    assert build.relative_error(build.load_executable(fused, imported, target)(x), want) < 1e-6
    gelu = torch.linspace(-10, 10, 2001)
    exact = torch.nn.functional.gelu(gelu).numpy()
    mod, _ = models.to_relax(torch.export.export(torch.nn.GELU(), (gelu,)))
    got = build.load_executable(tvm.compile(build.fuse(mod, target), target=target),
                                models.ImportedModel(mod, [], tuple(gelu.shape), "float32"), target)(gelu)
    assert np.abs(got - exact).max() < 1e-6, "fast_erf's GELU within float32 rounding over [-10, 10]"
