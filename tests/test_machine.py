import pytest
import tvm

from helpers import bf16, machine
from helpers.errors import NoGPUError


def test_cpu_target_names_the_real_cpu_never_native():
    target = machine.cpu_target()
    assert target.kind.name == "llvm"
    assert str(target.attrs["mcpu"]) == machine.cpu_name()
    assert machine.cpu_name() not in {"native", "generic", ""}
    assert int(target.attrs["num-cores"]) == machine.physical_core_count() >= 1


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


@pytest.mark.parametrize(
    "cpu, units, bits, flops_per_cycle",
    [
        ("znver4", 2, 256, 32),  # 512-bit instructions run as two 256-bit halves: no more than AVX2's 2 x 256
        ("znver5", 2, 512, 64),  # full 512-bit datapaths
        ("skylake-avx512", 2, 512, 64),
        ("icelake-server", 2, 512, 64),
        ("haswell", 2, 256, 32),
        ("znver1", 2, 128, 16),
    ],
)
def test_fma_throughput_comes_from_the_table(cpu, units, bits, flops_per_cycle):
    fma = machine.fma_throughput(cpu)
    assert (fma.cpu, fma.units, fma.width_bits, fma.flops_per_cycle) == (cpu, units, bits, flops_per_cycle)
    assert fma.fp32_lanes == bits // 32
    assert fma.source.startswith("table:") and cpu in fma.summary()


def test_fma_throughput_falls_back_to_an_upper_bound_for_cpus_not_in_the_table():
    assert "x86-64-v4" not in machine.FMA_BY_CPU and "sandybridge" not in machine.FMA_BY_CPU
    fma = machine.fma_throughput(tvm.target.Target({"kind": "llvm", "mcpu": "x86-64-v4"}))
    assert (fma.units, fma.width_bits) == (2, 512) and "upper bound" in fma.source
    no_fma = machine.fma_throughput("sandybridge")  # AVX, no FMA: a multiply and an add per cycle
    assert (no_fma.units, no_fma.width_bits) == (1, 256) and "no FMA" in no_fma.source


def test_a_client_cpu_name_with_a_server_parts_amx_gets_the_server_parts_units(tmp_path):
    assert machine.fma_throughput("rocketlake", flags={"avx512f", "avx2"}).units == 1
    served = machine.fma_throughput("rocketlake", flags={"avx512f", "amx_tile"})
    assert (served.units, served.width_bits) == (2, 512) and "AMX" in served.source
    assert machine.fma_throughput("znver4", flags={"amx_tile"}).units == 2  # not a client part: the table stands
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nflags\t\t: fpu avx512f amx_tile\n")
    assert {"avx512f", "amx_tile"} <= machine.host_flags(cpuinfo) and machine.host_flags(tmp_path / "none") == set()


def test_instructions_a_cpu_has_beyond_its_llvm_name_join_the_target():
    # A Xeon with AMX and AVX-512 BF16 whose virtual machine shows model 167: LLVM says rocketlake, which has neither.
    xeon_flags = {"avx512f", "avx512_vnni", "avx512_bf16", "amx_tile", "amx_bf16", "amx_int8"}
    assert machine.unnamed_features("rocketlake", xeon_flags) == ["amx-bf16", "amx-int8", "amx-tile", "avx512bf16"]
    assert machine.unnamed_features("sapphirerapids", xeon_flags) == []  # the right name implies them all
    assert machine.unnamed_features("znver4", {"avx512_bf16", "sse2", "made_up"}) == []  # unknown flags ignored
    # This machine: the target has AVX-512 BF16 exactly when the CPU does, whatever LLVM calls it.
    target = machine.cpu_target()
    assert bf16.has_bf16(target) == ("avx512_bf16" in machine.host_flags())
    assert ("mattr" in target.attrs) == bool(machine.unnamed_features())


def test_fma_throughput_of_this_machine_uses_its_cpu():
    fma = machine.fma_throughput()
    assert fma.cpu == machine.cpu_name()
    assert fma.width_bits <= machine.vector_width_bits()


def _topology(root, siblings: dict[int, str]):
    for cpu, group in siblings.items():
        (root / f"cpu{cpu}" / "topology").mkdir(parents=True)
        (root / f"cpu{cpu}" / "topology" / "core_cpus_list").write_text(group + "\n")
    return root


