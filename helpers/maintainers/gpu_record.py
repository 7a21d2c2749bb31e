"""Day 9's GPU measurements, recorded on a machine with an NVIDIA GPU and kept in ``results/gpu/``, so that Day 9
runs from them where there is none: ``python -m helpers.maintainers.gpu_record``.
"""

from __future__ import annotations

import argparse
import platform
from collections.abc import Sequence
from pathlib import Path

import torch

from .. import machine, models, timing
from ..gpu import RECORDED_ROOT, crossover_builds, measure_crossover, measure_gpu_backends, recorded_rows
from ..results import save_record, slug


def gpu_machine() -> dict:
    """The machine a GPU measurement came from: GPU, driver and CUDA versions, host CPU, libraries."""
    info = machine.describe().as_dict()
    info["gpu"] = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    info["gpu_arch"] = str(machine.cuda_target().attrs["arch"]) if machine.has_gpu() else None
    info["cuda"] = torch.version.cuda
    info["torch"] = torch.__version__
    info["host_cpu"] = _cpu_model_name()
    return info


def _cpu_model_name() -> str:
    return machine.cpuinfo_field("model name") or platform.processor() or "unknown"


def save_recorded(
    model: str, gpu_backends: Sequence[timing.Timing], crossover: Sequence[timing.Timing], root: Path = RECORDED_ROOT
) -> Path:
    """Write the measurements to ``results/gpu/<model>-<gpu>.json`` with the machine they came from."""
    info = gpu_machine()
    path = root / f"{model}-{slug(info['gpu'] or 'no-gpu')}.json"
    save_record(path, machine=info, model=model, gpu_backends=recorded_rows(gpu_backends), crossover=recorded_rows(crossover))
    return path


def record(model_name: str = "mobilenet_v2", batches: Sequence[int] = (1, 2, 4, 8, 16, 32, 64, 128)) -> Path:
    """Measure everything Day 9 shows on this GPU machine and save it under results/gpu/."""
    machine.require_gpu("recording GPU measurements")
    model = models.load_model(model_name, pretrained=False)
    print("GPU backends at batch 1 ...", flush=True)
    gpu_backends = measure_gpu_backends(model, batch=1, repeats=100)
    print("CPU/GPU crossover sweep ...", flush=True)
    builds = crossover_builds(model, max_batch=max(batches))
    crossover = measure_crossover(builds, batches, repeats=10)
    path = save_recorded(model_name, gpu_backends, crossover)
    print(f"saved {path}")
    return path


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m helpers.maintainers.gpu_record", description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="mobilenet_v2")
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32, 64, 128])
    args = parser.parse_args(argv)
    record(args.model, args.batches)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
