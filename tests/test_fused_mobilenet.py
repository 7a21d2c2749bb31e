"""A whole MobileNetV2 (and EfficientNet-B0) from the course's own fused kernels (helpers.fused_mobilenet, Day 7):
real torchvision models, compiled and checked against PyTorch on image sizes the course does not use."""

import numpy as np
import pytest
import torch

from helpers import block_fusion, build, fused_mobilenet, models


@pytest.fixture(scope="module")
def model():
    return models.load_model("mobilenet_v2", pretrained=False)


def test_the_fused_model_computes_mobilenets_logits(model):
    x = torch.rand(1, 3, 96, 96, generator=torch.Generator().manual_seed(5)) * 2 - 1
    compiled, tilings = fused_mobilenet.compile_fused(model, x)
    assert list(tilings) == [f"features[{i}]" for i in range(1, 18)]  # every block fused, the first (no expansion) too
    with torch.no_grad():
        want = model(x).numpy()
    got = compiled(x)
    assert got.shape == (1, 1000)
    assert build.relative_error(got, want) < 1e-4
    assert np.argmax(got) == np.argmax(want)


def test_each_blocks_cut_can_be_chosen_and_is_kept(model):
    x = torch.rand(1, 3, 64, 64, generator=torch.Generator().manual_seed(6))
    seen = []

    def one_row_bands(name, shape):
        seen.append((name, shape.size))
        return block_fusion.Tiling(rows=1)

    compiled, tilings = fused_mobilenet.compile_fused(model, x, choose=one_row_bands)
    assert set(tilings.values()) == {block_fusion.Tiling(rows=1)}
    assert seen[0] == ("features[1]", 32) and seen[-1] == ("features[17]", 2)  # each with the image size it sees
    with torch.no_grad():
        assert build.relative_error(compiled(x), model(x).numpy()) < 1e-4


def test_efficientnet_is_built_from_the_same_kernels_with_its_squeeze_and_excitations():
    model = models.load_model("efficientnet_b0", pretrained=False)
    x = torch.rand(1, 3, 65, 65, generator=torch.Generator().manual_seed(9)) * 2 - 1  # odd: the stem's last row
    compiled, tilings = fused_mobilenet.compile_fused(model, x)
    assert len(tilings) == 16 and list(tilings)[:3] == ["features[1][0]", "features[2][0]", "features[2][1]"]
    with torch.no_grad():
        want = model(x).numpy()
    assert build.relative_error(compiled(x), want) < 1e-4


def test_the_same_model_unfused_is_the_three_kernels_of_every_block(model):
    x = torch.rand(1, 3, 65, 65, generator=torch.Generator().manual_seed(8))  # odd: the stem's last row
    compiled, tilings = fused_mobilenet.compile_fused(model, x, choose="separate")
    assert set(tilings.values()) == {None}
    with torch.no_grad():
        assert build.relative_error(compiled(x), model(x).numpy()) < 1e-4
    with pytest.raises(block_fusion.BlockError, match="rule.*measure.*separate"):
        fused_mobilenet.compile_fused(model, x, choose="fastest")


def test_the_rule_bands_large_images_and_chunks_small_ones():
    large = block_fusion.BlockShape(size=56, c_in=24, hidden=144, c_out=24, stride=1)
    small = block_fusion.BlockShape(size=7, c_in=160, hidden=960, c_out=160, stride=1)
    assert fused_mobilenet.default_tiling(large, cores=2, lanes=16) == block_fusion.Tiling(rows=7)
    assert fused_mobilenet.default_tiling(small, cores=2, lanes=16) == block_fusion.Tiling(channels=48)


def test_the_classifier_is_packed_so_that_each_group_of_classes_is_contiguous():
    weight = np.arange(6 * 4, dtype=np.float32).reshape(6, 4)  # 6 classes, 4 features
    packed = fused_mobilenet.pack_weight(weight, group=3)
    assert packed.shape == (2, 4, 3) and packed.flags["C_CONTIGUOUS"]
    assert packed[1, 2, 0] == weight[3, 2]
    assert fused_mobilenet.classifier_group(1000, 16) == 8  # one 8-wide vector (1000 = 125 x 8)
    assert block_fusion.tile_channels(7, 1280, 16) == 32  # 7 pixels x 2 vectors (x 4 would be 28 sums)


def test_anything_but_mobilenet_on_one_square_image_is_refused(model):
    with pytest.raises(block_fusion.BlockError, match=r"MobileNetV2 or EfficientNet .* \(1, 3, S, S\)"):
        fused_mobilenet.compile_fused(model, torch.rand(2, 3, 64, 64))
    with pytest.raises(block_fusion.BlockError, match="ResNet"):
        fused_mobilenet.compile_fused(models.load_model("resnet50", pretrained=False), torch.rand(1, 3, 64, 64))


def test_on_a_cpu_with_8_float_lanes_the_same_model_is_built_with_8_wide_vectors(model):
    import tvm

    avx2 = tvm.target.Target({"kind": "llvm", "mcpu": "haswell", "num-cores": 2})  # runs on any AVX2 x86 CPU
    x = torch.rand(1, 3, 64, 64, generator=torch.Generator().manual_seed(7))
    compiled, _ = fused_mobilenet.compile_fused(model, x, target=avx2)
    assert "zmm" not in compiled.executable.mod.imports[0].inspect_source("asm")
    with torch.no_grad():
        assert build.relative_error(compiled(x), model(x).numpy()) < 1e-4
