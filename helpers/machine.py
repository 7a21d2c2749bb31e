"""What this machine is, and the TVM target that fits it.

LLVM 22 in the pip wheel turns ``mcpu=native`` into ``generic`` (no AVX-512),
so the target always names the real CPU as LLVM reports it.

Introduced on Day 0.
"""

from __future__ import annotations

import os
import platform
from dataclasses import asdict, dataclass, field
from pathlib import Path

import tvm
from tvm.target import codegen

from .config import REPO
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
    """Logical CPUs this process may run on (respects taskset and container limits).

    SMT siblings count separately (``physical_core_count()`` does not); the threads the engines get are
    ``thread_count()``.
    """
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def physical_core_count(
    cpus: set[int] | None = None,
    sysfs: str | Path = "/sys/devices/system/cpu",
    cpuinfo: str | Path = "/proc/cpuinfo",
) -> int:
    """Physical cores among the CPUs this process may run on: SMT siblings (hyper-threads) count once.

    ``core_count()`` counts logical CPUs; peak arithmetic and thread counts need physical cores, because
    two hyper-threads of one core share its FMA units. The CPUs allowed by
    ``os.sched_getaffinity(0)`` (or ``cpus``) are grouped by the sibling list the kernel publishes
    (``topology/core_cpus_list``, ``thread_siblings_list`` on older kernels), else by the
    ``(physical id, core id)`` pairs of ``/proc/cpuinfo``; with neither, every logical CPU counts as
    a core. In a virtual machine this is the topology the hypervisor shows, which may not say
    whether two virtual CPUs share a physical core.
    """
    if cpus is None:
        try:
            cpus = set(os.sched_getaffinity(0))
        except AttributeError:  # not on Linux
            return core_count()
    if not cpus:
        return 1
    groups = set()
    for cpu in sorted(cpus):
        topology = Path(sysfs) / f"cpu{cpu}" / "topology"
        siblings = next((f.read_text().strip() for f in (topology / "core_cpus_list", topology / "thread_siblings_list")
                         if f.is_file()), None)
        if not siblings:
            break
        groups.add(siblings)
    else:
        return len(groups)
    pairs = {}
    try:
        for block in Path(cpuinfo).read_text().split("\n\n"):
            fields = dict(line.split(":", 1) for line in block.splitlines() if ":" in line)
            fields = {k.strip(): v.strip() for k, v in fields.items()}
            if {"processor", "physical id", "core id"} <= fields.keys():
                pairs[int(fields["processor"])] = (fields["physical id"], fields["core id"])
    except (OSError, ValueError):
        pairs = {}
    if cpus <= pairs.keys():
        return len({pairs[cpu] for cpu in cpus})
    return len(cpus)


THREADS_ENV = "TVM_NUM_THREADS"


def thread_count(
    cpus: set[int] | None = None,
    sysfs: str | Path = "/sys/devices/system/cpu",
    cpuinfo: str | Path = "/proc/cpuinfo",
    environ: dict[str, str] | None = None,
) -> int:
    """The threads every engine gets, TVM, PyTorch, ONNX Runtime and OpenVINO alike: one per physical core this
    process may use (``physical_core_count``), unless ``TVM_NUM_THREADS`` says otherwise (the hub, the test
    suite, or a learner's own choice).

    One count for all, so that a comparison is fair: on a 4-core laptop with 8 hyper-threads each engine gets 4.
    Two hyper-threads of one core share its vector units, so a second thread per core rarely helps these
    kernels and makes their timings noisier.
    """
    environ = os.environ if environ is None else environ
    if (value := environ.get(THREADS_ENV, "").strip()):
        try:
            if int(value) >= 1:
                return int(value)
        except ValueError:
            pass
        raise ValueError(f"{THREADS_ENV}={value!r} is not a thread count: set a whole number of threads, 1 or more, "
                         f"or unset it to get one per physical core.")
    return physical_core_count(cpus, sysfs, cpuinfo)


# TVM's runtime reads TVM_NUM_THREADS when it starts its pool and again at every parallel kernel. Unset, the pool
# gets half the logical CPUs on x86 (it assumes two hardware threads per core: one thread on a 2-core machine
# without them), and each parallel kernel reads how many CPUs are online from a file (a profile shows it).
# Both together, measured on a Zen 4: SmolLM2's decoding step (Day 15) 8.2 ms unset, 4.5 ms set to 2.
# Set here, where every helper that runs TVM code imports from, before TVM's first parallel call.
os.environ.setdefault(THREADS_ENV, str(thread_count()))


