import pytest
import tvm

from helpers import machine
from helpers.errors import NoGPUError


def test_cpu_target_names_the_real_cpu_never_native():
    target = machine.cpu_target()
    assert target.kind.name == "llvm"
    assert str(target.attrs["mcpu"]) == machine.cpu_name()
    assert machine.cpu_name() not in {"native", "generic", ""}
    assert int(target.attrs["num-cores"]) == machine.core_count() >= 1


@pytest.mark.parametrize(
    "cpu, bits, lanes_feature",
    [("haswell", 256, "avx2"), ("skylake-avx512", 512, "avx512f"), ("generic", 128, None)],
)
def test_vector_width_follows_the_cpu_features(cpu, bits, lanes_feature):
    target = tvm.target.Target({"kind": "llvm", "mcpu": cpu})
    assert machine.vector_width_bits(target) == bits
    if lanes_feature:
        assert lanes_feature in machine.vector_extensions(target)
    else:
        assert "avx2" not in machine.vector_extensions(target)


def test_cuda_target_builds_without_a_gpu_when_arch_is_given():
    target = machine.cuda_target("sm_80")
    assert target.kind.name == "cuda" and str(target.attrs["arch"]) == "sm_80"
    assert str(target.host.attrs["mcpu"]) == machine.cpu_name()


@pytest.mark.skipif(machine.has_gpu(), reason="checks the no-GPU path")
def test_gpu_requests_fail_clearly_without_a_gpu():
    assert machine.gpu_name() is None
    with pytest.raises(NoGPUError, match="needs an NVIDIA GPU.*arch='sm_80'"):
        machine.cuda_target()


def test_describe_is_a_plain_record():
    info = machine.describe()
    record = info.as_dict()
    assert record["cpu"] == machine.cpu_name() and record["cores"] == machine.core_count()
    assert record["tvm"] == tvm.__version__
    assert machine.cpu_name() in info.summary()
