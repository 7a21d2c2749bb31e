"""helpers.dispatch on real TVM and PyTorch: the rewrite, the registered library calls, the build."""

import numpy as np
import pytest
import torch
import tvm
from tvm import relax, te, topi

from helpers import build, databases, dispatch, ir, models, tuning
from helpers.errors import CourseError


class ConvBlocks(torch.nn.Module):
    """Every epilogue the rewrite knows: BN+ReLU, BN+add+ReLU, BN alone, BN+ReLU6, a depthwise conv, a bare conv."""

    def __init__(self):
        super().__init__()
        self.c1, self.b1 = torch.nn.Conv2d(3, 8, 3, padding=1, bias=False), torch.nn.BatchNorm2d(8)
        self.c2, self.b2 = torch.nn.Conv2d(8, 8, 3, padding=1, bias=False), torch.nn.BatchNorm2d(8)
        self.c3, self.b3 = torch.nn.Conv2d(8, 8, 1, bias=False), torch.nn.BatchNorm2d(8)
        self.dw = torch.nn.Conv2d(8, 8, 3, padding=1, groups=8, bias=False)
        self.c4, self.b4 = torch.nn.Conv2d(8, 8, 1, stride=2, bias=False), torch.nn.BatchNorm2d(8)
        self.c5 = torch.nn.Conv2d(8, 4, 3, padding=2, dilation=2, bias=False)

    def forward(self, x):
        y = torch.relu(self.b1(self.c1(x)))
        y = torch.relu(self.b2(self.c2(y)) + y)
        y = self.b3(self.c3(y)) + y
        y = torch.nn.functional.relu6(self.b4(self.c4(self.dw(y))))
        return self.c5(y)


def _with_batch_norm_statistics(model: torch.nn.Module) -> torch.nn.Module:
    """``model`` in eval mode, every BatchNorm given statistics and an affine part that are not the identity."""
    for bn in (m for m in model.modules() if isinstance(m, torch.nn.BatchNorm2d)):
        bn.running_mean.uniform_(-1, 1)
        bn.running_var.uniform_(0.5, 2)
        bn.weight.data.uniform_(0.5, 2)
        bn.bias.data.uniform_(-1, 1)
    return model.eval()


@pytest.fixture(scope="module")
def blocks():
    torch.manual_seed(0)
    model = _with_batch_norm_statistics(ConvBlocks())
    x = torch.randn(1, 3, 16, 16, generator=torch.Generator().manual_seed(1))
    return model, x, models.import_to_relax(model, x)


def test_function_names_and_registration():
    assert dispatch.function_name() == "course.torch.conv2d"
    assert dispatch.function_name(bias=True, add=True, activation="relu") == "course.torch.conv2d_bias_add_relu"
    for bias, add, act in dispatch.variants():
        assert dispatch.is_registered(dispatch.function_name(bias, add, act))
    assert dispatch.function_name(True, True, "relu", packed=True) == "course.torch.conv2d_packed_bias_add_relu"
    for bias, add, act in dispatch.variants(packed=True):
        assert dispatch.is_registered(dispatch.function_name(bias, add, act, packed=True))
    assert (True, True, "relu6") not in dispatch.variants(packed=True)
    assert dispatch.is_registered(dispatch.PACK_WEIGHT)
    assert not dispatch.is_registered("course.torch.no_such_function")
    with pytest.raises(CourseError, match="activation"):
        dispatch.function_name(activation="gelu")


def test_offload_convs_matches_each_epilogue_and_leaves_depthwise(blocks):
    _, _, imported = blocks
    offloaded = dispatch.offload_convs(imported.mod)
    assert dispatch.dispatched_calls(offloaded) == {
        "course.torch.conv2d_bias_relu": 1,
        "course.torch.conv2d_bias_add_relu": 1,
        "course.torch.conv2d_bias_add": 1,
        "course.torch.conv2d_bias_relu6": 1,
        "course.torch.conv2d": 1,
    }
    hist = ir.op_histogram(offloaded)
    assert hist["nn.conv2d"] == 1, "the depthwise convolution stays in TVM"
    assert hist.get("nn.batch_norm", 0) == 0
    assert ir.op_histogram(imported.mod)["nn.conv2d"] == 6, "the input module is not changed"


