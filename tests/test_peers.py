"""helpers.peers: naming the fastest PyTorch and engine, and real peers of a tiny conv net."""

import numpy as np
import pytest
import torch

from helpers import build, peers
from helpers.errors import ParityError
from helpers.timing import Timing


def _timings(**medians):
    """One Timing per backend, keyed as peers labels them: eager=, compiled=, frozen=, ort=, tvm=."""
    labels = {"eager": peers.EAGER, "compiled": peers.COMPILED, "frozen": peers.FROZEN, "ort": peers.ORT,
              "tvm": "TVM tuned"}
    return [Timing(labels[key], 1, [ms * 0.98, ms, ms * 1.05]) for key, ms in medians.items()]


def test_fastest_names_onnx_runtime_as_engine_and_the_best_pytorch_apart():
    best = peers.fastest(_timings(eager=12.0, compiled=10.0, frozen=11.0, ort=7.0, tvm=5.0))
    assert best == (peers.COMPILED, peers.ORT)  # TVM is not a peer, however fast


def test_fastest_names_freezing_when_it_beats_the_rest():
    best = peers.fastest(_timings(eager=12.0, compiled=10.0, frozen=8.0, ort=9.0))
    assert best.pytorch == best.engine == peers.FROZEN


def test_fastest_leaves_out_missing_peers():
    assert peers.fastest(_timings(eager=12.0, compiled=10.0)) == (peers.COMPILED, peers.COMPILED)
    assert peers.fastest(_timings(ort=3.0, tvm=1.0)) == (None, peers.ORT)
    assert peers.fastest([]) == (None, None)
    assert peers.fastest({peers.EAGER: 5.0, peers.FROZEN: 6.0}) == (peers.EAGER, peers.EAGER)  # a row's medians


@pytest.fixture(scope="module")
def conv_bn_relu():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 16, 3, padding=1), torch.nn.BatchNorm2d(16), torch.nn.ReLU())
    with torch.no_grad():  # statistics that are not the identity, so that folding BN changes the weights
        model[1].running_mean.normal_()
        model[1].running_var.uniform_(0.5, 2.0)
    return model.eval(), torch.randn(1, 3, 32, 32, generator=torch.Generator().manual_seed(1))


def test_every_peer_runs_matches_eager_and_freezing_really_froze(conv_bn_relu):
    model, x = conv_bn_relu
    found = peers.peers(model, x, which=peers.ENGINES)
    assert list(found.runners) == list(peers.ENGINES) and not found.missing
    assert set(found.compile_s) == {peers.COMPILED, peers.FROZEN, peers.ORT, peers.OPENVINO} and min(found.compile_s.values()) > 0
    with torch.no_grad():
        expected = model(x).numpy()
    for label, run in found.runners.items():
        out = run()
        assert build.relative_error(out.numpy() if isinstance(out, torch.Tensor) else out, expected) < peers.RTOL, label
    # Frozen weights are constants: after BN's statistics change, only the frozen compile gives the old output.
    # (Had it been served the plain compile's code from Dynamo's cache, it would follow the change.)
    try:
        with torch.no_grad():
            model[1].running_mean += 1.0
            changed = model(x).numpy()
        assert build.relative_error(found.runners[peers.COMPILED]().numpy(), changed) < peers.RTOL
        assert build.relative_error(found.runners[peers.FROZEN]().numpy(), expected) < peers.RTOL
        assert build.relative_error(changed, expected) > 0.1
    finally:
        with torch.no_grad():
            model[1].running_mean -= 1.0


def test_a_model_that_does_not_export_has_onnx_runtime_missing_with_the_reason(conv_bn_relu, monkeypatch):
    def fail(*args, **kwargs):
        raise RuntimeError("unsupported operator aten::made_up\nmore detail")

    monkeypatch.setattr(torch.onnx, "export", fail)
    monkeypatch.setattr(peers, "kept_for_tests", lambda *args, **kwargs: None)  # an export the suite cached stays out
    with pytest.raises(peers.PeerUnavailable, match="RuntimeError: unsupported operator aten::made_up$"):
        peers.onnx_engine_runner(peers.ORT, *conv_bn_relu)
    found = peers.peers(*conv_bn_relu, which=peers.ENGINES)
    assert list(found.runners) == list(peers.PYTORCH)
    assert "aten::made_up" in found.missing[peers.ORT] and "aten::made_up" in found.missing[peers.OPENVINO]