# The kernel's name (``/proc/cpuinfo``'s flags) and LLVM's for the vector instructions the course's kernels use
# or look for. LLVM names a CPU from its model number, and a virtual machine may show an older model's number on a
# newer part: a Xeon with AMX and AVX-512 BF16 shown as model 167 is named ``rocketlake``, which has neither.
FLAG_FEATURES = {
    "fma": "fma", "avx2": "avx2", "avx512f": "avx512f", "avx512bw": "avx512bw", "avx512dq": "avx512dq",
    "avx512vl": "avx512vl", "avx512_vnni": "avx512vnni", "avx_vnni": "avxvnni", "avx512_bf16": "avx512bf16",
    "avx512_fp16": "avx512fp16", "amx_tile": "amx-tile", "amx_int8": "amx-int8", "amx_bf16": "amx-bf16",
}


def unnamed_features(mcpu: str | None = None, flags: set[str] | None = None) -> list[str]:
    """LLVM features this CPU has (``flags``, default: this machine's) that LLVM's CPU ``mcpu`` lacks
    (default: this machine's name for it): what ``cpu_target`` adds, so that no instruction the CPU
    has is left out because of the name its model number gives it."""
    flags = host_flags() if flags is None else flags
    named = cpu_features(tvm.target.Target({"kind": "llvm", "mcpu": mcpu or cpu_name()}))
    return sorted(feature for flag, feature in FLAG_FEATURES.items() if flag in flags and feature not in named)


def cpu_target(num_cores: int | None = None) -> tvm.target.Target:
    """The LLVM target for this host: the real CPU name, the instructions it has beyond what that name
    implies (``unnamed_features``, as ``mattr``; usually none), and its physical cores (the threads a build
    is tuned for: ``thread_count`` without a setting)."""
    attrs = {"kind": "llvm", "mcpu": cpu_name(), "num-cores": num_cores or physical_core_count()}
    if extra := unnamed_features():
        attrs["mattr"] = [f"+{feature}" for feature in extra]
    return tvm.target.Target(attrs)


def cpu_features(target: tvm.target.Target | None = None) -> set[str]:
    """LLVM feature names of the target's CPU and its ``mattr`` (``avx512f``, ``avx2``, ...)."""
    return {str(f) for f in codegen.llvm_get_cpu_features(target or cpu_target())}


def vector_width_bits(target: tvm.target.Target | None = None) -> int:
    """Widest SIMD register the target's CPU has, in bits (512 with AVX-512, 256 with AVX2)."""
    feats = cpu_features(target)
    return next((bits for feat, bits in WIDTH_BY_FEATURE if feat in feats), 64)


def float32_lanes(target: tvm.target.Target | None = None) -> int:
    """float32 values per vector register of the target's CPU (16 with AVX-512, 8 with AVX2)."""
    return vector_width_bits(target) // 32


def vector_extensions(target: tvm.target.Target | None = None) -> list[str]:
    """The notable SIMD extensions present, widest first."""
    feats = cpu_features(target)
    return [f for f in VECTOR_FEATURES if f in feats]


@dataclass(frozen=True)
class FmaThroughput:
    """How much float32 arithmetic one core of a CPU can start per clock cycle.

    ``units`` fused multiply-add instructions per cycle, each on ``width_bits`` of data: the width
    of the FMA *datapath*, which is not always the register width (Zen 4 has 512-bit registers
    but runs each 512-bit instruction as two 256-bit halves).
    """

    cpu: str
    units: int
    width_bits: int
    source: str  # where the numbers come from: the table below, or the fallback's assumption

    @property
    def fp32_lanes(self) -> int:
        """float32 values one FMA unit processes per cycle."""
        return self.width_bits // 32

    @property
    def flops_per_cycle(self) -> int:
        """float32 FLOP per cycle per core: units x lanes x 2 (an FMA is a multiply and an add)."""
        return 2 * self.units * self.fp32_lanes

    def summary(self) -> str:
        units = f"{self.units} FMA unit{'s' if self.units > 1 else ''}"
        return (f"{self.cpu}: {units} of {self.width_bits} bits per core = {self.flops_per_cycle} float32 FLOP "
                f"per cycle ({self.source})")