def test_without_folding_only_convolutions_move(blocks):
    _, _, imported = blocks
    plain = dispatch.offload_convs(imported.mod, fold_bn=False)
    assert dispatch.dispatched_calls(plain) == {"course.torch.conv2d": 5}
    assert ir.op_histogram(plain)["nn.batch_norm"] == 4


@pytest.mark.parametrize("rewrite", [{}, {"fuse_epilogue": False}, {"fold_bn": False}])
def test_compile_dispatched_matches_pytorch(blocks, rewrite):
    model, x, imported = blocks
    compiled = dispatch.compile_dispatched(imported, **rewrite)
    assert build.check_parity(compiled, model, x, rtol=1e-5) <= 1e-5


def test_prepacked_dispatch_fuses_each_epilogue_and_packs_once_per_load(blocks):
    model, x, imported = blocks
    offloaded = dispatch.offload_convs(imported.mod, prepack=True)
    assert dispatch.dispatched_calls(offloaded) == {
        "course.torch.conv2d_packed_bias_relu": 1,
        "course.torch.conv2d_packed_bias_add_relu": 1,
        "course.torch.conv2d_packed_bias_add": 1,
        "course.torch.conv2d_packed_bias_relu6": 1,
        "course.torch.conv2d_packed": 1,
    }
    script = offloaded["main"].script()
    # channels-last from one oneDNN call to the next: the only layout changes left are at the edges of each
    # chain of packed calls (into c1 from the input; out to the depthwise conv in TVM and back; out of c5)
    assert (script.count(dispatch.TO_NHWC), script.count(dispatch.TO_NCHW)) == (2, 2)
    import gc
    gc.collect()   # builds other tests left unreferenced go now, not during the count below
    before = dispatch.packed_weights_alive()
    compiled = dispatch.compile_dispatched(imported, prepack=True)
    assert dispatch.packed_weights_alive() == before + 5, "one packed weight per dispatched convolution, made at load"
    assert build.check_parity(compiled, model, x, rtol=1e-5) <= 1e-5
    compiled(x)
    assert dispatch.packed_weights_alive() == before + 5, "calls reuse the packed weights: none packed per call"
    main = compiled.executable  # the packing is lifted out of main: main only calls the convolutions
    del compiled, main
    gc.collect()
    assert dispatch.packed_weights_alive() == before, "the packed weights go with the build that holds their handles"


class StemAndPool(torch.nn.Module):
    """ResNet's stem: conv -> BN -> ReLU -> max pool (padded, strided), then a block."""

    def __init__(self):
        super().__init__()
        self.c1, self.b1 = torch.nn.Conv2d(3, 8, 7, stride=2, padding=3, bias=False), torch.nn.BatchNorm2d(8)
        self.pool = torch.nn.MaxPool2d(3, stride=2, padding=1)
        self.c2, self.b2 = torch.nn.Conv2d(8, 8, 3, padding=1, bias=False), torch.nn.BatchNorm2d(8)

    def forward(self, x):
        y = self.pool(torch.relu(self.b1(self.c1(x))))
        return torch.relu(self.b2(self.c2(y)) + y)


def test_a_max_pool_between_packed_calls_stays_channels_last():
    torch.manual_seed(4)
    model = _with_batch_norm_statistics(StemAndPool())
    x = torch.randn(1, 3, 30, 30, generator=torch.Generator().manual_seed(5))  # odd sizes: padding and rounding matter
    imported = models.import_to_relax(model, x)
    script = dispatch.offload_convs(imported.mod, prepack=True)["main"].script()
    assert "nn.max_pool2d" not in script and script.count(dispatch.MAX_POOL) == 1
    assert (script.count(dispatch.TO_NHWC), script.count(dispatch.TO_NCHW)) == (1, 1), "only the input and the output change layout"
    assert "nn.max_pool2d" in dispatch.offload_convs(imported.mod)["main"].script(), "unpacked dispatch leaves pooling to TVM"
    assert build.check_parity(dispatch.compile_dispatched(imported, prepack=True), model, x, rtol=1e-5) <= 1e-5


