"""One inverted residual block as one fused TensorIR kernel (helpers.block_fusion, Day 13): real builds, checked
against PyTorch's block on shapes the course does not show."""

import pytest
import torch
import tvm
from torchvision.models.mobilenetv2 import InvertedResidual

from helpers import block_fusion, layer_compare, models, peers
from helpers.maintainers import fusion_table


def _block(c_in: int, c_out: int, stride: int, expand: int, seed: int) -> torch.nn.Module:
    """A torchvision block with BatchNorm statistics far from the identity, so that folding them matters."""
    torch.manual_seed(seed)
    return _scrambled(InvertedResidual(c_in, c_out, stride, expand).eval())


def _mbconv(c_in: int, c_out: int, stride: int, expand: int, kernel: int, seed: int) -> torch.nn.Module:
    """An EfficientNet block (SiLU, a squeeze-and-excitation of c_in / 4 channels), BatchNorm scrambled too."""
    from torchvision.models.efficientnet import MBConv, MBConvConfig

    torch.manual_seed(seed)
    return _scrambled(MBConv(MBConvConfig(expand, kernel, stride, c_in, c_out, 1), 0.0, torch.nn.BatchNorm2d).eval())


def _scrambled(block: torch.nn.Module) -> torch.nn.Module:
    with torch.no_grad():
        for bn in (m for m in block.modules() if isinstance(m, torch.nn.BatchNorm2d)):
            bn.running_mean.uniform_(-0.5, 0.5)
            bn.running_var.uniform_(0.5, 2.0)
            bn.weight.uniform_(0.5, 1.5)
            bn.bias.uniform_(-0.3, 0.3)
    return block


CASES = [  # (c_in, c_out, stride, expansion, size): residual, stride 2, widths that 16 lanes do not divide
    (8, 8, 1, 6, 10),
    (8, 12, 2, 4, 12),
    (12, 20, 1, 3, 6),
]


@pytest.mark.parametrize("c_in,c_out,stride,expand,size", CASES)
def test_the_fused_kernel_computes_the_block_with_every_tiling(c_in, c_out, stride, expand, size):
    block = _block(c_in, c_out, stride, expand, seed=size)
    x = torch.rand(1, c_in, size, size) * 4 - 1  # below zero and above six: both clips are used
    shape = block_fusion.block_shape(block, size)
    assert shape.residual == (stride == 1 and c_in == c_out)
    choices = block_fusion.tilings(shape)
    assert any(t.rows for t in choices) and any(t.channels for t in choices)
    for tiling in [None, *choices]:
        compiled = block_fusion.compile_block(block, size, tiling)
        assert block_fusion.check(compiled, block, x) < 1e-5, tiling


SE_CASES = [  # (c_in, c_out, stride, expansion, kernel, size): the gates on the weights (more pixels than output
    (8, 8, 1, 6, 5, 10),  # channels) or on the image (fewer), 5x5 filters, stride 2, no expansion
    (16, 24, 2, 4, 3, 6),
    (16, 16, 1, 1, 3, 8),
]


