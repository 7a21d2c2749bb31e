"""What the maintainers' comparisons share: timings as plain records, the machine's load while they ran,
and a result printed and kept in ``results/`` beside the machine it was measured on (``print_and_keep``)."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence

import tvm

from .. import bf16, machine, peers, timing
from ..results import results_path_here, save_record

UNRELIABLE_MARK = "≈ "


def records(timings: Sequence[timing.Timing]) -> dict[str, dict]:
    """Each timing as ``{label: {"median_ms", "iqr_ms", "repeats"}}``: what a results file keeps of it."""
    return {t.label: {"median_ms": t.median_ms, "iqr_ms": t.iqr_ms, "repeats": len(t.times_ms)} for t in timings}


def add_openvino_default(runners: dict, model, x, exported: bytes | None) -> dict[str, float]:
    """OpenVINO at its default precision added to ``runners`` where that is not float32 (bf16 on a CPU with AVX-512
    BF16; ``peers.openvino_default``): what a table keeps as ``lower_precision``, its label and its logits' relative
    error against eager ({} where there is none). Added after the float32 engines' parity check: it is held to no
    tolerance."""
    lower = peers.openvino_default(model, x, exported)
    if lower is None:
        return {}
    label, run, error = lower
    runners[label] = run
    return {label: float(error)}


def require_bf16(target: tvm.target.Target) -> None:
    """Stop with the reason where ``target`` has no AVX-512 BF16: TVM's bf16 kernels and builds cannot run there."""
    if not bf16.has_bf16(target):
        raise SystemExit(f"{target.attrs.get('mcpu', machine.cpu_name())} has no AVX-512 BF16 (vdpbf16ps): "
                         "TVM's bf16 kernels and builds do not run here.")


def load_average() -> float:
    """The machine's one-minute load average, kept beside a run's timings (before and after it)."""
    return round(os.getloadavg()[0], 2)


def print_and_keep(kind: str, title: str, result: dict, format_result: Callable[[dict, str], str], save: bool,
                   target: tvm.target.Target | None = None) -> str:
    """Format ``result`` for this machine, print it, and (``save``) keep it in
    results/<kind>-<cpu>-<cores>cores.{json,md}: the record with the machine, the Markdown under ``title``.
    For a ``target`` imitated on this CPU the files are named ``...-on-<this cpu>``."""
    info = machine.describe()
    target = target or machine.cpu_target()
    imitated = machine.is_imitated(target)
    summary = info.summary() + (f"; imitating {target.attrs['mcpu']} (TVM built for it, PyTorch held to "
                                f"{os.environ.get('ONEDNN_MAX_CPU_ISA')})" if imitated else "")
    text = format_result(result, summary)
    print(text)
    if save:
        paths = [results_path_here(target, suffix, kind) for suffix in ("json", "md")]
        record = save_record(paths[0], machine=info.as_dict(), target=str(target), imitated=imitated, **result)
        paths[1].write_text(f"# {title}, measured {record['measured']}\n\n{text}\n")
        print(f"saved {paths[1]}")
    return text