def test_packed_dispatch_refuses_a_database_tuned_without_prepacking(blocks, tmp_path):
    # such a build keeps the weight arithmetic in main: every call would pack every weight again
    (tmp_path / tuning.SETTINGS_FILE).write_text('{"prepack": false}')
    db = databases.Database(tmp_path, databases.YOURS, "znver4", 2, 8, transferred=True)
    with pytest.raises(CourseError, match="without weight prepacking"):
        dispatch.compile_dispatched(blocks[2], database=db, prepack=True)
    (tmp_path / tuning.SETTINGS_FILE).write_text('{"prepack": true}')
    assert db.prepacked()


def test_a_packed_call_without_its_weight_says_what_to_do():
    x, w = dispatch.random_conv_problem((1, 4, 6, 6), 5, 3, seed=2)
    bb = relax.BlockBuilder()
    xv = relax.Var("x", relax.TensorType(x.shape, "float32"))
    hv = relax.Var("h", relax.TensorType((1,), "int64"))
    with bb.function("main", [xv, hv]):
        with bb.dataflow():
            call = relax.call_dps_packed(dispatch.function_name(packed=True), relax.Tuple([xv, hv, relax.ShapeExpr([1, 1, 1, 1, 1, 1])]),
                                         out_ty=relax.TensorType((1, 5, 6, 6), "float32"))
            out = bb.emit_output(bb.emit(call))
        bb.emit_func_output(out)
    vm = relax.VirtualMachine(tvm.compile(bb.get(), target="llvm"), tvm.cpu())
    with pytest.raises(Exception, match="main_transform_params"):
        vm["main"](tvm.runtime.tensor(x), tvm.runtime.tensor(np.array([0], dtype=np.int64)))


class SharedProjection(torch.nn.Module):
    """MobileNetV2's ``x + block(x)``: the first conv's result has two users, the next conv and the add."""

    def __init__(self):
        super().__init__()
        self.c1, self.b1 = torch.nn.Conv2d(3, 8, 1, bias=False), torch.nn.BatchNorm2d(8)
        self.c2, self.b2 = torch.nn.Conv2d(8, 8, 3, padding=1, bias=False), torch.nn.BatchNorm2d(8)
        self.c3 = torch.nn.Conv2d(8, 4, 1, bias=False)

    def forward(self, x):
        a = self.b1(self.c1(x))
        return self.c3(a + self.b2(self.c2(a)))


@pytest.fixture(scope="module")
def shared():
    torch.manual_seed(2)
    model = _with_batch_norm_statistics(SharedProjection())
    x = torch.randn(1, 3, 8, 8, generator=torch.Generator().manual_seed(3))
    return model, x, models.import_to_relax(model, x)


def test_a_convolution_with_two_users_is_dispatched_once(shared):
    model, x, imported = shared
    offloaded = dispatch.offload_convs(imported.mod)
    assert dispatch.dispatched_calls(offloaded) == {
        "course.torch.conv2d_bias": 1,  # c1: its result is also the residual, so it stays a value
        "course.torch.conv2d_bias_add": 1,  # c2 with the add, whichever operand order the import gives
        "course.torch.conv2d": 1,
    }
    assert build.check_parity(dispatch.compile_dispatched(imported), model, x, rtol=1e-5) <= 1e-5


def test_offload_convs_refuses_a_rewrite_that_computes_a_convolution_twice(shared, monkeypatch):
    monkeypatch.setattr(dispatch._Uses, "only_once", lambda self, value: True)  # the check the rules rely on, off
    with pytest.raises(CourseError, match="3 convolutions into 4"):
        dispatch.offload_convs(shared[2].mod)


def test_offload_convs_rejects_a_missing_function(blocks):
    with pytest.raises(CourseError, match="no function 'forward'"):
        dispatch.offload_convs(blocks[2].mod, function="forward")