def test_physical_cores_count_smt_siblings_once(tmp_path):
    # 4 logical CPUs: cores {0, 2} and {1, 3}, two hyper-threads each
    sysfs = _topology(tmp_path / "sys", {0: "0,2", 1: "1,3", 2: "0,2", 3: "1,3"})
    assert machine.physical_core_count({0, 1, 2, 3}, sysfs=sysfs, cpuinfo=tmp_path / "none") == 2
    assert machine.physical_core_count({0, 2}, sysfs=sysfs, cpuinfo=tmp_path / "none") == 1  # one core, both threads
    assert machine.physical_core_count({0, 1}, sysfs=sysfs, cpuinfo=tmp_path / "none") == 2


def test_physical_cores_from_cpuinfo_when_sysfs_has_no_topology(tmp_path):
    blocks = [f"processor\t: {cpu}\nphysical id\t: {pkg}\ncore id\t\t: {core}\n"
              for cpu, (pkg, core) in enumerate([(0, 0), (0, 1), (0, 0), (0, 1), (1, 0)])]
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("\n".join(blocks))
    assert machine.physical_core_count({0, 1, 2, 3, 4}, sysfs=tmp_path / "none", cpuinfo=cpuinfo) == 3
    assert machine.physical_core_count({0, 2}, sysfs=tmp_path / "none", cpuinfo=cpuinfo) == 1
    # neither source: every logical CPU counts
    assert machine.physical_core_count({0, 1, 2}, sysfs=tmp_path / "none", cpuinfo=tmp_path / "none") == 3


def test_every_engine_gets_one_thread_per_physical_core_of_an_smt_machine(tmp_path):
    # a laptop's 4 cores with 2 hyper-threads each: 8 logical CPUs, 4 threads
    sysfs = _topology(tmp_path / "sys", {cpu: f"{cpu % 4},{cpu % 4 + 4}" for cpu in range(8)})
    assert machine.thread_count(set(range(8)), sysfs=sysfs, cpuinfo=tmp_path / "none", environ={}) == 4
    # the learner's (or the hub's) own setting wins; a setting that is no count says so
    assert machine.thread_count(set(range(8)), sysfs=sysfs, environ={"TVM_NUM_THREADS": "8"}) == 8
    for bad in ("four", "0"):
        with pytest.raises(ValueError, match="TVM_NUM_THREADS=.* is not a thread count"):
            machine.thread_count(set(range(8)), sysfs=sysfs, environ={"TVM_NUM_THREADS": bad})


@pytest.mark.parametrize("tvm_threads", [None, "1"])
def test_tvm_and_pytorch_run_on_one_thread_count(tvm_threads):
    """A fresh process, as a notebook's kernel is: other tests in this worker change both pools."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    env = {k: v for k, v in os.environ.items() if k not in ("TVM_NUM_THREADS", "OMP_NUM_THREADS")}
    if tvm_threads:
        env["TVM_NUM_THREADS"] = tvm_threads
    # the LLM's kernels never import helpers.build: TVM's pool is set where every helper imports from (machine)
    probe = ("import tvm\nfrom helpers import qgemv\nfirst = tvm.get_global_func('runtime.NumThreads')()\n"
             "import torch\nfrom helpers import build, kernels, machine\n"
             "print(first, kernels.threads(), torch.get_num_threads(), machine.thread_count(), machine.physical_core_count())")
    out = subprocess.run([sys.executable, "-c", probe], env=env, cwd=Path(__file__).parents[1],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    first, tvm_pool, torch_pool, count, cores = map(int, out.stdout.split()[-5:])
    assert first == tvm_pool == torch_pool == count == (int(tvm_threads) if tvm_threads else cores)


def test_physical_cores_of_this_process():
    assert 1 <= machine.physical_core_count() <= machine.core_count()


def test_cache_sizes_reads_the_data_caches_smallest_first_and_skips_what_it_cannot_read(tmp_path):
    for index, (level, kind, size) in enumerate([("1", "Data", "48K"), ("1", "Instruction", "32K"),
                                                 ("2", "Unified", "2048K"), ("3", "Unified", "105M")]):
        folder = tmp_path / f"index{index}"
        folder.mkdir()
        for name, value in (("level", level), ("type", kind), ("size", size)):
            (folder / name).write_text(value + "\n")
    (tmp_path / "index4").mkdir()  # a level without its files
    assert machine.cache_sizes(tmp_path) == {"L1d": 48 * 1024, "L2": 2048 * 1024, "L3": 105 * 1024**2}
    assert machine.cache_sizes(tmp_path / "absent") == {}
