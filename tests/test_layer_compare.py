"""helpers.layer_compare: two engines' convolutions read as NCHW, epilogues counted in, paired layer by layer."""

import pytest
import torch

from helpers import layer_compare
from helpers.layer_compare import ConvCall


def _conv(shape, ms=1.0, name="c", kernel=None, groups=None):
    return ConvCall(name, shape, ms, kernel, groups)


def test_epilogues_count_in_their_convolution_and_layout_changes_do_not_end_it():
    calls = [("layout", 0.1, "to blocks"), ("conv", 1.0, "a"), ("epilogue", 0.2, "silu"), ("layout", 0.05, "reorder"),
             ("epilogue", 0.3, "gate"), ("other", 0.4, "mean"), ("epilogue", 0.5, "add after a mean"), ("conv", 2.0, "b")]
    indices, times, rest = layer_compare._group(calls)
    assert indices == [1, 7]
    assert times == pytest.approx([1.5, 2.0])  # a's SiLU and gate; the add after the mean is not a's
    assert rest == pytest.approx(0.1 + 0.05 + 0.4 + 0.5)


def test_pairs_follow_the_other_engines_order_compare_channels_in_blocks_and_fall_back_to_the_input():
    ours = [_conv((256, 56, 56, 64, 56, 56), name="conv1"), _conv((64, 56, 56, 256, 56, 56), name="down"),
            _conv((8, 1, 1, 32, 112, 112), name="se expand, gate applied"), _conv((3, 7, 7, 9, 7, 7), name="odd")]
    theirs = [_conv((64, 56, 56, 256, 56, 56), name="Down"), _conv((256, 56, 56, 64, 56, 56), name="Conv1"),
              _conv((16, 1, 1, 32, 1, 1), name="SE expand (8 channels padded to 16)"), _conv((5, 3, 3, 5, 3, 3), name="none")]
    pairs, ours_left, theirs_left = layer_compare.pair(ours, theirs)
    assert [(o.name, t.name) for o, t in pairs] == [("down", "Down"), ("conv1", "Conv1"),
                                                    ("se expand, gate applied", "SE expand (8 channels padded to 16)")]
    assert [c.name for c in ours_left] == ["odd"] and [c.name for c in theirs_left] == ["none"]


def test_a_node_openvino_ran_in_only_some_requests_is_left_out_and_the_runs_then_line_up():
    reorder, conv, relu = ("Reorder:input", [(1, 3, 8, 8)], 0.003), ("Convolution:c1", [(1, 3, 8, 8)], 0.02), ("Relu:r1", [], 0.001)
    runs = [[conv, relu], [reorder, conv, relu], [conv, relu]]
    assert layer_compare.in_every_run(runs) == [[conv, relu]] * 3
    assert [call[0] for call in layer_compare._medians(layer_compare.in_every_run(runs))] == ["Convolution:c1", "Relu:r1"]
    with pytest.raises(RuntimeError, match="different numbers of calls"):
        layer_compare._medians(runs)


def test_the_table_names_each_layer_and_puts_what_is_not_paired_in_the_rest():
    ours = layer_compare.EngineLayers("TVM tuned", [_conv((64, 56, 56, 64, 56, 56), 0.6), _conv((1, 2, 2, 1, 2, 2), 0.1)], 0.5)
    theirs = layer_compare.EngineLayers("ONNX Runtime", [_conv((64, 56, 56, 64, 56, 56), 0.4, kernel=(3, 3), groups=64)], 0.2)
    frame = layer_compare.table(ours, theirs)
    assert list(frame["convolution"]) == ["3x3 depthwise 64x56x56 -> 64x56x56", "the rest (not convolutions, or not paired)"]
    assert list(frame["TVM tuned ms"]) == pytest.approx([0.6, 0.6]) and list(frame["ratio"]) == pytest.approx([1.5, 3.0])
    lost = layer_compare.where_time_is_lost(frame, 1)
    assert list(lost["ms lost"]) == pytest.approx([0.4])


def test_both_engines_profile_a_real_model_and_every_convolution_pairs(tiny_model, tiny_input, tiny_compiled):
    ours = layer_compare.tvm_layers(tiny_compiled, tiny_input, repeats=3)
    theirs = layer_compare.onnx_runtime_layers(tiny_model, tiny_input, repeats=3)
    c, h, w = tiny_input.shape[1:]
    assert [conv.shape for conv in ours.convs] == [(c, h, w, 16, h, w)]  # conv + BN + ReLU: one kernel
    assert [(conv.shape, conv.kernel, conv.groups) for conv in theirs.convs] == [((c, h, w, 16, h, w), (3, 3), 1)]
    assert ours.conv_ms > 0 and theirs.conv_ms > 0 and ours.rest_ms > 0 and theirs.rest_ms > 0  # pool and linear
    frame = layer_compare.table(ours, theirs)
    assert len(frame) == 2 and frame["convolution"][0] == f"3x3 conv {c}x{h}x{w} -> 16x{h}x{w}"