_SERVER_AVX512 = "most Xeon server parts; some (Xeon Bronze, Silver, some Gold 5100/5200) have 1 unit, half this"
_CLIENT_AVX512 = "client AVX-512: two 256-bit units join into one 512-bit FMA"
# FMA issue per core, keyed by LLVM CPU name: (units, datapath bits, note), as documented in the vendors'
# optimization guides (Intel's Optimization Reference Manual; AMD's Software Optimization Guides for
# families 17h, 19h and 1Ah) and Agner Fog's microarchitecture guide. A CPU not listed here gets the
# fallback of fma_throughput(), an upper bound.
FMA_BY_CPU: dict[str, tuple[int, int, str]] = {
    "haswell": (2, 256, "Haswell"),
    "broadwell": (2, 256, "Broadwell"),
    "skylake": (2, 256, "client Skylake"),
    "skylake-avx512": (2, 512, _SERVER_AVX512),
    "cascadelake": (2, 512, _SERVER_AVX512),
    "cooperlake": (2, 512, "Cooper Lake server"),
    "icelake-server": (2, 512, "Ice Lake server"),
    "sapphirerapids": (2, 512, "Sapphire Rapids"),
    "emeraldrapids": (2, 512, "Emerald Rapids (Xeon 5th generation)"),
    "graniterapids": (2, 512, "Granite Rapids (Xeon 6 P-cores)"),
    "icelake-client": (1, 512, _CLIENT_AVX512),
    "tigerlake": (1, 512, _CLIENT_AVX512),
    "rocketlake": (1, 512, _CLIENT_AVX512),
    "znver1": (2, 128, "Zen 1 runs a 256-bit AVX instruction as two 128-bit halves"),
    "znver2": (2, 256, "Zen 2"),
    "znver3": (2, 256, "Zen 3"),
    "znver4": (2, 256, "Zen 4 runs a 512-bit AVX-512 instruction as two 256-bit halves: one 512-bit FMA per "
                       "cycle, as much as two 256-bit ones"),
    "znver5": (2, 512, "Zen 5 desktop and server parts have full 512-bit datapaths; the mobile parts, also "
                       "named znver5, keep 256-bit ones, half this"),
}


def cpuinfo_field(name: str, cpuinfo: str | Path = "/proc/cpuinfo") -> str | None:
    """A field of the first CPU in ``/proc/cpuinfo`` (``model name``, ``cpu MHz``, ``flags``; the name's case
    does not matter); None where there is no such file or field."""
    try:
        for line in Path(cpuinfo).read_text().splitlines():
            key, sep, value = line.partition(":")
            if sep and key.strip().lower() == name.lower():
                return value.strip()
    except OSError:
        pass
    return None


def host_flags(cpuinfo: str | Path = "/proc/cpuinfo") -> set[str]:
    """The instruction-set flags the kernel reports for this machine's CPU (empty where there is no cpuinfo)."""
    return set((cpuinfo_field("flags", cpuinfo) or "").split())


def fma_throughput(target: tvm.target.Target | str | None = None, flags: set[str] | None = None) -> FmaThroughput:
    """FMA units per core and their width for the target's CPU (default: this machine's).

    CPUs in ``FMA_BY_CPU`` get the table's figures. Any other CPU gets a documented fallback that
    errs high, as a ceiling should: 2 FMA units as wide as its widest vector register if it has
    FMA (true of Intel and AMD cores since 2013; some have 1, or run the widest instructions in
    halves), otherwise 1 (a multiply and an add per cycle, which is one FMA's worth).
    LLVM names a CPU from its model number, and a virtual machine may show a client model's number
    on a server part: a "client" CPU whose ``flags`` (default: this machine's, when the target is
    its CPU) include AMX, which only Xeon server parts have, gets their 2 units.
    """
    if isinstance(target, str):
        target = tvm.target.Target({"kind": "llvm", "mcpu": target})
    target = target or cpu_target()
    cpu = str(target.attrs.get("mcpu", "generic"))
    if cpu in FMA_BY_CPU:
        units, bits, why = FMA_BY_CPU[cpu]
        if flags is None:
            flags = host_flags() if cpu == cpu_name() else set()
        if why == _CLIENT_AVX512 and "amx_tile" in flags:
            return FmaThroughput(cpu, 2, bits, f"LLVM names this CPU {cpu} from its model number, but it has AMX, "
                                               "which only Xeon server parts (Sapphire Rapids on) have: 2 units, "
                                               "as theirs (a virtual machine showing another model, most likely)")
        return FmaThroughput(cpu, units, bits, f"table: {why}")
    bits = vector_width_bits(target)
    if "fma" in cpu_features(target):
        return FmaThroughput(cpu, 2, bits, f"not in the table: assumed 2 FMA units of the {bits}-bit registers, "
                                           "an upper bound (some CPUs have 1, or split wide instructions)")
    return FmaThroughput(cpu, 1, bits, f"not in the table, no FMA: assumed one {bits}-bit multiply and one add "
                                       "per cycle, counted as 1 FMA unit")


def cpu_ghz() -> float | None:
    """The CPU clock in GHz as the OS reports it (a rough figure: turbo and power states move it)."""
    try:
        import psutil

        freq = psutil.cpu_freq()
        if freq and (freq.max or freq.current):
            return round((freq.max or freq.current) / 1000.0, 2)
    except Exception:
        pass
    mhz = cpuinfo_field("cpu MHz")
    return round(float(mhz) / 1000.0, 2) if mhz else None