def test_a_peer_that_gives_other_numbers_is_an_error_not_a_result(conv_bn_relu, monkeypatch):
    model, x = conv_bn_relu
    wrong = model(x).detach().numpy() * 1.01
    real = peers.onnx_engine_runner

    def ort_wrong(label, *args, **kwargs):
        run, seconds, precision = real(label, *args, **kwargs)
        return (lambda: wrong, seconds, precision) if label == peers.ORT else (run, seconds, precision)

    monkeypatch.setattr(peers, "onnx_engine_runner", ort_wrong)
    with pytest.raises(ParityError, match=r"ONNX Runtime differs from PyTorch eager: relative error 1\.0\de-02"):
        peers.peers(model, x)


def test_openvino_at_float32_matches_eager_and_can_be_the_fastest_engine(conv_bn_relu, monkeypatch):
    model, x = conv_bn_relu
    found = peers.peers(model, x, which=[peers.OPENVINO])  # checked against eager within RTOL, or ParityError
    assert list(found.runners) == [peers.EAGER, peers.OPENVINO] and found.compile_s[peers.OPENVINO] > 0
    _, _, precision = peers.onnx_engine_runner(peers.OPENVINO, model, x)
    assert precision == "f32"
    assert peers.fastest({peers.EAGER: 5.0, peers.ORT: 4.0, peers.OPENVINO: 3.0}).engine == peers.OPENVINO
    exports = []
    real_export = peers.onnx_export
    monkeypatch.setattr(peers, "onnx_export", lambda *args: exports.append(1) or real_export(*args))
    found = peers.peers(model, x, which=[peers.ORT, peers.OPENVINO])
    assert found.exported is not None
    peers.openvino_default(model, x, found.exported)
    assert len(exports) == 1, "one ONNX export feeds both engines and OpenVINO's default"


def test_openvinos_default_precision_is_named_and_its_error_reported(conv_bn_relu):
    """bf16 on a CPU with bfloat16 instructions (a Zen 4, Intel Xeons since Cooper Lake); float32 elsewhere,
    where it is OPENVINO itself and nothing apart."""
    import openvino as ov

    model, x = conv_bn_relu
    found = peers.openvino_default(model, x)
    has_bf16 = "BF16" in ov.Core().get_property("CPU", "OPTIMIZATION_CAPABILITIES")
    assert (found is not None) == has_bf16
    if found is not None:
        label, run, error = found
        assert label == f"{peers.OPENVINO}, default: bf16" and label not in peers.ENGINES
        assert peers.RTOL < error < 0.05, f"bf16 computes other numbers than float32, close ones: {error}"


def test_openvino_missing_is_said_not_fatal(conv_bn_relu, monkeypatch):
    def fail(*args, **kwargs):
        raise ImportError("No module named 'openvino'")

    monkeypatch.setattr(peers, "openvino_compiled", fail)
    found = peers.peers(*conv_bn_relu, which=[peers.ORT, peers.OPENVINO])
    assert list(found.runners) == [peers.EAGER, peers.ORT] and "No module named" in found.missing[peers.OPENVINO]
    assert peers.openvino_default(*conv_bn_relu) is None
    found = peers.peers(*conv_bn_relu, which=[peers.OPENVINO], with_onnx_runtime=False)
    assert "imitated CPU" in found.missing[peers.OPENVINO]


def test_quick_mode_builds_eager_onnx_runtime_and_openvino_only(monkeypatch):
    monkeypatch.setenv("TVM_COURSE_QUICK", "1")
    assert peers.default_peers() == (peers.EAGER, peers.ORT, peers.OPENVINO)
    monkeypatch.setenv("TVM_COURSE_QUICK", "0")
    assert peers.default_peers() == peers.ENGINES