def test_the_loss_plot_has_one_panel_per_model_and_one_bar_per_row():
    import matplotlib

    matplotlib.use("Agg")
    from helpers import plotting

    ours = layer_compare.EngineLayers("TVM tuned", [_conv((64, 8, 8, 64, 8, 8), 0.6), _conv((64, 8, 8, 32, 8, 8), 0.1)], 0.5)
    theirs = layer_compare.EngineLayers("ONNX Runtime", [_conv((64, 8, 8, 64, 8, 8), 0.4), _conv((64, 8, 8, 32, 8, 8), 0.3)], 0.2)
    fig = plotting.plot_layer_losses({"a": layer_compare.table(ours, theirs), "b": None})
    (ax,) = fig.axes
    assert [round(b.get_height(), 3) for b in ax.containers[0]] == [0.2, -0.2, 0.3]
    with pytest.raises(ValueError, match="at least one table"):
        plotting.plot_layer_losses({"b": None})


class _StridedResidual(torch.nn.Module):
    """A strided convolution, then a 1x1 one whose output a residual is added to: freezing fuses both."""

    def __init__(self):
        super().__init__()
        self.down = torch.nn.Sequential(torch.nn.Conv2d(3, 16, 3, stride=2, padding=1), torch.nn.BatchNorm2d(16), torch.nn.ReLU())
        self.mix = torch.nn.Sequential(torch.nn.Conv2d(16, 24, 1), torch.nn.BatchNorm2d(24))
        self.skip = torch.nn.Conv2d(16, 24, 1)
        self.fc = torch.nn.Linear(24, 10)

    def forward(self, x):
        y = self.down(x)
        y = torch.relu(self.mix(y) + self.skip(y))
        return self.fc(torch.flatten(torch.nn.functional.adaptive_avg_pool2d(y, 1), 1))


def test_freezing_is_profiled_call_by_call_and_each_onednn_convolution_is_read_back():
    from helpers import peers

    torch.manual_seed(0)
    model, x = _StridedResidual().eval(), torch.randn(1, 3, 30, 30, generator=torch.Generator().manual_seed(1))
    run, _ = peers.compiled_runner(model, x, freezing=True)
    theirs = layer_compare.frozen_pytorch_layers(run, repeats=3)
    assert theirs.engine == peers.FROZEN
    # 30x30 at stride 2 with padding 1 gives 15x15; the residual's two 1x1 convolutions in either order
    assert theirs.convs[0].shape == (3, 30, 30, 16, 15, 15) and theirs.convs[0].kernel == (3, 3)
    assert sorted(c.shape for c in theirs.convs[1:]) == [(16, 15, 15, 24, 15, 15)] * 2
    assert all(c.groups == 1 and c.ms > 0 for c in theirs.convs) and theirs.rest_ms > 0  # pool, linear
    with pytest.raises(RuntimeError, match="compiled whole"):
        layer_compare.frozen_pytorch_layers(lambda: model(x), repeats=2)  # eager: no compiled graph


def test_layers_sum_by_kind_in_the_order_of_the_time_lost():
    ours = layer_compare.EngineLayers("TVM bf16 tuned", [_conv((64, 8, 8, 64, 8, 8), 0.6), _conv((64, 8, 8, 32, 8, 8), 0.5),
                                                         _conv((3, 16, 16, 64, 8, 8), 0.2)], 0.1)
    theirs = layer_compare.EngineLayers("OpenVINO", [_conv((64, 8, 8, 64, 8, 8), 0.2, kernel=(3, 3), groups=64),
                                                     _conv((64, 8, 8, 32, 8, 8), 0.4, kernel=(1, 1), groups=1),
                                                     _conv((3, 16, 16, 64, 8, 8), 0.3, kernel=(3, 3), groups=1)], 0.1)
    kinds = layer_compare.by_kind(layer_compare.table(ours, theirs))
    assert list(kinds["kind"]) == ["depthwise", "1x1 conv", "the rest", "other conv"]
    assert list(kinds["ms lost"]) == pytest.approx([0.4, 0.1, 0.0, -0.1]) and list(kinds["layers"]) == [1, 1, 1, 1]


