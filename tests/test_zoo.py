"""helpers.zoo: the capstone's operator mix, on real Relax imports of small convolutional models."""

import torch

from helpers import models, zoo


class Mixed(torch.nn.Module):
    """One conv of each kind the capstone tells apart, and a sigmoid gate."""

    def __init__(self):
        super().__init__()
        self.regular = torch.nn.Conv2d(3, 8, 3, padding=1)         # 2*8*8*8 * 3*3*3 MACs
        self.depthwise = torch.nn.Conv2d(8, 8, 3, padding=1, groups=8)
        self.pointwise = torch.nn.Conv2d(8, 16, 1)
        self.squeeze = torch.nn.Conv2d(16, 4, 1)                     # on the pooled 1x1 map

    def forward(self, x):
        h = self.pointwise(self.depthwise(self.regular(x)))
        gate = torch.sigmoid(self.squeeze(h.mean(dim=(2, 3), keepdim=True)))
        return h[:, :4] * gate


def test_operator_mix_tells_the_conv_kinds_apart_and_counts_their_flops():
    imported = models.import_to_relax(Mixed().eval(), torch.randn(1, 3, 8, 8))
    mix = zoo.operator_mix(imported.mod)
    assert (mix["conv2d"], mix["regular"], mix["depthwise"], mix["pointwise"], mix["squeeze-excite"]) == (4, 1, 1, 1, 1)
    assert mix["sigmoid"] == 1
    out_pixels = 8 * 8
    macs = out_pixels * (8 * 3 * 9 + 8 * 1 * 9 + 16 * 8) + 4 * 16
    assert abs(mix["GFLOP (conv)"] - 2 * macs / 1e9) < 1e-12
    depthwise_share = 100 * (out_pixels * 8 * 9) / macs
    assert abs(mix["depthwise % of conv FLOPs"] - depthwise_share) < 1e-9
    assert 0 < mix["kernels after fusion"] <= mix["operators"]


def test_operator_mix_is_counted_once_per_module_and_again_for_another(monkeypatch, tmp_path):
    from helpers import build, cache

    monkeypatch.setattr(cache, "CACHE_ROOT", tmp_path)
    fused = []
    real_fuse = build.fuse
    monkeypatch.setattr(build, "fuse", lambda mod, target: fused.append(1) or real_fuse(mod, target))
    x = torch.randn(1, 3, 8, 8)
    first = zoo.operator_mix(models.import_to_relax(Mixed().eval(), x).mod)
    again = zoo.operator_mix(models.import_to_relax(Mixed().eval(), x).mod)  # imported anew: the same module
    assert again == first and len(fused) == 1
    other = zoo.operator_mix(models.import_to_relax(Mixed().eval(), torch.randn(1, 3, 16, 16)).mod)
    assert len(fused) == 2 and other["GFLOP (conv)"] > 3 * first["GFLOP (conv)"]  # 4x the pixels
    monkeypatch.setenv(cache.NO_CACHE_ENV, "1")
    assert zoo.operator_mix(models.import_to_relax(Mixed().eval(), x).mod) == first and len(fused) == 3


def test_the_equal_budget_is_one_every_model_has_in_its_best_kind_of_database(monkeypatch):
    """Day 11 compares models at one budget, never one that only an NCHW or other-width database meets."""
    import tvm

    from helpers import databases

    def db(mcpu, budget, layout="NCHW"):
        return databases.Database(databases.SHIPPED_ROOT / f"m-b1-{mcpu}-2cores", "shipped", mcpu, 2, budget, True,
                                  layout=layout)

    shelves = {}
    monkeypatch.setattr(databases, "candidates", lambda name, target, *a, **k: shelves.get(name, []))
    avx512 = tvm.target.Target({"kind": "llvm", "mcpu": "znver4", "num-cores": 2})
    avx2 = tvm.target.Target({"kind": "llvm", "mcpu": "haswell", "num-cores": 2})
    shelves["a"] = [db("emeraldrapids", 72, "NCHW16c"), db("znver4", 16), db("znver3", 32, "NCHW8c")]
    shelves["b"] = [db("emeraldrapids", 32, "NCHW16c"), db("znver4", 16), db("znver3", 32, "NCHW8c")]
    assert zoo.equal_budget(avx512, ["a", "b"]) is None  # 16 is only NCHW's, 32 only the AVX2 class's for a
    assert zoo.equal_budget(avx2, ["a", "b"]) == 32
    shelves["a"].append(db("skylake-avx512", 32, "NCHW16c"))
    shelves["b"].append(db("icelake-server", 48, "NCHW16c"))
    assert zoo.equal_budget(avx512, ["a", "b"]) == 32
    assert zoo.equal_budget(avx512, ["a", "b", "none"]) is None  # a model with no database at all