def test_conv_attrs_packs_stride_padding_dilation_and_rejects_grouped(blocks):
    convs = ir.calls(blocks[2].mod, "nn.conv2d")
    attrs = [dispatch.conv_attrs(c) for c in convs]
    assert [int(v) for v in attrs[0].values] == [1, 1, 1, 1, 1, 1]
    assert sum(a is None for a in attrs) == 1  # the depthwise one
    assert [int(v) for v in attrs[-1].values] == [1, 1, 2, 2, 2, 2]


def test_te_module_and_run_module_on_a_tensor_expression():
    def add_one(a: te.Tensor) -> te.Tensor:
        return topi.add(a, 1.0)

    mod = dispatch.te_module(add_one, [(2, 3)])
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    np.testing.assert_array_equal(dispatch.run_module(mod, x), x + 1)
    assert any(isinstance(f, tvm.tirx.PrimFunc) for f in mod.functions.values())


def test_time_saved_counts_overhead_per_call_and_refuses_bad_rows():
    rows = [dict(kernel="a", calls=2, tvm_ms=1.0, library_ms=0.5), dict(kernel="b", calls=1, tvm_ms=1.0, library_ms=None)]
    assert dispatch.time_saved_ms(rows, ["a"], 0.1) == pytest.approx(0.3)
    assert dispatch.time_saved_ms(rows, [], 0.1) == 0.0
    with pytest.raises(CourseError, match="cannot be offloaded"):
        dispatch.time_saved_ms(rows, ["b"], 0.1)
    with pytest.raises(CourseError, match="No row named 'c'"):
        dispatch.time_saved_ms(rows, ["c"], 0.1)


def test_choose_offload_pays_the_overhead_per_call_and_skips_what_the_library_cannot_run():
    table = [dict(kernel="pointwise", calls=17, tvm_ms=1.20, library_ms=1.00),   # 0.2 ms faster, but 17 calls x 0.02 ms
             dict(kernel="stem", calls=1, tvm_ms=0.90, library_ms=0.60),
             dict(kernel="dense3x3", calls=16, tvm_ms=20.0, library_ms=12.0),
             dict(kernel="depthwise", calls=17, tvm_ms=3.0, library_ms=None),
             dict(kernel="classifier", calls=1, tvm_ms=0.10, library_ms=0.10)]
    assert dispatch.choose_offload(table, 0.02) == ["dense3x3", "stem"]
    assert dispatch.choose_offload(table, 0.0) == ["dense3x3", "pointwise", "stem"]
    assert dispatch.choose_offload(table, 0.5) == []
    assert dispatch.choose_offload([], 0.01) == []
    best = dispatch.time_saved_ms(table, dispatch.choose_offload(table, 0.02), 0.02)
    for other in (["dense3x3"], ["dense3x3", "pointwise", "stem"], ["stem"]):
        assert dispatch.time_saved_ms(table, other, 0.02) < best


def test_a_dispatched_call_writes_into_the_output_it_is_given():
    x, w = dispatch.random_conv_problem((1, 4, 6, 6), 5, 3, seed=2)
    bb = relax.BlockBuilder()
    xv, wv = relax.Var("x", relax.TensorType(x.shape, "float32")), relax.Var("w", relax.TensorType(w.shape, "float32"))
    with bb.function("main", [xv, wv]):
        with bb.dataflow():
            call = relax.call_dps_packed(dispatch.function_name(activation="relu"),
                                         relax.Tuple([xv, wv, relax.ShapeExpr([2, 2, 1, 1, 1, 1])]),
                                         out_ty=relax.TensorType((1, 5, 3, 3), "float32"))
            out = bb.emit_output(bb.emit(call))
        bb.emit_func_output(out)
    got = dispatch.run_module(bb.get(), x, w)
    want = torch.relu(torch.nn.functional.conv2d(torch.from_numpy(x), torch.from_numpy(w), stride=2, padding=1)).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_aten_conv_paths_names_a_kernel_for_every_convolution(blocks):
    model, x, _ = blocks
    paths = dispatch.aten_conv_paths(model, x)
    assert sum(paths.values()) == 6, paths  # ConvBlocks' six convolutions, the depthwise one included
    assert paths["aten::slow_conv_dilated2d"] == 1, paths  # the dilated one: never oneDNN here
    assert all(name.startswith("aten::") for name in paths), paths
