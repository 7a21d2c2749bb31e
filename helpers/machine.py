"""What this machine is, and the TVM target that fits it.

LLVM 22 in the pip wheel turns ``mcpu=native`` into ``generic`` (no AVX-512),
so the target always names the real CPU as LLVM reports it.
"""

from __future__ import annotations

import os
import platform
from dataclasses import asdict, dataclass, field

import tvm
from tvm.target import codegen

from .errors import NoGPUError

# The instruction-set extensions a learner should look for, widest first.
VECTOR_FEATURES = ("avx512f", "avx2", "avx", "sse4.2", "neon", "sve")
# Register width each extension brings. (LLVM's own llvm_get_vector_width answers
# 512 for every x86 CPU in this wheel, haswell included, so it is not used.)
WIDTH_BY_FEATURE = (("avx512f", 512), ("avx", 256), ("sse2", 128), ("neon", 128), ("sve", 128))


def cpu_name() -> str:
    """The CPU as LLVM names it (e.g. ``znver5``, ``skylake-avx512``); never ``native``."""
    return str(codegen.llvm_get_system_cpu())


def core_count() -> int:
    """Cores this process may run on (respects taskset and container limits)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def cpu_target(num_cores: int | None = None) -> tvm.target.Target:
    """The LLVM target for this host: the real CPU name and its core count."""
    return tvm.target.Target(
        {"kind": "llvm", "mcpu": cpu_name(), "num-cores": num_cores or core_count()}
    )


def cpu_features(target: tvm.target.Target | None = None) -> set[str]:
    """LLVM feature names of the target's CPU (``avx512f``, ``avx2``, ...)."""
    return {str(f) for f in codegen.llvm_get_cpu_features(target or cpu_target())}


def vector_width_bits(target: tvm.target.Target | None = None) -> int:
    """Widest SIMD register the target's CPU has, in bits (512 with AVX-512, 256 with AVX2)."""
    feats = cpu_features(target)
    return next((bits for feat, bits in WIDTH_BY_FEATURE if feat in feats), 64)


def vector_extensions(target: tvm.target.Target | None = None) -> list[str]:
    """The notable SIMD extensions present, widest first."""
    feats = cpu_features(target)
    return [f for f in VECTOR_FEATURES if f in feats]


def cpu_ghz() -> float | None:
    """The CPU clock in GHz as the OS reports it (a rough figure: turbo and power states move it)."""
    try:
        import psutil

        freq = psutil.cpu_freq()
        if freq and (freq.max or freq.current):
            return round((freq.max or freq.current) / 1000.0, 2)
    except Exception:
        pass
    try:
        for line in open("/proc/cpuinfo"):
            if line.lower().startswith("cpu mhz"):
                return round(float(line.split(":")[1]) / 1000.0, 2)
    except OSError:
        pass
    return None


def has_gpu() -> bool:
    """True when TVM can see an NVIDIA GPU (CUDA device 0)."""
    try:
        return bool(tvm.cuda(0).exist)
    except Exception:  # a wheel without CUDA runtime support
        return False


def gpu_name() -> str | None:
    """The GPU's name, or None when there is none."""
    if not has_gpu():
        return None
    try:
        import torch

        return torch.cuda.get_device_name(0)
    except Exception:
        return str(tvm.cuda(0).device_name)


def require_gpu(what: str = "this cell") -> None:
    """Raise a clear error when ``what`` needs a GPU and the machine has none."""
    if not has_gpu():
        raise NoGPUError(
            f"{what} needs an NVIDIA GPU, and this machine has none (tvm.cuda(0).exist is False). "
            "To only build CUDA code, use cuda_target(arch='sm_80'); to run it, use a machine with a GPU."
        )


def cuda_target(arch: str | None = None) -> tvm.target.Target:
    """A CUDA target with this host as its host target.

    With ``arch`` (e.g. ``"sm_80"``) it works on a machine without a GPU, which is
    enough to compile and read kernels. Without ``arch`` it asks the GPU for its
    compute capability and raises ``NoGPUError`` if there is no GPU.
    """
    if arch is None:
        require_gpu("cuda_target() without arch")
        arch = "sm_" + str(tvm.cuda(0).compute_version).replace(".", "")
    return tvm.target.Target({"kind": "cuda", "arch": arch}, host=cpu_target())


@dataclass(frozen=True)
class MachineInfo:
    """A plain record of the machine, stored beside every measurement."""

    cpu: str
    cores: int
    vector_bits: int
    vector_extensions: list[str]
    gpu: str | None
    os: str = field(default_factory=platform.platform)
    python: str = field(default_factory=platform.python_version)
    tvm: str = field(default_factory=lambda: tvm.__version__)

    def as_dict(self) -> dict:
        return asdict(self)

    def summary(self) -> str:
        ext = ", ".join(self.vector_extensions) or "none"
        gpu = self.gpu or "no GPU"
        return f"{self.cpu}, {self.cores} cores, {self.vector_bits}-bit SIMD ({ext}), {gpu}"


def describe() -> MachineInfo:
    """Everything a benchmark result must be recorded with."""
    return MachineInfo(
        cpu=cpu_name(),
        cores=core_count(),
        vector_bits=vector_width_bits(),
        vector_extensions=vector_extensions(),
        gpu=gpu_name(),
    )
