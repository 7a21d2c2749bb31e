"""helpers.dynamo: TVM as a torch.compile backend, on real Dynamo captures and real TVM builds."""

import pytest
import torch
import tvm
import tvm_ffi

from helpers import dynamo, models
from helpers.errors import NoGPUError, TuningDatabaseError

from conftest import TinyNet  # conv + BatchNorm (parameters and buffers) + pool + linear


class Branchy(torch.nn.Module):
    """A data-dependent Python branch: a graph break."""

    def __init__(self):
        super().__init__()
        self.a, self.b = torch.nn.Linear(5, 5), torch.nn.Linear(5, 2)

    def forward(self, x):
        h = self.a(x)
        h = torch.relu(h) if h.sum() > 0 else -h
        return self.b(h)


def _trained_like(model: torch.nn.Module) -> torch.nn.Module:
    """Non-trivial BatchNorm statistics, so that freezing them wrongly would show."""
    torch.manual_seed(1)
    for name, buf in model.named_buffers():
        if "running" in name:
            buf.copy_(torch.rand_like(buf) + 0.5)
    return model.eval()


def test_a_cnn_compiles_as_one_graph_and_matches_eager():
    model = _trained_like(TinyNet())
    x = torch.randn(2, 3, 8, 8)
    compiled, backend = dynamo.compile_with_tvm(model)
    with torch.inference_mode():
        got, expected = compiled(x), model(x)
    assert torch.allclose(got, expected, atol=1e-5)
    assert len(backend.graphs) == 1
    graph = backend.graphs[0]
    assert graph.input_shapes == [(2, 3, 8, 8)]  # the weights are frozen, not inputs
    assert graph.num_weights == 6  # the parameters (conv, BatchNorm, fc); the buffers are constants
    assert "conv2d" in graph.ops and "batch_norm" in graph.ops
    assert backend.compile_s > 0 and backend.summary()[0]["graph"] == 0


def test_the_captured_graph_imports_as_the_explicitly_exported_module():
    model = _trained_like(TinyNet())
    x = torch.randn(1, 3, 8, 8)
    compiled, backend = dynamo.compile_with_tvm(model)
    with torch.inference_mode():
        compiled(x)
    assert tvm_ffi.structural_equal(backend.graphs[0].module, models.import_to_relax(model, x).mod)


def test_each_side_of_a_graph_break_is_compiled_when_first_reached():
    torch.manual_seed(0)
    model = Branchy().eval()
    compiled, backend = dynamo.compile_with_tvm(model)
    push = 4 * torch.sign(model.a.weight.sum(dim=0))
    with torch.inference_mode():
        for x in (push.repeat(3, 1), -push.repeat(3, 1)):
            assert torch.allclose(compiled(x), model(x), atol=1e-5)
    assert len(backend.graphs) == 3  # the graph before the break, then one per branch taken


def test_dynamic_shapes_get_a_clear_error():
    model = TinyNet().eval()
    torch._dynamo.reset()
    compiled = torch.compile(model, backend=dynamo.TVMBackend(), dynamic=True)
    with pytest.raises(Exception, match="dynamic=False"):
        with torch.inference_mode():
            compiled(torch.randn(2, 3, 8, 8))


def test_bad_backend_settings_fail_before_dynamo_runs(tmp_path):
    if not tvm.cuda().exist:
        with pytest.raises(NoGPUError):
            dynamo.TVMBackend(target=tvm.target.Target({"kind": "cuda", "arch": "sm_80"}))
    with pytest.raises(TuningDatabaseError):
        dynamo.TVMBackend(database=tmp_path / "no-such-database")
