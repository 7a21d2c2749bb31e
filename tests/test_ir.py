import tvm
from tvm import relax

from helpers import build, ir

def test_op_histogram_of_an_imported_model(tiny_imported):
    hist = ir.op_histogram(tiny_imported.mod)
    assert hist["nn.conv2d"] == 1 and hist["nn.batch_norm"] == 1 and hist["nn.relu"] == 1
    assert "call_tir" not in hist


def test_fusion_reduces_kernel_calls(tiny_imported):
    legal = tvm.transform.Sequential([relax.transform.DecomposeOpsForInference(), relax.transform.LegalizeOps()])(
        tiny_imported.mod)
    fused = build.fuse(tiny_imported.mod)
    assert ir.count_kernel_calls(legal) == ir.op_histogram(legal)["call_tir"]
    assert ir.count_kernel_calls(fused) < ir.count_kernel_calls(legal)
    assert ir.count_kernels(fused) < ir.count_kernels(legal)
    assert ir.fused_function_names(fused), "FuseOps should have produced fused_* kernels"
    assert not ir.fused_function_names(legal)


def test_unknown_function_name_is_explained(tiny_imported):
    import pytest

    from helpers.errors import CourseError

    with pytest.raises(CourseError, match="no function 'forward'.*'main'"):
        ir.op_histogram(tiny_imported.mod, "forward")


def test_op_type_reads_kernel_names():
    assert ir.op_type("fused_conv2d3_add2_relu1") == "conv2d"
    assert ir.op_type("conv2d12") == "conv2d"
    assert ir.op_type("tir_clip3") == "clip"
    assert ir.op_type("adaptive_avg_pool2d1") == "adaptive_avg_pool2d"
    assert ir.op_type("max_pool2d") == "max_pool2d"
    assert ir.op_type("batch_norm7") == "batch_norm"
    assert ir.op_type("fused_matmul_add") == "matmul"
    assert ir.op_type("weird_kernel9") == "weird"


def test_a_group_of_one_operator_is_not_a_fusion():
    assert ir.is_fused("fused_conv2d3_add2_relu1")
    assert ir.is_fused("fused_tir_clip_multiply")
    assert not ir.is_fused("fused_conv2d3")
    assert not ir.is_fused("conv2d_add")  # not named by FuseOps
    assert ir.op_type("fused_expand_dims_add") == "expand_dims"


def test_calls_of_one_operator_take_the_histogram_names(tiny_imported):
    convs = ir.calls(tiny_imported.mod, "nn.conv2d")
    assert len(convs) == ir.op_histogram(tiny_imported.mod)["nn.conv2d"] == 1
    assert convs[0].op.name == "relax.nn.conv2d"
    assert [c.op.name for c in ir.calls(tiny_imported.mod, "relax.nn.relu")] == ["relax.nn.relu"]
    assert ir.calls(tiny_imported.mod, "nn.softmax") == []