def cache_sizes(root: str | Path = "/sys/devices/system/cpu/cpu0/cache") -> dict[str, int]:
    """The data caches one core sees, in bytes, smallest first: ``{"L1d": ..., "L2": ..., "L3": ...}`` as Linux
    lists them under ``root``; a level it does not list (another OS, a container hiding it) is left out."""
    found = {}
    for index in sorted(Path(root).glob("index*")):
        try:
            level, kind, size = ((index / name).read_text().strip() for name in ("level", "type", "size"))
        except OSError:
            continue
        if kind == "Instruction" or not size[:-1].isdigit():
            continue
        scale = {"K": 1024, "M": 1024**2, "G": 1024**3}.get(size[-1], 1)
        found["L1d" if level == "1" else f"L{level}"] = int(size[:-1]) * scale if size[-1] in "KMG" else int(size)
    return dict(sorted(found.items(), key=lambda item: item[1]))


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


# ------------------------------------------------------- a smaller CPU class, imitated on this one

# The widest vectors PyTorch may use, by the target's widest extension: (ATen's capability, oneDNN's ISA).
TORCH_ISA = (("avx512f", "avx512", "AVX512_CORE"), ("avx2", "avx2", "AVX2"))
AVX2_CPUS = ("znver3", "haswell")  # an AMD and an Intel AVX2 CPU class, tried in this order
# LLVM lists tuning hints among a CPU's features ("prefer-256-bit", "slow-3ops-lea"): no instruction depends on them.
TUNING_FLAGS = ("allow-light-", "branchfusion", "ermsb", "false-deps-", "fast-", "faster-", "idiv", "insert-vzeroupper",
                "lea-", "macrofusion", "no-bypass-delay", "pad-short-", "prefer-", "sbb-dep", "slow-", "tuning-", "use-")


def missing_instructions(mcpu: str) -> list[str]:
    """The instructions a CPU of kind ``mcpu`` has and this one lacks (empty: this CPU can imitate it)."""
    known = {str(name) for name in codegen.llvm_get_cpu_archlist(cpu_target())}
    if mcpu not in known:
        raise ValueError(f"LLVM does not know a CPU called {mcpu!r}: use an LLVM name such as znver3 or haswell.")
    wanted = cpu_features(tvm.target.Target({"kind": "llvm", "mcpu": mcpu}))
    return sorted(f for f in wanted - cpu_features() if not f.startswith(TUNING_FLAGS))


def avx2_stand_in() -> str | None:
    """An AVX2 CPU class this one can imitate: ``znver3`` on an AMD CPU, ``haswell`` on an Intel one
    (neither vendor's CPUs have all of the other's instructions); None on a CPU without AVX2."""
    return next((mcpu for mcpu in AVX2_CPUS if not missing_instructions(mcpu)), None)


def imitated_target(mcpu: str) -> tvm.target.Target:
    """The target of a CPU of kind ``mcpu``, to be run on this one, with PyTorch held to its vector width.

    Only a CPU whose instructions this one has can be imitated (a Zen 3 on a Zen 5, not the reverse;
    a Haswell, not a Zen 3, on an Intel Xeon); PyTorch must not have run an operator yet, or it keeps
    the ISA it picked then. The instructions are that CPU's; the cores, caches and clock stay this one's.
    """
    missing = missing_instructions(mcpu)
    if missing:
        stand_in = avx2_stand_in()
        raise ValueError(f"This {cpu_name()} lacks instructions {mcpu} has ({', '.join(missing[:5])}...): "
                         "it can only imitate a CPU whose instructions it has"
                         + (f" (for AVX2, try {stand_in})." if stand_in else "."))
    target = tvm.target.Target({"kind": "llvm", "mcpu": mcpu, "num-cores": physical_core_count()})
    wanted = cpu_features(target)
    aten, onednn = next(((a, o) for feat, a, o in TORCH_ISA if feat in wanted), ("default", "SSE41"))
    os.environ["ATEN_CPU_CAPABILITY"], os.environ["ONEDNN_MAX_CPU_ISA"] = aten, onednn
    # Inductor's cache does not key its kernels by ATEN_CPU_CAPABILITY: served the host ISA's kernels,
    # torch.compile of MobileNetV2 under avx2 gave a relative error of 8e8 (measured on a Zen 5).
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(REPO / "build" / f"torchinductor-{aten}")
    return target


def is_imitated(target: tvm.target.Target) -> bool:
    """Whether ``target`` is another CPU class imitated on this one (``imitated_target``)."""
    return str(target.attrs.get("mcpu")) != cpu_name()


def target_for(mcpu: str | None) -> tvm.target.Target:
    """This CPU's target, or (``mcpu``) that of a CPU class imitated on this one, PyTorch held to its vectors."""
    if not mcpu or mcpu == cpu_name():
        return cpu_target()
    return imitated_target(mcpu)