def test_openvino_and_tvms_bf16_build_profile_the_same_convolutions():
    """OpenVINO's counters, read with its graph's shapes, against the bf16 rewrite's channels-last kernels (built
    untuned: their names and shapes are what the table reads, on any CPU): every convolution pairs."""
    from helpers import bf16_model, build, quantize
    from helpers.peers import OPENVINO
    from test_quantize import Pointwise

    torch.manual_seed(0)
    inputs = [torch.randn(2, 3, 12, 12, generator=torch.Generator().manual_seed(s)) for s in range(3)]
    model = quantize.with_batchnorm_statistics(Pointwise().eval(), inputs)
    x = torch.randn(1, 3, 12, 12, generator=torch.Generator().manual_seed(9))
    theirs = layer_compare.openvino_layers(model, x, "f32", repeats=3)
    assert theirs.engine == OPENVINO
    assert sorted((c.shape, c.kernel, c.groups) for c in theirs.convs) == sorted([
        ((3, 12, 12, 16, 12, 12), (3, 3), 1), ((16, 12, 12, 32, 12, 12), (1, 1), 1), ((32, 12, 12, 32, 12, 12), (3, 3), 32),
        ((32, 12, 12, 24, 12, 12), (1, 1), 1), ((16, 12, 12, 24, 12, 12), (1, 1), 1)])
    ours = layer_compare.tvm_layers(build.compile_model(bf16_model.import_bf16(model, x)), x, repeats=3, engine="TVM bf16")
    # channels last, read as NCHW (outputs of 24 channels may be written padded to the instruction's 16 lanes: 32)
    assert sorted(c.shape[:3] for c in ours.convs) == sorted(c.shape[:3] for c in theirs.convs)
    pairs, ours_left, theirs_left = layer_compare.pair(ours.convs, theirs.convs)
    assert len(pairs) == 5 and not ours_left and not theirs_left
    assert all(c.ms > 0 for c in ours.convs + theirs.convs)
    assert list(layer_compare.table(ours, theirs).columns[2:4]) == ["TVM bf16 ms", f"{OPENVINO} ms"]


def test_tvms_int8_build_and_the_engines_int8_profile_the_same_convolutions():
    """Day 12's int8 rewrite (channels last, its 1x1 convolutions int8 matrix products, its depthwise one reading
    uint8; built untuned: names and
    shapes are what the table reads, on any CPU) against the same model quantized by ONNX Runtime's tool, run by
    ONNX Runtime (its int8 convolutions channels last, their weights prepacked: no kernel size) and by OpenVINO:
    every convolution pairs, each read as NCHW, and the table names each one's kernel from the side that knows it."""
    from helpers import build, models, quantize
    from test_quantize import Pointwise

    inputs = [torch.randn(2, 3, 12, 12, generator=torch.Generator().manual_seed(s)) for s in range(3)]
    model = quantize.with_batchnorm_statistics(Pointwise().eval(), inputs)
    folded = quantize.fold_batch_norms(model)
    x = torch.randn(1, 3, 12, 12, generator=torch.Generator().manual_seed(9))
    quantized = quantize.quantize_pointwise_convs(models.import_to_relax(folded, x), quantize.calibrate(folded, inputs))
    quantized = quantize.quantize_depthwise_inputs(quantized, quantize.calibrate(folded, inputs, which=quantize.is_depthwise))
    ours = layer_compare.tvm_layers(build.compile_model(quantized), x, repeats=3, engine="TVM int8", channels_last=True)
    expected = [((3, 12, 12, 16, 12, 12), (3, 3), 1), ((16, 12, 12, 32, 12, 12), (1, 1), 1),
                ((32, 12, 12, 32, 12, 12), (3, 3), 32), ((32, 12, 12, 24, 12, 12), (1, 1), 1), ((16, 12, 12, 24, 12, 12), (1, 1), 1)]
    # (an output of 24 channels may be written padded to the instruction's 16 lanes, 32, and sliced after)
    assert sorted((c.shape[:3], c.kernel, c.groups) for c in ours.convs) == sorted((e[0][:3], *e[1:]) for e in expected)
    onnx_int8 = quantize.onnx_int8(model, inputs, example=x)
    ort = layer_compare.onnx_runtime_layers(model, x, 3, onnx_int8, engine=quantize.ORT_INT8)
    openvino = layer_compare.openvino_layers(model, x, "f32", 3, onnx_int8, engine=quantize.OPENVINO_INT8)
    assert sorted(c.shape for c in ort.convs) == sorted(c.shape for c in openvino.convs) == sorted(e[0] for e in expected)
    for theirs in (ort, openvino):
        pairs, ours_left, theirs_left = layer_compare.pair(ours.convs, theirs.convs)
        assert len(pairs) == 5 and not ours_left and not theirs_left, theirs.engine
        frame = layer_compare.table(ours, theirs)
        assert frame.columns[3] == f"{theirs.engine} ms"
        assert sorted(layer_compare.by_kind(frame)["kind"]) == ["1x1 conv", "depthwise", "other conv", "the rest"]