def test_unknown_peers_and_an_imitated_cpu_are_said(conv_bn_relu):
    with pytest.raises(ValueError, match="Unknown peers.*TensorRT"):
        peers.peers(*conv_bn_relu, which=["TensorRT"])
    found = peers.peers(*conv_bn_relu, which=[peers.ORT], with_onnx_runtime=False)
    assert list(found.runners) == [peers.EAGER] and "imitated CPU" in found.missing[peers.ORT]


def test_verdict_names_the_fastest_peers_says_slower_and_warns_about_noise():
    text = peers.verdict(_timings(eager=12.0, compiled=10.0, ort=4.0, tvm=5.0))
    lines = text.splitlines()
    assert lines[0] == (f"TVM tuned is 2.00x faster than the fastest PyTorch measured here, {peers.COMPILED} "
                        "(their interquartile ranges apart)")
    assert lines[1] == (f"TVM tuned is 1.25x slower than the fastest engine measured here, {peers.ORT} "
                        "(their interquartile ranges apart)")
    assert lines[2] == f"(not measured in this run: {peers.FROZEN}, {peers.OPENVINO})"
    close = peers.verdict(_timings(eager=12.0, ort=5.1, tvm=5.0)).splitlines()[1]
    assert close.startswith(f"TVM tuned runs at 1.02x the speed of the fastest engine measured here, {peers.ORT}, "
                            "inside the spread"), close
    noisy = _timings(eager=12.0, tvm=5.0) + [Timing(peers.ORT, 1, [1.0, 4.0, 9.0, 20.0])]
    assert "(unreliable: ONNX Runtime spread too wide)" in peers.verdict(noisy)
    with pytest.raises(ValueError, match="No timing labelled 'TVM tuned'"):
        peers.verdict(_timings(eager=1.0))


def test_check_against_eager_compares_first_outputs_of_the_labels_asked():
    logits = torch.arange(6.0).reshape(2, 3)
    runners = {peers.EAGER: lambda: (logits, torch.zeros(1)), "same first output": lambda: (logits.clone(), torch.ones(1)),
               "wrong": lambda: (logits + 1, torch.zeros(1))}
    peers.check_against_eager(runners, ["same first output"])
    with pytest.raises(ParityError, match="wrong differs from PyTorch eager"):
        peers.check_against_eager(runners)


def test_in_the_suite_a_models_onnx_export_is_kept_per_weights(conv_bn_relu, tmp_path, monkeypatch):
    from helpers import cache, config

    model, x = conv_bn_relu
    monkeypatch.setattr(cache, "CACHE_ROOT", tmp_path)
    monkeypatch.setenv(config.QUICK_ENV, "1")
    monkeypatch.delenv(cache.NO_CACHE_ENV, raising=False)
    exports, real = [], torch.onnx.export
    monkeypatch.setattr(torch.onnx, "export", lambda *a, **k: exports.append(1) or real(*a, **k))
    outputs = [peers.onnx_engine_runner(peers.ORT, model, x)[0]() for _ in range(2)]
    assert len(exports) == 1
    assert build.relative_error(outputs[1], outputs[0]) == 0.0
    assert build.relative_error(outputs[0], model(x).detach().numpy()) < peers.RTOL
    peers.onnx_engine_runner(peers.ORT, model, x[:, :, :8, :8])  # another shape: exported again
    assert len(exports) == 2


def test_one_onnx_engine_setup_gives_every_output_in_order_in_both_engines():
    class TwoOutputs(torch.nn.Module):
        def forward(self, a, b):
            return a @ b, (a * 2).sum(dim=1)

    a, b = torch.randn(3, 4), torch.randn(4, 5)
    exported = torch.onnx.export(TwoOutputs(), (a, b), dynamo=True, verbose=False).model_proto.SerializeToString()
    want = [t.numpy() for t in TwoOutputs()(a, b)]
    for label in peers.ONNX_ENGINES:
        engine = peers.OnnxEngine(label, exported)
        got = engine.run([a, b.numpy()])  # tensors or arrays, in the model's input order
        peers.check_outputs(label, got, want, ["product", "sums"])
        assert engine.precision == "f32"
        assert np.array_equal(np.asarray(engine.runner([a, b], output=1)()), got[1])
    with pytest.raises(ValueError, match="does not run ONNX models"):
        peers.OnnxEngine(peers.EAGER, exported)