@pytest.mark.parametrize("c_in,c_out,stride,expand,kernel,size", SE_CASES)
def test_an_efficientnet_block_with_its_squeeze_and_excitation_is_computed_with_every_tiling(c_in, c_out, stride,
                                                                                              expand, kernel, size):
    block = _mbconv(c_in, c_out, stride, expand, kernel, seed=size)
    x = torch.rand(1, c_in, size, size) * 8 - 4  # SiLU's and the gates' sigmoids on both sides of zero
    shape = block_fusion.block_shape(block, size)
    assert (shape.kernel, shape.activation, shape.squeeze, shape.expands) == (kernel, "silu", c_in // 4, expand > 1)
    assert f"{kernel}x{kernel}/{stride} -> SE {c_in // 4} ->" in str(shape)
    for tiling in [None, *block_fusion.tilings(shape)]:
        compiled = block_fusion.compile_block(block, size, tiling)
        assert block_fusion.check(compiled, block, x) < 1e-5, tiling


def test_with_a_squeeze_and_excitation_the_pieces_end_at_the_filter_and_chunks_pool_as_they_go():
    shape = block_fusion.BlockShape(size=8, c_in=8, hidden=32, c_out=8, stride=1, kernel=5, activation="silu",
                                    squeeze=2)
    bands = block_fusion.schedule_fused(shape, block_fusion.Tiling(rows=2), lanes=8, cores=2)

    def outer(sch, name):
        return sch.get(sch.get_loops(sch.get_sblock(name))[0])

    assert outer(bands, "expand_update").same_as(outer(bands, "depthwise_update"))  # one loop over bands
    assert not outer(bands, "project_update").same_as(outer(bands, "depthwise_update"))  # after every gate
    assert int(outer(bands, "depthwise_update").extent) == 4
    chunks = block_fusion.schedule_fused(shape, block_fusion.Tiling(channels=8), lanes=8, cores=2)
    chunk_loop = chunks.get(chunks.get_loops(chunks.get_sblock("depthwise_update"))[1])
    assert int(chunk_loop.extent) == 2  # 32 channels: 16 per core, in chunks of 8
    for stage in ("expand_update", "pool_update"):  # expanded and averaged in the chunk, as it is filtered
        assert chunks.get(chunks.get_loops(chunks.get_sblock(stage))[1]).same_as(chunk_loop)


def test_fusing_moves_every_stage_into_the_loop_over_pieces_and_separate_kernels_keep_their_own():
    shape = block_fusion.BlockShape(size=8, c_in=8, hidden=24, c_out=8, stride=1)
    fused = block_fusion.schedule_fused(shape, block_fusion.Tiling(rows=2), lanes=8, cores=2)
    separate = block_fusion.schedule_separate(shape, lanes=8)

    def outer_loops(sch):  # (a convolution's block is its "_update" after its reduction is split)
        names = [f"{n}_update" if n in ("expand", "depthwise", "project") else n for n in block_fusion.STAGES]
        return {name.removesuffix("_update"): sch.get(sch.get_loops(sch.get_sblock(name))[0]) for name in names}

    fused_outer = outer_loops(fused)
    band = fused_outer["project_act"]
    assert all(loop.same_as(band) for loop in fused_outer.values())
    assert int(band.extent) == 4 and band.kind == tvm.tirx.ForKind.PARALLEL
    separate_outer = outer_loops(separate)
    assert not separate_outer["expand"].same_as(separate_outer["project"])
    assert int(separate_outer["expand"].extent) == shape.size  # every row, in one kernel

    by_channels = block_fusion.schedule_fused(shape, block_fusion.Tiling(channels=4), lanes=8, cores=2)
    partial = by_channels.get_sblock("project_rf_update")  # each core's share of the projection
    part, chunks = by_channels.get_loops(partial)[:2]
    assert by_channels.get(part).kind == tvm.tirx.ForKind.PARALLEL and int(by_channels.get(part).extent) == 2
    assert int(by_channels.get(chunks).extent) == 3  # 24 channels: 12 per core, in chunks of 4
    for stage in ("expand_update", "depthwise_update"):  # both inside the loop over chunks
        loop = by_channels.get_loops(by_channels.get_sblock(stage))[1]
        assert by_channels.get(loop).same_as(by_channels.get(chunks))

def test_a_tiling_that_does_not_cut_the_block_evenly_is_refused_with_the_choices():
    shape = block_fusion.BlockShape(size=14, c_in=8, hidden=48, c_out=8, stride=1)
    choices = [str(t) for t in block_fusion.tilings(shape, cores=2, lanes=16)]
    assert choices == ["rows=1", "rows=2", "rows=7", "channels=8", "channels=24"]  # 24 channels per core, 8 lanes
    for bad in (block_fusion.Tiling(rows=3), block_fusion.Tiling(channels=16)):
        with pytest.raises(block_fusion.BlockError, match=rf"{bad} does not cut .* 14 output rows.* 24 expanded "
                                                          r"channels; try one of \['rows=1', 'rows=2'"):
            block_fusion.schedule_fused(shape, bad, lanes=16, cores=2)
    block_fusion.schedule_fused(shape, block_fusion.Tiling(rows=14), lanes=16, cores=2)  # one band: slow, not wrong
    with pytest.raises(block_fusion.BlockError, match="not both"):
        block_fusion.Tiling(rows=2, channels=8)
    assert block_fusion.Tiling.parse("channels=24") == block_fusion.Tiling(channels=24)
    with pytest.raises(block_fusion.BlockError, match="not a tiling"):
        block_fusion.Tiling.parse("TVM, three kernels")


def test_mobilenets_blocks_are_read_with_their_shapes_and_anything_else_is_refused():
    model = models.load_model("mobilenet_v2", pretrained=False)
    blocks = block_fusion.model_blocks(model)
    assert [name for name, _, _ in blocks] == [f"features[{i}]" for i in range(1, 18)]
    assert [name for name, _, shape in blocks if not shape.expands] == ["features[1]"]
    assert all(block is model.features[i + 1] for i, (_, block, _) in enumerate(blocks))
    first = blocks[1][2]
    assert (first.size, first.c_in, first.hidden, first.c_out, first.stride, first.out_size) == (112, 16, 96, 24, 2, 56)
    assert first.expanded_mb == pytest.approx(112 * 112 * 96 * 4 / 1e6)
    no_expansion = block_fusion.block_shape(model.features[1], 112)
    assert (no_expansion.c_in, no_expansion.hidden, no_expansion.c_out, no_expansion.expands) == (32, 32, 16, False)
    assert str(no_expansion) == "32x112x112 -> 3x3/1 -> 16x112x112"
    for module in (model.features[0], torch.nn.Conv2d(3, 3, 1)):
        with pytest.raises(block_fusion.BlockError, match="features"):
            block_fusion.block_shape(module, 8)


def test_efficientnets_blocks_are_named_by_stage_and_their_sizes_follow_pytorchs_at_an_odd_size():
    model = models.load_model("efficientnet_b0", pretrained=False).eval()
    blocks = block_fusion.model_blocks(model, size=65)
    assert [name for name, _, _ in blocks][:4] == ["features[1][0]", "features[2][0]", "features[2][1]", "features[3][0]"]
    assert len(blocks) == 16 and all(shape.squeeze for _, _, shape in blocks)
    x = torch.zeros(1, 3, 65, 65)
    with torch.no_grad():
        x = model.features[0](x)
        for name, block, shape in blocks:  # each shape's input and output sizes are PyTorch's
            assert (shape.c_in, shape.size) == (x.shape[1], x.shape[-1]), name
            x = block(x)
            assert (shape.c_out, shape.out_size) == (x.shape[1], x.shape[-1]), name


def test_a_block_without_an_expansion_is_a_depthwise_and_a_projection_in_one_kernel():
    torch.manual_seed(1)
    block = InvertedResidual(16, 8, 1, 1).eval()
    x = torch.rand(1, 16, 10, 10) * 4 - 1
    for tiling in (None, block_fusion.Tiling(rows=5), block_fusion.Tiling(channels=8)):
        assert block_fusion.check(block_fusion.compile_block(block, 10, tiling), block, x) < 1e-5


def test_a_schedule_of_ones_own_compiles_with_the_blocks_weights_and_a_wrong_one_is_named():
    from tvm import s_tir

    block = _block(8, 8, 1, 4, seed=4)
    sch = s_tir.Schedule(block_fusion.block_function(block_fusion.block_shape(block, 6)))
    x = torch.rand(1, 8, 6, 6)
    assert block_fusion.check(block_fusion.compile_schedule(sch, block), block, x) < 1e-5  # unscheduled: right, slow
    other = s_tir.Schedule(block_fusion.block_function(block_fusion.block_shape(_block(8, 12, 1, 4, seed=4), 6)))
    with pytest.raises(block_fusion.BlockError, match=r"block_function\(block_shape\(block, size\)\)"):
        block_fusion.compile_schedule(other, block)


def test_a_wrong_input_shape_is_named():
    block = _block(8, 8, 1, 2, seed=0)
    compiled = block_fusion.compile_block(block, 6, block_fusion.Tiling(rows=3))
    with pytest.raises(block_fusion.BlockError, match=r"\(1, 8, 6, 6\), got \(1, 8, 7, 7\)"):
        compiled(torch.rand(1, 8, 7, 7))


def test_the_comparison_times_both_kernels_and_the_engines_on_one_block(capsys):
    block = _block(8, 8, 1, 4, seed=3)
    x = torch.rand(1, 8, 8, 8)
    timings = block_fusion.compare(block, x, block_fusion.Tiling(channels=16), repeats=3)
    labels = [t.label for t in timings]
    assert labels[:2] == [block_fusion.SEPARATE, block_fusion.FUSED]
    missing = capsys.readouterr().out
    for engine in (peers.ORT, peers.OPENVINO):  # each timed, or said why not
        assert engine in labels or engine in missing
    assert all(len(t.times_ms) == 3 and t.median_ms > 0 for t in timings)
    choices = [block_fusion.Tiling(rows=4), block_fusion.Tiling(channels=16)]
    timings = block_fusion.time_tilings(block, x, choices, repeats=3)
    assert [t.label for t in timings] == [block_fusion.SEPARATE, "rows=4", "channels=16"]
    assert block_fusion.best_tiling(timings) in choices


def test_the_fusion_table_gives_each_blocks_ratios_and_the_totals():
    def rec(ms):
        return {"median_ms": ms, "iqr_ms": ms / 20, "repeats": 20}

    ort_model, ov_model = peers.ORT + fusion_table.IN_MODEL, peers.OPENVINO + fusion_table.IN_MODEL
    blocks = [{"block": "features[2]", "shape": "a", "expanded_mb": 4.82, "tiling": "rows=4",
               "timings": {block_fusion.SEPARATE: rec(0.8), block_fusion.FUSED: rec(0.4), peers.ORT: rec(0.6),
                           peers.OPENVINO: rec(0.5)},
               "in_model_ms": {ort_model: 0.44, ov_model: 0.3}},
              {"block": "features[16]", "shape": "b", "expanded_mb": 0.19, "tiling": "channels=96",
               "timings": {block_fusion.SEPARATE: rec(0.3), block_fusion.FUSED: rec(0.5), peers.ORT: rec(0.1)},
               "in_model_ms": {ort_model: 0.06}}]
    text = fusion_table.format_fusion({"blocks": blocks, "load_before": 0.1, "load_after": 0.2}, "a test machine")
    lines = text.splitlines()
    assert ("| features[2] | a | 4.82 | rows=4 | 800 (40) | 400 (20) | 600 (30) | 500 (25) | 440 | 300 | 2.00x | 1.25x "
            "| 0.75x |") in lines
    assert "| features[16] | b | 0.19 | channels=96 | 300 (15) | 500 (25) | 100 (5) | - | 60 | - | 0.60x | 0.20x | 0.12x |" in lines
    total = next(line for line in lines if line.startswith("| all"))  # OpenVINO missed a block: no total of its own
    assert total == f"| all | | | | 1100 | 900 | 700 | - | 500 | - | {1.1 / 0.9:.2f}x | {0.7 / 0.9:.2f}x | {0.5 / 0.9:.2f}x |"

    whole = {"timings": {fusion_table.FUSED_MEASURED: rec(2.0), peers.OPENVINO: rec(2.5), fusion_table.TUNED: rec(3.0)},
             "tilings": {fusion_table.FUSED_MEASURED: {"features[1]": "rows=7", "features[2][1]": "rows=4"}},
             "database": "shipped",
             "verdict": "faster\nslower", "missing": {peers.FROZEN: "not installed"}}
    bf16 = f"{peers.OPENVINO}{peers.DEFAULT_PRECISION}bf16"
    whole["timings"][bf16], whole["lower_precision"] = rec(1.6), {bf16: 0.0042}
    lines = fusion_table.format_whole_model(whole, "EfficientNet-B0")
    rows = [line for line in lines if line.startswith("| ") and "median" not in line and "---" not in line]
    assert rows == [f"| {bf16} | 1.60 (0.08) | 0.80x |", f"| {fusion_table.FUSED_MEASURED} | 2.00 (0.10) | 1.00x |",
                    f"| {peers.OPENVINO} | 2.50 (0.12) | 1.25x |", f"| {fusion_table.TUNED} | 3.00 (0.15) | 1.50x |"]  # fastest first
    assert (f"Against {bf16} (a lower precision; its logits' relative error against float32 eager 4.2e-03): the fused "
            "float32 build is 1.25x slower.") in lines
    assert "faster; slower." in lines and "Missing: not installed" in lines
    assert "Cuts measured here: features[1] rows=7, features[2][1] rows=4." in lines
    assert lines[0].startswith("The whole model (EfficientNet-B0, batch 1, float32 unless a row names its precision;")


def test_an_engines_blocks_are_found_in_its_profile_of_the_whole_model_by_their_shapes():
    shape = block_fusion.BlockShape(size=8, c_in=4, hidden=12, c_out=6, stride=2)
    calls = [layer_compare.ConvCall("stem", (3, 16, 16, 4, 8, 8), 1.0),
             layer_compare.ConvCall("e", (4, 8, 8, 12, 8, 8), 0.1), layer_compare.ConvCall("d", (12, 8, 8, 12, 4, 4), 0.2),
             layer_compare.ConvCall("p", (12, 4, 4, 6, 4, 4), 0.3), layer_compare.ConvCall("head", (6, 4, 4, 8, 4, 4), 2.0)]
    layers = layer_compare.EngineLayers("engine", calls, rest_ms=0.5)
    missing = block_fusion.BlockShape(size=8, c_in=4, hidden=24, c_out=6, stride=2)
    assert fusion_table.in_model_ms(layers, [("a", shape), ("b", missing)]) == {"a": pytest.approx(0.6)}
